"""Fuzzing: random programs of the ops torch_llga maps (and some it leaves to PyTorch), fused and
compared with eager.

Each example draws a program (fuzz_programs.py, fuzz_ops.py: shapes with broadcasting, fp32/bf16 and
dtypes that must stay in PyTorch, values used twice, several outputs, input layouts), traces and
freezes it with torch_llga on (sometimes making a group of every partition, sometimes unfrozen),
warms it up, then checks its outputs against eager on the traced inputs, on fresh ones of the same
sizes, on fresh ones with other strides (channels_last, transposed, sliced, expanded) and on ones of
other sizes, within error bounds computed from the program's own values (fuzz_ops.py); and that no
same-sized call failed a guard or fell back to PyTorch in the kernel. An example that plain
TorchScript (torch_llga off) also gets wrong is PyTorch's bug: it is set aside and reported.
test_fuzz_small_plans draws its programs from the ops the small-graph plan has steps for, fp32 and
bf16, with plans on, so most run as one plan (small_plan/run.cpp's own loops, not oneDNN's).

`make test` runs a fixed set of examples; a long random run (stopping after MINUTES if given; a
crash leaves the example it ran in LOG):
    TORCH_LLGA_FUZZ_EXAMPLES=5000 TORCH_LLGA_FUZZ_MINUTES=40 TORCH_LLGA_FUZZ_LOG=/tmp/fuzz.txt \
        python -m pytest -q -s test/test_fuzz.py   # -k small_plans: the plan programs only
"""
import collections
import math
import os
import sys
import time
import unittest

import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

import torch_llga
from fuzz_ops import BF16, F32, F64, mag
from fuzz_programs import ProgramModule, evaluate, programs
from torch_llga.report import fusion_groups, small_plans

QUICK_EXAMPLES = 80
QUICK_PLAN_EXAMPLES = 150
LONG_EXAMPLES = int(os.environ.get("TORCH_LLGA_FUZZ_EXAMPLES", "0"))
LONG_MINUTES = float(os.environ.get("TORCH_LLGA_FUZZ_MINUTES", "inf"))  # a long run stops there too
CURRENT_LOG = os.environ.get("TORCH_LLGA_FUZZ_LOG")  # each example is written here first: a crash leaves it

# The floor of the tolerance, on top of the program's error bound (|fused - eager| <= atol + rtol |eager|).
BASE_TOL = {F32: (1e-5, 1e-5), BF16: (1.6e-2, 1e-5), F64: (1e-7, 1e-7)}  # bf16: torch.testing's default


# ---- the check --------------------------------------------------------------------------------

def assert_matches(got, expected, what, tally=False):
    outs, bounds = expected
    assert len(got) == len(outs)
    for k, (g, w, e) in enumerate(zip(got, outs, bounds)):
        rtol, atol = BASE_TOL.get(w.dtype, (0.0, 0.0))
        # The bound is for |fused - eager| already; twice it leaves room for its rough constants.
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol + 2 * e,
                                   msg=lambda m: f"{what}, output {k} (bound {e:.3g}): {m}")
        if tally and w.is_floating_point() and mag(w) > 0:  # how tight the check was: allowed error / output magnitude
            allowed = (atol + 2 * e + rtol * mag(w)) / max(mag(w), 1e-30)
            TALLY[f"tolerance {str(w.dtype)[6:]}: " + next(f"<= {c:g}" for c in (1e-4, 1e-3, 1e-2, 1e-1, math.inf) if allowed <= c)
                  + " of |output|"] += 1


TALLY = collections.Counter()
FUSED_OPS = collections.Counter()
DEADLINE = [math.inf]
TORCHSCRIPT_BUGS = []  # (program, error): plain TorchScript gets these wrong too, PyTorch's bugs, not ours


def eager(prog, inputs):
    """evaluate(), or None where eager PyTorch rejects these inputs (an other-sized call can break
    broadcasting, a static reshape, a weight's size) or a value is not finite."""
    try:
        return evaluate(prog, inputs)
    except RuntimeError:
        return None


def later_calls(prog):
    """(what, inputs, same sizes as traced) for the calls after warm-up."""
    return [("traced inputs", prog.make_inputs(0), True),
            ("fresh inputs", prog.make_inputs(1), True),
            ("fresh inputs, other strides", prog.make_inputs(2, restride=True), True),
            ("other sizes", prog.make_inputs(3, resize=True), False)]


