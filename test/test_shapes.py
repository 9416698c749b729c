"""Inputs of sizes the module was not profiled with: compiled and cached, or run unfused, by the
shape policy; the compiled-partition cache is bounded (least recently used evicted)."""
import random

import pytest
import torch
import torch.nn as nn

import torch_llga

from conftest import FP32, ConvNet, check, SOME


@pytest.fixture(autouse=True)
def restore_settings():
    policy, capacity = torch_llga.shape_policy(), torch_llga.cache_capacity()
    yield
    torch_llga.set_shape_policy(policy)
    torch_llga.set_cache_capacity(capacity)


class Attention(nn.Module):
    """Single-head attention over [batch, length, 32]: sizes change along batch and length."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        scores = torch.matmul(self.q(x), self.k(x).transpose(1, 2)) / 32 ** 0.5
        return self.norm(torch.matmul(scores.softmax(-1), self.v(x)) + x)


def delta(before, after, key):
    return after[key] - before[key]


def calls_match_eager(model, fused, inputs):
    """Calls fused on each input (twice) and compares with eager; returns the stats delta."""
    before = torch_llga.stats()
    with torch.no_grad():
        for x in inputs:
            expected = model(x)
            for _ in range(2):
                torch.testing.assert_close(fused(x), expected, **FP32)
    return before, torch_llga.stats()


def test_new_sizes_are_compiled_and_run_fused():
    model = ConvNet().eval()
    fused = check(model, torch.randn(1, 3, 16, 16), groups=SOME)
    shapes = [(2, 3, 16, 16), (1, 3, 24, 20), (1, 3, 16, 16), (3, 3, 9, 31)]
    before, after = calls_match_eager(model, fused, [torch.randn(*s) for s in shapes])
    assert delta(before, after, "guard_failures") == 0
    assert delta(before, after, "kernel_fallbacks") == 0
    assert delta(before, after, "executions") == 2 * len(shapes) * len(fused.groups)
    # Each conv group compiles the three new sizes; the linear group sees [batch, 8]: two new.
    assert fused.groups == [["_convolution", "relu"], ["_convolution", "add", "relu"], ["linear"]]
    assert delta(before, after, "compilations") == 3 + 3 + 2


def test_warm_up_partitions_each_block_once():
    """Kernels compile the partitions the fuser found: oneDNN partitions the graph once at warm-up,
    not once more per group. A group asks for a partition of any sizes the first time a call
    brings it new sizes, and only then."""
    model = ConvNet().eval()
    before = torch_llga.stats()
    fused = check(model, torch.randn(1, 3, 16, 16), groups=SOME)
    assert len(fused.groups) == 3
    assert delta(before, torch_llga.stats(), "partitionings") == 1
    shapes = [(2, 3, 16, 16), (1, 3, 24, 20), (3, 3, 9, 31)]
    before, after = calls_match_eager(model, fused, [torch.randn(*s) for s in shapes])
    assert delta(before, after, "kernel_fallbacks") == 0 and delta(before, after, "guard_failures") == 0
    assert delta(before, after, "partitionings") == 3  # one per group, whatever the number of sizes


def test_fallback_policy_runs_new_sizes_unfused():
    torch_llga.set_shape_policy("fallback")
    model = ConvNet().eval()
    fused = check(model, torch.randn(1, 3, 16, 16), groups=SOME)
    before, after = calls_match_eager(model, fused, [torch.randn(2, 3, 16, 16), torch.randn(1, 3, 24, 20)])
    assert delta(before, after, "guard_failures") > 0
    assert delta(before, after, "compilations") == 0


def test_shape_specific_group_compiles_for_new_sizes():
    # A reshape's target was mapped for the profiled sizes (traced, it is a constant: eager
    # TorchScript keeps it too). At new input sizes the group's ops are mapped again at the sizes
    # they have there, and a partition compiled for them: no guard fallback, still right.
    def heads(a, b):
        return torch.matmul(a, b).transpose(1, 2).reshape(1, 16, 64)

    a, b = torch.randn(1, 4, 16, 16), torch.randn(1, 4, 16, 16)
    fused = check(heads, a, b, groups=[["matmul", "transpose", "reshape"]])
    before = torch_llga.stats()
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(fused(a, b[:, :, :, :8].contiguous().repeat(1, 1, 1, 2)),
                                       heads(a, b[:, :, :, :8].repeat(1, 1, 1, 2)), **FP32)  # same sizes
            b2 = torch.randn(1, 2, 16, 32)
            torch.testing.assert_close(fused(a[:, :2], b2), heads(a[:, :2], b2), **FP32)  # new sizes
    after = torch_llga.stats()
    assert delta(before, after, "guard_failures") == 0
    assert delta(before, after, "executions") == 4 and delta(before, after, "compilations") == 1
    assert delta(before, after, "kernel_fallbacks") == 0


def test_reshape_to_a_number_stays_out_and_its_group_compiles_for_new_sizes():
    # A reshape whose target a number argument sets stays in PyTorch (the compiled partitions are
    # keyed by the tensors' sizes alone); the group before it compiles for new sizes, and each
    # number gives eager's result.
    @torch.jit.script
    def heads(a, b, n: int):
        return torch.matmul(a, b).transpose(1, 2).reshape(n, 16, -1)

    a, b = torch.randn(1, 4, 16, 16), torch.randn(1, 4, 16, 16)
    fused = check(heads, a, b, 1, groups=[["matmul", "transpose"]])
    before = torch_llga.stats()
    with torch.no_grad():
        for n in (1, 2):
            a2, b2 = torch.randn(2, 2, 16, 16), torch.randn(2, 2, 16, 16)
            torch.testing.assert_close(fused(a2, b2, n), heads(a2, b2, n), **FP32)
    after = torch_llga.stats()
    assert delta(before, after, "guard_failures") == 0 and delta(before, after, "kernel_fallbacks") == 0
    assert delta(before, after, "executions") >= 2  # every call ran the group fused


class PooledHead(nn.Module):
    """A classifier's tail: conv, ReLU, max-pool with ceil_mode, an adaptive average pool to 2x2
    (both mapped for their input's spatial sizes only), flatten, linear."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 3, 2, ceil_mode=True)
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 2).flatten(1))


