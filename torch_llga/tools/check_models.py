"""Model sweep: each model traced and frozen with random weights (nothing downloaded), fused by
torch_llga, and compared with eager.

    python -m torch_llga.tools.check_models [--models resnet18,gpt2] [--size 224] [--compile] [--markdown docs/models.md]

With --compile each model runs as torch.compile(model, backend="torch_llga") instead (the groups
column then counts the fused partitions one call executed, over all of Dynamo's graphs).

Prints a table (model, groups, ops fused / total, max abs diff, pass, the op explain() most often
leaves to PyTorch and why) and exits 1 if a model fails. --markdown writes the whole page: the
command, date, CPU, torch and oneDNN, the table. The models come from torchvision and transformers;
a model whose package is not installed is skipped, with a note saying what to install.
"""
import argparse
import collections
import datetime
import os
import shlex
import subprocess
import sys
import textwrap
import warnings

import torch

import torch_llga
from torch_llga import _optional
from torch_llga.tools import bench_models
from torch_llga.tools.bench_models import informative
from torch_llga.report import Explanation

TORCHVISION = ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "mobilenet_v2",
               "mobilenet_v3_large", "mobilenet_v3_small", "mnasnet1_0", "shufflenet_v2_x1_0", "squeezenet1_0",
               "efficientnet_b0", "regnet_y_400mf", "googlenet", "vgg11", "alexnet", "convnext_tiny", "vit_b_16",
               "swin_t"]
TRANSFORMERS = ["bert_base", "distilbert", "gpt2"]
# Segmentation, detection, diffusion and speech models (bench_models.BEYOND), as the benchmark builds them.
BEYOND = list(bench_models.BEYOND)
PACKAGE = {**dict.fromkeys(TORCHVISION, "torchvision"), **dict.fromkeys(TRANSFORMERS, "transformers"),
           **{name: bench_models.PACKAGE[name] for name in BEYOND}}
# fp32 sums over many layers in another order drift ~1e-5 relative per layer. The absolute part
# scales with the output: random-init MobileNets output ~1e-9, where a fixed atol would pass anything.
RTOL = 1e-4


def make(name, size):
    torch.manual_seed(0)
    if name in TRANSFORMERS:
        import transformers as tf

        config = {"bert_base": (tf.BertConfig, tf.BertModel), "distilbert": (tf.DistilBertConfig, tf.DistilBertModel),
                  "gpt2": (tf.GPT2Config, tf.GPT2Model)}[name]
        model = bench_models.FirstOf(config[1](config[0](return_dict=False, torchscript=True)))
        return model.eval(), (torch.randint(0, 1000, (1, 128)),)
    if name in BEYOND:
        model, inputs = bench_models.BEYOND[name](1)
        return model.eval(), inputs
    import torchvision

    kwargs = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    if name == "vit_b_16":
        size = 224  # its position embedding fixes the input size
    return getattr(torchvision.models, name)(**kwargs).eval(), (torch.rand(1, 3, size, size),)


def check(name, size):
    model, inputs = make(name, size)
    model = informative(model)
    with torch.no_grad():
        expected = model(*inputs)
        with torch_llga.enabled():
            fused = torch.jit.freeze(torch.jit.trace(model, inputs))
            fused(*inputs)
            fused(*inputs)
            graph = torch.jit.last_executed_optimized_graph()
        before = torch_llga.stats()
        out = fused(*inputs)
        after = torch_llga.stats()
    report = Explanation(graph, after["guard_failures"] - before["guard_failures"],
                         after["nonfinite_fallbacks"] - before["nonfinite_fallbacks"])  # what explain() reports
    diff = (out - expected).abs().max().item()
    scale = expected.abs().max().item()
    n_fused = sum(len(g["ops"]) for g in report.groups)
    ok = (torch.allclose(out, expected, rtol=RTOL, atol=RTOL * scale) and report.guard_fallbacks == 0
          and after["kernel_fallbacks"] == before["kernel_fallbacks"])
    reasons = collections.Counter(f"{op}: {reason}" for op, reason in report.unfused).most_common(1)
    return len(report.groups), n_fused, n_fused + len(report.unfused), diff, scale, ok, reasons[0][0] if reasons else "-"


