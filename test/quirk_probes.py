"""Probes: is the oneDNN fault behind each workaround in onednn_quirks.cpp still there?

The regression tests of the workarounds assert that an op stays in PyTorch, so with a workaround
off (TORCH_LLGA_QUIRKS_OFF=<name>) they fail whether or not oneDNN still has the fault. A probe
here builds the faulty case its comment in onednn_quirks.cpp describes (its shapes, and the case
of its regression test) and looks for the fault itself:

  values            the fused output differs from eager (fp32: rtol = atol = 1e-4; bf16: 2e-2)
  crash             the child dies (a signal), or glibc's heap check finds the heap corrupted
  compile           the partition does not compile (kernel_fallbacks rises, or the call raises)
  reference_kernel  ONEDNN_VERBOSE shows a reference implementation ("ref") run in the calls
                    after profiling (2-7) that the profiling call, PyTorch's own ops, did not
                    run. Not only the calls after the speed check (2nd-3rd executions): it
                    sends the slowest reference kernels to PyTorch after their 3rd execution
  slower            the fused model's median call is over 1.3x the same model traced without
                    the fuser (interleaved calls): the two speed rules only

Wrong values and a crash count as the fault in every probe. Each probe runs in a child process
twice: with its workaround off (is the fault still there?) and on (the sanity check: no fault).
With the workaround off a case only counts if it reached oneDNN: a fusion group holding the op(s)
in question ran; else the verdict is "not reached" (inconclusive), not "fixed".

    python test/quirk_probes.py [--only name,...] [--json out.json]
    python -m pytest test/quirk_probes.py -q -rA   # not in the default suite (not named test_*)

Needs the extension built (conftest.py, which pytest loads, needs it current; --noconftest does
without: the probes need none of its fixtures). One child at a time: about 3-4 minutes on 2 cores.
The timing probes ("slower") need a quiet machine: other work makes their ratios noisy.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 240  # seconds per child; the slowest probe (reference kernels at full size) takes ~15
SLOWER = 1.3   # the "slower" fault: fused median over unfused median

# glibc's heap checking (crash probes): an overrun corrupting a chunk header aborts at the next
# malloc/free instead of going unnoticed (the one-row matmul's 28-byte overrun did not always crash).
MALLOC_CHECK = {"LD_PRELOAD": "libc_malloc_debug.so.0", "GLIBC_TUNABLES": "glibc.malloc.check=3"}

# ---------------------------------------------------------------------------------------------
# The child's harness: a probe's source runs after it and calls case(), timing_case() or record().
# Markers ("@@ ...") go to stdout between oneDNN's verbose lines (C stdio flushed first), so the
# parent can tell the profiling call's primitives from the fused calls' ones.
HARNESS = r'''
import collections, ctypes, gc, io, json, os, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_llga
from torch_llga.report import fusion_groups

torch_llga._C._set_small_plans(False)  # tiny graphs form oneDNN partitions, not small plans
torch.manual_seed(0)  # a probe's tensors, the same in both runs
_libc = ctypes.CDLL(None)
_ids = iter(range(1000))
CL = torch.channels_last
rn = torch.randn
BF16_TOL = 2e-2  # bf16 keeps 8 mantissa bits; a wrong broadcast is off by ~1


def mark(text):
    sys.stdout.flush()
    _libc.fflush(None)  # oneDNN's verbose lines (C stdio) before the marker
    os.write(1, f"@@ {text}\n".encode())


def record(label, reached, fault, detail="", kind=None, **more):
    rec = dict(label=label, kind=kind or KIND, reached=bool(reached), fault=bool(fault), detail=detail, **more)
    mark("case " + json.dumps(rec))


def _tensors(out):
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _tensors(o)]


def _diff(got, want, tol, rtol=None):
    """(max |got - want|, whether it is beyond tol + rtol * |want| (rtol: tol unless given));
    NaN against a number is inf."""
    rtol = tol if rtol is None else rtol
    worst, bad = 0.0, False
    for g, w in zip(_tensors(got), _tensors(want)):
        if g.shape != w.shape:
            return float("inf"), True
        g, w = g.double(), w.double()
        d = torch.where((g == w) | (g.isnan() & w.isnan()), 0.0, (g - w).abs().nan_to_num(nan=float("inf")))
        worst = max(worst, d.max().item() if d.numel() else 0.0)
        bad |= bool((d > tol + rtol * w.abs().nan_to_num(0)).any())
    return worst, bad


def padded(t):
    """t's values in the middle of a NaN-filled storage: a kernel reading outside the tensor reads NaN."""
    base = torch.full((t.numel() + 2048,), float("nan"), dtype=t.dtype)
    return base[1024:1024 + t.numel()].view(t.shape).copy_(t)


def _stats():
    return torch_llga.stats()


def _delta(a, b):
    return {k: b[k] - a[k] for k in ("executions", "kernel_fallbacks", "slow_partitions", "guard_failures")}


def _has(groups, needs):
    """needs: ops that must share one fusion group, or a list of such lists (each its own group)."""
    needs = needs if needs and isinstance(needs[0], list) else [needs]
    return all(any(not (collections.Counter(n) - collections.Counter(g)) for g in groups) for n in needs)


def _trace(model, inputs, freeze):
    if isinstance(model, nn.Module):
        m = torch.jit.trace(model.eval(), inputs, check_trace=False)
        return torch.jit.freeze(m) if freeze else m
    return torch.jit.trace(model, inputs, check_trace=False)


