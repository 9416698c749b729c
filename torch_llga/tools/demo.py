"""The main demo: ResNet-50 traced and frozen, fused by torch_llga, checked against eager, timed.

    python -m torch_llga.tools.demo [--model resnet50] [--runs 30]
"""
import argparse
import statistics
import time
import warnings

import torch

import torch_llga
from torch_llga import _optional
from torch_llga.report import format_groups, fusion_groups, unfused_ops


def median_ms(fn, x, runs):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv=None):
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch.jit's deprecation notes
    parser = argparse.ArgumentParser(prog="python -m torch_llga.tools.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", help="a torchvision model name")
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    if not _optional.installed("torchvision"):
        raise SystemExit(_optional.missing("the demo", "torchvision"))
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)().eval()  # random weights: nothing downloaded
    x = torch.rand(1, 3, 224, 224)
    print(f"torch {torch.__version__}, oneDNN {torch_llga.onednn_version()} (inside torch's libtorch_cpu.so), "
          f"{torch.get_num_threads()} threads")
    print(f"{args.model}, input {tuple(x.shape)}, traced and frozen\n")

    with torch.no_grad():
        expected = model(x)
        plain = torch.jit.freeze(torch.jit.trace(model, x))
        with torch_llga.enabled():
            fused = torch.jit.freeze(torch.jit.trace(model, x))
            t0 = time.perf_counter()
            fused(x)  # profiling run
            fused(x)  # optimization: torch_llga's passes, then the first fused run (compiles partitions)
            warmup = time.perf_counter() - t0
            y = fused(x)
            graph = torch.jit.last_executed_optimized_graph()
        plain(x), plain(x)

        print(format_groups(fusion_groups(graph), unfused_ops(graph)))
        diff = (y - expected).abs().max().item()
        ok = torch.allclose(y, expected, rtol=1e-4, atol=1e-4)
        print(f"\noutput vs eager: max abs diff {diff:.2e} ({'OK' if ok else 'MISMATCH'}, rtol=atol=1e-4)")

        ts_ms = median_ms(plain, x, args.runs)
        llga_ms = median_ms(fused, x, args.runs)
        print(f"latency (median of {args.runs}): TorchScript {ts_ms:.2f} ms, torch_llga {llga_ms:.2f} ms "
              f"-> {ts_ms / llga_ms:.2f}x; first two calls {warmup * 1e3:.0f} ms")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