def check_compiled(name, size):
    model, inputs = make(name, size)
    model = informative(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torch_llga")
    with torch.no_grad():
        expected = model(*inputs)
        compiled(*inputs)  # compilation
        compiled(*inputs)  # profiling run
        before = torch_llga.stats()
        out = compiled(*inputs)
        after = torch_llga.stats()
    delta = {k: after[k] - before[k] for k in before}
    diff = (out - expected).abs().max().item()
    scale = expected.abs().max().item()
    ok = (torch.allclose(out, expected, rtol=RTOL, atol=RTOL * scale) and delta["guard_failures"] == 0
          and delta["kernel_fallbacks"] == 0 and delta["executions"] > 0)
    return delta["executions"], "-", "-", diff, scale, ok, "-"


HEADING = ("| model | groups | ops fused / total | max abs diff | max abs output | pass | "
           "most frequent op left to PyTorch (explain) |\n|---|---|---|---|---|---|---|")


def row(name, args):
    """(table row, passed) for one model."""
    try:
        groups, n_fused, total, diff, scale, ok, left = (check_compiled if args.compile else check)(name, args.size)
        ok = ok and scale > 0
        return f"| {name} | {groups} | {n_fused} / {total} | {diff:.1e} | {scale:.1e} | {'yes' if ok else 'NO'} | {left} |", ok
    except Exception as e:
        return f"| {name} | - | - | {type(e).__name__}: {str(e).splitlines()[-1][:80]} | - | NO | - |", False


def cpu():
    """The CPU as /proc/cpuinfo names it, with its family and model (virtual machines may show only
    the vendor's line as its name), its cores, and the instruction set oneDNN uses."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = info.get("model name", "unknown CPU")
    if "cpu family" in info and "model" in info:
        name += f" (family {info['cpu family']}, model {info['model']})"
    return f"{name}, {os.cpu_count()} cores, oneDNN ISA {torch_llga.config()['cpu_isa']}"


def code_version():
    """The commit of the checkout this torch_llga runs from, "+changes" if its code (csrc/,
    torch_llga/) differs from it; None for an installed wheel."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True)

    try:
        if git("ls-files", "--error-unmatch", os.path.basename(__file__)).returncode != 0:
            return None
        commit = git("rev-parse", "--short=7", "HEAD").stdout.strip()
        changed = git("diff", "--quiet", "HEAD", "--", "../../csrc", "..").returncode != 0
        return commit + (" +changes" if changed else "") if commit else None
    except OSError:
        return None


def page(command, code, rows, skipped, compiled, size):
    """The whole markdown page of a sweep."""
    lines = [
        "# Model sweep",
        "",
        "Generated by",
        "",
        "```sh",
        command,
        "```",
        "",
        f"on {datetime.date.today().isoformat()}: {cpu()}; {torch.get_num_threads()} threads; torch {torch.__version__}, "
        f"oneDNN {torch_llga.onednn_version()}" + (f"; code {code}" if code else "") + ".",
        "",
        "Each model is traced and frozen with random weights (nothing downloaded; all-zero heads get small "
        "random values so the outputs are informative), fused by torch_llga"
        + (' through `torch.compile(backend="torch_llga")`' if compiled else "")
        + " and compared with eager: rtol 1e-4, atol 1e-4 x max |output|; a pass also needs no guard failure and "
        f"no kernel fallback on a repeat call. Vision models take one {size}x{size} image"
        + (" (vit_b_16 224x224)" if size != 224 else "") + ", transformers 128 tokens; the models past classifiers "
        "(segmentation at 256x256, detection backbone + FPN + heads at 320x320, a diffusion UNet on a 32x32 latent "
        "with 16 text tokens, Whisper's encoder on 3,000 frames, T5's encoder on 128 tokens) come from "
        "`torch_llga.tools.bench_models` as the benchmark builds them. Columns: "
        + ("the fused partitions one call executed, over all of Dynamo's graphs; the largest difference to eager and "
           "the largest output (the ops columns come from the TorchScript path only)" if compiled else
           "fusion groups in the optimized graph; aten ops fused inside groups / all ops of the optimized graph; the "
           "largest difference to eager and the largest output; the op `torch_llga.explain` most often leaves to "
           "PyTorch in that model, and why") + ".",
        "",
        HEADING,
        *rows,
    ]
    if skipped:
        lines += ["", "Not run: " + "; ".join(f"{', '.join(names)}, {_optional.not_installed(package)}"
                                          for package, names in skipped.items()) + "."]
    lines += ["", "A fast subset runs in `make test` (`test/test_models.py`)."]
    return "\n".join(textwrap.fill(line, 100, break_on_hyphens=False) if not line.startswith(("|", "python")) else line
                     for line in lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m torch_llga.tools.check_models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(TORCHVISION + TRANSFORMERS + BEYOND),
                        help="comma-separated, from: " + ", ".join(TORCHVISION + TRANSFORMERS + BEYOND))
    parser.add_argument("--size", type=int, default=224, help="image size for the vision models")
    parser.add_argument("--compile", action="store_true", help='through torch.compile(backend="torch_llga")')
    parser.add_argument("--markdown", metavar="PATH", help="write the whole page (command, date, CPU, torch, oneDNN, "
                        "the table) here, e.g. docs/models.md")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in PACKAGE:
            parser.error(f"unknown model {m!r}; choose from {', '.join(PACKAGE)}")
    warnings.filterwarnings("ignore")
    code = code_version()  # the code measured, before any edit during the run

    skipped = {}  # package -> the models it would have given
    for name in models:
        if not _optional.installed(PACKAGE[name]):
            skipped.setdefault(PACKAGE[name], []).append(name)
    for package, names in skipped.items():
        print(f"skipping {', '.join(names)}: {_optional.not_installed(package)}", file=sys.stderr)

    print(HEADING, flush=True)
    rows, failed = [], []
    for name in models:
        if name in skipped.get(PACKAGE[name], ()):
            continue
        line, ok = row(name, args)
        print(line, flush=True)
        rows.append(line)
        if not ok:
            failed.append(name)
    if args.markdown:
        command = shlex.join(["python", "-m", "torch_llga.tools.check_models", *argv])
        with open(args.markdown, "w") as f:
            f.write(page(command, code, rows, skipped, args.compile, args.size))
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
