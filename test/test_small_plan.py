"""Small-graph plans: a whole graph of tiny fp32 or bf16 tensors runs as one llga::SmallPlan step (small_plan.h)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga
from torch_llga.tools.bench_models import MODELS
from torch_llga.report import small_plans

from conftest import AVX2, FP32, Fused, run_in_threads, requires_bf16_kernels

pytestmark = pytest.mark.small_plan


def planned(model, *inputs, ops, **tol):
    """Traces model with torch_llga on, checks that the whole graph became one plan of `ops` (in
    order), that it runs (not its fallback) and matches eager; returns the Fused model."""
    if isinstance(model, nn.Module):
        model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    compiled = torch_llga.stats()["plan_compilations"]
    fused = Fused(model, inputs)
    assert small_plans(fused.graph) == [ops], f"{fused.unfused}\n{fused.graph}"
    # compiled once: the pass's compilation is the one the operator runs
    assert torch_llga.stats()["plan_compilations"] - compiled == 1
    assert fused.groups == [] and fused.unfused == []
    before = torch_llga.stats()
    again = fused(*inputs)
    after = torch_llga.stats()
    assert after["plan_runs"] - before["plan_runs"] == 1
    assert after["guard_failures"] == before["guard_failures"]
    for out in (fused.output, again):
        torch.testing.assert_close(out, expected, equal_nan=True, **(tol or FP32))
    return fused


DEEP_AND_WIDE_OPS = ["add", "mul", "clamp", "transpose", "bmm", "flatten", "cat", "mm", "add", "sigmoid"]


@pytest.mark.parametrize("name", ["deep_and_wide", "deep_and_wide_64"])
def test_deep_and_wide_is_one_plan(name):
    model, inputs = MODELS[name](1)
    planned(model, *inputs, ops=DEEP_AND_WIDE_OPS)


def test_new_batch_size_falls_back_then_gets_its_own_plan():
    model, inputs = MODELS["deep_and_wide"](1)
    fused = planned(model, *inputs, ops=DEEP_AND_WIDE_OPS)
    other = tuple(torch.randn(5, *x.shape[1:]) for x in inputs)
    before = torch_llga.stats()
    with torch_llga.enabled():
        for _ in range(3):  # the plan's guard misses; the executor profiles the fallback, then plans it for batch 5
            torch.testing.assert_close(fused(*other), model(*other), **FP32)
    after = torch_llga.stats()
    assert after["plan_misses"] - before["plan_misses"] == 3 and after["guard_failures"] == before["guard_failures"]
    assert after["plan_runs"] - before["plan_runs"] == 2  # the fallback's own plan, from its second call
    torch.testing.assert_close(fused(*inputs), model(*inputs), **FP32)


def test_strided_inputs_run_the_plan():
    model, inputs = MODELS["deep_and_wide_64"](1)
    fused = planned(model, *inputs, ops=DEEP_AND_WIDE_OPS)
    strided = tuple(torch.randn(x.shape[::-1]).transpose(0, -1) for x in inputs)
    assert not any(x.is_contiguous() for x in strided)
    before = torch_llga.stats()
    torch.testing.assert_close(fused(*strided), model(*strided), **FP32)
    after = torch_llga.stats()
    assert after["plan_runs"] - before["plan_runs"] == 1 and after["guard_failures"] == before["guard_failures"]


def test_nan_and_inf_as_eager():
    def f(x, y):
        return torch.clamp(torch.relu(x) * y, -1, 1) + torch.sigmoid(x) - F.leaky_relu(y, 0.1)

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    fused = planned(f, x, y, ops=["relu", "mul", "clamp", "sigmoid", "add", "leaky_relu", "sub"])
    x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    y[1, :2] = torch.tensor([float("nan"), -float("inf")])
    before = torch_llga.stats()["plan_runs"]
    torch.testing.assert_close(fused(x, y), f(x, y), equal_nan=True, **FP32)
    assert torch_llga.stats()["plan_runs"] == before + 1  # no scan, no fallback: the loops keep NaN


def test_other_dtype_and_grad_fall_back():
    def f(x):
        return torch.tanh(x) * 2

    x = torch.randn(2, 8)
    fused = planned(f, x, ops=["tanh", "mul"])
    before = torch_llga.stats()
    out = fused(x.double())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, f(x.double()))
    grad = x.clone().requires_grad_()
    out = fused.module(grad)  # grad mode on: the guard sends it to the fallback, which records the graph
    out.sum().backward()
    torch.testing.assert_close(grad.grad, 2 * (1 - torch.tanh(x) ** 2), **FP32)
    assert torch_llga.stats()["plan_misses"] == before["plan_misses"] + 2
    assert torch_llga.stats()["plan_runs"] == before["plan_runs"]


def test_eight_threads():
    model, inputs = MODELS["deep_and_wide_64"](1)
    fused = planned(model, *inputs, ops=DEEP_AND_WIDE_OPS)
    batches = [tuple(torch.randn(x.shape) for x in inputs) for _ in range(8)]
    with torch.no_grad():
        expected = [model(*b) for b in batches]
    before = torch_llga.stats()["plan_runs"]

    def run(i):
        for _ in range(200):
            torch.testing.assert_close(fused(*batches[i]), expected[i], **FP32)

    run_in_threads(run, 8)
    assert torch_llga.stats()["plan_runs"] - before == 8 * 200


class Ops(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f
        self.w = nn.Parameter(torch.randn(6, 5))
        self.b = nn.Parameter(torch.randn(6))

    def forward(self, *x):
        return self.f(self, *x)


# name -> (forward, inputs, the plan's ops)
CASES = {
    "add_sub_alpha": (lambda m, x, y: torch.add(x, y, alpha=2) - torch.sub(y, x, alpha=0.5), (torch.randn(3, 5), torch.randn(1, 5)),
                      ["mul", "add", "mul", "sub", "sub"]),  # PrepareBinary moves alpha into a mul
    "scalar_operands": (lambda m, x: (x + 1.5) * 3 / 2 - 1, (torch.randn(3, 5),), ["add", "mul", "div", "sub"]),
    "broadcast_both": (lambda m, x, y: x * y + y, (torch.randn(4, 1, 5), torch.randn(3, 1)), ["mul", "add"]),
    "unary": (lambda m, x: torch.exp(-torch.tanh(F.hardtanh(x, -0.5, 2.0))) + torch.clamp(x, min=0.1), (torch.randn(3, 5),),
              ["hardtanh", "tanh", "neg", "exp", "clamp", "add"]),
    "more_unary": (lambda m, x: F.relu6(x.abs() * 4) + F.hardsigmoid(x) - F.hardswish(x) * F.elu(x, 0.5) + x.square(),
                   (torch.randn(3, 5) * 4,), ["abs", "mul", "relu6", "hardsigmoid", "add", "hardswish", "elu", "mul", "sub", "square", "add"]),
    "log_sqrt": (lambda m, x: torch.log(x.abs() + 1) * torch.sqrt(x.abs() + 1), (torch.randn(3, 5),),
                 ["abs", "add", "log", "sqrt", "mul"]),  # |x| + 1 computed once (CSE)
    "gelu_silu": (lambda m, x: F.gelu(x) + F.gelu(x, approximate="tanh") + F.silu(x), (torch.randn(3, 5) * 3,), None),
    "maximum_minimum": (lambda m, x, y: torch.maximum(x, y) - torch.minimum(x, y), (torch.randn(3, 5), torch.randn(5)),
                        ["maximum", "minimum", "sub"]),
    "clamp_low_above_high": (lambda m, x: torch.clamp(x, 1.0, -1.0), (torch.randn(3, 5),), ["clamp"]),
    "views": (lambda m, x: x.permute(2, 0, 1).unsqueeze(0).squeeze(0).transpose(1, 2).reshape(5, -1).view(-1).relu(),
              (torch.randn(3, 4, 5),), ["permute", "unsqueeze", "squeeze", "transpose", "reshape", "view", "relu"]),
    "flatten_of_transposed": (lambda m, x: x.transpose(0, 1).flatten(0) * 2, (torch.randn(3, 4),), ["transpose", "flatten", "mul"]),
    "contiguous": (lambda m, x: x.t().contiguous() + 1, (torch.randn(3, 4),), ["t", "contiguous", "add"]),
    "linear": (lambda m, x: F.linear(x, m.w, m.b), (torch.randn(2, 3, 5),), ["linear"]),
    "linear_no_bias_of_view": (lambda m, x: F.linear(x.t(), m.w), (torch.randn(5, 4),), ["t", "linear"]),
    "mm_addmm": (lambda m, x: torch.addmm(m.b, torch.mm(x, m.w.t()), torch.eye(6)), (torch.randn(4, 5),),
                 ["mm", "mm", "add"]),  # DecomposeOps: addmm -> mm + add; freezing folds w.t()
    "matmul_3d_2d": (lambda m, x: torch.matmul(x, m.w.t()), (torch.randn(2, 3, 5),), ["matmul"]),
    "bmm_long_k": (lambda m, x, y: torch.bmm(x, y), (torch.randn(2, 3, 70), torch.randn(2, 70, 4)), ["bmm"]),
    "cat": (lambda m, x, y: torch.cat([x, y.relu(), x], -1), (torch.randn(3, 2), torch.randn(3, 4)), ["relu", "cat"]),
    "cat_dim0": (lambda m, x, y: torch.cat([x, y], 0).sigmoid(), (torch.randn(2, 4), torch.randn(3, 4)), ["cat", "sigmoid"]),
    # Results nothing else reads are computed into their slice of the cat (no copy); one read
    # twice, or returned, is computed into a place of its own and copied.
    "cat_of_results": (lambda m, x, y: torch.cat([(x + y).clamp(-0.5, 0.5), x * y, torch.sigmoid(x)], 1) * 2,
                       (torch.randn(3, 4), torch.randn(1, 4)), ["add", "clamp", "mul", "sigmoid", "cat", "mul"]),
    "cat_dim0_of_results": (lambda m, x, y: torch.cat([x.tanh(), y + 1], 0), (torch.randn(2, 4), torch.randn(3, 4)),
                            ["tanh", "add", "cat"]),
    "cat_of_a_result_read_twice": (lambda m, x: (lambda r: torch.cat([r, r * 2], 1))(x.relu()), (torch.randn(3, 4),),
                                   ["relu", "mul", "cat"]),
    "cat_of_a_returned_result": (lambda m, x: (lambda r: (r, torch.cat([x, r], 1)))(x.exp()), (torch.randn(3, 4),),
                                 ["exp", "cat"]),
    "bmm_dot_products": (lambda m, x, y: torch.bmm(x, y.transpose(1, 2)), (torch.randn(5, 1, 37), torch.randn(5, 1, 37)),
                         ["transpose", "bmm"]),  # one dot product per batch (DeepAndWide's)
    # ... and where a row or a column is strided, none (the general loops).
    "bmm_dot_products_of_strided_rows": (lambda m, x, y: torch.bmm(x.t().unsqueeze(1), y.unsqueeze(2)),
                                         (torch.randn(37, 5), torch.randn(5, 37)), ["t", "unsqueeze", "unsqueeze", "bmm"]),
    "bmm_dot_products_of_strided_columns": (lambda m, x, y: torch.bmm(x.unsqueeze(1), y.t().unsqueeze(2)),
                                            (torch.randn(5, 37), torch.randn(37, 5)), ["unsqueeze", "t", "unsqueeze", "bmm"]),
    "dot_product_with_bias": (lambda m, x: F.linear(x, m.w[:1], m.b[:1]), (torch.randn(1, 5),), ["linear"]),
    "cat_of_a_result_listed_twice": (lambda m, x: (lambda r: torch.cat([r, r], 1))(x.relu()), (torch.randn(3, 4),),
                                     ["relu", "cat"]),
    "nested_cats": (lambda m, x, y: torch.cat([torch.cat([x.relu(), y], 1), torch.cat([x.exp(), y * 2], 1)], 0),
                    (torch.randn(3, 4), torch.randn(3, 4)), ["relu", "cat", "exp", "mul", "cat", "cat"]),
    "returns_a_view": (lambda m, x: (x + 1).t(), (torch.randn(3, 4),), ["add", "t"]),
    "returns_a_tuple": (lambda m, x: (x * 2, x.t() + 1, x * 2), (torch.randn(3, 4),), ["mul", "t", "add", "mul"]),
    # Rows behind size-1 dims, whose strides are arbitrary (review finding: rows were read at the
    # stride of a size-1 dim, past the input's end).
    "matmul_rows_behind_permuted_ones": (lambda m, x: torch.matmul(x.unsqueeze(1).unsqueeze(0).permute(1, 2, 0, 3), m.w.t()),
                                         (torch.randn(3, 5),), ["unsqueeze", "unsqueeze", "permute", "matmul"]),
}


@pytest.mark.parametrize("case", CASES)
def test_ops(case):
    forward, inputs, ops = CASES[case]
    if ops is None:  # what DecomposeOps makes of them: whatever it is, one plan
        fused = Fused(Ops(forward).eval(), inputs)
        ops = (small_plans(fused.graph) or [[]])[0]
        assert ops, fused.graph
    planned(Ops(forward), *inputs, ops=ops)


# ---- bf16: the same fp32 steps, each result rounded to bf16 as eager's bf16 kernels round theirs ----

# Where matmuls feed a rounding, the plan's fp32 sums and eager's (MKL's, oneDNN's) add in other
# orders and can round to neighbouring bf16 values (1 ulp, 0.4-0.8% relative), which later ops
# carry on: the suite's bf16 tolerance (test_bf16.py).
BF16 = dict(rtol=3e-2, atol=3e-2)
# Elementwise-only graphs compute each op in fp32 and round it, as eager does: at most one bf16
# ulp apart (transcendental functions are other fp32 approximations, which can round the other way).
BF16_ULP = dict(rtol=2 ** -7, atol=1e-6)


def bf16(model, inputs):
    return model.eval().to(torch.bfloat16), tuple(x.to(torch.bfloat16) for x in inputs)


@pytest.mark.parametrize("name", ["deep_and_wide", "deep_and_wide_64"])
def test_bf16_deep_and_wide_is_one_plan(name):
    model, inputs = bf16(*MODELS[name](1))
    fused = planned(model, *inputs, ops=DEEP_AND_WIDE_OPS, **BF16)
    assert fused.output.dtype == torch.bfloat16


@pytest.mark.parametrize("case", ["scalar_operands", "add_sub_alpha", "broadcast_both", "unary", "more_unary", "log_sqrt",
                                  "maximum_minimum", "views", "cat", "cat_of_results", "cat_of_a_result_read_twice",
                                  "nested_cats"])
def test_bf16_elementwise_rounds_every_op_as_eager(case):
    forward, inputs, ops = CASES[case]
    module, inputs = bf16(Ops(forward), inputs)
    fused = planned(module, *inputs, ops=ops, **BF16_ULP)
    assert fused.output.dtype == torch.bfloat16


@pytest.mark.parametrize("case", ["bmm_dot_products", "dot_product_with_bias", "bmm_dot_products_of_strided_rows"])
def test_bf16_dot_products(case):
    """The dot product per batch adds its bias in fp32 and rounds once, as the general loops do."""
    forward, inputs, ops = CASES[case]
    module, inputs = bf16(Ops(forward), inputs)
    fused = planned(module, *inputs, ops=ops, **BF16)
    assert fused.output.dtype == torch.bfloat16


def test_bf16_rounds_after_each_op_not_only_at_the_end():
    """(x * 3) / 3 in bf16 is not x: the product is rounded first, as eager rounds it. Without
    that rounding the plan would return x exactly, and differ from eager."""
    def f(x):
        return x * 3 / 3

    x = (torch.arange(1, 257, dtype=torch.float32) / 7).to(torch.bfloat16)
    with torch.no_grad():
        expected = f(x)
    assert not torch.equal(expected, x)  # eager's rounding shows
    fused = planned(f, x, ops=["mul", "div"], rtol=0, atol=0)
    assert torch.equal(fused.output, expected)


def test_bf16_new_size_falls_back_then_gets_its_own_plan():
    model, inputs = bf16(*MODELS["deep_and_wide"](1))
    fused = planned(model, *inputs, ops=DEEP_AND_WIDE_OPS, **BF16)
    other = tuple(torch.randn(5, *x.shape[1:], dtype=torch.bfloat16) for x in inputs)
    before = torch_llga.stats()
    with torch_llga.enabled():
        for _ in range(3):
            torch.testing.assert_close(fused(*other), model(*other), **BF16)
    after = torch_llga.stats()
    assert after["plan_misses"] - before["plan_misses"] == 3
    assert after["plan_runs"] - before["plan_runs"] == 2
    fp32 = tuple(x.float() for x in inputs)  # an fp32 call of the bf16 plan: the guard sends it to the fallback
    with pytest.raises(RuntimeError):  # as eager does: bf16 weights, fp32 input
        model(*fp32)
    with pytest.raises(RuntimeError):
        fused(*fp32)


def test_bf16_graph_with_an_fp32_input_is_no_plan():
    """Mixed dtypes promote (bf16 + fp32 is fp32): one dtype a plan, or no plan."""
    def f(x, y):
        return torch.relu(x) + y

    x, y = torch.randn(3, 5, dtype=torch.bfloat16), torch.randn(3, 5)
    fused = Fused(f, (x, y))
    assert small_plans(fused.graph) == []
    torch.testing.assert_close(fused(x, y), f(x, y), **FP32)


@requires_bf16_kernels
def test_bf16_mlp_at_batch_1_goes_to_onednn():
    """bf16's one-row limit is lower (small_plan.h): oneDNN's bf16 dot products read half the bytes."""
    model, inputs = bf16(*MODELS["mlp"](1))
    fused = Fused(model, inputs)
    assert small_plans(fused.graph) == [] and fused.groups == [["linear", "relu"], ["linear", "relu"], ["linear"]]
    torch.testing.assert_close(fused(*inputs), model(*inputs), **BF16)


def test_bf16_eight_threads():
    model, inputs = bf16(*MODELS["deep_and_wide_64"](1))
    fused = planned(model, *inputs, ops=DEEP_AND_WIDE_OPS, **BF16)
    batches = [tuple(torch.randn(x.shape, dtype=torch.bfloat16) for x in inputs) for _ in range(8)]
    with torch.no_grad():
        expected = [fused(*b) for b in batches]  # one thread's results: the others must match them exactly
        for b, e in zip(batches, expected):
            torch.testing.assert_close(e, model(*b), **BF16)
    before = torch_llga.stats()["plan_runs"]

    def run(i):
        for _ in range(200):
            assert torch.equal(fused(*batches[i]), expected[i])

    run_in_threads(run, 8)
    assert torch_llga.stats()["plan_runs"] - before == 8 * 200


def test_too_large_for_a_plan_goes_to_onednn():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))  # 16 rows: 131K multiply-adds
    x = torch.randn(16, 64)
    fused = Fused(model.eval(), (x,))
    assert small_plans(fused.graph) == [] and fused.groups == [["linear", "relu"], ["linear"]]
    torch.testing.assert_close(fused(x), model(x), **FP32)


def test_matrix_vector_mlp_is_one_plan():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 64))  # one row: 80K multiply-adds
    planned(model, torch.randn(1, 256), ops=["linear", "relu", "linear"])


def test_mlp_at_batch_1_is_one_plan():
    """393K multiply-adds of one row: under the one-row limit (small_plan.h), split over the threads."""
    model, inputs = MODELS["mlp"](1)
    planned(model, *inputs, ops=["linear", "relu", "linear", "relu", "linear"])


@pytest.mark.parametrize("rows, width", [(4, 256), (1, 1024)], ids=["4_rows_524K", "1_row_2M"])
def test_matrix_vector_past_its_limit_goes_to_the_row_kernel_or_onednn(rows, width, monkeypatch):
    """The plan reads the weights once per row: with 4 rows of 256 (524K multiply-adds) or one row
    of 1024 (2M) torch_llga's row kernel (llga::row_linear, 0.82-0.84x the time of oneDNN's groups)
    takes the linears; with own kernels off (or no AVX2), oneDNN's groups."""
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).eval()
    x = torch.randn(rows, width)
    fused = Fused(model, (x,))
    assert small_plans(fused.graph) == []
    if AVX2:
        assert fused.groups == [] and str(fused.graph).count("llga::row_linear(") == 2
    torch.testing.assert_close(fused(x), model(x), **FP32)
    monkeypatch.setenv("TORCH_LLGA_OWN_KERNELS", "0")
    fused = Fused(model, (x,))
    assert small_plans(fused.graph) == [] and fused.groups == [["linear", "relu"], ["linear"]]
    torch.testing.assert_close(fused(x), model(x), **FP32)