def case(label, model, inputs, needs, calls=(), tol=1e-4, rtol=None, freeze=True, all_partitions=False,
         reference=None, repeat=0, kind=None, kernel=None):
    """Traces model at inputs with the fuser on, calls it 7 times (1: profiling, PyTorch's ops;
    2: compiles and runs the partition; 3-4: the speed check also times the unfused ops; 5-7),
    then once per entry of calls (other sizes or layouts: each called twice), plus repeat more
    times; compares every output with reference (default: model) run eagerly. needs: the ops a
    fusion group must hold for the case to reach oneDNN; with calls, a call must also run that
    group fused (the fault is at those sizes or layouts). kernel: a regex one of the fused calls'
    oneDNN implementations must match to count as reached (the kernel the fault was seen in).
    tol=None: values are reported, not judged."""
    cid = next(_ids)
    torch_llga._C._set_fuse_all_partitions(all_partitions)
    torch.manual_seed(cid)
    mark(f"start {cid} {label}")
    ref = reference or model
    worst, bad, call_ran, d, groups, error, stage = 0.0, False, [], {}, [], None, "setup"
    try:
        with torch.no_grad(), torch_llga.enabled():
            m = _trace(model, inputs, freeze)
            expected, wants = ref(*inputs), [ref(*args) for args in calls]  # eager's kernels: before the markers
            stage = "run"
            mark(f"profile {cid}")
            outs = [m(*inputs)]
            s0 = _stats()
            mark(f"fused {cid}")
            outs += [m(*inputs) for _ in range(4)]
            groups = fusion_groups(torch.jit.last_executed_optimized_graph())
            mark(f"late {cid}")
            outs += [m(*inputs) for _ in range(2 + repeat)]
            s1 = _stats()
            d = _delta(s0, s1)
            tol, rtol = (float("inf"), 0.0) if tol is None else (tol, rtol)
            for o in outs:
                w, b = _diff(o, expected, tol, rtol)
                worst, bad = max(worst, w), bad or b
            for args, want in zip(calls, wants):
                a = _stats()
                mark(f"call {cid}")
                got = [m(*args) for _ in range(2)]  # the first call at new sizes judges them, the second reuses that
                dd = _delta(a, _stats())
                call_ran.append(dd["executions"] > 0 and dd["kernel_fallbacks"] == 0 and dd["guard_failures"] == 0)
                for o in got:
                    w, b = _diff(o, want, tol, rtol)
                    worst, bad = max(worst, w), bad or b
            mark(f"end {cid}")
            gc.collect()
    except Exception as e:  # noqa: BLE001 - a case that fails to compile may raise
        error = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
    if stage == "setup":  # tracing or eager failed: the probe's own error, no verdict
        return record(label, False, False, f"probe error: {error}", kind=kind, id=cid, setup_error=True)
    k = kind or KIND
    grouped = _has(groups, needs)
    ran = grouped and d.get("executions", 0) > 0
    reached = (grouped and any(call_ran)) if calls else (grouped if k == "compile" else ran)
    # compile: the group ran unfused (kernel_fallbacks), not for being slow (that counts fallbacks too)
    fault = bad or (k == "compile" and grouped and (error is not None or
                                                   (d.get("kernel_fallbacks", 0) > 0 and d.get("slow_partitions", 0) == 0)))
    if error and k != "compile":
        fault = True  # a call that raised where eager did not
    detail = f"max|diff| {worst:.3g}" + (f"; {error}" if error else "")
    if k == "compile":
        detail += f"; kernel_fallbacks +{d.get('kernel_fallbacks', 0)}"
    record(label, reached, fault, detail, kind=k, id=cid, wrong_values=bad, groups=groups, stats=d,
           calls_fused=call_ran, kernel_hint=kernel)


def timing_case(label, model, inputs, needs, all_partitions=False, samples=300, inner=5, freeze=True, budget=10.0):
    """Median time of inner calls, fused against the same model traced with the fuser off,
    interleaved (the order alternating) so that other work on the machine hits both alike; at most
    budget seconds. The ratio of the fastest samples is reported beside: where the two disagree
    about the threshold, the machine was too busy for a verdict (oneDNN's threads wait for each
    other when another process takes a core: a fused call then costs milliseconds)."""
    torch_llga._C._set_fuse_all_partitions(all_partitions)
    with torch.no_grad():
        with torch_llga.enabled():
            fused = _trace(model, inputs, freeze)
            for _ in range(8):
                out = fused(*inputs)
            groups = fusion_groups(torch.jit.last_executed_optimized_graph())
        with torch_llga.enabled(False):
            unfused = _trace(model, inputs, freeze)
            for _ in range(8):
                unfused(*inputs)
        worst, bad = _diff(out, model(*inputs), 1e-4)
        times, end = {fused: [], unfused: []}, time.time() + budget
        for s in range(samples):
            for m in ((fused, unfused) if s % 2 else (unfused, fused)):
                t0 = time.perf_counter_ns()
                for _ in range(inner):
                    m(*inputs)
                times[m].append((time.perf_counter_ns() - t0) / inner / 1e3)
            if s >= 30 and time.time() > end:
                break
    tf, tu = statistics.median(times[fused]), statistics.median(times[unfused])
    ratio, best = tf / tu, min(times[fused]) / min(times[unfused])
    reached = _has(groups, needs)
    near = " (near the threshold: noise may flip it)" if abs(ratio - SLOWER) < 0.1 else ""
    if (ratio > SLOWER) != (best > SLOWER):
        near = f" (the fastest calls' ratio, {best:.2f}x, disagrees: a busy machine, no verdict)"
    record(label, reached, bad or (reached and ratio > SLOWER and not near.startswith(" (the fastest")),
           f"fused {tf:.1f} us, unfused {tu:.1f} us: {ratio:.2f}x{near}; {len(times[fused])} samples; "
           f"max|diff| {worst:.3g}", kind="slower", wrong_values=bad, groups=groups, ratio=ratio, best_ratio=best,
           busy=near.startswith(" (the fastest"))
