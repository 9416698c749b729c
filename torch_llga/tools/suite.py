"""Suite runner: torch_llga on the models PyTorch benchmarks Inductor with on CPU, the timm and
Hugging Face lists of its dashboard (benchmarks/dynamo/*_models_list_cpu.txt, copied into suite_lists/).

    python -m torch_llga.tools.suite [--list timm|huggingface|all] [--models lcnet,Bert] [--limit N]
        [--batch 1|list|N] [--dtype fp32|bf16] [--rounds 5] [--layers N] [--seq N] [--out DIR]

Each model is built with random weights and nothing downloaded: timm's by timm.create_model(name,
pretrained=False) (timm is a benchmark extra: requirements-bench.txt), Hugging Face's from their config
class (where PyTorch's harness reads a config from the hub, the config class with that config's values).
It runs five ways: eager; torch_compile (Inductor with freezing on, as the CPU dashboard runs it);
torch_llga_compile (torch.compile(backend="torch_llga")); torch_llga (torch.jit.trace + freeze, fuser
on); torchscript (the same, fuser off). Each round times every way once, in a new shuffled order; the
ratios are medians of per-round ratios (as bench.py's), > 1 where torch_llga is faster. Only ratios
within one run mean anything on a shared machine.

Inputs as PyTorch's harness makes them: timm, a normalized random image at the model's test input size;
Hugging Face, random input_ids at the harness's sequence length for the model (128 to 2048 tokens; the
encoder-decoders get them as decoder_input_ids too), without labels (inference without the loss, which
the harness computes). With random weights the batch norms get statistics measured on random images
and all-zero layers small values, so the outputs (and so the comparisons with eager) mean something.

Each model runs in a process of its own: a crash, running out of memory or --timeout costs its row
only, and the TorchScript modules (which PyTorch keeps until the process ends) go with it.
"""
import argparse
import collections
import datetime
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import torch

import torch_llga
from torch_llga import _optional
from torch_llga.tools.bench import (Backend, bench_import, cpu_name, first, flops_of, ratio, ratio_cell, ratio_spread,
                                    time_interleaved)
from torch_llga.tools.bench_models import informative, with_batch_norm_statistics
from torch_llga.tools.check_models import code_version

LISTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite_lists")
# list -> (its file in suite_lists/, the package its models come from)
SUITES = {"timm": ("timm_models_list_cpu.txt", "timm"),
          "huggingface": ("huggingface_models_list_cpu.txt", "transformers")}
WAYS = ["eager", "torch_compile", "torch_llga_compile", "torch_llga", "torchscript"]
# (column heading, baseline way, torch_llga way): the speedups the table and the chart show
SPEEDUPS = [("llga_compile vs Inductor", "torch_compile", "torch_llga_compile"),
            ("llga vs TorchScript", "torchscript", "torch_llga")]
# A way equals eager when max |output - eager's| <= tolerance x max |eager's| (--tolerance): whole fp32
# models sum in other orders, ~1e-5 relative per layer; bf16 keeps 8 significant bits.
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
# Copies of the weights one model's run holds at once: eager's, the frozen TorchScript modules',
# Inductor's frozen constants, oneDNN's reordered ones, and what compiling takes (BertForMaskedLM on
# 128 tokens peaked at 3.8 GB for its 0.44 GB of weights, ~1 GB of it the imports). A model whose
# copies do not fit in the memory available is not run: the machine may be shared.
WEIGHT_COPIES = 7

# Names PyTorch's harness builds from a hub config (its EXTRA_MODELS; BigBird's entry is commented out
# there, block-sparse attention): here the config class, given the hub config's values that differ
# from its defaults. T5Config's defaults are t5-small's, FNetConfig's google/fnet-base's,
# ConvBertConfig's YituTech/conv-bert-base's.
HUB_MODELS = {
    "AllenaiLongformerBase": ("LongformerForMaskedLM", dict(attention_window=512, max_position_embeddings=4098,
                                                             vocab_size=50265, type_vocab_size=1, layer_norm_eps=1e-5,
                                                             pad_token_id=1, bos_token_id=0, eos_token_id=2)),
    "BigBird": ("BigBirdForMaskedLM", dict(attention_type="block_sparse")),
    "DistillGPT2": ("GPT2LMHeadModel", dict(n_layer=6)),
    "GoogleFnet": ("FNetForMaskedLM", {}),
    "T5Small": ("T5ForConditionalGeneration", {}),
    "YituTechConvBert": ("ConvBertForMaskedLM", {}),
}
# The config fields --layers cuts (each model family names its layer count its own way).
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")
# Models the harness also gives decoder_input_ids (its encoder-decoders).
ENCODER_DECODERS = ("T5", "MT5", "M2M100")


