"""Inputs a fused module was not built for: each runs as PyTorch would run it (same result, or
PyTorch's own error), never a crash or a wrong number."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga

from conftest import FP32, check, SOME, BF16


def conv_net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3),
                         nn.Hardtanh(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4), nn.ReLU()).eval()


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_propagate_like_eager(dtype, value):
    # oneDNN's ReLU, Clamp and max-pool would turn NaN into numbers: such inputs run unfused.
    model = conv_net().to(dtype)
    x = torch.randn(1, 3, 16, 16, dtype=dtype)
    tol = FP32 if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)  # bf16: 8-bit mantissa
    fused = check(model, x, **tol, groups=SOME)
    assert len(fused.groups) >= 2
    bad = x.clone()
    bad[0, 1, 5, 5] = value
    before = torch_llga.stats()
    with torch.no_grad():
        expected = model(bad)
        for _ in range(3):
            torch.testing.assert_close(fused(bad), expected, equal_nan=True, **tol)
        torch.testing.assert_close(fused(x), model(x), **tol)  # finite inputs still run fused
    after = torch_llga.stats()
    assert after["nonfinite_fallbacks"] > before["nonfinite_fallbacks"]
    assert expected.isnan().any() or expected.isinf().any()  # the test would be vacuous otherwise


@pytest.mark.parametrize("rows", [4, 300])
def test_nan_in_a_half_of_a_wider_tensor_is_found(rows):
    # A chunk of a linear's output (GEGLU's, SwiGLU's halves) is scanned row by row in place: a NaN
    # in the half the group reads sends it unfused, one in the other half does not.
    def f(a):
        h, gate = a.chunk(2, -1)
        return torch.softmax(gate, -1) * 2.0, h
    x = torch.randn(2, rows, 64)
    fused = check(f, x, groups=[["softmax", "mul"]])
    for column, falls_back in [(40, True), (63, True), (10, False)]:
        bad = x.clone()
        bad[1, rows - 1, column] = float("nan")
        before = torch_llga.stats()
        for got, expected in zip(fused(bad), f(bad)):
            torch.testing.assert_close(got, expected, equal_nan=True, **FP32)
        assert (torch_llga.stats()["nonfinite_fallbacks"] > before["nonfinite_fallbacks"]) == falls_back


@pytest.mark.parametrize("position", [0, 70_000, 140_000, 3 * 64 * 1024 - 1])
def test_nan_anywhere_in_a_large_input_is_found(position):
    # Inputs of 128K elements and more are scanned in blocks on several threads: each block counts.
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    x = torch.randn(1, 3, 256, 256)
    fused = check(model, x, groups=SOME)
    bad = x.clone()
    bad.view(-1)[position] = float("nan")
    with torch.no_grad():
        torch.testing.assert_close(fused(bad), model(bad), equal_nan=True, **FP32)
    assert model(bad).isnan().any()


class ThreeConvBranches(nn.Module):
    """XML-CNN's shape: one input read by three conv + relu groups."""

    def __init__(self, write_between=False):
        super().__init__()
        self.write_between = write_between
        self.convs = nn.ModuleList(nn.Conv1d(16, 8, k) for k in (2, 4, 8))

    def forward(self, x):
        x = x.transpose(1, 2) + 0.5  # not the caller's tensor: the in-place write below stays inside
        first = F.relu(self.convs[0](x))
        if self.write_between:
            x.mul_(2.0)  # the later groups read other values than the first
        rest = [F.relu(conv(x)) for conv in self.convs[1:]]
        return torch.cat([first.amax(2)] + [r.amax(2) for r in rest], 1)


@pytest.mark.parametrize("write_between", [False, True])
def test_one_nan_scan_for_an_input_several_groups_read(write_between):
    model = ThreeConvBranches(write_between)
    x = torch.randn(2, 32, 16)
    # Written in place between its readers, the input keeps them in PyTorch: nothing to scan.
    fused = check(model, x.clone(), groups=[] if write_between else SOME)
    scans = fused.graph.findAllNodes("llga::AllFinite", True)
    assert len(scans) == (0 if write_between else 1)  # shared only when nothing writes to the input
    for position in (0, 2 * 32 * 16 - 1):
        bad = x.clone()
        bad.view(-1)[position] = float("nan")
        with torch.no_grad():
            expected = model(bad.clone())
            torch.testing.assert_close(fused(bad.clone()), expected, equal_nan=True, **FP32)
        assert expected.isnan().any()


