"""One fused module called from 8 threads at once, 500 calls each: no crash, every result equal to
the single-thread one.

oneDNN compiled partitions must not execute on two threads at once (a known oneDNN double free);
the kernel serializes execution per compiled partition (its cost: see docs/guarantees.md).
"""

import threading
import time

import torch
import torch.nn as nn

import torch_llga
from conftest import check, run_in_threads, SOME


def test_eight_threads_500_calls_each():
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 16 * 16, 10))
    inputs = [torch.randn(2, 3, 16, 16) for _ in range(8)]
    fused = check(model, inputs[0], rtol=1e-4, atol=1e-4, groups=SOME)
    assert len(fused.groups) >= 2
    expected = [fused(x) for x in inputs]  # single-thread results, one input per thread
    mismatches = []
    before = torch_llga.stats()

    def worker(i):
        for _ in range(500):
            if not torch.equal(fused(inputs[i]), expected[i]):
                mismatches.append(i)

    run_in_threads(worker, 8)
    after = torch_llga.stats()
    assert not mismatches
    assert after["executions"] - before["executions"] == 8 * 500 * len(fused.groups)
    assert after["guard_failures"] == before["guard_failures"]


def test_eight_threads_bring_new_sizes_at_once():
    """Each thread brings its own input sizes to a shape-free group at the same moment: each size is
    judged (new_sizes.cpp, maps_at) and compiled once, and every result equals eager. Half the threads'
    sizes make the add a broadcast oneDNN gets wrong after a 4-D linear (onednn_quirks.h): those
    run the group unfused."""
    linear = nn.Linear(4, 8).requires_grad_(False)
    fn = lambda a, b: torch.relu(linear(a)) + b  # noqa: E731
    fused = check(fn, torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 8), groups=[["linear", "relu", "add"]])
    sizes = [((b, 2, s, 4), (b, 2, s, 8) if i % 2 else (1, 1, s, 8)) for i, (b, s) in
             enumerate([(1, 5), (3, 5), (2, 7), (4, 7), (3, 2), (2, 2), (4, 9), (1, 9)])]
    inputs = [(torch.randn(a), torch.randn(b)) for a, b in sizes]
    expected = [fn(a, b) for a, b in inputs]
    errors = []
    before = torch_llga.stats()

    def worker(i):
        for _ in range(50):
            got = fused(*inputs[i])
            if not torch.allclose(got, expected[i], rtol=1e-5, atol=1e-5):
                errors.append((i, (got - expected[i]).abs().max().item()))

    run_in_threads(worker, 8)
    after = torch_llga.stats()
    assert not errors, errors
    assert after["guard_failures"] == before["guard_failures"]
    assert after["executions"] - before["executions"] == 4 * 50  # the full-size operands
    assert after["kernel_fallbacks"] - before["kernel_fallbacks"] == 4 * 50  # the broadcast ones


def _shape_free_group():
    """linear + relu + add, one group that compiles a partition for each new input size."""
    linear = nn.Linear(64, 64).requires_grad_(False)
    fn = lambda a, b: torch.relu(linear(a)) + b  # noqa: E731
    fused = check(fn, torch.randn(2, 2, 3, 64), torch.randn(2, 2, 3, 64), groups=[["linear", "relu", "add"]])
    return fn, fused


class _CompileDelay:
    """Each compilation of a new key first sleeps `seconds` (torch_llga._C._test_delay_compile_ms,
    a test hook) while in this block."""

    def __init__(self, seconds):
        self.ms = int(seconds * 1000)

    def __enter__(self):
        torch_llga._C._test_delay_compile_ms(self.ms)

    def __exit__(self, *exc):
        torch_llga._C._test_delay_compile_ms(0)


def test_new_shape_compile_does_not_block_cached_calls():
    """Thread 0 calls the group at new sizes, its compilation held 2 s by the test hook; threads
    1-3 call it at the cached sizes meanwhile: each finishes its 50 calls well before that
    compilation ends (a compilation holds no lock the cached calls take), all equal to eager."""
    fn, fused = _shape_free_group()
    cached = [(torch.randn(2, 2, 3, 64), torch.randn(2, 2, 3, 64)) for _ in range(3)]
    new = (torch.randn(2, 2, 5, 64), torch.randn(2, 2, 5, 64))
    inputs = [new] + cached
    expected = [fn(*x) for x in inputs]
    delay = 2.0
    barrier = threading.Barrier(4)
    started, finished, errors = {}, {}, []
    before = torch_llga.stats()

    def worker(i):
        barrier.wait()
        if i > 0:
            time.sleep(0.2)  # thread 0 is compiling by now
        started[i] = time.monotonic()
        for _ in range(1 if i == 0 else 50):
            got = fused(*inputs[i])
            if not torch.allclose(got, expected[i], rtol=1e-5, atol=1e-5):
                errors.append((i, (got - expected[i]).abs().max().item()))
        finished[i] = time.monotonic()

    with _CompileDelay(delay):
        run_in_threads(worker, 4)
    after = torch_llga.stats()
    assert not errors, errors
    assert finished[0] - started[0] >= delay  # the new sizes' call did wait for its compilation
    for i in (1, 2, 3):
        assert finished[i] < finished[0] - delay / 4, (i, finished[i] - started[0], finished[0] - started[0])
        assert finished[i] - started[i] < delay / 2, (i, finished[i] - started[i])
    assert after["compilations"] - before["compilations"] == 1
    assert after["guard_failures"] == before["guard_failures"]
    assert after["executions"] - before["executions"] == 1 + 3 * 50


def test_threads_asking_for_one_new_key_compile_it_once():
    """Four threads bring the same new sizes at once, the compilation held 1 s: one compiles, the
    others wait for it (not compiling again), and all get eager's result."""
    fn, fused = _shape_free_group()
    new = (torch.randn(2, 2, 7, 64), torch.randn(2, 2, 7, 64))
    expected = fn(*new)
    barrier = threading.Barrier(4)
    errors = []
    before = torch_llga.stats()

    def worker(i):
        barrier.wait()
        got = fused(*new)
        if not torch.allclose(got, expected, rtol=1e-5, atol=1e-5):
            errors.append((i, (got - expected).abs().max().item()))

    start = time.monotonic()
    with _CompileDelay(1.0):
        run_in_threads(worker, 4)
    elapsed = time.monotonic() - start
    after = torch_llga.stats()
    assert not errors, errors
    assert after["compilations"] - before["compilations"] == 1
    assert after["executions"] - before["executions"] == 4
    assert elapsed < 4.0  # one held compilation, not four in a row