def read_list(suite):
    """[(model, batch size)] of a list file; '#' lines are comments."""
    with open(os.path.join(LISTS_DIR, SUITES[suite][0])) as f:
        entries = [line.strip().split(",") for line in f if line.strip() and not line.startswith("#")]
    return [(name, int(batch)) for name, batch in entries]


def sequence_length(name):
    """The sequence length PyTorch's harness gives a model of its Hugging Face list."""
    if name.startswith("Blenderbot"):
        return 128
    if name.startswith(("GPT2", "Bart", "T5", "PLBart", "MBart")) or name in ("AllenaiLongformerBase", "BigBird"):
        return 1024
    if name.startswith("OPT"):
        return 2048
    if name.startswith(("Albert", "Deberta", "Layout", "Electra", "XLNet", "MegatronBert", "Bert", "Roberta")) or \
            name in ("DistillGPT2", "GoogleFnet", "YituTechConvBert"):
        return 512
    if name == "TrOCRForCausalLM":
        return 256
    return 128  # MobileBert's, and the harness's for the models it sets none for


def memory_available():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def check_fits(n_params, dtype):
    weights = n_params * (2 if dtype == "bf16" else 4)
    available = memory_available()
    if weights * WEIGHT_COPIES > available:
        raise MemoryError(f"{weights / 1e9:.1f} GB of weights, ~{weights * WEIGHT_COPIES / 1e9:.0f} GB as its ways hold "
                          f"them, more than the {available / 1e9:.0f} GB available (--layers N makes it smaller)")


def timm_model(name, batch, args):
    timm = bench_import("timm")
    from timm.data import resolve_data_config

    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False)
    check_fits(sum(p.numel() for p in model.parameters()), args.dtype)
    channels, height, width = resolve_data_config({}, model=model, use_test_size=True)["input_size"]
    model = informative(model)
    if height == width:
        try:
            model = with_batch_norm_statistics(model, height)
        except Exception:  # noqa: BLE001 - a model its training mode does not run: initial statistics
            pass
    # The harness's image: random pixel values 0..255, normalized.
    torch.manual_seed(1337)
    image = torch.randint(256, (batch, channels, height, width)).float()
    return model.eval(), ((image - image.mean()) / image.std(),), f"{height}x{width} image"


class FirstOutput(torch.nn.Module):
    """A Hugging Face model called with its inputs by name, returning its first output (the logits):
    one tensor, which every way takes (a trace records tensors, not ModelOutput)."""

    def __init__(self, model, input_names):
        super().__init__()
        self.model, self.input_names = model, input_names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.input_names, inputs)))[0]


def hf_model(name, batch, args):
    transformers = bench_import("transformers")
    transformers.logging.set_verbosity_error()
    class_name, hub_values = HUB_MODELS.get(name, (name, {}))
    model_class = getattr(transformers, class_name)
    config = model_class.config_class(**hub_values, return_dict=False)
    config.use_cache = False  # as the harness: one forward, no KV cache
    if name.startswith(("GPT2ForSequenceClassification", "Roberta")):
        config.pad_token_id = 0  # the harness's: batches > 1 need a pad token
    for field in LAYER_COUNTS if args.layers else ():
        if isinstance(getattr(config, field, None), int):
            setattr(config, field, min(getattr(config, field), args.layers))
    with torch.device("meta"):  # its size before its memory
        check_fits(sum(p.numel() for p in model_class(config).parameters()), args.dtype)
    torch.manual_seed(0)
    model = informative(model_class(config))
    seq = args.seq or sequence_length(name)
    torch.manual_seed(1337)
    # The harness's input_ids: random tokens (Roberta's all 0), Bart's ending with end-of-sequence.
    ids = torch.randint(0, 1 if name.startswith("Roberta") else config.vocab_size, (batch, seq))
    if "Bart" in name:
        ids[:, -1] = config.eos_token_id
    names = ["input_ids", "decoder_input_ids"] if name.startswith(ENCODER_DECODERS) else ["input_ids"]
    return FirstOutput(model, names).eval(), tuple(ids.clone() for _ in names), f"{seq} tokens"


