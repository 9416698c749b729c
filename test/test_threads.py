"""One fused module called from 8 threads at once, 500 calls each: no crash, every result equal to
the single-thread one.

oneDNN compiled partitions must not execute on two threads at once (a known oneDNN double free);
the kernel serializes execution per compiled partition (its cost: see docs/guarantees.md).
"""

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
    judged (kernel.cpp, maps_at) and compiled once, and every result equals eager. Half the threads'
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
