"""torch.compile(model, backend="torch_llga"): each graph Dynamo hands over runs through the same
fuser as the TorchScript path (torch_llga/dynamo.py)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga
import torch_llga.dynamo

from conftest import FP32, ConvNet, requires_bf16_kernels


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch_llga.dynamo._warned.clear()  # its warnings come once a process
    yield
    torch._dynamo.reset()


def groups_of(graph):
    """The ops of each fusion group in a TorchScript graph (inside guards' branches too)."""
    return [[n.kind().split("::")[1] for n in g.g("Subgraph").nodes() if n.kind() != "prim::Constant"]
            for g in graph.findAllNodes("llga::FusionGroup", True)]


def run_three_times(compiled, *inputs):
    """Compile, profiling run, fused run; returns the last output and the fused run's stats delta."""
    with torch.no_grad():
        compiled(*inputs)
        compiled(*inputs)
        before = torch_llga.stats()
        out = compiled(*inputs)
    after = torch_llga.stats()
    return out, {k: after[k] - before[k] for k in before}


def test_backend_by_name_fuses_and_matches_eager():
    model, x = ConvNet().eval(), torch.randn(1, 3, 16, 16)
    out, delta = run_three_times(torch.compile(model, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert groups_of(torch.jit.last_executed_optimized_graph()) == [
        ["_convolution", "relu"], ["_convolution", "add", "relu"], ["linear"]]
    assert delta["executions"] == 3 and delta["guard_failures"] == 0 and delta["kernel_fallbacks"] == 0
    # The weights are constants of the frozen graph (each reordered once), not graph inputs.
    assert len(list(torch.jit.last_executed_optimized_graph().inputs())) == 2  # self, x


class TwoHalves(nn.Module):
    """A graph break between two fusable halves: Dynamo hands over two graphs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        y = F.relu(self.a(x))
        torch._dynamo.graph_break()
        return F.relu(self.b(y))


def test_graph_break():
    model, x = TwoHalves().eval(), torch.randn(4, 16)
    out, delta = run_three_times(torch.compile(model, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert delta["executions"] == 2  # [linear, relu] in each graph


def test_second_batch_size_recompiles():
    model = ConvNet().eval()
    compiled = torch.compile(model, backend="torch_llga", dynamic=False)
    for batch in (1, 3, 1):
        x = torch.randn(batch, 3, 16, 16)
        out, delta = run_three_times(compiled, x)
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), **FP32)
        assert delta["executions"] == 3


def test_dynamic_shapes_run_eager_with_a_warning():
    model, x = ConvNet().eval(), torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="torch_llga", dynamic=True)
    with pytest.warns(UserWarning, match="static shapes only"):
        out, delta = run_three_times(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert delta["executions"] == 0


def test_a_weight_written_in_place_compiles_again():
    model, x = ConvNet().eval(), torch.randn(1, 3, 16, 16)
    compiled = torch.compile(model, backend="torch_llga")
    run_three_times(compiled, x)
    with torch.no_grad():
        model.fc.weight.mul_(2)  # the frozen graph's constant is stale now
    out, delta = run_three_times(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert delta["executions"] == 3


def test_gradients_run_eager_with_a_warning():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(2, 8, requires_grad=True)
    compiled = torch.compile(model, backend="torch_llga")
    with pytest.warns(UserWarning, match="inference only"):
        out = compiled(x)
    out.sum().backward()
    assert x.grad is not None and torch.equal(out, model(x))


def test_grad_mode_with_trainable_weights_runs_eager():
    # Outside no_grad, a module's own parameters need gradients: the output must carry them.
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8)
    compiled = torch.compile(model, backend="torch_llga")
    with pytest.warns(UserWarning, match="inference only"):
        out = compiled(x)
    assert out.requires_grad


BF16 = dict(rtol=3e-2, atol=3e-2)  # as test_bf16.py: bf16 rounds at other points than eager


@requires_bf16_kernels
def test_bf16_model_and_autocast():
    x = torch.randn(1, 3, 16, 16)
    model = ConvNet().eval()
    expected_groups = [["_convolution", "relu"], ["_convolution", "add", "relu"], ["linear"]]
    out, delta = run_three_times(torch.compile(model.bfloat16(), backend="torch_llga"), x.bfloat16())
    with torch.no_grad():
        torch.testing.assert_close(out, model(x.bfloat16()), **BF16)
    assert groups_of(torch.jit.last_executed_optimized_graph()) == expected_groups and delta["executions"] == 3

    torch._dynamo.reset()
    model = ConvNet().eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, delta = run_three_times(torch.compile(model, backend="torch_llga"), x)
        with torch.no_grad():
            expected = model(x)
    assert out.dtype == torch.bfloat16 and delta["executions"] == 3
    torch.testing.assert_close(out, expected, **BF16)


class LinearPlusBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.register_buffer("offset", torch.randn(16))

    def forward(self, x):
        return F.relu(self.linear(x) + self.offset)


def test_buffers_are_constants_and_a_written_one_compiles_again():
    # Dynamo passes buffers as inputs too: baked in, the add joins the linear as a post-op.
    model, x = LinearPlusBuffer().eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="torch_llga")
    out, delta = run_three_times(compiled, x)
    assert groups_of(torch.jit.last_executed_optimized_graph()) == [["linear", "add", "relu"]]
    model.offset.add_(1.0)
    out, delta = run_three_times(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert delta["executions"] == 1