class EmbeddingConvs(nn.Module):
    """XML-CNN's front: token embeddings, transposed, read by two conv + relu groups."""

    def __init__(self, table):
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(table)
        self.convs = nn.ModuleList(nn.Conv1d(table.shape[1], 8, k) for k in (2, 4))

    def forward(self, tokens):
        x = self.embedding(tokens).transpose(1, 2)
        return torch.cat([F.relu(conv(x)).amax(2) for conv in self.convs], 1)


@pytest.mark.parametrize("table_holds_nan", [False, True])
def test_embedding_rows_are_scanned_only_if_the_table_holds_nan(table_holds_nan):
    # Rows gathered from a constant table without NaN/Inf are finite whatever the tokens: their
    # groups' guards skip the scan. A table that holds a NaN keeps the scan, and its row runs unfused.
    table = torch.randn(50, 16)
    if table_holds_nan:
        table[7, 3] = float("nan")
    model = EmbeddingConvs(table).eval()
    tokens = torch.randint(8, 50, (2, 24))
    fused = check(model, tokens, groups=[["_convolution", "relu"]] * 2)
    guards = fused.graph.findAllNodes("llga::Guard", True)
    assert len(guards) == 2
    unscanned = [g.hasAttribute("finite_given") and getattr(g, "is")("finite_given") == [-2] for g in guards]
    assert unscanned == [not table_holds_nan] * 2
    assert len(fused.graph.findAllNodes("llga::AllFinite", True)) == (0 if not table_holds_nan else 1)
    bad = tokens.clone()
    bad[1, 5] = 7  # the row with the NaN, if the table has one
    before = torch_llga.stats()
    with torch.no_grad():
        expected = model(bad)
        torch.testing.assert_close(fused(bad), expected, equal_nan=True, **FP32)
    assert expected.isnan().any() == table_holds_nan
    after = torch_llga.stats()
    assert after["nonfinite_fallbacks"] - before["nonfinite_fallbacks"] == (2 if table_holds_nan else 0)


class LinearAdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(64, 64)

    def forward(self, x, residual):
        return self.linear(x) + residual


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_through_arithmetic_groups_run_fused(dtype, value):
    # Matmul, bias and add carry NaN/Inf as eager does: such groups skip the input scan.
    model = LinearAdd().to(dtype)
    x, r = torch.randn(1, 32, 64, dtype=dtype), torch.randn(1, 32, 64, dtype=dtype)
    tol = FP32 if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)  # bf16: 8-bit mantissa
    fused = check(model, x, r, groups=[["linear", "add"]], **tol)
    for bad_x, bad_r in [(x.clone(), r), (x, r.clone())]:
        (bad_x if bad_x is not x else bad_r)[0, 3, 5] = value
        before = torch_llga.stats()
        with torch.no_grad():
            expected = model(bad_x, bad_r)
            got = fused(bad_x, bad_r)
        after = torch_llga.stats()
        torch.testing.assert_close(got, expected, equal_nan=True, **tol)
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
        assert after["nonfinite_fallbacks"] == before["nonfinite_fallbacks"]
        assert after["executions"] == before["executions"] + 1
        assert expected.isnan().any() or expected.isinf().any()


class ConvThenPool(nn.Module):
    """A conv without an activation (a group that carries NaN/Inf, unscanned) before a max-pool."""

    def __init__(self, dtype):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1).to(dtype)

    def forward(self, x):
        return F.max_pool2d(self.conv(x), 2)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_from_a_carrying_group_reach_the_next_groups_scan(dtype, value):
    # The conv's group passes NaN/Inf on in its LLGA output; the pool's guard scans that output
    # (oneDNN's max-pool would turn NaN into numbers), blocked layout and all.
    model = ConvThenPool(dtype).eval()
    x = torch.randn(1, 16, 32, 32, dtype=dtype)
    tol = FP32 if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)  # bf16: 8-bit mantissa
    fused = check(model, x, **tol, groups=SOME)
    assert len(fused.groups) == 2, fused.groups
    for position in [(0, 0, 5, 5), (0, 15, 31, 31)]:
        bad = x.clone()
        bad[position] = value
        with torch.no_grad():
            expected = model(bad)
            got = fused(bad)
        torch.testing.assert_close(got, expected, equal_nan=True, **tol)
        assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.isinf(), expected.isinf())
        assert expected.isnan().any() or expected.isinf().any()
    before = torch_llga.stats()
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), **tol)  # finite inputs still run fused
    assert torch_llga.stats()["nonfinite_fallbacks"] == before["nonfinite_fallbacks"]