def one_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def difference(out, expected, tolerance):
    """The way's output beside eager's: max |difference| relative to max |eager output|, and whether
    that is within the tolerance."""
    if out.shape != expected.shape:
        return {"rel_err": None, "equal": False, "why": f"shape {list(out.shape)}, eager's {list(expected.shape)}"}
    scale = expected.abs().max().item()
    rel = (out - expected).abs().max().item() / (scale or 1.0)
    return {"rel_err": rel, "equal": rel <= tolerance}  # NaN compares False


def fusion(backend, inputs):
    """What torch_llga fused in the torch_llga way's script (explain(); its calls also make the
    groups' measured choices, which would otherwise fall in the first timed round)."""
    report = torch_llga.explain(backend.fn, *inputs, verbose=False)
    left = collections.Counter(f"{op}: {why}" for op, why in report.unfused).most_common(1)
    return {"fused_share": report.fused_share, "groups": len(report.groups), "guard_fallbacks": report.guard_fallbacks,
            "most_left": left[0][0] if left else ""}


def compiled_partitions(backend):
    """Fused partitions one call of the torch.compile way runs, after the calls that make its
    measured choices (a group's 3rd to 5th)."""
    for _ in range(4):
        backend.time_ms(1)
    before = torch_llga.stats()
    backend.time_ms(1)
    after = torch_llga.stats()
    return {"partitions_per_call": after["executions"] - before["executions"],
            "guard_fallbacks": after["guard_failures"] - before["guard_failures"]}


def run_model(suite, name, batch, args):
    """One model's row: each way's times and difference to eager, torch_llga's fused share."""
    def say(stage):
        print(f"{args.tag} {name}: {stage}", file=sys.stderr, flush=True)

    row = {"model": name, "suite": suite, "batch": batch, "results": {}}
    say("building")
    try:
        model, inputs, row["input"] = (timm_model if suite == "timm" else hf_model)(name, batch, args)
        if args.dtype == "bf16":
            model = model.to(torch.bfloat16)
            inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
        with torch.no_grad():
            expected = first(model(*inputs)).float()
        row["flops"] = flops_of(model, inputs)
    except Exception as e:  # noqa: BLE001 - the row says why, the run goes on
        row["error"] = one_line(e)
        return row
    ready = []
    for way in args.ways:
        say(f"preparing {way}")
        try:
            backend = Backend(way, model, inputs, args.dtype)
            result = {"warmup_ms": backend.warmup_ms, "times": [],
                      **difference(first(backend.output).float(), expected, args.tolerance)}
            if way == "torch_llga":
                result.update(fusion(backend, inputs))
            elif way == "torch_llga_compile":
                result.update(compiled_partitions(backend))
            row["results"][way] = result
            ready.append(backend)
        except Exception as e:  # noqa: BLE001 - blanks this way's cells only
            row["results"][way] = {"error": one_line(e)}
    if not ready:
        return row
    time_interleaved(ready, row["results"], args.rounds, args.sample_ms, lambda r: say(f"round {r}/{args.rounds}"))
    return row


def run_in_own_process(suite, name, batch, tag, args):
    """run_model in a child process (this module with --child); its progress lines pass through."""
    with tempfile.TemporaryDirectory() as tmp:
        row_path = os.path.join(tmp, "row.json")
        command = [sys.executable, "-m", "torch_llga.tools.suite", "--child", f"{suite}:{name}:{batch}",
                   "--row-json", row_path, "--tag", tag, "--dtype", args.dtype, "--rounds", str(args.rounds),
                   "--threads", str(args.threads), "--sample-ms", str(args.sample_ms), "--ways", ",".join(args.ways),
                   "--layers", str(args.layers), "--seq", str(args.seq), "--tolerance", str(args.tolerance)]
        # The child imports this torch_llga, wherever the caller's came from (a checkout, say).
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_llga.__file__)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        timed_out = threading.Event()
        timer = threading.Timer(args.timeout, lambda: (timed_out.set(), child.kill()))
        timer.start()
        tail = collections.deque(maxlen=5)  # what it said last, for the row if it dies
        for line in child.stdout:
            if line.startswith(tag):
                sys.stderr.write(line)
            elif line.strip():
                tail.append(line.strip())
        child.wait()
        timer.cancel()
        if os.path.exists(row_path):
            with open(row_path) as f:
                return json.load(f)
    if timed_out.is_set():
        why = f"timed out after {args.timeout:.0f} s (--timeout)"
    elif child.returncode < 0:
        sig = signal.Signals(-child.returncode).name
        why = f"its process was killed by {sig}" + (" (out of memory?)" if sig == "SIGKILL" else "")
    else:
        why = f"its process exited with code {child.returncode}: {tail[-1][:160] if tail else ''}"
    return {"model": name, "suite": suite, "batch": batch, "results": {}, "error": why}


