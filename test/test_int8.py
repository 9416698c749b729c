"""int8: models quantized by PyTorch's own FX flow (x86 qconfig, calibrated, convert_to_reference_fx),
traced and frozen. oneDNN runs dequantize -> conv/linear/pool -> post-ops -> quantize as int8 kernels.

Tolerance, in steps of the model's output quantization scale (its last quantize_per_tensor). The
reference computes each layer in fp32 on dequantized values and rounds to the layer's scale; an int8
kernel sums exactly in int32 and rounds once, so a value near a rounding boundary may come out one
step apart, and over a deep model such flips compound. Measured: by default every requantization is
kept and torch_llga is 0 steps off on these models (ResNet-18: 0 in 9 of 10 seeds, 2 in one where
PyTorch's own int8 kernels, convert_fx x86, were 2 off too; they are 1-2 off). With
TORCH_LLGA_INT8_EXACT=0 the conv output before a residual add is not requantized
(prepare_quantization.cpp): 1 step on the small CNN, 2-3 on ResNet-18, and closer to the fp32 model
than the reference is. A wrong scale, zero point, axis or layout is off by tens of steps.
"""
import collections
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from resnet import resnet18
from torch.ao.quantization import QConfig, QConfigMapping, get_default_qconfig_mapping
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver
from torch.ao.quantization.quantize_fx import convert_to_reference_fx, prepare_fx

import torch_llga
from conftest import AVX2, CPU, OWN_QUANTIZED_POOL, Fused, check, requires_int8_kernels, SOME

# torch.ao.quantization and quantized tensors are deprecated in torch 2.14 (with warnings); they work.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


def calibrated(model, example, qconfig_mapping=None):
    """model prepared for quantization the way PyTorch users do it, calibrated on a few batches."""
    prepared = prepare_fx(model.eval(), qconfig_mapping or get_default_qconfig_mapping("x86"), (example,))
    with torch.no_grad():
        for _ in range(3):
            prepared(torch.randn_like(example))
    return prepared


def quantized(model, example, qconfig_mapping=None):
    """The reference quantized model: quantize -> dequantize around fp32 ops."""
    return convert_to_reference_fx(calibrated(model, example, qconfig_mapping))


def output_step(reference):
    """The scale of the reference model's last quantize: one step of its output."""
    last = [n for n in reference.graph.nodes if n.op == "call_function" and n.target == torch.quantize_per_tensor][-1]
    return float(getattr(reference, last.args[1].target))


def sorted_groups(fused):
    return [sorted(g) for g in fused.groups]


def weight_zero_points(graph):
    """The zero points of the frozen quantized weights the graph's dequantize nodes read."""
    zps = []
    for n in graph.nodes():
        if n.kind() == "aten::dequantize" and n.input().node().kind() == "prim::Constant":
            w = n.input().toIValue()
            zps.append(w.q_per_channel_zero_points() if w.qscheme() == torch.per_channel_affine
                       else torch.tensor([w.q_zero_point()]))
    return zps


def steps(a, b, step):
    return ((a - b).abs().max() / step).item()


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn, self.relu = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()
        self.conv2, self.relu2 = nn.Conv2d(16, 16, 3, padding=1), nn.ReLU()
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        y = self.relu(self.bn(self.conv1(x)))
        z = self.relu2(self.conv2(y) + y)
        return self.fc(self.pool(z).flatten(1))


class Residual(nn.Module):
    """A ResNet block: the residual add reads the block's input and its second conv's output."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.conv1, self.conv2 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.stem(x))
        return F.relu(self.conv2(F.relu(self.conv1(x))) + x)


def mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def within_steps(reference, n):
    """check()'s tolerance: n output steps (and a hair for the fp32 dequantize of the last step)."""
    return dict(rtol=0, atol=n * output_step(reference) * 1.0001)


