"""BERT-base through torch.compile(backend="torch_llga") with default settings, called at 50 sizes
(batch 1-4, sequence length 8-128, each pair once, in a seeded random order): every call must run
fused and equal eager. Not part of `make test` (minutes):

    python test/sweep_compile_sizes.py [--sizes 50] [--per-size]

--per-size traces a script per input size instead of one script for all (what the backend does for
a graph whose sizes the trace cannot follow), to compare the two costs. Prints, per call, its size,
the fused partition runs, the wall time and the difference from eager; then the totals.
"""
import argparse
import random
import time
import warnings

import torch

import torch_llga
import torch_llga.dynamo
from torch_llga.tools.bench_models import bert_base


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, default=50)
    parser.add_argument("--per-size", action="store_true", help="a script per input size (for comparison)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.per_size:
        follow = torch_llga.dynamo._follow_sizes

        def per_size(graph, roles):
            stray, read = follow(graph, roles)
            return stray or next(iter(graph.nodes)), read

        torch_llga.dynamo._follow_sizes = per_size

    torch.manual_seed(0)
    model, _ = bert_base(1, 8)
    model = model.eval()
    rng = random.Random(0)
    sizes = rng.sample([(b, s) for b in range(1, 5) for s in range(8, 129, 4)], args.sizes)
    compiled = torch.compile(model, backend="torch_llga")
    worst, unfused, total = 0.0, [], 0.0
    start = torch_llga.stats()
    for i, (batch, seq) in enumerate(sizes):
        ids = torch.randint(0, 30522, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[:, seq - seq // 4:] = 0  # padding at the end, as a tokenizer's batch has
        with torch.no_grad():
            before = torch_llga.stats()
            t = time.perf_counter()
            out = compiled(ids, mask)
            ms = (time.perf_counter() - t) * 1e3
            after = torch_llga.stats()
            expected = model(ids, mask)
        fused = after["executions"] - before["executions"] + after["plan_runs"] - before["plan_runs"]
        diff = (out - expected).abs().max().item()
        worst, total = max(worst, diff), total + ms
        if fused == 0:
            unfused.append((batch, seq))
        print(f"{i + 1:3d} batch {batch} seq {seq:3d}: {fused:3d} fused runs, {ms:8.1f} ms, max abs diff {diff:.2e}", flush=True)
    end = torch_llga.stats()
    print(f"\n{len(sizes)} sizes{' (a script per size)' if args.per_size else ''}: {len(sizes) - len(unfused)} fused "
          f"(unfused: {unfused or 'none'}), worst max abs diff {worst:.2e}, {total / 1e3:.1f} s in compiled calls, "
          f"{end['compile_scripts'] - start['compile_scripts']} scripts traced, "
          f"{end['compilations'] - start['compilations']} partitions compiled")
    if unfused or worst > 1e-4:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