def chain(a):
    return torch.relu(a * 2.0 + 1.0) * a


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.bool])
def test_other_dtypes_run_in_pytorch(dtype):
    x = torch.randn(64, 64, 64)  # 256K elements: the chain is worth a group
    fused = check(chain, x, groups=[["mul", "add", "relu", "mul"]])
    other = (torch.randn(64, 64, 64) * 10).to(dtype)
    before = torch_llga.stats()
    for _ in range(3):
        got, expected = fused(other), chain(other)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, **FP32)
    assert torch_llga.stats()["guard_failures"] - before["guard_failures"] >= 1


def test_complex_input_gets_pytorchs_error():
    fused = check(chain, torch.randn(64, 64, 64), groups=[["mul", "add", "relu", "mul"]])
    z = torch.randn(64, 64, 64, dtype=torch.complex64)
    with pytest.raises(RuntimeError) as eager:
        chain(z)
    with pytest.raises(RuntimeError) as ours:
        fused(z)
    assert str(eager.value).splitlines()[0] in str(ours.value)


def test_meta_tensor_runs_in_pytorch():
    fused = check(chain, torch.randn(64, 64, 64), groups=[["mul", "add", "relu", "mul"]])
    meta = torch.empty(64, 64, 64, device="meta")
    for _ in range(3):
        out = fused(meta)
        assert out.device.type == "meta" and out.shape == meta.shape
    # With CPU weights, a meta input fails in eager PyTorch: the fused module gives the same error.
    model = conv_net()
    fused = check(model, torch.randn(1, 3, 16, 16), **FP32, groups=SOME)
    with pytest.raises(RuntimeError, match="meta"):
        model(torch.empty(1, 3, 16, 16, device="meta"))
    for _ in range(3):
        with pytest.raises(RuntimeError, match="meta"):
            fused(torch.empty(1, 3, 16, 16, device="meta"))


@pytest.mark.parametrize("kind", ["negative view", "zero tensor", "mkldnn"])
def test_tensors_without_plain_memory_run_in_pytorch(kind):
    # A negative view's memory holds -x, an efficient zero tensor has none, an mkldnn tensor's is
    # opaque: handing it to oneDNN gave -x's result (diff 2.0), a segfault, and an error where
    # eager runs. (PyTorch's mkldnn tensors reach few aten ops: conv + relu.)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval() if kind == "mkldnn" else conv_net()
    x = torch.randn(1, 3, 16, 16)
    fused = check(model, x, **FP32, groups=SOME)
    other = {"negative view": lambda: torch._neg_view(x), "zero tensor": lambda: torch._efficientzerotensor((1, 3, 16, 16)),
             "mkldnn": lambda: x.to_mkldnn()}[kind]()
    dense = (lambda t: t.to_dense()) if kind == "mkldnn" else (lambda t: t)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(dense(fused(other)), dense(model(other)), **FP32)


def test_sparse_input_gets_pytorchs_error():
    model = conv_net()
    fused = check(model, torch.randn(1, 3, 16, 16), **FP32, groups=SOME)
    sparse = torch.randn(1, 3, 16, 16).to_sparse()
    with pytest.raises(RuntimeError) as eager:
        model(sparse)
    with pytest.raises(RuntimeError) as ours:
        fused(sparse)
    assert str(eager.value).splitlines()[0] in str(ours.value)


def test_requires_grad_input_takes_the_unfused_path():
    model = conv_net()
    x = torch.randn(1, 3, 16, 16)
    fused = check(model, x, **FP32, groups=SOME)
    before = torch_llga.stats()
    for _ in range(3):
        a = x.clone().requires_grad_()
        b = x.clone().requires_grad_()
        out = fused.module(a)  # grad mode on
        torch.testing.assert_close(out, model(b), **FP32)
        out.sum().backward()
        model(b).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, **FP32)
    assert torch_llga.stats()["executions"] == before["executions"]


def test_training_mode_is_not_fused():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.0)).train()
    x = torch.randn(2, 3, 12, 12)
    with torch_llga.enabled():
        traced = torch.jit.trace(model, x)  # shares model's parameters and buffers
        reference = copy.deepcopy(model)
        for _ in range(3):
            out = traced(x)
            torch.testing.assert_close(out, reference(x), **FP32)
        graph = torch.jit.last_executed_optimized_graph()
    assert not graph.findAllNodes("llga::FusionGroup", True)
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean, **FP32)
    out.sum().backward()
    assert model[0].weight.grad is not None