@requires_int8_kernels
def test_small_cnn_int8_patterns():
    x = torch.randn(2, 3, 16, 16)
    ref = quantized(SmallCNN(), x)
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    # conv+bn(folded) (its ReLU goes: the grid after it starts at 0, PrepareQuantization); conv (its
    # residual add reads the conv's own input, y: an int8 sum post-op oneDNN 3.12 cannot compile, so
    # the conv is requantized and the add is PyTorch's int8 add); pool; linear
    assert sorted_groups(fused) == [
        ["_convolution", "dequantize", "dequantize", "quantize_per_tensor"],
        ["_convolution", "dequantize", "dequantize", "quantize_per_tensor"],
        ["dequantize", "max_pool2d", "quantize_per_tensor"],
        ["dequantize", "dequantize", "linear", "quantize_per_tensor"],
    ], fused.graph
    # Left to PyTorch: the input's quantize, the flatten between pool and linear (of the pool's
    # codes: llga::requantize takes them to the linear's grid), the output's dequantize; and the
    # residual add as one quantized::add (its ReLU gone as the first conv's).
    assert sorted(fused.unfused) == ["dequantize", "flatten", "quantize_per_tensor"]
    assert len(fused.graph.findAllNodes("llga::requantize", True)) == 1
    assert fused.graph.findAllNodes("quantized::add", True)


class FlattenRequantized(nn.Module):
    def forward(self, x):
        return torch.quantize_per_tensor(torch.flatten(x.dequantize(), 1), 0.05, 3, torch.quint8).dequantize()


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_a_reshape_between_grids_requantizes_per_tensor_codes_only(per_channel):
    # Per-tensor codes of a known grid: the flatten reads them and llga::requantize moves them to the
    # quantize's grid, PyTorch's codes. Per-channel codes (a type does not tell them apart) keep
    # PyTorch's dequantize: their flatten would keep the channel axis and its scales.
    x = torch.randn(2, 3, 4)
    if per_channel:
        codes = torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1, 2]), 1, torch.quint8)
        model = FlattenRequantized()
    else:
        codes = x

        class Model(nn.Module):
            def forward(self, x):
                return FlattenRequantized()(torch.quantize_per_tensor(x, 0.03, 7, torch.quint8))
        model = Model()
    fused = check(model, codes, groups=[], rtol=0, atol=0)
    assert len(fused.graph.findAllNodes("llga::requantize", True)) == (0 if per_channel else 1)


def test_requantized_codes_keep_their_known_top():
    # Codes below 128 let an int8 conv or linear run without VNNI (prepare_quantization.cpp): a clamp
    # at 1 quantized at 0.03 + 7 gives codes up to 40, which requantized at 0.05 + 3 stay up to 23.
    class Model(nn.Module):
        def forward(self, x):
            return FlattenRequantized()(torch.quantize_per_tensor(torch.clamp(x, 0, 1), 0.03, 7, torch.quint8))
    fused = check(Model(), torch.randn(2, 3, 4), groups=[], rtol=0, atol=0)
    (requantize,) = fused.graph.findAllNodes("llga::requantize", True)
    dequantize = requantize.output().uses()[0].user
    assert dequantize.kind() == "aten::dequantize" and dequantize.i("llga_max_code") == 23


@requires_int8_kernels
def test_default_keeps_every_requantization():
    # The conv's output is requantized before the residual add, as in the reference; the add (no int8
    # add partition in oneDNN, 3.12 included) is PyTorch's int8 add, one pass instead of dequantize,
    # dequantize, add, quantize. The ReLUs go: their grids start at 0 (PrepareQuantization). Measured
    # here: 0 steps off.
    x = torch.randn(2, 3, 16, 16)
    ref = quantized(Residual(), x)
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    conv = ["_convolution", "dequantize", "dequantize", "quantize_per_tensor"]
    assert sorted_groups(fused) == [conv, conv, conv]
    assert "add" not in fused.unfused and len(fused.graph.findAllNodes("quantized::add", True)) == 1


@requires_int8_kernels
def test_fast_mode_adds_residuals_as_post_ops(monkeypatch):
    # TORCH_LLGA_INT8_EXACT=0: the conv's output goes to the add unrequantized, and the add joins the
    # conv's int8 kernel as a post-op: one step off the reference here.
    monkeypatch.setenv("TORCH_LLGA_INT8_EXACT", "0")
    x = torch.randn(2, 3, 16, 16)
    ref = quantized(Residual(), x)
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    conv = ["_convolution", "dequantize", "dequantize", "quantize_per_tensor"]
    assert sorted_groups(fused) == [conv, conv, ["_convolution", "add", "dequantize", "dequantize", "dequantize", "quantize_per_tensor"]]
    assert not fused.graph.findAllNodes("quantized::add", True)