def matmul_gflops(dtype, n=2048, repeats=5, budget_s=3.0):
    """The machine's matmul rate: (GFLOP/s, calls) of the best of a few n x n x n torch.mm, fewer
    past budget_s (bf16 without bf16 kernels takes seconds a call)."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
    torch.mm(a, b)
    times = []
    while len(times) < repeats and sum(times) < budget_s:
        t = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / min(times) / 1e9, len(times)


def fastest_llga(row):
    """(way, median ms) of the faster torch_llga way, or None."""
    timed = [(w, row["results"][w]["median_ms"]) for w in ("torch_llga", "torch_llga_compile")
             if "median_ms" in row["results"].get(w, {})]
    return min(timed, key=lambda t: t[1]) if timed else None


def geomean(values):
    values = [v for v in values if v]
    return (math.exp(sum(map(math.log, values)) / len(values)), len(values)) if values else (None, 0)


def notes(row, header):
    out = []
    if header["dtype"] == "bf16" and not header["bf16_kernels"]:
        out.append(f"oneDNN has no bf16 kernels on this CPU ({header['isa']}): its bf16 ops stay in PyTorch")
    llga = row["results"].get("torch_llga", {})
    compiled = row["results"].get("torch_llga_compile", {})
    for way, result in (("torch_llga", llga), ("torch_llga_compile", compiled)):
        if result.get("guard_fallbacks"):
            out.append(f"{way}: {result['guard_fallbacks']} guard fallbacks on the profiled inputs")
    if llga.get("most_left"):
        out.append(f"most left to PyTorch: {llga['most_left'][:90]}")
    return "; ".join(out)


def markdown(rows, header):
    ways = header["ways"]
    lines = [
        "# torch_llga on PyTorch's CPU model lists", "",
        f"`{header['command']}`", "",
        f"torch_llga {header['commit'] or '(no checkout)'}, {header['date']}; {header['cpu']} (oneDNN ISA {header['isa']}, "
        f"bf16 kernels: {'yes' if header['bf16_kernels'] else 'no'}); torch {header['torch']}, oneDNN {header['onednn']}; "
        f"{header['threads']} threads; {header['matmul_dtype']} torch.mm 2048x2048x2048: {header['matmul_gflops']:.3g} GFLOP/s "
        f"(best of {header['matmul_calls']}); batch {header['batch']}; random weights, nothing downloaded.", "",
        f"Times: median ms over {header['rounds']} rounds, the ways in a new shuffled order each round. Speedups: "
        "median of the per-round ratios, > 1 where torch_llga is faster, ~ where their middle half spans 1.00x. "
        f"= eager: every way's max |output - eager's| <= {header['tolerance']:g} x max |eager's| (the next table "
        "has each way's). fused: share of the ops torch_llga runs fused in the torch_llga way's script (explain()), and "
        "its groups; compile partitions: fused partitions one torch_llga_compile call runs. GFLOP/s: the faster torch_llga way's "
        "(flops counted by torch.utils.flop_counter), and its share of the torch.mm rate." +
        (" In bf16 without bf16 kernels the share is of the fp32 rate." if header["dtype"] != header["matmul_dtype"] else ""), "",
        "| model | batch x input | " + " | ".join(f"{w} ms" for w in ways) + " | = eager | fused | compile partitions | " +
        " | ".join(h for h, _, _ in SPEEDUPS) + " | GFLOP/s | % of mm | notes |",
        "|---" * (len(ways) + 10) + "|",
    ]
    for row in rows:
        results = row["results"]
        if "error" in row:
            lines.append(f"| {row['model']} | {row['batch']} x {row.get('input', '-')} | " + " | ".join("-" for _ in ways) +
                         " | - | - | - | - | - | - | - | not run: " + row["error"].replace("|", "/") + " |")
            continue
        cells = []
        for w in ways:
            r = results.get(w, {})
            cells.append(f"{r['median_ms']:.2f}" if "median_ms" in r else
                         "failed: " + r["error"].replace("|", "/") if "error" in r else "-")
        checked = {w: r for w, r in results.items() if w != "eager" and "equal" in r}
        wrong = [w for w, r in checked.items() if not r["equal"]]
        worst = max((r["rel_err"] for r in checked.values() if r["rel_err"] is not None), default=None)
        cells.append(("NO: " + ", ".join(wrong)) if wrong else f"yes ({worst:.0e})" if worst is not None else "-")
        llga, compiled = results.get("torch_llga", {}), results.get("torch_llga_compile", {})
        cells.append(f"{llga['fused_share']:.0%}, {llga['groups']} groups" if "fused_share" in llga else "-")
        cells.append(str(compiled["partitions_per_call"]) if "partitions_per_call" in compiled else "-")
        cells += [ratio_cell(ratio_spread(row, base, way)) for _, base, way in SPEEDUPS]
        fastest = fastest_llga(row)
        if fastest and row.get("flops"):
            gflops = row["flops"] / fastest[1] / 1e6
            cells += [f"{gflops:.1f} ({fastest[0].replace('torch_', '')})", f"{100 * gflops / header['matmul_gflops']:.0f}%"]
        else:
            cells += ["-", "-"]
        cells.append(notes(row, header).replace("|", "/") or "")
        lines.append(f"| {row['model']} | {row['batch']} x {row['input']} | " + " | ".join(cells) + " |")
    for heading, base, way in SPEEDUPS:
        mean, n = geomean([ratio(row, base, way) for row in rows if "error" not in row])
        if mean:
            lines.append(f"\ngeometric mean, {heading}: {mean:.3f}x over {n} models")
    checked = [w for w in ways if w != "eager"]
    lines += ["", f"max |output - eager's| / max |eager's| (NO: over {header['tolerance']:g}):", "",
              "| model | " + " | ".join(checked) + " |", "|---" * (len(checked) + 1) + "|"]
    for row in rows:
        cells = []
        for w in checked:
            r = row["results"].get(w, {})
            cells.append("failed" if "error" in r else "-" if "equal" not in r else
                         ("" if r["equal"] else "NO ") + (f"{r['rel_err']:.1e}" if r["rel_err"] is not None else r["why"]))
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tables(rows, header, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "suite.md"), "w") as f:
        f.write(markdown(rows, header))
    with open(os.path.join(out, "suite.json"), "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in rows if "error" not in row]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) + 2), 4))
    width = 0.8 / len(SPEEDUPS)
    for i, (heading, base, way) in enumerate(SPEEDUPS):
        ax.bar([k + i * width for k in range(len(rows))], [ratio(row, base, way) or 0 for row in rows], width, label=heading)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))], [r["model"] for r in rows], rotation=45, ha="right",
                  fontsize=7)
    ax.set_ylabel("speedup (x), > 1: torch_llga faster")
    ax.axhline(1, color="gray", lw=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def selected(args):
    """[(list, model, batch)] the run takes, in the lists' order."""
    suites = list(SUITES) if args.list == "all" else [args.list]
    wanted = [w.lower() for w in args.models.split(",") if w] if args.models else []
    models = [(suite, name, batch if args.batch == "list" else int(args.batch))
              for suite in suites for name, batch in read_list(suite)
              if not wanted or any(w in name.lower() for w in wanted)]
    return models[:args.limit] if args.limit else models


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m torch_llga.tools.suite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", choices=["timm", "huggingface", "all"], default="all")
    parser.add_argument("--models", help="comma-separated substrings: the models whose names hold one (any case)")
    parser.add_argument("--limit", type=int, help="the first N models selected")
    parser.add_argument("--batch", default="1", help='batch size: N, or "list" for the list files\' own (default 1)')
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: model and inputs cast to bfloat16")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds: each times every way once")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="default: every core this process may run on")
    parser.add_argument("--sample-ms", type=float, default=150.0,
                        help="timed calls per way per round: enough for about this long (at least one)")
    parser.add_argument("--layers", type=int, default=0,
                        help="Hugging Face models: at most N layers (their encoders' and decoders'), for quick runs")
    parser.add_argument("--seq", type=int, default=0, help="Hugging Face models: N tokens instead of the harness's length")
    parser.add_argument("--ways", default=",".join(WAYS), help="comma-separated, from: " + ", ".join(WAYS))
    parser.add_argument("--tolerance", type=float, help="a way equals eager when max |output - eager's| <= this x "
                        f"max |eager's| (default {TOLERANCE['fp32']:g}, bf16 {TOLERANCE['bf16']:g})")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds a model may take (its process is ended)")
    parser.add_argument("--out", metavar="DIR", help="write suite.md (the tables), suite.png (the speedups: needs "
                        "matplotlib) and suite.json (everything measured) here")
    # One model's run, in the process the runner starts for it.
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--row-json", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.ways = [w for w in args.ways.split(",") if w]
    args.tolerance = args.tolerance or TOLERANCE[args.dtype]
    for w in args.ways:
        if w not in WAYS:
            parser.error(f"unknown way {w!r}; choose from {', '.join(WAYS)}")
    if args.batch != "list" and not (args.batch.isdigit() and int(args.batch) >= 1):
        parser.error(f'--batch takes a positive int or "list", not {args.batch!r}')
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    warnings.filterwarnings("ignore")  # the run's own output only
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing downloaded: the models come from config classes
    torch.set_num_threads(args.threads)
    if args.child:
        suite, name, batch = args.child.split(":")
        row = run_model(suite, name, int(batch), args)
        with open(args.row_json, "w") as f:
            json.dump(row, f)
        return row

    models = selected(args)
    if not models:
        sys.exit("no model of the lists matches --models")
    cpu = torch_llga._C._onednn_cpu()
    # The rate GFLOP/s are a share of: bf16's where oneDNN has bf16 kernels; elsewhere fp32's (PyTorch's
    # bf16 torch.mm there is no reference: 0.3 GFLOP/s on a 2-core AVX2 machine, 64 s a call).
    mm_dtype = "bf16" if args.dtype == "bf16" and cpu["bf16"] else "fp32"
    print(f"matmul rate: {mm_dtype} torch.mm 2048x2048x2048 on {args.threads} threads ...", file=sys.stderr, flush=True)
    header = {"command": shlex.join(["python", "-m", "torch_llga.tools.suite", *argv]), "commit": code_version(),
              "date": datetime.date.today().isoformat(), "cpu": cpu_name(), "isa": cpu["isa"], "bf16_kernels": cpu["bf16"],
              "torch": torch.__version__, "onednn": torch_llga.onednn_version(), "threads": args.threads,
              "dtype": args.dtype, "batch": "the lists'" if args.batch == "list" else args.batch, "rounds": args.rounds,
              "tolerance": args.tolerance,
              "ways": args.ways, "matmul_dtype": mm_dtype}
    header["matmul_gflops"], header["matmul_calls"] = matmul_gflops(mm_dtype)
    print(f"matmul rate: {header['matmul_gflops']:.3g} GFLOP/s", file=sys.stderr, flush=True)
    rows = []
    for i, (suite, name, batch) in enumerate(models):
        tag = f"[{i + 1}/{len(models)}]"
        package = SUITES[suite][1]
        t = time.perf_counter()
        if _optional.installed(package):
            row = run_in_own_process(suite, name, batch, tag, args)
        else:
            row = {"model": name, "suite": suite, "batch": batch, "results": {},
                   "error": f"{_optional.not_installed(package)}, a benchmark extra (requirements-bench.txt)"}
        rows.append(row)
        print(f"{tag} {name}: " + (f"not run: {row['error']}" if "error" in row else f"done in {time.perf_counter() - t:.0f} s"),
              file=sys.stderr, flush=True)
        if args.out:  # after each model: a long run stopped keeps what it measured
            write_tables(rows, header, args.out)
    print(markdown(rows, header))
    if args.out and _optional.installed("matplotlib"):
        plot(rows, os.path.join(args.out, "suite.png"))
    elif args.out:
        print(f"no chart: {_optional.missing('the chart', 'matplotlib')}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
