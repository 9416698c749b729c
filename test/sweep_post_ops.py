"""Sweep of binary post-ops: every broadcast pattern of the post-op's operand, after each kind of
main op, over small shapes with size-1 dims and in several input layouts, each partition made a
group (the fuser's all-partitions mode), compared with eager at 1e-5 (fp32) or 2^-5 (bf16) of
the output's largest magnitude.

The random fuzzer (test_fuzz.py) found oneDNN faults in exactly this corner one at a time (a 4-D
linear's broadcast post-op, channels-last binary chains, a per-channel post-op at unit spatial
sizes); this walks the corner systematically. Not part of `make test` (minutes):

    python test/sweep_post_ops.py [--quick] [--dtype bf16]

Prints each case whose fused result differs from eager, and the count of cases checked.
"""
import argparse
import itertools
import subprocess
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga

SHAPES = [(2, 3), (1, 3), (3, 1), (2, 3, 1), (2, 1, 3), (1, 3, 2), (2, 3, 2),
          (2, 3, 1, 1), (1, 3, 1, 1), (2, 3, 2, 1), (2, 3, 1, 2), (2, 1, 2, 3), (1, 3, 2, 2), (2, 3, 2, 2),
          (2, 3, 1, 1, 1), (2, 3, 2, 1, 2), (1, 2, 1, 2, 3), (2, 16, 1, 1), (3, 17, 1, 1), (2, 8, 3, 5)]
QUICK_SHAPES = [(2, 3), (2, 3, 1), (2, 3, 1, 1), (2, 3, 2, 1), (1, 3, 2, 2), (2, 3, 1, 1, 1), (2, 16, 1, 1)]


def operand_shapes(shape):
    """Every broadcast pattern of a post-op operand: each dim kept or 1, also with fewer dims."""
    seen = []
    for mask in itertools.product([0, 1], repeat=len(shape)):
        s = tuple(d if m else 1 for d, m in zip(shape, mask))
        for drop in range(len(s)):  # leading size-1 dims dropped (right-aligned broadcasting)
            t = s[drop:]
            if drop and s[drop - 1] != 1:
                break
            if t not in seen:
                seen.append(t)
    return seen


def layouts(x):
    yield "contiguous", x
    if x.dim() == 4:
        yield "channels_last", x.contiguous(memory_format=torch.channels_last)
    if x.dim() >= 2:
        yield "transposed", x.transpose(-1, -2).contiguous().transpose(-1, -2)


def main_ops(shape, dtype):
    """(name, f(x)) for each main op the post-op may follow; f keeps x's shape."""
    c = shape[1]
    ops = [("mul_scalar", lambda x: x * 2), ("add_full", lambda x, y=torch.randn(shape, dtype=dtype): x + y),
           ("relu", torch.relu), ("abs", torch.abs)]
    ops.append(("linear", lambda x, lin=nn.Linear(shape[-1], shape[-1]).requires_grad_(False).to(dtype): lin(x)))
    if len(shape) == 4:
        ops.append(("conv1x1", lambda x, conv=nn.Conv2d(c, c, 1).requires_grad_(False).to(dtype): conv(x)))
    if len(shape) >= 3:
        ops.append(("matmul", lambda x, w=torch.randn(shape[-1], shape[-1], dtype=dtype): torch.matmul(x, w)))
    ops.append(("layer_norm", lambda x, n=shape[-1]: F.layer_norm(x, (n,))))
    ops.append(("gelu", F.gelu))
    ops.append(("softmax", lambda x: torch.softmax(x, -1)))
    bn = dict(mean=torch.randn(c, dtype=dtype), var=torch.rand(c, dtype=dtype) + 0.5, w=torch.randn(c, dtype=dtype),
              b=torch.randn(c, dtype=dtype))
    ops.append(("batch_norm", lambda x, p=bn: F.batch_norm(x, p["mean"], p["var"], p["w"], p["b"], False, 0.1, 1e-5)))
    return ops


POST_OPS = [("add", torch.add), ("mul", torch.mul), ("sub", torch.sub), ("maximum", torch.maximum)]


def check(f, x):
    class M(nn.Module):
        def forward(self, a):
            return f(a)

    m = M().eval()
    with torch.no_grad():
        expected = m(x)
        fused = torch.jit.freeze(torch.jit.trace(m, x, check_trace=False))
        fused(x)
        before = torch_llga.stats()["executions"]
        got = fused(x)
        ran = torch_llga.stats()["executions"] > before  # a case no group ran checks nothing
    return (got.double() - expected.double()).abs().max().item() / max(1.0, expected.abs().max().item()), ran


def sweep(shape, dtype):
    """Checks every case of one shape; returns (cases checked, wrong ones)."""
    torch.manual_seed(0)
    # bf16: a fused chain keeps fp32 between its ops where eager rounds each to bf16 (a few bf16
    # ulps of the output); a broadcast along the wrong dim is off by the operands' size, ~1.
    tol = 2 ** -5 if dtype == torch.bfloat16 else 1e-5
    bad, checked, fused = [], 0, 0
    for (main_name, main), (post_name, post) in itertools.product(main_ops(shape, dtype), POST_OPS):
        for operand in operand_shapes(shape):
            y = torch.randn(operand, dtype=dtype)
            for first in (False, True):
                def f(x, main=main, post=post, y=y, first=first):
                    return post(y, main(x)) if first else post(main(x), y)

                for layout, x in layouts(torch.randn(shape, dtype=dtype)):
                    err, ran = check(f, x)
                    checked += 1
                    fused += ran
                    if not err <= tol:
                        bad.append((shape, layout, main_name, post_name, operand, "operand first" if first else "", err))
                        print(*bad[-1], flush=True)
    return checked, fused, len(bad)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer shapes (a few minutes)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--shape", help=argparse.SUPPRESS)  # one shape, in a child process
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch_llga.enable()
    torch_llga._C._set_fuse_all_partitions(True)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.shape:
        checked, fused, bad = sweep(tuple(int(d) for d in args.shape.split(",")), dtype)
        print(f"checked {checked} {fused} {bad}")
        return 0
    # One process per shape: PyTorch keeps every traced module's code and constants until exit
    # (~130 KB each here; thousands of cases a shape), so a single process would grow by gigabytes.
    checked = fused = bad = 0
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        out = subprocess.run([sys.executable, __file__, "--dtype", args.dtype, "--shape", ",".join(map(str, shape))],
                             capture_output=True, text=True)
        lines = out.stdout.splitlines()
        if out.returncode or not lines or not lines[-1].startswith("checked "):
            print(shape, "failed:", out.stderr[-2000:], flush=True)
            bad += 1
            continue
        for line in lines[:-1]:
            print(line, flush=True)
        n, f, b = map(int, lines[-1].split()[1:])
        checked, fused, bad = checked + n, fused + f, bad + b
    print(f"{checked} cases ({fused} ran a fusion group), {bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