def test_matmul_rows_at_no_single_stride_stay_with_pytorch():
    """[2, 1, 3, k] with strides [k, k, 2k, 1]: its 6 rows are at no one stride (review finding:
    they were read at the stride of a size-1 dim, past the input's end)."""
    w = torch.randn(5, 6)

    def f(x):
        return torch.matmul(x.transpose(0, 1).unsqueeze(2).permute(0, 2, 1, 3), w)

    x = torch.randn(3, 2, 5)
    fused = Fused(f, (x,))
    assert small_plans(fused.graph) == []
    torch.testing.assert_close(fused(x), f(x), **FP32)


@pytest.mark.parametrize("f", [lambda x: (x.view(-1), x * 2), lambda x: (lambda y: (y, y.view(-1)))(x * 2)],
                         ids=["view_of_input", "view_of_output"])
def test_outputs_that_alias_stay_views(f):
    """Eager returns a view of an input or of another output, which a caller may write through."""
    x = torch.randn(3, 4)
    fused = Fused(f, (x,))
    assert small_plans(fused.graph) == []
    outs = fused(x)
    torch.testing.assert_close(outs, f(x))
    if outs[0].data_ptr() != x.data_ptr():  # the second case: one output views the other
        assert outs[0].data_ptr() == outs[1].data_ptr()


