"""What stays in PyTorch, and what happens when inputs differ from the profiled ones."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga

from conftest import ConvNet, FP32, check, opaque_outputs, SOME


def assert_matches_eager(model, fused, x):
    with torch.no_grad():
        torch.testing.assert_close(fused(x), model(x), **FP32)


def test_channels_last_and_non_contiguous_inputs():
    # Same sizes, other strides: the guard passes and the kernel compiles for the actual strides.
    model = ConvNet().eval()
    fused = check(model, torch.randn(1, 3, 16, 16), groups=SOME)
    x = torch.randn(1, 3, 16, 16)
    before = torch_llga.stats()
    for _ in range(3):
        assert_matches_eager(model, fused, x.to(memory_format=torch.channels_last))
        assert_matches_eager(model, fused, torch.randn(1, 3, 32, 16)[:, :, ::2])
        assert_matches_eager(model, fused, torch.randn(1, 16, 16, 3).permute(0, 3, 1, 2))
    after = torch_llga.stats()
    assert after["guard_failures"] == before["guard_failures"]
    assert after["executions"] - before["executions"] == 9 * len(fused.groups)


def test_channels_last_traced():
    model = ConvNet().eval()
    x = torch.randn(1, 3, 16, 16).to(memory_format=torch.channels_last)
    fused = check(model, x, groups=SOME)
    assert len(fused.groups) >= 2


def test_called_with_another_dtype_than_traced_falls_back():
    def f(a, b):
        return torch.relu(torch.matmul(a, b))

    a, b = torch.randn(4, 8, 16), torch.randn(4, 16, 8)
    fused = check(f, a, b, groups=[["matmul", "relu"]])
    before = torch_llga.stats()["guard_failures"]
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
    for _ in range(3):
        out = fused(a16, b16)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, f(a16, b16))
    assert torch_llga.stats()["guard_failures"] > before  # the fp32 group did not run on bf16


def test_float64_is_not_mapped():
    f64 = check(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).double(), torch.randn(2, 8, dtype=torch.float64),
                groups=[])
    assert f64.unfused == ["linear", "relu"]


def test_int_tensors_are_left_alone():
    a = torch.arange(24).view(2, 3, 4)
    fused = check(lambda a, b: torch.relu(a + b) * 2, a, a.flip(0), groups=[])
    assert sorted(fused.unfused) == ["add", "mul", "relu"]
    assert fused.output.dtype == torch.int64


def test_unsupported_op_splits_groups():
    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x):
            return F.relu(self.conv2(torch.sin(F.relu(self.conv1(x)))))

    fused = check(Split(), torch.randn(1, 4, 12, 12), groups=[["_convolution", "relu"], ["_convolution", "relu"]])
    assert fused.unfused == ["sin"]
    # The first group's output is read by PyTorch (sin): it must be a strided tensor.
    first = fused.graph.findAllNodes("llga::FusionGroup", True)[0]
    assert opaque_outputs(first) == [0]


def test_model_without_mappable_ops_is_unchanged():
    fused = check(lambda a: torch.sin(a).cumsum(0), torch.randn(4, 4), groups=[])
    assert fused.unfused == ["sin", "cumsum"]
    assert not fused.graph.findAllNodes("llga::Guard", True)


def test_grad_mode_uses_no_fusion():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()
    x = torch.randn(2, 8, requires_grad=True)
    with torch_llga.enabled():
        m = torch.jit.freeze(torch.jit.trace(model, x.detach()))
        for _ in range(3):
            y = m(x)
    torch.testing.assert_close(y, model(x), **FP32)
    y.sum().backward()  # autograd still works: the fused path was not taken
    assert x.grad is not None


def test_shape_computed_at_run_time_is_not_baked_in():
    # view's shape comes from aten::size of another tensor: guards cannot see it, so view stays in
    # PyTorch (a static reshape would be wrong for another n) and the rest still fuses.
    w = torch.randn(6, 6)

    def f(x, n_like):
        y = torch.relu(F.linear(x, w))
        return y.view(n_like.size(0), -1)

    x = torch.randn(4, 6)
    fused = check(f, x, torch.empty(2), groups=[["linear", "relu"]])
    assert "view" in fused.unfused
    torch.testing.assert_close(fused(x, torch.empty(3)), f(x, torch.empty(3)))


def test_graph_returning_a_bool_mask():
    # oneDNN v3.2's End op rejects boolean tensors: building the graph used to throw (found by fuzzing).
    a, b = torch.randn(4, 8, 16), torch.randn(4, 16, 8)
    check(lambda a, b: (torch.relu(torch.matmul(a, b)), a > 0), a, b, groups=[["matmul", "relu"]])


def test_size_one_dims_with_any_stride(all_partitions):
    # oneDNN v3.2 crashed compiling an add whose operand is a [1] slice of stride 2 (found by
    # fuzzing): a size-1 dim's stride addresses nothing, the kernel passes the dense one.
    a, b = torch.randn(1), torch.randn(2)[::2]
    check(torch.add, a, b, groups=[["add"]])
    a, b = torch.randn(2, 1, 3), torch.randn(2, 2, 3)[:, ::2]
    assert b.stride() == (6, 6, 1)
    check(torch.add, a, b, groups=[["add"]])


class ManyLinearsOfOneElement(nn.Module):
    """Found by fuzzing: oneDNN 3.12's pattern matcher throws std::out_of_range ("vector::_M_range_check",
    the message PyTorch's built-in fuser crashes with on DeepAndWide) partitioning this graph. addmm's
    bias is [1, 1]: a full-size one would stay in PyTorch (quirks::one_row_matmul_sum_post_op), and
    the graph oneDNN sees would no longer be this one."""

    def __init__(self):
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.randn(8, 1)) for _ in range(4)])
        self.w5, self.w8, self.b8 = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(1, 8)), nn.Parameter(torch.randn(1, 1))

    def forward(self, x0, x1):
        F.linear(x0, self.w[0]), F.linear(x0, self.w[1]), F.linear(x0, self.w[2])
        v5 = F.linear(torch.bmm(x0, x1), self.w5)
        v8 = torch.addmm(self.b8, x0.reshape((1, -1)), self.w8)
        return v5, F.linear(x0, self.w[3]), v8


def test_block_onednn_cannot_partition_runs_unfused(all_partitions):
    model = ManyLinearsOfOneElement().requires_grad_(False)
    fused = check(model, torch.randn(1, 1, 1), torch.randn(1, 1, 8), freeze=False, groups=[])
    assert any("oneDNN could not partition this block" in n.s("llga_unfused")
               for n in fused.graph.nodes() if n.hasAttribute("llga_unfused"))


def test_six_dim_tensors_stay_in_pytorch(all_partitions):
    # oneDNN 3.12's reference eltwise kernel indexes 5 dims: abs + add of a 6-D tensor gave wrong
    # values and wrote past its output (found by fuzzing; a heap corruption, then a segfault).
    fn = lambda a: a.reshape(1, 1, 1, 4, 1, 1).abs() + 1  # noqa: E731
    fused = check(lambda a: fn(a.relu()), torch.randn(1, 1, 4, 1, 1), groups=[["relu"]])
    assert sorted(fused.unfused) == ["abs", "add", "reshape"]


def test_one_element_layer_norm_post_op_stays_in_pytorch(all_partitions):
    # oneDNN 3.12 gave 0 or 1 for 0.5 + layer_norm(x) of a one-element x (found by fuzzing).
    fn = lambda a: 0.5 + F.layer_norm(a.relu() - 0.3, (1,), None, None, 1e-5)  # noqa: E731
    fused = check(fn, torch.randn(1, 1), groups=SOME)
    assert ["layer_norm"] in fused.groups and "add" in fused.unfused


def test_fused_groups_pass_the_speed_check():
    # The check must not send ordinary groups to their unfused ops: a conv net and a linear stack,
    # run past their timed executions, stay fused.
    before = torch_llga.stats()
    net = check(ConvNet(), torch.randn(2, 3, 32, 32), groups=SOME)
    mlp = check(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)), torch.randn(32, 64), groups=SOME)
    for _ in range(3):
        net(torch.randn(2, 3, 32, 32))
        mlp(torch.randn(32, 64))
    assert torch_llga.stats()["slow_partitions"] == before["slow_partitions"]


def test_llga_tensor_to_dense_compiles_its_reorder_once():
    """A guard that fails on a group whose input is another group's opaque (LLGA) output converts
    that input to strided for PyTorch's ops, as the speed check's unfused run does: the reorder for
    its layout is compiled once (stats()["to_dense_compilations"]), not on every conversion."""

    class TwoGroups(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(8, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x, y):
            return self.conv2(F.relu(self.conv1(x))) + y

    model = TwoGroups()
    x = torch.randn(1, 8, 16, 16)
    start = torch_llga.stats()
    fused = check(model, x, torch.randn(1, 16, 16, 16), groups=[["_convolution", "relu"], ["_convolution", "add"]])
    assert opaque_outputs(fused.graph.findAllNodes("llga::FusionGroup", True)[0]) == [1]  # stays in oneDNN's layout
    y = torch.randn(1, 16, 1, 1)  # another size: the second group's guard fails, the first's holds
    torch_llga.set_shape_policy("fallback")
    try:
        for i in range(3):
            before = torch_llga.stats()
            out = fused(x, y)
            after = torch_llga.stats()
            torch.testing.assert_close(out, model(x, y), **FP32)
            assert after["guard_failures"] - before["guard_failures"] == 1  # converted the first group's output
            if i > 0:  # the reorder compiled by the first conversion, or by an earlier test of this process
                assert after["to_dense_compilations"] == before["to_dense_compilations"]
    finally:
        torch_llga.set_shape_policy("compile")
    assert after["to_dense_compilations"] - start["to_dense_compilations"] <= 1