class AddReluOnGrid(nn.Module):
    """relu(dequantize(a) + dequantize(b)) quantized to 0.05 and zero_point."""

    def __init__(self, zero_point):
        super().__init__()
        self.zero_point = zero_point

    def forward(self, a, b):
        return torch.quantize_per_tensor(F.relu(a.dequantize() + b.dequantize()), 0.05, self.zero_point, torch.quint8)


@pytest.mark.parametrize("zero_point", [0, 10])
def test_an_int8_add_keeps_its_relu_where_the_grid_needs_it(zero_point):
    # One int8 add in PyTorch either way: quantized::add where the grid's zero point clamps at 0
    # already (the ReLU goes), quantized::add_relu where the grid reaches below 0 (codes under 10).
    a, b = (torch.quantize_per_tensor(torch.randn(1, 8, 6, 6) * 2, 0.04, 128, torch.quint8) for _ in range(2))
    fused = check(AddReluOnGrid(zero_point), a, b, groups=[], rtol=0, atol=0)
    assert len(fused.graph.findAllNodes("quantized::add_relu" if zero_point else "quantized::add", True)) == 1
    assert not fused.graph.findAllNodes("quantized::add" if zero_point else "quantized::add_relu", True)
    assert fused(a, b).int_repr().min() == zero_point  # negative sums reach the ReLU's 0


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand + BN + ReLU6, 3x3 depthwise + BN + ReLU6, 1x1 project + BN."""

    def __init__(self):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(16, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6())
        self.depthwise = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False), nn.BatchNorm2d(64), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(64, 16, 1, bias=False), nn.BatchNorm2d(16))

    def forward(self, x):
        return self.project(self.depthwise(self.expand(x)))


@requires_int8_kernels
def test_relu6_joins_its_conv():
    # FX observes ReLU6 apart from its conv: quantize -> dequantize -> hardtanh -> quantize, both
    # quantizes with the same parameters. The pair is dropped (prepare_quantization.cpp: the same codes)
    # and hardtanh becomes a post-op of the conv's int8 kernel, instead of three PyTorch passes.
    x = torch.randn(1, 16, 14, 14)
    ref = quantized(InvertedResidual(), x)
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    conv_relu6 = ["_convolution", "dequantize", "dequantize", "hardtanh", "quantize_per_tensor"]
    assert sorted_groups(fused) == [conv_relu6, conv_relu6, ["_convolution", "dequantize", "dequantize", "quantize_per_tensor"]]
    # Left to PyTorch: the input's quantize and the output's dequantize only.
    assert sorted(fused.unfused) == ["dequantize", "quantize_per_tensor"], fused.unfused


class ConvClipOnGrid(nn.Module):
    """conv -> hardtanh(lo, hi) -> quantize on a grid of (scale, zero_point), as a reference model."""

    def __init__(self, lo, hi, scale, zero_point):
        super().__init__()
        self.conv, self.lo, self.hi, self.grid = nn.Conv2d(8, 16, 3, padding=1), lo, hi, (scale, zero_point)

    def forward(self, x):
        x = torch.quantize_per_tensor(x, 0.05, 128, torch.quint8).dequantize()
        w = torch.quantize_per_channel(self.conv.weight, self.conv.weight.abs().amax((1, 2, 3)) / 127,
                                       torch.zeros(16, dtype=torch.long), 0, torch.qint8).dequantize()
        y = F.hardtanh(F.conv2d(x, w, self.conv.bias, padding=1), self.lo, self.hi)
        return torch.quantize_per_tensor(y, *self.grid, torch.quint8).dequantize()


# (lo, hi, scale, zero point): the grid of [0, 6] and a narrower one make ReLU6's clip anyway; a
# wider grid needs its top, one below zero its bottom.
CLIP_GRIDS = {"grid_0_6": (0., 6., 6 / 255, 0), "narrower": (0., 6., 3 / 255, 0),
              "wider": (0., 6., 12 / 255, 0), "below_zero": (0., 6., 7 / 255, 36)}


@requires_int8_kernels
@pytest.mark.parametrize("case", CLIP_GRIDS)
def test_a_clip_the_grid_makes_goes(case):
    # A clip goes where the output's codes saturate at or inside its bounds (PrepareQuantization);
    # elsewhere the int8 kernel runs it (without it, codes beyond the bounds would be tens of steps off).
    lo, hi, scale, zero_point = CLIP_GRIDS[case]
    torch.manual_seed(0)
    # Conv outputs well beyond both bounds; channels-last, the layout the int8 primitives read.
    x = (torch.randn(1, 8, 12, 12) * 3).contiguous(memory_format=torch.channels_last)
    model = ConvClipOnGrid(lo, hi, scale, zero_point)
    fused = check(model, x, groups=SOME, rtol=0, atol=scale * 1.0001)
    kept = case in ("wider", "below_zero")
    assert sorted_groups(fused) == [["_convolution", "dequantize", "dequantize", *(["hardtanh"] if kept else []), "quantize_per_tensor"]]
    code = f"""