def trace(prog, xs, freeze):
    with torch.no_grad():
        module = torch.jit.trace(ProgramModule(prog).eval(), xs, check_trace=False)
        return torch.jit.freeze(module) if freeze else module


def check_fused(prog, all_partitions, freeze, plans=False):
    xs = prog.make_inputs(0)
    expected = evaluate(prog, xs)
    assert expected is not None, "the builder keeps traced values finite"
    fused = trace(prog, xs, freeze)
    torch_llga._C._set_fuse_all_partitions(all_partitions)
    torch_llga._C._set_small_plans(plans)
    try:
        with torch.no_grad(), torch_llga.enabled():
            outs = [fused(*xs), fused(*xs)]  # profiling run, then the optimized graph
            graph = torch.jit.last_executed_optimized_graph()
    finally:
        torch_llga._C._set_fuse_all_partitions(False)
        torch_llga._C._set_small_plans(False)
    for k, out in enumerate(outs):
        assert_matches(out, expected, f"warm-up call {k}", tally=k == 1)
    groups = fusion_groups(graph)
    plans = small_plans(graph)
    TALLY["small-graph plans: examples"] += bool(plans)
    TALLY["examples"] += 1
    TALLY["with_groups"] += bool(groups)
    TALLY["groups"] += len(groups)
    for g in groups:
        FUSED_OPS.update(g)
    for what, inputs, same_sizes in later_calls(prog):
        expected = eager(prog, inputs)
        if expected is None:
            TALLY[f"skipped: {what}"] += 1
            continue
        before = torch_llga.stats()
        with torch.no_grad():
            got = fused(*inputs)
        after = torch_llga.stats()
        assert_matches(got, expected, what, tally=True)
        if same_sizes:
            assert after["kernel_fallbacks"] == before["kernel_fallbacks"], f"{what}: oneDNN could not run a group\n{graph}"
            assert after["guard_failures"] == before["guard_failures"], f"{what}: a guard rejected same-sized inputs\n{graph}"
            assert after["executions"] - before["executions"] == len(groups), f"{what}: not every group ran\n{graph}"
            assert after["plan_runs"] - before["plan_runs"] == len(plans), f"{what}: the plan did not run\n{graph}"
        else:  # new sizes: shape-free groups recompile, the others take the guard's fallback
            TALLY["other sizes: fused executions"] += after["executions"] - before["executions"]
            TALLY["other sizes: kernel fallbacks"] += after["kernel_fallbacks"] - before["kernel_fallbacks"]


def plain_torchscript_fails(prog, freeze):
    """Whether TorchScript without torch_llga crashes or goes wrong on the same calls."""
    xs = prog.make_inputs(0)
    calls = [(what, inputs, eager(prog, inputs)) for what, inputs, _ in [("traced inputs", xs, True)] * 2 + later_calls(prog)]
    try:
        module = trace(prog, xs, freeze)
        with torch.no_grad(), torch_llga.enabled(False):
            for what, inputs, expected in calls:
                if expected is not None:
                    assert_matches(module(*inputs), expected, what)
    except (RuntimeError, AssertionError):
        return True
    return False


def check_program(prog, all_partitions, freeze, plans):
    try:
        check_fused(prog, all_partitions, freeze, plans)
    except Exception as e:
        if plain_torchscript_fails(prog, freeze):
            TORCHSCRIPT_BUGS.append((prog, f"{type(e).__name__}: {str(e)[:300]}"))
            reject()
        FOUND_FAILURE[0] = True  # past the deadline too, Hypothesis must shrink and report it
        raise


def forget_traced_code():
    """PyTorch keeps the code of every traced module in its global compilation unit until exit
    (graphs, frozen weights, executors and so torch_llga's compiled partitions): 0.7 MB an
    example, so a 40-minute run outgrew this 24 GB machine at about 33,000 examples and stalled
    (an earlier run stopped printing there). A long run (test_fuzz.py alone: no other TorchScript
    code alive) drops it all after each example; the modules, local to it, are gone by then."""
    torch.jit._state._python_cu.drop_all_functions()


