"""LLM decoding benchmark: Hugging Face generate() on Llama-shaped models with random weights (greedy,
static KV cache, batch 1): time to the first token and decode tokens/s per backend, the decode's
weight traffic in GB/s against the machine's memory bandwidth: a large read (the decode's kind of traffic),
timed after each backend's rounds, and a STREAM-like copy, timed at the start.
Needs transformers.

    python -m torch_llga.tools.bench_llm [--configs smollm2_135m,llama_1b] [--backends eager,torch_compile,openvino,torch_llga]
                                   [--prompt 128] [--new-tokens 128] [--dtype fp32|bf16] [--rounds 3]
                                   [--openvino-python PATH]

eager: the model as it is; torch_compile: Inductor, model.forward compiled (torch.compile defaults)
with the static cache; openvino: the same weights saved and exported with optimum-intel's
OVModelForCausalLM (bench_llm_openvino.py; optimum-intel pins an older transformers, so it may live
in a venv of its own: --openvino-python names its python, `make openvino-venv` makes one);
torch_llga: model.forward compiled with backend="torch_llga". Every backend's tokens are compared
with eager's (greedy: identical in fp32). A round is one generate() call; the first token's time is
when the streamer receives it. Backends are prepared with three untimed calls (PREPARATION_CALLS).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

from torch_llga import _optional
from torch_llga.tools.bench_llm_openvino import FirstToken  # the openvino backend's script times the same way

CONFIGS = {  # the shapes of SmolLM2-135M and Llama-3.2-1B
    "smollm2_135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "llama_1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
}
BACKENDS = ["eager", "torch_compile", "openvino", "torch_llga"]
# Untimed generate() calls before the rounds: compilation, the sizes a call reaches, and torch_llga's
# speed check (a partition's 2nd and 3rd executions also run its ops unfused: a prefill partition
# runs once a call, so calls 2 and 3 pay it).
PREPARATION_CALLS = 3


def memory_bandwidth_gbs(mb=512, repeat=5):
    """A STREAM-like copy: bytes read plus bytes written per second, best of `repeat`."""
    a = torch.ones(mb * 2**20 // 4)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.numel() * 4 / best / 1e9


def memory_read_gbs(mb=512, repeat=5):
    """A read of a buffer far larger than the caches (a sum: the decode's traffic is reads of the
    weights), bytes per second, best of `repeat`. A copy also writes, and on some machines its rate
    counted both ways is below what reads alone reach."""
    a = torch.ones(mb * 2**20 // 4)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - t)
    return a.numel() * 4 / best / 1e9


def build(config, dtype, backend):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # the same weights for every backend
    model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=4096, **CONFIGS[config])).eval().to(dtype)
    if backend == "torch_compile":
        model.forward = torch.compile(model.forward)
    elif backend == "torch_llga":
        import torch_llga  # noqa: F401  (registers the backend by name when not pip-installed)

        model.forward = torch.compile(model.forward, backend="torch_llga")
    return model


def openvino_runs(config, dtype, ids, args):
    """The openvino backend's (preparation s, [(tokens, first ms, tokens/s)] per round): the model with
    bench_llm's weights saved, then exported and run by bench_llm_openvino.py, in this Python if it
    has optimum-intel, else in --openvino-python."""
    python = args.openvino_python or (sys.executable if _optional.installed("optimum") else None)
    if python is None:
        raise RuntimeError("needs optimum-intel: make openvino-venv, then --openvino-python .venv-openvino/bin/python")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_llm_openvino.py")
    from transformers.utils import logging

    logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as directory:
        build(config, dtype, "eager").save_pretrained(directory)
        command = [python, script, directory, json.dumps(ids[0].tolist()), str(args.new_tokens), str(args.rounds),
                   str(args.threads), args.dtype]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    tokens = torch.tensor(result["tokens"])
    return result["prepared"], [(tokens, f, p) for f, p in zip(result["first_ms"], result["per_second"])]


def generate(model, ids, new_tokens):
    streamer = FirstToken()
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, cache_implementation="static", streamer=streamer)
        end = time.perf_counter()
    return out, (streamer.first - start) * 1e3, (new_tokens - 1) / (end - streamer.first)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_llga.tools.bench_llm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="smollm2_135m", help="comma-separated, from: " + ", ".join(CONFIGS))
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated, from: " + ", ".join(BACKENDS) + " (eager first: the others' tokens are compared with its)")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--openvino-python", help="the python that runs the openvino backend (one with optimum-intel)")
    args = parser.parse_args(argv)
    configs, backends = args.configs.split(","), args.backends.split(",")
    for c in configs:
        if c not in CONFIGS:
            parser.error(f"unknown config {c!r}; choose from {', '.join(CONFIGS)}")
    for b in backends:
        if b not in BACKENDS:
            parser.error(f"unknown backend {b!r}; choose from {', '.join(BACKENDS)}")
    if not _optional.installed("transformers"):
        sys.exit(_optional.missing("the LLM benchmark", "transformers"))
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    bandwidth = memory_bandwidth_gbs()
    from torch_llga.tools.bench import cpu_name

    print(f"{cpu_name()}; torch {torch.__version__}, {args.threads} threads, {args.dtype}, batch 1, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, greedy, static cache; medians of {args.rounds} rounds; "
          f"memory copy {bandwidth:.1f} GB/s\n")
    print("| config | backend | first token ms | decode tokens/s | decode weight traffic GB/s | memory read GB/s | "
          "traffic of the read's | tokens as eager | preparation s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config in configs:
        ids = torch.randint(0, CONFIGS[config]["vocab_size"], (1, args.prompt), generator=torch.Generator().manual_seed(0))
        expected = None
        for backend in backends:
            model = build(config, dtype, "eager" if backend == "openvino" else backend)
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            t = time.perf_counter()
            try:
                if backend == "openvino":
                    del model
                    prepared, runs = openvino_runs(config, dtype, ids, args)
                else:
                    for _ in range(PREPARATION_CALLS):
                        generate(model, ids, args.new_tokens)
                    prepared = time.perf_counter() - t
                    runs = [generate(model, ids, args.new_tokens) for _ in range(args.rounds)]
            except Exception as e:  # reported, not dropped
                print(f"| {config} | {backend} | failed: {type(e).__name__}: {str(e).splitlines()[0][:100]} ||||||")
                continue
            tokens = runs[-1][0]
            if backend == "eager":
                expected = tokens
            first_ms = statistics.median(r[1] for r in runs)
            per_second = statistics.median(r[2] for r in runs)
            traffic = weight_bytes * per_second / 1e9
            read = memory_read_gbs()  # the memory's speed drifts on shared machines: read where the rounds ran
            same = "-" if expected is None else "yes" if torch.equal(tokens, expected) else "no"
            print(f"| {config} | {backend} | {first_ms:.0f} | {per_second:.1f} | {traffic:.1f} | {read:.1f} | {traffic / read:.0%} | "
                  f"{same} | {prepared:.1f} |", flush=True)
            model = None
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