def test_spatial_size_specific_groups_compile_other_batch_sizes():
    # A server pads batches to a few sizes and warms each up: a group whose pooling was mapped for
    # the profiled H and W compiles for another batch size as any group does (no guard fallback),
    # one partition for every batch size; another H or W maps the pooling again, for them.
    model = PooledHead().eval()
    fused = check(model, torch.randn(1, 3, 16, 16), groups=SOME)
    assert any("adaptive_avg_pool2d" in g for g in fused.groups) and any("max_pool2d" in g for g in fused.groups)
    before, after = calls_match_eager(model, fused, [torch.randn(b, 3, 16, 16) for b in (2, 8, 3)])
    assert delta(before, after, "guard_failures") == 0
    assert delta(before, after, "executions") == 2 * 3 * len(fused.groups)
    before, after = calls_match_eager(model, fused, [torch.randn(2, 3, 20, 20)])
    assert delta(before, after, "guard_failures") == 0 and delta(before, after, "kernel_fallbacks") == 0
    assert delta(before, after, "executions") == 2 * len(fused.groups)
    # 9 x 31 pools to 5 x 16, which no oneDNN pooling takes to 2 x 2 (windows of unequal sizes):
    # that group runs its ops unfused at these sizes, the others fused.
    before, after = calls_match_eager(model, fused, [torch.randn(1, 3, 9, 31)])
    assert delta(before, after, "guard_failures") == 0 and delta(before, after, "kernel_fallbacks") == 2
    assert delta(before, after, "executions") == 2 * (len(fused.groups) - 1)


@pytest.mark.parametrize("capacity", [64, 8])
def test_fifty_sizes_in_random_order(capacity):
    """50 batch sizes and sequence lengths, shuffled, twice over: every result equals eager; the
    cache keeps at most `capacity` compilations per group and evicts the least recently used."""
    torch_llga.set_cache_capacity(capacity)
    rng = random.Random(capacity)
    model = Attention().eval()
    x = torch.randn(2, 16, 32)
    fused = check(model, x, rtol=1e-4, atol=1e-4, groups=SOME)
    # The attention core is one oneDNN SDPA partition, recompiled for every new length.
    assert ["matmul", "div", "softmax", "matmul"] in fused.groups, fused.groups
    shapes = [(rng.randint(1, 4), rng.randint(1, 48)) for _ in range(50)]
    shapes = list(dict.fromkeys(s for s in shapes if s != (2, 16)))  # distinct, not the profiled one
    order = shapes + shapes
    rng.shuffle(order)
    cached = torch_llga.stats()["cached_partitions"]
    before = torch_llga.stats()
    with torch.no_grad():
        for b, n in order:
            x = torch.randn(b, n, 32)
            # Softmax over up to 48 keys and a LayerNorm: fp32 reassociation, a few ulps of 1.
            torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-4)
    after = torch_llga.stats()
    groups = len(fused.groups)
    # One key makes q @ k^T a matrix-vector product, which the op table leaves to PyTorch (faster
    # there): at that length the attention group runs unfused. Every other call runs fused.
    vector = sum(1 for _, n in order if n == 1)
    assert delta(before, after, "guard_failures") == 0 and delta(before, after, "kernel_fallbacks") == vector
    assert delta(before, after, "executions") == len(order) * groups - vector
    assert after["cached_partitions"] - cached <= (capacity - 1) * groups  # one was there already
    if capacity >= len(shapes) + 1:
        assert delta(before, after, "compilations") == len(shapes) * groups - (1 if vector else 0)
        assert delta(before, after, "evictions") == 0
    else:
        assert delta(before, after, "evictions") > 0


def test_zero_size_and_other_rank_fall_back():
    model = ConvNet().eval()
    fused = check(model, torch.randn(1, 3, 16, 16), groups=SOME)
    before, after = calls_match_eager(model, fused, [torch.randn(0, 3, 16, 16)])
    assert delta(before, after, "guard_failures") > 0 and delta(before, after, "compilations") == 0

    mlp = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    fused = check(mlp, torch.randn(4, 16), groups=[["linear", "relu"]])
    before, after = calls_match_eager(mlp, fused, [torch.randn(16), torch.randn(2, 4, 16)])  # ranks 1 and 3
    assert delta(before, after, "guard_failures") > 0 and delta(before, after, "compilations") == 0


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="compile"):
        torch_llga.set_shape_policy("dynamic")
    with pytest.raises(ValueError, match=">= 1"):
        torch_llga.set_cache_capacity(0)
    torch_llga.set_shape_policy("fallback")
    assert torch_llga.shape_policy() == "fallback"
    torch_llga.set_cache_capacity(3)
    assert torch_llga.cache_capacity() == 3