def heap_in_use_mb():
    """Bytes malloc has handed out and not had back (glibc's mallinfo2): beside the resident size, it
    tells a leak (both grow) from a heap that fragments or a cache that fills (only the resident size)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):  # not glibc 2.33+
        return "?"
    return (info.uordblks + info.hblkhd) >> 20


class OutOfTime(unittest.SkipTest):
    """Raised at the deadline (unless a failure was found): Hypothesis passes skip exceptions
    straight out, where rejecting every further example would keep it drawing programs up to its
    cap of invalid ones."""


FOUND_FAILURE = [False]
FORGET_CODE = [False]  # set by a long run of test_fuzz.py alone


def one_example(prog, all_partitions, freeze, small_plans):
    if time.time() > DEADLINE[0] and not FOUND_FAILURE[0]:
        raise OutOfTime()
    if CURRENT_LOG:
        with open(CURRENT_LOG, "w") as f:
            f.write(f"all_partitions={all_partitions} freeze={freeze} small_plans={small_plans}{prog!r}")
    check_program(prog, all_partitions, freeze, small_plans)
    if FORGET_CODE[0]:
        forget_traced_code()
    if LONG_EXAMPLES and TALLY["examples"] % 250 == 0:
        rss_mb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
        print(f"  {TALLY['examples']} examples, {time.strftime('%H:%M:%S')}, {rss_mb} MB resident, "
              f"{heap_in_use_mb()} MB of malloc's heap in use", flush=True)


# small_plans: whole programs of tiny tensors may run as one small-graph plan (not with all_partitions).
@given(prog=programs(max_steps=12 if LONG_EXAMPLES else 8), all_partitions=st.sampled_from([True, True, False]),
       freeze=st.sampled_from([True, True, True, False]), small_plans=st.sampled_from([False, True]))
def fuzz(prog, all_partitions, freeze, small_plans):
    one_example(prog, all_partitions, freeze, small_plans)


# Programs of the ops the small-graph plan has steps for, plans on: most run as one plan.
@given(prog=programs(max_steps=12 if LONG_EXAMPLES else 8, plannable=True), freeze=st.sampled_from([True, True, False]))
def fuzz_plans(prog, freeze):
    one_example(prog, False, freeze, True)


def run(examples, test):
    """Runs a Hypothesis test (up to the long run's deadline) and returns its summary line."""
    long_run = LONG_EXAMPLES > 0
    TALLY.clear()
    FUSED_OPS.clear()
    TORCHSCRIPT_BUGS.clear()
    FOUND_FAILURE[0] = False
    FORGET_CODE[0] = long_run and not [m for m in sys.modules if m.startswith("test_") and m != "test_fuzz"]
    start = time.time()
    DEADLINE[0] = start + LONG_MINUTES * 60 if long_run else math.inf
    try:
        settings(max_examples=LONG_EXAMPLES or examples, derandomize=not long_run, database=None,
                 deadline=None, print_blob=True, suppress_health_check=list(HealthCheck))(test)()
    except OutOfTime:
        pass
    summary = (f"{test.__name__}: {TALLY['examples']} examples in {time.time() - start:.0f} s, {TALLY['with_groups']} with "
               f"fusion groups ({TALLY['groups']} groups), {len(TORCHSCRIPT_BUGS)} rejected as PyTorch's own bugs; "
               f"{ {k: v for k, v in TALLY.items() if ':' in k} }; fused ops: {dict(FUSED_OPS.most_common())}")
    print(summary)
    for prog, error in TORCHSCRIPT_BUGS[:5]:
        print(f"plain TorchScript fails too:{prog}    {error}")
    return summary


def test_fuzz():
    summary = run(QUICK_EXAMPLES, fuzz)
    # Fuzzing that never fuses tests nothing.
    assert TALLY["with_groups"] >= 0.3 * TALLY["examples"], summary
    assert len(FUSED_OPS) >= 12, summary


def test_fuzz_small_plans():
    summary = run(QUICK_PLAN_EXAMPLES, fuzz_plans)
    # Planning is what this fuzz is for (57% of the fixed examples, 45% of a long random run).
    assert TALLY["small-graph plans: examples"] >= 0.3 * TALLY["examples"], summary