import sys, torch, torch_llga
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_int8 import ConvClipOnGrid
torch_llga.enable()
with torch.no_grad():
    x = torch.randn(1, 8, 12, 12).contiguous(memory_format=torch.channels_last)
    m = torch.jit.freeze(torch.jit.trace(ConvClipOnGrid{CLIP_GRIDS[case]!r}.eval(), x))
    for _ in range(3):
        m(x)
"""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ONEDNN_VERBOSE": "1"}, capture_output=True,
                         text=True, check=True).stdout
    convs = [line for line in out.splitlines() if line.startswith("onednn_verbose,v1,primitive,exec,cpu,convolution,")]
    assert convs and all(("eltwise_clip" in line) == kept for line in convs), convs


@requires_int8_kernels
def test_mlp_int8():
    x = torch.randn(4, 64)
    ref = quantized(mlp(), x)
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    # The ReLUs go: the grids after them start at 0 (PrepareQuantization).
    assert sorted_groups(fused) == [["dequantize", "dequantize", "linear", "quantize_per_tensor"]] * 3


def per_tensor_mlp():
    """The MLP quantized with per-tensor symmetric weights and activations over all 8 bits, its input."""
    qconfig = QConfig(activation=MinMaxObserver.with_args(dtype=torch.quint8),
                      weight=MinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric))
    x = torch.randn(4, 64)
    return quantized(mlp(), x, QConfigMapping().set_global(qconfig)), x


@requires_int8_kernels
def test_per_tensor_weights():
    ref, x = per_tensor_mlp()
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    assert len(fused.groups) == 3 and all("linear" in g and "quantize_per_tensor" in g for g in fused.groups)


def test_int8_weights_without_vnni_run_in_fp32():
    # Without VNNI, oneDNN's int8 kernels add u8 x s8 products in saturating 16-bit pairs: with
    # activations over all 8 bits (no reduce_range) a linear came out 14-53 steps off. There the
    # int8 weights stay PyTorch's and the linears run fused in fp32 (quirks::int8_without_vnni).
    ref, x = per_tensor_mlp()
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    assert sum(g.count("linear") for g in fused.groups) == 3
    groups = fused.graph.findAllNodes("llga::FusionGroup", True)
    int8_weights = [zp for g in groups for zp in weight_zero_points(g.g("Subgraph"))]
    assert len(int8_weights) == (3 if CPU["int8_vnni"] else 0)


def test_quantize_of_a_layer_norm_stays_apart():
    # oneDNN writes a layer norm's quantized output only in its reference kernel, 100-300x slower
    # than its jit layer norm (quirk layer_norm_quantized_output): the quantize of its output is
    # PyTorch's, and the layer norm runs torch_llga's own kernel (less than a partition of one op
    # costs around it), or is fused alone where that kernel does not run (no AVX2).
    model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 32))
    x = torch.randn(2, 16, 64)
    ref = quantized(model, x)
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    assert not [g for g in fused.groups if "layer_norm" in g and "quantize_per_tensor" in g], fused.groups
    own = fused.graph.findAllNodes("llga::layer_norm", True)
    assert len(own) == (1 if AVX2 else 0), fused.graph
    assert (["layer_norm"] in fused.groups) == (not AVX2), fused.groups


@pytest.mark.parametrize("weight_qscheme", [torch.per_channel_affine, torch.per_tensor_affine])
def test_asymmetric_weights_stay_fp32(weight_qscheme):
    # oneDNN's int8 kernels take symmetric weights only: a weight with zero points is dequantized
    # once, when the graph is prepared, into an fp32 constant, and the linear runs fused in fp32
    # (no int8 pattern), still correct; PyTorch dequantizes no weight on each call.
    observer = PerChannelMinMaxObserver if weight_qscheme == torch.per_channel_affine else MinMaxObserver
    qconfig = QConfig(activation=MinMaxObserver.with_args(dtype=torch.quint8),
                      weight=observer.with_args(dtype=torch.qint8, qscheme=weight_qscheme))
    model = mlp()
    with torch.no_grad():  # weights in [0, 2 max|w|]: zero points of -128, asymmetric for certain
        for linear in (m for m in model.modules() if isinstance(m, nn.Linear)):
            linear.weight += linear.weight.abs().amax()
    x = torch.randn(4, 64)
    ref = quantized(model, x, QConfigMapping().set_global(qconfig))
    fused = Fused(ref, (x,))
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ref(x), **within_steps(ref, 1))

    groups = fused.graph.findAllNodes("llga::FusionGroup", True)
    assert not [zp for g in groups for zp in weight_zero_points(g.g("Subgraph"))]  # no int8 weight in oneDNN
    assert not weight_zero_points(fused.graph)  # nor one PyTorch dequantizes on every call
    assert sum(g.count("linear") for g in fused.groups) == 3


def test_dequantized_input_of_an_fp32_weight_conv():
    # Asymmetric per-channel conv weights: oneDNN takes them in fp32 only (folded once to fp32
    # constants). Its partitioning then crashed on dequantize(src) -> conv(fp32 weights), the
    # weights having no producer op (quirk dequantized_src_of_fp32_conv): that dequantize stays in
    # PyTorch and the conv runs fused in fp32.
    qconfig = QConfig(activation=MinMaxObserver.with_args(dtype=torch.quint8),
                      weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_affine))
    x = torch.randn(2, 3, 16, 16)
    ref = quantized(SmallCNN(), x, QConfigMapping().set_global(qconfig))
    fused = check(ref, x, **within_steps(ref, 1), groups=SOME)
    assert sum(g.count("_convolution") for g in fused.groups) == 2
    assert not weight_zero_points(fused.graph)


class QuantizedHead(nn.Module):
    """An int8 classifier head written with quantized tensors: 7-bit codes in, fp32 logits out."""

    def __init__(self, k=256, n=64):
        super().__init__()
        w = torch.randn(n, k) / 16
        scales = w.abs().amax(1) / 127
        self.w = torch.quantize_per_channel(w, scales, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        self.b = torch.randn(n)

    def forward(self, x):
        q = torch.quantize_per_tensor(torch.clamp(torch.relu(x), max=127 * 0.02), 0.02, 0, torch.quint8)
        return F.linear(q.dequantize(), self.w.dequantize(), self.b)


def test_int8_head_called_with_another_rank():
    # Without VNNI the head's 4 rows run as a 1x1 conv (Int8LinearsAsConvolutions), its reshapes outside the
    # group's guard: a call with 2 x 3 rows gets linear's [2, 3, 64], the reference's values.
    model = QuantizedHead().eval()
    fused = Fused(model, (torch.randn(4, 256),))
    head = ["dequantize", "dequantize", "linear"] if torch_llga.config()["int8_vnni"] else ["conv2d", "dequantize", "dequantize"]
    assert head in sorted_groups(fused)
    for x in (torch.randn(4, 256), torch.randn(2, 3, 256), torch.randn(256)):
        with torch.no_grad():
            torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)


@requires_int8_kernels
@pytest.mark.parametrize("policy", ["compile", "fallback"])
def test_other_batch_size(policy):
    # "compile": the int8 groups compile for the new sizes (quantized outputs come back contiguous);
    # "fallback": quantized tensors cross group boundaries as PyTorch quantized tensors, so the
    # guards' fallbacks run PyTorch's ops on them.
    x = torch.randn(2, 3, 16, 16)
    ref = quantized(SmallCNN(), x)
    fused = Fused(ref, (x,))
    other = torch.randn(3, 3, 16, 16)
    previous = torch_llga.shape_policy()
    torch_llga.set_shape_policy(policy)
    try:
        before = torch_llga.stats()
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(fused(other), ref(other), **within_steps(ref, 1))
        after = torch_llga.stats()
    finally:
        torch_llga.set_shape_policy(previous)
    if policy == "compile":
        assert after["guard_failures"] == before["guard_failures"] and after["compilations"] > before["compilations"]
        assert after["kernel_fallbacks"] == before["kernel_fallbacks"]
    else:
        assert after["guard_failures"] > before["guard_failures"]


@requires_int8_kernels
@pytest.mark.parametrize("exact", ["1", "0"])
def test_resnet18_int8(exact, monkeypatch):
    monkeypatch.setenv("TORCH_LLGA_INT8_EXACT", exact)
    model = resnet18().eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        fp32 = model(x)
    ref = quantized(model, x)
    if exact == "1":
        # The default. Measured over 10 seeds: 0 steps off the reference in 9, 2 in one (where
        # PyTorch's own int8 kernels were 2 off too).
        fused = check(ref, x, rtol=0, atol=2 * output_step(ref) * 1.0001, groups=SOME)
        assert len(fused.graph.findAllNodes("quantized::add", True)) == 8  # every residual add, one pass
    else:
        # Up to 3 steps off the reference (measured over 10 seeds: 2-3, mean 0.5-0.65 steps): the
        # conv's output is not requantized before its residual add, so the rounding differs from
        # there on. What matters is not worse for it: as close to the fp32 model.
        fused = check(ref, x, rtol=0, atol=3 * output_step(ref) * 1.0001, groups=SOME)
        with torch.no_grad():
            rms = {name: (y - fp32).pow(2).mean().sqrt().item() for name, y in (("llga", fused(x)), ("reference", ref(x)))}
        assert rms["llga"] <= rms["reference"], rms  # measured: 5-15% closer
    ops = collections.Counter(op for g in fused.groups for op in g)
    assert ops["_convolution"] == sum(isinstance(m, nn.Conv2d) for m in model.modules())  # all 20
    assert ops["add"] == (0 if exact == "1" else 8)  # fast: every residual add joined its conv
    for g in fused.groups:  # every group is an int8 kernel: int8 in, int8 out
        assert "dequantize" in g and "quantize_per_tensor" in g, g
    # The stem's max pool: a group, or (AVX-512) the own kernel of the codes' maxima.
    assert "linear" in ops and ("max_pool2d" in ops) != OWN_QUANTIZED_POOL
    assert len(fused.graph.findAllNodes("llga::quantized_max_pool2d", True)) == OWN_QUANTIZED_POOL


@requires_int8_kernels
def test_int8_kernels_are_not_reference_ones():
    # A channels-last int8 tensor with N = 1 once reached oneDNN with an N stride that made it read
    # the layout as "cdab": int8 max-pool then ran its reference kernel (ResNet-18 int8 3x slower).
    code = f"""
import sys, torch, torch_llga
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_int8 import SmallCNN, quantized
x = torch.randn(1, 3, 16, 16)
ref = quantized(SmallCNN(), x)
torch_llga.enable()
with torch.no_grad():
    m = torch.jit.freeze(torch.jit.trace(ref, x))
    for _ in range(3):
        m(x)
"""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ONEDNN_VERBOSE": "1"}, capture_output=True,
                         text=True, check=True).stdout
    executions = [line for line in out.splitlines() if line.startswith("onednn_verbose,v1,primitive,exec,")]
    assert any(",pooling," in line for line in executions)
    assert not [line for line in executions if ",ref:" in line]
