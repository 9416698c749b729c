"""One fused module called from 8 threads at once, 500 calls each: no crash, every result equal to
the single-thread one.

oneDNN compiled partitions must not execute on two threads at once (a known oneDNN double free);
the kernel serializes execution per compiled partition (its cost: see README, Guarantees).
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