def test_an_op_without_a_step_leaves_the_graph_to_the_fuser():
    def f(x):
        return torch.softmax(torch.relu(x) * 2, -1)

    x = torch.randn(4, 8)
    fused = Fused(f, (x,))
    assert small_plans(fused.graph) == []
    torch.testing.assert_close(fused(x), f(x), **FP32)


def test_off_switch():
    torch_llga._C._set_small_plans(False)
    model, inputs = MODELS["deep_and_wide"](1)
    fused = Fused(model.eval(), inputs)
    assert small_plans(fused.graph) == []
    assert torch_llga.config()["small_plans"] is False
    torch.testing.assert_close(fused(*inputs), model(*inputs), **FP32)


def test_explain_names_the_plan():
    model, inputs = MODELS["deep_and_wide"](1)
    report = torch_llga.explain(model, *inputs, verbose=False)
    assert report.plans == [DEEP_AND_WIDE_OPS] and report.unfused == [] and report.fused_share == 1.0
    assert "small-graph plan: 10 ops run as one native step" in str(report)


def test_through_torch_compile():
    """The torch.compile backend freezes each FX graph to TorchScript: DeepAndWide's is one plan too."""
    model, inputs = MODELS["deep_and_wide_64"](1)
    compiled = torch.compile(model.eval(), backend="torch_llga")
    with torch.no_grad():
        for _ in range(3):  # compile, profiling run, planned run
            compiled(*inputs)
        before = torch_llga.stats()["plan_runs"]
        out = compiled(*inputs)
        torch.testing.assert_close(out, model(*inputs), **FP32)
    assert torch_llga.stats()["plan_runs"] - before == 1