'''

# ---------------------------------------------------------------------------------------------
# The probes: one per quirk, its case(s) from the quirk's comment (the shapes it names) and its
# regression test. Modules and tensors a lambda reads are constants of the traced graph.


@dataclass
class Probe:
    name: str
    kind: str      # the fault looked for (several: "values, reference_kernel"); crash always counts
    source: str    # Python run in the child after HARNESS
    env: dict = field(default_factory=dict)
    also_off: tuple = ()  # other workarounds off in both runs (ones that would keep the case from oneDNN)


PROBES = [
    Probe("linear_4d_broadcast_post_op", "values", """
lin = nn.Linear(4, 8).requires_grad_(False)
fn = lambda a, b: lin(a) + b
x = rn(2, 1, 3, 4)
for p in [(1, 1, 3, 8), (1, 3, 8), (2, 1, 1, 8)]:
    case(f"linear([2,1,3,4]) + {list(p)}", fn, (x, rn(p)), ["linear", "add"])
# fuzzing found it at sizes other than the traced ones: traced full-size, called broadcast
case("traced full-size, called [2,1,3,4]+[1,1,3,8] and [4,2,3,4]+[4,1,3,8]", fn, (x, rn(2, 1, 3, 8)),
     ["linear", "add"], calls=[(rn(2, 1, 3, 4), rn(1, 1, 3, 8)), (rn(4, 2, 3, 4), rn(4, 1, 3, 8))])
"""),
    Probe("layer_norm_sum_post_op", "values", """
ln = nn.LayerNorm(768).requires_grad_(False)
ln.weight.uniform_(0.5, 1.5), ln.bias.normal_()
case("BERT: layer_norm([1,128,768]) + [1,128,768]", lambda a, b: ln(a) + b, (rn(1, 128, 768), rn(1, 128, 768)),
     ["layer_norm", "add"])
ln64 = nn.LayerNorm(64).requires_grad_(False)
case("layer_norm([2,16,64]) + [2,16,64]", lambda a, b: ln64(a) + b, (rn(2, 16, 64), rn(2, 16, 64)), ["layer_norm", "add"])
case("[16,64] + layer_norm([1,16,64])", lambda a, b: b + ln64(a), (rn(1, 16, 64), rn(16, 64)), ["layer_norm", "add"])
"""),
    Probe("matmul_last_dim_broadcast_post_op", "values, reference_kernel", """
lin = nn.Linear(2, 8).requires_grad_(False)
case("linear([3,2,2]) + [1,2,1]", lambda a, b: lin(a) + b, (rn(3, 2, 2), rn(1, 2, 1)), ["linear", "add"])
c = rn(1, 2, 1)  # "also with other post-ops between"; 3-D (at 4-D linear_4d_broadcast_post_op keeps it out too)
case("relu(linear([3,2,2])) * [1,2,1]", lambda a: torch.relu(lin(a)) * c, (rn(3, 2, 2),), ["linear", "mul"])
# 2-D: right values, but the reference kernel (1188 ms against 1.4 at [256, 768])
lin768 = nn.Linear(768, 768).requires_grad_(False)
case("linear([256,768]) * [256,1]", lambda a, r: lin768(a) * r, (rn(256, 768), torch.rand(256, 1)), ["linear", "mul"],
     kind="reference_kernel")
case("linear([16,2]) * [16,1]", lambda a, r: lin(a) * r, (rn(16, 2), rn(16, 1)), ["linear", "mul"], kind="reference_kernel")
case("mm([16,4], [4,8]) + ones(16,1)", lambda a, b: torch.mm(a, b) + torch.ones(16, 1), (rn(16, 4), rn(4, 8)),
     ["mm", "add"], kind="reference_kernel")
"""),
    Probe("one_row_matmul_sum_post_op", "crash", """
fc = nn.Linear(2048, 1000).requires_grad_(False)
case("linear([1,2048] -> 1000) + [1,1000]", lambda a, r: fc(a) + r, (rn(1, 2048), rn(1, 1000)), ["linear", "add"], repeat=20)
case("[1,1,1000] + linear([1,1,2048])", lambda a, r: r + fc(a), (rn(1, 1, 2048), rn(1, 1, 1000)), ["linear", "add"], repeat=20)
w = rn(2048, 1000) / 45
case("matmul([1,2048], [2048,1000]) + [1000]", lambda a, b: torch.matmul(a, w) + b, (rn(1, 2048), rn(1000)),
     ["matmul", "add"], repeat=20)
mlp = nn.Linear(3072, 768).requires_grad_(False)
case("one token: linear([1,1,3072] -> 768) + [1,1,768]", lambda a, r: mlp(a) + r, (rn(1, 1, 3072), rn(1, 1, 768)),
     ["linear", "add"], repeat=20)
""", env=MALLOC_CHECK),
    Probe("conv_per_sample_post_op", "reference_kernel", """
conv = nn.Conv2d(64, 64, 3, padding=1).requires_grad_(False)
case("conv3x3([2,64,56,56]) + [2,1,1,1]", lambda a, b: conv(a) + b, (rn(2, 64, 56, 56), rn(2, 1, 1, 1)), ["_convolution", "add"])
dw = nn.Conv2d(64, 64, 3, padding=1, groups=64).requires_grad_(False)
case("depthwise([2,64,56,56]) + [2,64,1,1]", lambda a, b: dw(a) + b, (rn(2, 64, 56, 56), rn(2, 64, 1, 1)), ["_convolution", "add"])
conv8 = nn.Conv2d(8, 8, 3, padding=1).requires_grad_(False)
case("relu(conv([2,8,12,12])) * [2,1,1,1]", lambda a, b: torch.relu(conv8(a)) * b, (rn(2, 8, 12, 12), rn(2, 1, 1, 1)),
     ["_convolution", "mul"])
conv1d, conv3d = nn.Conv1d(8, 8, 3).requires_grad_(False), nn.Conv3d(4, 4, 3).requires_grad_(False)
case("conv1d([2,8,20]) * [2,1,1]", lambda a, b: conv1d(a) * b, (rn(2, 8, 20), rn(2, 1, 1)), ["_convolution", "mul"])
case("conv3d([2,4,6,6,6]) + [2,1,1,1,1]", lambda a, b: conv3d(a) + b, (rn(2, 4, 6, 6, 6), rn(2, 1, 1, 1, 1)),
     ["_convolution", "add"])
"""),
    Probe("matmul_per_batch_column_post_op", "reference_kernel", """
w = rn(1, 12, 768, 64)
case("matmul([1,12,128,768], [1,12,768,64]) + [1,12,1,64]", lambda a, b: torch.matmul(a, w) + b,
     (rn(1, 12, 128, 768), rn(1, 12, 1, 64)), ["matmul", "add"])
w2 = rn(2, 8, 64, 64)
for bias in [(1, 8, 1, 64), (8, 1, 64)]:
    case(f"matmul([2,8,64,64], [2,8,64,64]) + {list(bias)}", lambda a, b: torch.matmul(a, w2) + b, (rn(2, 8, 64, 64), rn(bias)),
         ["matmul", "add"])
"""),
    Probe("conv_spatial_broadcast_post_op", "reference_kernel", """
conv = nn.Conv2d(64, 64, 3, padding=1).requires_grad_(False)
for p in [(1, 64, 56, 56), (2, 64, 56, 1)]:
    case(f"conv3x3([2,64,56,56]) + {list(p)}", lambda a, b: conv(a) + b, (rn(2, 64, 56, 56), rn(p)), ["_convolution", "add"])
conv8 = nn.Conv2d(8, 8, 3, padding=1).requires_grad_(False)
for p in [(12, 1), (8, 12, 12)]:
    case(f"conv([2,8,12,12]) + {list(p)}", lambda a, b: conv8(a) + b, (rn(2, 8, 12, 12), rn(p)), ["_convolution", "add"])
conv1d = nn.Conv1d(8, 8, 3, padding=1).requires_grad_(False)
case("conv1d([2,8,20]) * [1,8,20]", lambda a, b: conv1d(a) * b, (rn(2, 8, 20), rn(1, 8, 20)), ["_convolution", "mul"])
"""),
    Probe("matmul_broadcast_select", "reference_kernel", """
fn = lambda q, k, m, y: torch.where(m, torch.matmul(q, k.transpose(-1, -2)), y)
case("where([2,1,1,197] mask, q @ k^T [2,12,197,197], [1,1,1,1])", fn,
     (rn(2, 12, 197, 64), rn(2, 12, 197, 64), torch.rand(2, 1, 1, 197) > 0.2, torch.full((1, 1, 1, 1), -1e4)),
     ["matmul", "where"])
w = rn(2, 4, 16, 16)
fn2 = lambda a, m, y: torch.where(m, torch.matmul(a, w), y)
case("where([2,1,1,16] mask, matmul [2,4,16,16], [1,1,1,1])", fn2,
     (rn(2, 4, 16, 16), torch.rand(2, 1, 1, 16) > 0.3, torch.full((1, 1, 1, 1), -1e4)), ["matmul", "where"])
"""),
    Probe("layer_norm_4d_last_dim_broadcast_post_op", "reference_kernel", """
case("layer_norm([2,12,197,768]) * [2,12,197,1]", lambda a, t: F.layer_norm(a, (768,)) * t,
     (rn(2, 12, 197, 768), rn(2, 12, 197, 1)), ["layer_norm", "mul"])
case("layer_norm([2,3,8,32]) * [2,3,8,1]", lambda a, t: F.layer_norm(a, (32,)) * t, (rn(2, 3, 8, 32), rn(2, 3, 8, 1)),
     ["layer_norm", "mul"])
"""),
    Probe("one_element_layer_norm_post_op", "values", """
fn = lambda a: 0.5 + F.layer_norm(a.relu() - 0.3, (1,), None, None, 1e-5)
case("0.5 + layer_norm([1,1])", fn, (rn(1, 1),), ["layer_norm", "add"], all_partitions=True,
     calls=[(rn(1, 1),), (torch.ones(1, 1),)])
"""),
    # A speed rule: the fused model against the unfused one. Eight independent products in one
    # graph, so that the fixed cost of a call (the interpreter's) does not hide the products' own.
    Probe("matrix_vector_product", "slower", """
ab = [t for _ in range(8) for t in (rn(64, 1, 32), rn(64, 32, 1))]
timing_case("DeepAndWide: 8 x bmm([64,1,32], [64,32,1])", lambda *xs: [torch.bmm(xs[i], xs[i + 1]) for i in range(0, 16, 2)],
            tuple(ab), ["bmm"])
lins = [nn.Linear(16, 1).requires_grad_(False) for _ in range(8)]
timing_case("8 x Linear(16 -> 1) of [8,16]", lambda x: [l(x) for l in lins], (rn(8, 16),), ["linear"])
"""),
    Probe("bf16_round", "compile", """
case("bf16 round(x) + 0.5", lambda a: a.round() + 0.5, ((rn(2, 8, 16) * 10).bfloat16(),), ["round", "add"], tol=BF16_TOL)
"""),
    Probe("above_five_dims", "values, crash", """
case("abs(x.reshape(1,1,1,4,1,1)) + 1", lambda a: a.relu().reshape(1, 1, 1, 4, 1, 1).abs() + 1, (rn(1, 1, 4, 1, 1),),
     ["abs"], all_partitions=True, repeat=20)
""", env=MALLOC_CHECK),
        # "its AVX-512 kernel": only a pooling kernel of AVX-512 counts as reaching the fault; channels-last
    # inputs too (oneDNN picks its jit pooling for them, a plain reference-like one for NCHW here)
    Probe("pooling_binary_post_op", "values", """
for fmt, x in (("", rn(3, 5, 8, 8)), (" channels-last", rn(3, 5, 8, 8).contiguous(memory_format=CL))):
    for name, pool in (("max_pool2d", F.max_pool2d), ("avg_pool2d", F.avg_pool2d)):
        case(f"{name}([3,5,8,8]{fmt}, 2) + [3,5,4,4]", lambda a, b, pool=pool: pool(a, 2) + b, (x, rn(3, 5, 4, 4)),
             [name, "add"], kernel="pooling:.*avx512")
        case(f"{name}([3,5,8,8]{fmt}, 2) * [1,5,1,1]", lambda a, b, pool=pool: pool(a, 2) * b, (x, rn(1, 5, 1, 1)),
             [name, "mul"], kernel="pooling:.*avx512")
"""),
    Probe("per_channel_post_op_at_unit_spatial", "values", """
c = rn(1024, 1, 1)
case("((x * 2) + c).relu() at [256,1024,1,1], c [1024,1,1]", lambda a: ((a * 2) + c).relu(), (rn(256, 1024, 1, 1),),
     ["mul", "add"])
"""),
    # A speed rule: MobileNetV3's squeeze-and-excitation scale, x * hardsigmoid(conv(s)), x channels-last
    # (the depthwise conv's output, as in the model). The pooled, reduced s is an input, so that the
    # model is that one partition (conv + hardsigmoid + the mul) and the mul's cost is not hidden.
    Probe("broadcast_up_post_op", "slower", """
class Scale(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.fc2 = nn.Conv2d(r, c, 1)
    def forward(self, x, s):
        return x * F.hardsigmoid(self.fc2(s))
for c, r, hw in [(72, 24, 28), (480, 120, 14)]:
    timing_case(f"MobileNetV3 SE scale: [1,{c},{hw},{hw}] channels-last * hardsigmoid(conv([1,{r},1,1]))", Scale(c, r),
                (rn(1, c, hw, hw).contiguous(memory_format=CL), rn(1, r, 1, 1)), ["hardsigmoid", "mul"])
"""),
    Probe("int8_sum_of_own_input", "compile", """
from torch.ao.quantization import get_default_qconfig_mapping
from torch.ao.quantization.quantize_fx import convert_to_reference_fx, prepare_fx

sys.path.insert(0, 'test')
from test_int8 import SmallCNN  # conv2's residual add reads conv2's own input, y

x = rn(2, 3, 16, 16)
prepared = prepare_fx(SmallCNN().eval(), get_default_qconfig_mapping("x86"), (x,))
with torch.no_grad():
    for _ in range(3):
        prepared(torch.randn_like(x))
ref = convert_to_reference_fx(prepared)
last = [n for n in ref.graph.nodes if n.op == "call_function" and n.target == torch.quantize_per_tensor][-1]
# Values are not judged: without VNNI (int8_without_vnni off, below) the int8 linear may be steps off.
case("int8 conv(y) + y (SmallCNN, TORCH_LLGA_INT8_EXACT=0)", ref, (x,), ["_convolution", "add"], tol=None)
""", env={"TORCH_LLGA_INT8_EXACT": "0"},  # the add joins the conv only without the requantization
          also_off=("int8_without_vnni",)),  # on a CPU without VNNI the conv would not be int8 at all
    # Only on a CPU whose oneDNN int8 kernels lack VNNI (this quirk is inactive elsewhere); 1 output step
    # is right (the regression test's tolerance), the fault is 14-53.
    Probe("int8_without_vnni", "values", """
from torch.ao.quantization import QConfig, QConfigMapping
from torch.ao.quantization.observer import MinMaxObserver
from torch.ao.quantization.quantize_fx import convert_to_reference_fx, prepare_fx

if hasattr(torch_llga._C, "_onednn_cpu"):
    vnni = torch_llga._C._onednn_cpu()["int8_vnni"]
else:  # a build older than the quirk
    vnni = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(open("/proc/cpuinfo").read().split()))
qconfig = QConfig(activation=MinMaxObserver.with_args(dtype=torch.quint8),  # all 8 bits: no reduce_range
                  weight=MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric))
mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
x = rn(4, 64)
prepared = prepare_fx(mlp, QConfigMapping().set_global(qconfig), (x,))
with torch.no_grad():
    for _ in range(3):
        prepared(torch.randn_like(x))
ref = convert_to_reference_fx(prepared)
last = [n for n in ref.graph.nodes if n.op == "call_function" and n.target == torch.quantize_per_tensor][-1]
step = float(getattr(ref, last.args[1].target))
if vnni:
    record("int8 MLP [4,64] -> 128 -> 128 -> 10", False, False, "this CPU's int8 kernels have VNNI: the fault needs one without")
else:  # the int8 weights in a group: two dequantize (activation, weight) with the linear
    case(f"int8 MLP [4,64] -> 128 -> 128 -> 10, 1 step = {step:.3g}", ref, (x,), ["dequantize", "dequantize", "linear"],
         tol=1.0001 * step, rtol=0.0)
"""),
    Probe("copy_matmul_post_op_operands", "values", """
for op, f in (("mul", torch.mul), ("add", torch.add)):
    fn = lambda a, b, c, f=f: f(torch.matmul(a, b), c)
    a, b = rn(2, 2, 1, 4), rn(2, 2, 4, 8)
    case(f"matmul [2,2,1,8] {op} [1,2,1,8] channels-last", fn, (a, b, rn(1, 2, 1, 8).contiguous(memory_format=CL)), ["matmul", op])
    a, b = rn(2, 2, 3, 4), rn(2, 2, 4, 8)  # the regression test's: traced contiguous, called channels-last
    case(f"matmul [2,2,3,8] {op} [1,2,3,8], called channels-last", fn, (a, b, rn(1, 2, 3, 8)), ["matmul", op],
         calls=[(a, b, rn(1, 2, 3, 8).contiguous(memory_format=CL)) for _ in range(2)])
"""),
    Probe("copy_transposed_inputs", "values, crash", """
c = rn(2)
case("(a * b) * c, called with a, b transposed", lambda a, b: (a * b) * c, (rn(2, 2), rn(2, 2)), ["mul", "mul"],
     all_partitions=True, calls=[(rn(2, 2).t(), rn(2, 2).t())])
c8, b8 = rn(1, 8), rn(2, 8, 8, 8)
x = rn(2, 8, 8, 8).contiguous(memory_format=CL)
case("c + x * 2, x [2,8,8,8] channels-last", lambda a: c8 + a * 2.0, (x,), ["mul", "add"], all_partitions=True)
case("relu(x * 2) + c, x channels-last", lambda a: torch.relu(a * 2.0) + c8, (x,), ["mul", "add"], all_partitions=True)
case("x * b + c, x channels-last", lambda a: a * b8 + c8, (x,), ["mul", "add"], all_partitions=True)
""", env=MALLOC_CHECK),
    # "reads outside the tensor": also called with the tensors inside NaN-filled storage
    Probe("copy_interleaved_matmul_inputs", "values", """
w = rn(1, 3, 3, 8)
case("matmul([1,3,3,3].permute(0,2,3,1), [1,3,3,8])", lambda a: torch.matmul(a.permute(0, 2, 3, 1), w), (rn(1, 3, 3, 3),),
     ["matmul"], calls=[(padded(rn(1, 3, 3, 3)),) for _ in range(2)])
for s in [(1, 2, 2, 2), (2, 5, 2, 5)]:
    case(f"matmul({list(s)}.permute(0,2,3,1), b)", lambda a, b: torch.matmul(a.permute(0, 2, 3, 1), b),
         (rn(s), rn(s[0], s[2], s[1], 8)), ["matmul"],
         calls=[(padded(rn(s)), padded(rn(s[0], s[2], s[1], 8))) for _ in range(2)])
"""),
    Probe("canonical_unit_dim_strides", "values, crash", """
w = rn(8, 1)
case("(linear([1,2,1]).permute(1,0,2).abs() + 1).log()", lambda a: (F.linear(a, w).permute(1, 0, 2).abs() + 1).log(),
     (rn(1, 2, 1),), [["linear", "permute"], ["add"]], freeze=False, all_partitions=True)
for s in [(2, 1, 1, 2, 2), (2, 2, 1, 2, 3)]:
    case(f"matmul(a, b^T) {list(s)}", lambda a, b: torch.matmul(a, b.transpose(-1, -2)), (rn(s), rn(s)), ["matmul"])
case("matmul(a, a^T) [2,1,1,2,2]", lambda a: torch.matmul(a, a.transpose(-1, -2)), (rn(2, 1, 1, 2, 2),), ["matmul"])
""", env=MALLOC_CHECK),
    # Unwritten output elements: fresh inputs each call, the buffer pool off and glibc filling new
    # memory with garbage, so an element left unwritten cannot happen to hold the right value.
    Probe("one_channel_unit_width_conv", "values", """
for shape, k, st, pad in [((1, 1, 6, 1), (3, 3), (1, 2), (0, 1)), ((2, 1, 6, 4), (4, 2), (1, 3), (0, 0)),
                          ((1, 1, 64, 1), (3, 3), (1, 2), (0, 1))]:
    w = rn(3, 1, *k)
    case(f"conv2d({list(shape)}, w [3,1,{k[0]},{k[1]}], stride {st}, padding {pad})",
         lambda a, w=w, st=st, pad=pad: F.conv2d(a, w, None, st, pad), (rn(shape),), ["_convolution"],
         calls=[(rn(shape),) for _ in range(4)], kernel="brg_conv_fwd")
""", env={"TORCH_LLGA_BUFFER_POOL_MB": "0", "GLIBC_TUNABLES": "glibc.malloc.perturb=165"}),
    Probe("dilated_unit_kernel", "crash", """
wb = rn(6, 8, 1).bfloat16()
case("bf16 conv1d([2,8,1]), kernel 1, stride 2, padding 1, dilation 2", lambda a: F.conv1d(a.relu(), wb, None, 2, 1, 2),
     (rn(2, 8, 1).bfloat16(),), ["_convolution"], tol=BF16_TOL, repeat=10)
w, b = rn(6, 2, 3, 1), rn(6)
fn = lambda a: F.conv2d(a.relu(), w, b, (1, 2), (1, 1), (2, 2), 2)
case("fp32 grouped conv2d([1,4,4,1], w [6,2,3,1]), stride (1,2), dilation (2,2)", fn, (rn(1, 4, 4, 1),), ["_convolution"],
     reference=lambda a: fn(a.contiguous()),  # eager PyTorch itself crashes on the channels-last input
     calls=[(rn(1, 4, 4, 1),), (rn(1, 4, 4, 1).contiguous(memory_format=CL),)], repeat=10)
""", env=MALLOC_CHECK),
    # test_memory.py::test_reloaded_models_use_their_own_weights: load, run, drop; 24 times, 3 models.
    Probe("stale_compiled_partition_cache", "values", """
sys.path.insert(0, 'test')
from test_memory import TwoBranches  # linears on a strided input and on each other's output: five groups
x = (torch.randint(-6, 7, (3, 2, 24)) * 0.5)[..., ::2]
saved = []
for seed in range(3):
    buf = io.BytesIO()
    model = TwoBranches(seed).eval()
    torch.jit.save(torch.jit.trace(model, x, check_trace=False), buf)
    saved.append((buf.getvalue(), model))
wrong, fused = [], 0
with torch_llga.enabled(), torch.no_grad():
    for i in range(24):
        data, model = saved[i % len(saved)]
        loaded = torch.jit.freeze(torch.jit.load(io.BytesIO(data)).eval())
        before = torch_llga.stats()["executions"]
        loaded(x)
        got = loaded(x)
        fused += torch_llga.stats()["executions"] - before == 5  # all five groups ran
        if any(not torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(got, model(x))):
            wrong.append(i)
        del loaded
        gc.collect()
record("24 reloads of 3 models of one architecture", fused > 0, wrong,
       f"{len(wrong)} of 24 reloads ran another model's weights; {fused} of 24 ran all five groups fused")
"""),
]

# ---------------------------------------------------------------------------------------------
# The parent: runs the children, reads their records and oneDNN's verbose lines.

REF_IMPL = re.compile(r"(^|[:_])ref([:_]|$)")
CRASH_TEXT = re.compile(r"corrupted|double free|free\(\)|malloc\(\)|munmap_chunk|Segmentation fault|Fatal Python error")


@dataclass
class Run:
    """One child's outcome: status is "fault", "ok" (reached, no fault), "not reached", "busy" (a
    timing the machine's other work left without a verdict), "error" (the harness failed: not a
    verdict) or "timeout"."""
    status: str
    detail: str
    cases: list
    seconds: float


def parse_verbose(stdout):
    """The harness's records, and per case id the (primitive, implementation) pairs oneDNN ran
    in each phase: profile (PyTorch's unfused ops) and fused (the later calls); the last case id
    begun and each case's label (for a child that died in one)."""
    records, prims, labels, phase, cid = [], {}, {}, None, None
    for line in stdout.splitlines():
        if line.startswith("@@ case "):
            records.append(json.loads(line[8:]))
        elif line.startswith("@@ start "):
            cid, _, label = line[9:].partition(" ")
            labels[cid], phase = label, None
        elif line.startswith("@@ "):
            tag, _, rest = line[3:].partition(" ")
            phase, cid = ("profile" if tag == "profile" else "fused" if tag != "end" else None), rest
        elif line.startswith("onednn_verbose") and phase:
            f = line.strip().split(",")
            if "exec" in f and "graph" not in f[:f.index("exec")]:
                i = f.index("exec")
                if len(f) > i + 3 and f[i + 1] == "cpu":
                    prims.setdefault(cid, {"profile": set(), "fused": set()})[phase].add(f"{f[i + 2]}:{f[i + 3]}")
    return records, prims, cid, labels


def run_child(probe, off):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LLGA_QUIRKS_OFF", "ONEDNN_VERBOSE", "DNNL_VERBOSE")}
    env.update(probe.env, TORCH_LLGA_SMALL_PLANS="0", PYTHONWARNINGS="ignore")
    off_list = ([probe.name] if off else []) + list(probe.also_off)
    if off_list:
        env["TORCH_LLGA_QUIRKS_OFF"] = ",".join(off_list)
    if probe.kind != "slower":  # verbose lines cost time per primitive: not while timing
        env["ONEDNN_VERBOSE"] = "1"
    code = HARNESS + f"\nKIND = {probe.kind.split(',')[0]!r}\nSLOWER = {SLOWER}\n" + probe.source
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        records, _, cid, labels = parse_verbose(out)
        return Run("timeout", f"over {TIMEOUT} s (in {labels.get(cid, cid)})", records, time.time() - t0)
    records, prims, last, labels = parse_verbose(p.stdout)
    for r in records:  # reference implementations the fused calls ran and PyTorch's own run did not
        seen = prims.get(str(r.get("id")), {"profile": set(), "fused": set()})
        new = sorted(seen["fused"] - seen["profile"])
        r["kernels"] = new
        r["ref_kernels"] = [k for k in new if REF_IMPL.search(k.split(":", 1)[1])]
        if r["reached"] and r.get("kernel_hint") and not any(re.search(r["kernel_hint"], k) for k in new):
            r["reached"] = False  # another kernel than the one the fault was seen in
            r["detail"] += f"; no kernel matching {r['kernel_hint']!r} ran"
        if r["kind"] == "reference_kernel":
            r["fault"] = r["fault"] or (r["reached"] and bool(r["ref_kernels"]))
    seconds = time.time() - t0
    tail = " | ".join(p.stderr.strip().splitlines()[-3:])
    crashed = p.returncode < 0 or (p.returncode != 0 and bool(CRASH_TEXT.search(p.stderr)))
    if crashed:
        label = labels.get(last, f"after {len(records)} case(s)")
        sig = f"signal {-p.returncode}" if p.returncode < 0 else f"exit {p.returncode}"
        done = summarize(records, seconds) if records else None
        before = f" || before it: {OFF_VERDICT.get(done.status, done.status)}: {done.detail}" if done else ""
        return Run("fault", f"crashed ({sig}) in {label}{'; ' + tail[-200:] if tail else ''}{before}", records, seconds)
    if p.returncode != 0:
        return Run("error", f"child failed (exit {p.returncode}): {tail[-300:]}", records, seconds)
    return summarize(records, seconds)


def case_detail(r):
    text = f"{r['label']}: {r['detail']}"
    if r.get("ref_kernels") and r["kind"] == "reference_kernel":
        text += f"; reference kernels {', '.join(r['ref_kernels'])}"
    elif r.get("kernels"):
        text += f"; kernels {', '.join(r['kernels'][:3])}"
    if (r.get("stats") or {}).get("slow_partitions"):
        text += "; the speed check sent it to PyTorch after 3 executions"
    if not r["reached"]:
        text += f"; not reached (groups {r.get('groups')})"
    return text


def summary(records):
    return " || ".join(case_detail(r) for r in records)


def summarize(records, seconds):
    if not records:
        return Run("error", "no case ran", records, seconds)
    faults = [r for r in records if r["fault"]]
    reached = [r for r in records if r["reached"] and not r.get("busy")]  # busy: a timing without a verdict
    if faults:
        return Run("fault", f"{len(faults)} of {len(records)} cases: " + summary(faults), records, seconds)
    if not reached:  # a probe whose cases failed to trace or run eagerly has no verdict
        errors = any(r.get("setup_error") for r in records)
        busy = any(r.get("busy") for r in records)
        return Run("error" if errors else "busy" if busy else "not reached", summary(records), records, seconds)
    note = f"{len(reached)} of {len(records)} cases reached: " if len(reached) < len(records) else ""
    return Run("ok", note + summary(reached), records, seconds)


OFF_VERDICT = {"fault": "still needed", "ok": "fixed on this oneDNN", "not reached": "not reached",
               "busy": "no verdict (busy)"}
ON_VERDICT = {"fault": "FAULT", "ok": "ok", "not reached": "ok", "busy": "ok"}  # busy: no fault seen


def probe_both(probe):
    """(workaround off, workaround on), each a Run."""
    return run_child(probe, off=True), run_child(probe, off=False)


def cpu():
    """The CPU, as far as oneDNN's choice of kernels goes: the faults were seen on AVX-512 machines."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return f"{os.cpu_count()} cpus"
    field_ = lambda k: next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith(k)), "?")  # noqa: E731
    isa = "AVX-512" if " avx512f" in info else "AVX2, no AVX-512" if " avx2" in info else "no AVX2"
    return f"{field_('model name')} (family {field_('cpu family')} model {field_('model')}), {os.cpu_count()} cpus, {isa}"


def versions():
    code = "import torch, torch_llga; print(torch.__version__, torch_llga.onednn_version())"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return out if len(out) == 2 else ["?", "?"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated quirk names")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    probes = PROBES
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - {p.name for p in PROBES}
        if unknown:
            ap.error(f"no probe named {', '.join(sorted(unknown))}")
        probes = [p for p in PROBES if p.name in wanted]
    torch_version, onednn = versions()
    print(f"torch {torch_version}, oneDNN {onednn}; {cpu()}", flush=True)
    width = max(len(p.name) for p in probes)
    print(f"{'quirk':<{width}} | {'fault kind':<24} | {'with workaround off':<20} | {'on':<5} | detail", flush=True)
    results, t0 = [], time.time()
    for p in probes:
        off, on = probe_both(p)
        off_v = OFF_VERDICT.get(off.status, off.status)
        on_v = ON_VERDICT.get(on.status, on.status)
        print(f"{p.name:<{width}} | {p.kind:<24} | {off_v:<20} | {on_v:<5} | {off.detail}", flush=True)
        if on_v != "ok":
            print(f"{'':<{width}} | {'':<24} | {'':<20} | {'':<5} | workaround on: {on.detail}", flush=True)
        results.append(dict(quirk=p.name, kind=p.kind, workaround_off=off_v, workaround_on=on_v,
                            off_detail=off.detail, on_detail=on.detail, off_cases=off.cases, on_cases=on.cases,
                            seconds=round(off.seconds + on.seconds, 1)))
    print(f"({time.time() - t0:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch_version, onednn=onednn, results=results), f, indent=1)
    return 0


# pytest (only when this file is named explicitly: the default suite collects test_*.py): passes
# when the workaround-on run shows no fault; the workaround-off verdict is a user property.
try:
    import pytest
except ImportError:  # the command line needs no pytest
    pytest = None

if pytest is not None:
    @pytest.mark.parametrize("name", [p.name for p in PROBES])
    def test_quirk_probe(name, record_property):
        probe = next(p for p in PROBES if p.name == name)
        off, on = probe_both(probe)
        record_property("workaround_off", OFF_VERDICT.get(off.status, off.status))
        record_property("workaround_off_detail", off.detail)
        print(f"{name}: workaround off: {OFF_VERDICT.get(off.status, off.status)} ({off.detail})")
        print(f"{name}: workaround on: {ON_VERDICT.get(on.status, on.status)} ({on.detail})")
        assert on.status in ("ok", "not reached"), f"fault with the workaround on: {on.detail}"


if __name__ == "__main__":
    sys.exit(main())
