"""int8 the way PyTorch documents it now: torchao's PT2E flow (torch.export -> prepare_pt2e with
X86InductorQuantizer -> calibrate -> convert_pt2e), run through torch.compile(backend="torch_llga")
and torch_llga.compile(torch.export.export(...)). torch_llga/_pt2e.py rewrites PT2E's
quantized_decomposed ops as the quantized tensors the int8 path reads (test_int8.py: FX's flow).

Tolerance. The X86 quantizer leaves a model's output in fp32 (its last linear's output is not
quantized), so the output step of test_int8.py does not exist; what can differ is the input of that
last linear, in steps of its quantize scale (an int8 kernel sums exactly and rounds once, the
reference rounds fp32 sums: values at a rounding boundary flip, FX's ResNet-18 measured 0-2 steps).
Allowed: up to 32 of those inputs off by up to 2 steps each, so an output moves by at most
2 * scale * (the sum of the 32 largest |w| of its weight row). Without VNNI (fp32 kernels between
PyTorch's quantize ops) ResNet-18 at 32x32 came out 0.029 off, under this bound of about 0.06; a
wrong scale or zero point is off by tens of steps.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga
from torch_llga.report import own_kernels
from conftest import AVX2, AVX512_KERNELS, CPU, OWN_QUANTIZED_POOL, requires_int8_kernels
from resnet import resnet18

pytest.importorskip("torchao")
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pt2e(model, example, **config):
    """The PT2E reference: exported, prepared with the X86 quantizer, calibrated, converted."""
    # strict: non-strict export of a module that reuses one ReLU (torchvision's BasicBlock) gives a
    # graph X86InductorQuantizer rejects ("Input partition has more than one output node").
    exported = torch.export.export(model.eval(), (example,), strict=True).module()
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config(**config))
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn_like(example))
    return convert_pt2e(prepared)


def last_linear_tolerance(reference, steps, flipped=32):
    """atol for `flipped` inputs of the last linear `steps` steps off (see the module's note)."""
    nodes = list(reference.graph.nodes)
    linear = [n for n in nodes if n.target is torch.ops.aten.linear.default][-1]
    dequantize = linear.args[0]  # dequantize_per_tensor(quantize_per_tensor(x, scale, ...), scale, ...)
    scale = dequantize.args[1]
    weight = linear.args[1]  # dequantize_per_channel(int8, scales, zero points, ...)
    int8, scales = (getattr(reference, a.target) for a in weight.args[:2])
    weights = (int8.float() * scales[:, None]).abs()
    largest = weights.topk(min(flipped, weights.shape[1]), dim=1).values.sum(1).max().item()
    return dict(rtol=0, atol=steps * scale * largest * 1.0001 + 1e-6)


def groups_of(graph):
    return sorted(sorted(n.kind().split("::")[1] for n in g.g("Subgraph").nodes() if n.kind() != "prim::Constant")
                  for g in graph.findAllNodes("llga::FusionGroup", True))


def int8_row_linear_group():
    """The group of an int8 linear of a few rows, fp32 out: without VNNI a 1x1 conv (Int8LinearsAsConvolutions)."""
    return ["dequantize", "dequantize", "linear"] if torch_llga.config()["int8_vnni"] else ["conv2d", "dequantize", "dequantize"]


def left_in_pytorch(graph):
    return sorted(n.kind() for n in graph.nodes() if n.kind().split("::")[0] in ("aten", "quantized_decomposed"))


def warm(compiled, x):
    """Compile, profiling run, fused run: the fused run's output and its optimized graph."""
    with torch.no_grad():
        compiled(x), compiled(x)
        before = torch_llga.stats()["executions"]
        out = compiled(x)
        assert torch_llga.stats()["executions"] > before
    return out, torch.jit.last_executed_optimized_graph()


def fused_pt2e(model, x, **config):
    """The model quantized by PT2E, through torch.compile(backend="torch_llga"), checked against the
    PT2E reference within 2 steps (the module's note): its fused run's optimized graph."""
    reference = pt2e(model, x, **config)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))
    return graph


class TinyEncoder(nn.Module):
    """A transformer encoder layer written out (projections, attention, GELU MLP, two layer norms)."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.head = nn.Linear(d, 8)

    def attention_block(self, x):
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        attention = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        return self.ln1(x + self.o(attention.transpose(1, 2).reshape(b, s, d)))

    def forward(self, x):
        x = self.attention_block(x)
        x = self.ln2(x + self.fc2(F.gelu(self.fc1(x))))
        return self.head(x)


def test_pt2e_quantize_ops_become_quantized_tensors():
    # Every quantize/dequantize of the X86 quantizer's default config (u8 activations, symmetric
    # per-channel s8 weights) is rewritten; with VNNI each one lands in an int8 group, without it the
    # weights are fp32 constants (test_int8.py::test_int8_weights_without_vnni_run_in_fp32).
    graph = fused_pt2e(resnet18(), torch.randn(1, 3, 32, 32))
    assert not [k for k in left_in_pytorch(graph) if k.startswith("quantized_decomposed")]
    convs = sum(g.count("_convolution") for g in groups_of(graph))
    assert convs == 20  # every conv fused


@requires_int8_kernels
def test_pt2e_resnet18_runs_int8_kernels():
    graph = fused_pt2e(resnet18(), torch.randn(1, 3, 32, 32))
    groups = groups_of(graph)
    # conv (+ residual add) + relu, int8 in and out: the quantizer annotates conv-add-relu as one
    # pattern, so the residual add is a post-op of the conv's int8 kernel, as in Inductor.
    assert sum(g.count("_convolution") for g in groups) == 20
    assert sum(g.count("add") for g in groups) == 8
    assert ["dequantize", "dequantize", "linear"] in groups  # the head: int8 in, fp32 logits out
    for g in groups:
        assert g == ["dequantize", "dequantize", "linear"] or ("dequantize" in g and "quantize_per_tensor" in g), g
    # Left to PyTorch: the input's quantize, and the flatten between the pool's and the linear's
    # int8 groups, of the pool's codes (PT2E's dequantize and quantize around it give them back).
    assert left_in_pytorch(graph) == ["aten::flatten", "aten::quantize_per_tensor"], left_in_pytorch(graph)


def image_classifier():
    """A CNN in brief: a strided conv of an RGB image, ReLU, pooled, a linear head."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(16, 10))


def test_pt2e_quantized_image_goes_to_onednn_channels_last():
    # The model's quantized input image (NCHW, 1-4 channels), which only the first conv reads, is
    # interleaved to NHWC by torch_llga before that conv's partition reads it, as an fp32 image is
    # (image_to_channels_last): oneDNN's own reorder took 30 us for MobileNetV2's 1x3x224x224 codes.
    # Without VNNI, as the quantizer advises there, 7-bit activations (reduce_range): the int8
    # kernels then take u8 codes (quirk int8_without_vnni), each output clamped to code 127.
    graph = fused_pt2e(image_classifier(), torch.randn(1, 3, 64, 64), reduce_range=not CPU["int8_vnni"])
    # (its ReLU gone: the grid after it starts at 0, PrepareQuantization)
    conv = ["_convolution", "dequantize", "dequantize", "quantize_per_tensor"] if CPU["int8_vnni"] else \
        ["_convolution", "clamp", "dequantize", "dequantize", "quantize_per_tensor"]
    assert conv in groups_of(graph), groups_of(graph)
    code = f"""
import sys, torch
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_pt2e import image_classifier, pt2e, warm
x = torch.randn(1, 3, 64, 64)
warm(torch.compile(pt2e(image_classifier(), x, reduce_range={not CPU["int8_vnni"]}), backend="torch_llga"), x)
"""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "TORCH_LLGA_SMALL_PLANS": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    # The conv runs as a partition, or (an int8 conv group on a CPU with VNNI: int8_primitive.h) as a
    # primitive; either reads the codes NHWC.
    # (the image's conv: without VNNI the head's linear is a 1x1 convolution partition too)
    partitions = [line for line in out.splitlines()
                  if line.startswith("onednn_verbose,v1,graph,exec,") and "convolution" in line and "1x3x64x64" in line]
    assert all("in0_u8" in line and "1x3x64x64:12288s1s192s3" in line for line in partitions), partitions
    primitives = [line for line in out.splitlines() if line.startswith("onednn_verbose,v1,primitive,exec,")]
    first_convs = [line for line in primitives if ",convolution," in line and "mb1_ic3oc" in line and "ih64" in line]
    assert all("src:u8::blocked:acdb:" in line for line in first_convs), first_convs
    assert partitions or first_convs
    assert not [line for line in primitives if ",reorder," in line and "1x3x64x64" in line]


@requires_int8_kernels
def test_pt2e_encoder_linears_run_int8():
    graph = fused_pt2e(TinyEncoder(), torch.randn(2, 16, 64))
    int8_linears = [g for g in groups_of(graph) if "linear" in g and "dequantize" in g]
    assert sum(g.count("linear") for g in int8_linears) == 5  # q, k and v as one (MergeParallelLinears)


class Projections(nn.Module):
    """q, k and v of one input (k and v narrower, as grouped-query attention's); a gate whose output
    a relu reads (its kernel's post-op: it stays its own group); a linear whose output a view folds
    (`view(b, -1)`: no slice of a wider output suits it, so it stays its own too)."""

    def __init__(self, d=64):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d // 2), nn.Linear(d, d // 2)
        self.gate, self.flat = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        heads = lambda t: t.view(b, s, -1, 16).transpose(1, 2)  # noqa: E731
        return heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), F.relu(self.gate(x)), self.flat(x).view(b, -1)


@requires_int8_kernels
def test_pt2e_parallel_int8_linears_merge():
    # q, k and v (one quantized input, constant per-channel weights) run as one int8 matmul over
    # their stacked weights, each output a slice of its columns: the same codes, scales and bias
    # per column, so each is the reference's up to fp32 rounding (the reference sums the
    # dequantized products in fp32, the kernel the codes' in int32).
    x = torch.randn(2, 16, 64)
    reference = pt2e(Projections(), x)
    compiled = torch_llga.compile(torch.export.export(reference, (x,)))
    out, graph = warm(compiled, x)
    linears = [g for g in groups_of(graph) if "linear" in g]
    plain = ["dequantize", "dequantize", "linear"]
    assert linears == [plain, plain, plain + ["relu"]], linears  # q, k and v as one; flat; gate
    slices = graph.findAllNodes("aten::slice")
    assert len(slices) == 3 and len({next(s.inputs()).unique() for s in slices}) == 1
    with torch.no_grad():
        expected = reference(x)
    assert len(out) == len(expected) == 5
    for got, want in zip(out, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pt2e_through_torch_export():
    # The converted model exported again and run by torch_llga.compile: the same rewrite.
    x = torch.randn(2, 16, 64)
    reference = pt2e(TinyEncoder(), x)
    compiled = torch_llga.compile(torch.export.export(reference, (x,)))
    out, graph = warm(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))
    assert not [k for k in left_in_pytorch(graph) if k.startswith("quantized_decomposed")]
    assert sum(g.count("linear") for g in groups_of(graph)) == 5


def test_pt2e_reduce_range_runs_int8_kernels_on_every_cpu():
    # reduce_range (7-bit activations, the quantizer's advice for CPUs without VNNI): each quantize
    # becomes a clamp at code 127 and a quantize, which oneDNN's int8 kernels take as post-ops; u8
    # codes below 128 cannot overflow the 16-bit pair sums of kernels without VNNI
    # (quirk int8_without_vnni), so the weights stay int8 on every CPU.
    # A pool of 7-bit codes needs no clamp (oneDNN cannot compile an int8 pool with one): its
    # partitions compile, and the convs after it read codes known below 128.
    x = torch.randn(1, 3, 32, 32)
    reference = pt2e(resnet18(), x, reduce_range=True)
    fallbacks = torch_llga.stats()["kernel_fallbacks"]
    compiled = torch.compile(reference, backend="torch_llga")
    out, graph = warm(compiled, x)
    assert torch_llga.stats()["kernel_fallbacks"] == fallbacks
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))
    groups = groups_of(graph)
    # The stem's max pool: a group, or (AVX-512) the own kernel of the codes' maxima.
    assert (["dequantize", "max_pool2d", "quantize_per_tensor"] in groups) != OWN_QUANTIZED_POOL
    assert len(graph.findAllNodes("llga::quantized_max_pool2d", True)) == OWN_QUANTIZED_POOL
    assert sum(g.count("_convolution") for g in groups) == 20
    assert int8_row_linear_group() in groups  # the head: int8 in, fp32 logits out
    int8_groups = [g for g in groups if g.count("dequantize") >= 2 and "quantize_per_tensor" in g]
    assert sum(g.count("_convolution") for g in int8_groups) == 20, groups
    assert sum(g.count("clamp") for g in int8_groups) >= 17  # every conv's output clamped to 7 bits in its kernel
    assert not [k for k in left_in_pytorch(graph) if k.startswith("quantized_decomposed")]
    # Each block's residual add accumulates into the codes it adds (no copy of them first).
    with torch.no_grad():
        before = torch_llga.stats()["inplace_outputs"]
        compiled(x)
    assert torch_llga.stats()["inplace_outputs"] - before == 8


class Residual(nn.Module):
    """A residual block, then a conv; with the block's added tensor y read again afterwards, by c4."""

    def __init__(self, read_later):
        super().__init__()
        self.read_later = read_later
        self.c0 = nn.Conv2d(3, 16, 3, padding=1)
        self.c1, self.c2, self.c3, self.c4 = (nn.Conv2d(16, 16, 3, padding=1) for _ in range(4))

    def forward(self, x):
        y = torch.relu(self.c0(x))
        block = torch.relu(self.c2(torch.relu(self.c1(y))) + y)
        return self.c3(block) + self.c4(y) if self.read_later else self.c3(block)


@pytest.mark.parametrize("read_later", [False, True])
def test_pt2e_residual_add_in_place_unless_read_later(read_later):
    # The add's output takes y's memory unless something reads y afterwards (c4). Equal to the
    # reference: int8 kernels sum exactly, and fp32 adds the last two convs.
    x = torch.randn(1, 3, 16, 16)
    reference = pt2e(Residual(read_later), x, reduce_range=True)
    compiled = torch.compile(reference, backend="torch_llga")
    out, graph = warm(compiled, x)
    assert ["_convolution", "add", "clamp", "dequantize", "dequantize", "dequantize",
            "quantize_per_tensor"] in groups_of(graph), groups_of(graph)
    with torch.no_grad():
        before = torch_llga.stats()["inplace_outputs"]
        out = compiled(x)
        assert torch_llga.stats()["inplace_outputs"] - before == (0 if read_later else 1)
        torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-6)


class EncoderReturningNorm(TinyEncoder):
    """TinyEncoder that also returns its first layer norm's output, the second residual input."""

    def forward(self, x):
        h = self.attention_block(x)
        return self.head(self.ln2(h + self.fc2(F.gelu(self.fc1(h))))), h


@requires_int8_kernels
@pytest.mark.parametrize("read_later", [False, True])
def test_pt2e_encoder_residual_add_in_place_unless_read_later(read_later):
    # The second residual input, the first layer norm's output, is a dense tensor: PyTorch's quantize
    # reads it too (the layer norm's group keeps it plain). The FFN's int8 linear + add accumulates
    # into it when nothing else holds it (BERT: oneDNN's copy of it, 18 us a layer, gone); returned, it
    # must keep its values. The first residual is the model's input: the caller holds it.
    x = torch.randn(2, 16, 64)
    model = EncoderReturningNorm() if read_later else TinyEncoder()
    reference = pt2e(model, x)
    compiled = torch_llga.compile(torch.export.export(reference, (x,)))
    warm(compiled, x)
    with torch.no_grad():
        before = torch_llga.stats()["inplace_outputs"]
        out = compiled(x)
        assert torch_llga.stats()["inplace_outputs"] - before == (0 if read_later else 1)
        expected = reference(x)
        if read_later:
            torch.testing.assert_close(out[1], expected[1], rtol=1e-5, atol=1e-5)
            out, expected = out[0], expected[0]
        torch.testing.assert_close(out, expected, **last_linear_tolerance(reference, 2))


@pytest.mark.parametrize("activation", [nn.ReLU6, nn.ReLU])
def test_pt2e_reduce_range_clamp_takes_the_activation_in(activation):
    # reduce_range's clamp at code 127 after a ReLU6 or ReLU is one clamp to both bounds: one
    # post-op in the conv's kernel, not two (MobileNetV2 int8 on AVX2: 4% less time a call). Exact:
    # equal to the reference (the last conv adds in fp32 what the int8 kernel sums exactly).
    x = torch.randn(1, 3, 16, 16)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), activation(inplace=True),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), activation(), nn.Conv2d(16, 8, 1))
    reference = pt2e(model, x, reduce_range=True)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    clamped = ["_convolution", "clamp", "dequantize", "dequantize", "quantize_per_tensor"]
    assert groups_of(graph) == [clamped, clamped, ["_convolution", "dequantize", "dequantize"]], groups_of(graph)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("on_a_view", [False, True])
def test_pt2e_clamp_takes_an_in_place_relu_in_only_on_a_fresh_tensor(on_a_view):
    # relu_ on a view writes the viewed tensor (read again later): the ReLU must stay. On a conv's
    # own output it joins the clamp.
    from torch_llga import _pt2e

    g = torch.fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    conv = g.call_function(torch.ops.aten.convolution.default, (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    y = g.call_function(torch.ops.aten.slice.Tensor, (conv, 1, 0, 2)) if on_a_view else conv
    relu = g.call_function(torch.ops.aten.relu_.default, (y,))
    relu.meta["val"] = torch.empty(1, 2, 4, 4)
    params = (0.1, 0, 0, 127, torch.uint8)
    q = g.call_function(torch.ops.quantized_decomposed.quantize_per_tensor.default, (relu, *params))
    d = g.call_function(torch.ops.quantized_decomposed.dequantize_per_tensor.default, (q, *params))
    g.output((d, conv) if on_a_view else (d,))  # the viewed tensor read again
    _pt2e.lower(g, lambda n: n is w)
    kinds = [str(n.target) for n in g.nodes if n.op == "call_function"]
    assert ("aten.relu_.default" in kinds) == on_a_view, kinds
    [clamp] = [n for n in g.nodes if n.target is torch.clamp]
    assert clamp.kwargs == ({"max": 127 * 0.1} if on_a_view else {"min": 0.0, "max": 127 * 0.1})


class GeluReturned(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 512), nn.Linear(512, 16)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        return self.fc2(h), h


@pytest.mark.skipif(AVX512_KERNELS, reason="the GELU is the linear's post-op there (quirk gelu_post_op_slow)")
@pytest.mark.parametrize("returned", [False, True])
def test_pt2e_reduce_range_clamp_of_a_gelu_runs_in_place(returned, speed_rules_applied):
    # A GELU left to PyTorch (64K outputs on AVX2) computes in place on the linear's output, and
    # the clamp at code 127 before the next quantize in place on the GELU's: no allocation of their
    # size a call. Equal to the reference: the same GELU, the same codes, exact int8 sums.
    # Returned too, the GELU's output is read twice: the GELU still runs in place on the linear's
    # output, which nothing else reads, but the clamp of its result does not.
    x = torch.randn(2, 64, 64)
    model = GeluReturned() if returned else nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 16))
    reference = pt2e(model, x, reduce_range=True)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    # (The model's input is no group's result: its clamp and quantize allocate.)
    in_place = ["aten::clamp", "aten::gelu_"] if returned else ["aten::clamp_", "aten::gelu_"]
    assert left_in_pytorch(graph) == sorted(["aten::clamp", *in_place, "aten::quantize_per_tensor",
                                             "aten::quantize_per_tensor"]), graph
    assert groups_of(graph) == [["dequantize", "dequantize", "linear"]] * 2, groups_of(graph)  # both int8
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-5)


class MergedHeads(nn.Module):
    """A linear's output split into heads, transposed and merged back, as attention's context is."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 512), nn.Linear(512, 16)

    def forward(self, x):
        b, s, _ = x.shape
        return self.fc2(self.fc1(x).view(b, s, 8, 64).transpose(1, 2).reshape(b, s, 512))


def test_pt2e_reduce_range_clamp_of_merged_heads_runs_in_place():
    # The clamp before the second linear's quantize reads the first's result through a view, a
    # transpose and a reshape, each read once: in place (BERT's attention context, 12 a call).
    x = torch.randn(2, 64, 64)
    reference = pt2e(MergedHeads(), x, reduce_range=True)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    assert groups_of(graph) == [["dequantize", "dequantize", "linear"]] * 2, groups_of(graph)
    left = left_in_pytorch(graph)
    assert left.count("aten::clamp_") == 1 and left.count("aten::clamp") == 1, left  # (the model input's)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))


@pytest.mark.parametrize("rows,then", [(4, None), (32, None), (4, nn.ReLU())])
def test_pt2e_int8_linear_of_few_rows(rows, then):
    # Without VNNI oneDNN's int8 matmul of a few rows copies its weight on every call: up to 16 rows
    # run as a 1x1 conv instead (Int8LinearsAsConvolutions), unless ops after it would be its post-ops (the
    # ReLU). The same integer sums: equal to the reference.
    x = torch.randn(rows, 256)
    layers = [nn.ReLU(), nn.Linear(256, 64)] + ([then] if then else [])
    reference = pt2e(nn.Sequential(*layers), x, reduce_range=True)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    expected = ["dequantize", "dequantize", "linear"] + (["relu"] if then else [])
    assert groups_of(graph) == [int8_row_linear_group() if rows <= 16 and not then else expected]
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-5)


def test_pt2e_reduce_range_encoder_linears_run_int8():
    x = torch.randn(2, 16, 64)
    reference = pt2e(TinyEncoder(), x, reduce_range=True)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))
    int8_linears = [g for g in groups_of(graph) if "linear" in g and g.count("dequantize") >= 2]
    assert sum(g.count("linear") for g in int8_linears) == 5  # q, k and v as one


def test_pt2e_dynamic_quantization_stays_right():
    # Runtime scales (dynamic quantization) are not quantized tensors' constants: those ops stay
    # PyTorch's, as PT2E wrote them, and the result is the reference's: its linears run fused in
    # fp32, so a sum in another order can flip a code at a rounding boundary. 2e-2: a few such flips
    # (the head's weights are under 0.13, its input's steps a few hundredths); a wrong quantization
    # is off by far more.
    x = torch.randn(2, 16, 64)
    reference = pt2e(TinyEncoder(), x, is_dynamic=True)
    out, graph = warm(torch.compile(reference, backend="torch_llga"), x)
    with torch.no_grad():
        expected = reference(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=2e-2)
    assert [k for k in left_in_pytorch(graph) if k.startswith("quantized_decomposed::quantize_per_tensor")]


def test_bench_quantizes_a_model_that_computes_and_drops_a_value():
    # BERT's pooler behind the bench's wrapper: a linear + tanh nothing reads. The x86 quantizer's
    # linear-unary pattern fails on it (IndexError); the bench drops dead code before quantizing.
    class Dropping(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.pooler, self.act = nn.Linear(16, 16), nn.Linear(16, 16), nn.Tanh()

        def forward(self, x):
            h = self.body(x)
            self.act(self.pooler(h))  # computed, never read
            return h

    from torch_llga.tools import bench
    x = torch.randn(2, 16)
    quantized = bench.quantized_pt2e(Dropping().eval(), (x,))
    assert not [n for n in quantized.graph.nodes if n.target is torch.ops.aten.tanh.default]
    out, graph = warm(torch.compile(quantized, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, quantized(x), rtol=0, atol=1e-5)
    assert int8_row_linear_group() in groups_of(graph)


@pytest.mark.skipif(not AVX512_KERNELS, reason="the own quantize kernel runs with AVX-512")
@pytest.mark.parametrize("dtype,zero_point", [(torch.quint8, 127), (torch.quint8, 0), (torch.qint8, -3)])
def test_own_quantize_gives_pytorchs_codes(dtype, zero_point):
    # Bit for bit: values at halves of a step (rounded to even), NaN, infinities, values past int32,
    # and a length that leaves a partial vector.
    scale = 0.0137
    steps = torch.arange(-300, 300, dtype=torch.float64)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 0.0, -0.0])
    x = torch.cat([((steps + 0.5) * scale).float(), special, torch.randn(40_000) * 3])
    own = torch.ops.llga.quantize_per_tensor(x, scale, zero_point, dtype)
    expected = torch.quantize_per_tensor(x, scale, zero_point, dtype)
    assert own.dtype == dtype and own.q_scale() == scale and own.q_zero_point() == zero_point
    assert torch.equal(own.int_repr(), expected.int_repr())


def pytorch_pool(x, scale, zero_point, dtype):
    return torch.quantize_per_tensor(F.adaptive_avg_pool2d(x.dequantize(), 1), scale, zero_point, dtype)


@pytest.mark.skipif(not OWN_QUANTIZED_POOL, reason="the own int8 pool kernel needs AVX-512 (F, BW, VL)")
@pytest.mark.parametrize("dtype,zero_point", [(torch.quint8, 3), (torch.qint8, -5)])
def test_own_quantized_pool_gives_pytorchs_codes(dtype, zero_point):
    # 37 channels leave a partial vector; 7x5 pixels, two images. The kernel sums the codes exactly,
    # PyTorch sums rounded floats: at a rounding tie a code may differ by one, never more.
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (2, 37, 7, 5), generator=g, dtype=torch.uint8)
    x = torch._make_per_tensor_quantized_tensor(codes if dtype == torch.quint8 else (codes.int() - 128).to(torch.int8),
                                                0.05, zero_point).contiguous(memory_format=torch.channels_last)
    own = torch.ops.llga.quantized_global_avg_pool(x, 0.0231, zero_point + 1, dtype)
    expected = pytorch_pool(x, 0.0231, zero_point + 1, dtype)
    assert own.shape == (2, 37, 1, 1) and own.dtype == dtype and own.q_scale() == 0.0231
    difference = (own.int_repr().int() - expected.int_repr().int()).abs()
    steps = F.adaptive_avg_pool2d(x.dequantize().double(), 1) / 0.0231  # the mean in output steps, exact enough
    at_a_tie = ((steps - steps.floor()) - 0.5).abs() < 1e-4
    assert difference.max() <= 1 and not difference[~at_a_tie].any(), difference.flatten()
    # Saturated: means beyond the output grid clamp as PyTorch's quantize does.
    assert torch.equal(torch.ops.llga.quantized_global_avg_pool(x, 1e-4, 0, dtype).int_repr(),
                       pytorch_pool(x, 1e-4, 0, dtype).int_repr())
    # NCHW codes are not what the kernel reads: PyTorch's ops, the same codes.
    nchw = x.contiguous()
    assert torch.equal(torch.ops.llga.quantized_global_avg_pool(nchw, 0.0231, 7, dtype).int_repr(),
                       pytorch_pool(nchw, 0.0231, 7, dtype).int_repr())


@pytest.mark.skipif(not OWN_QUANTIZED_POOL, reason="the own int8 pool kernels need AVX-512 (F, BW, VL)")
@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8])
@pytest.mark.parametrize("pool", [((3, 3), (2, 2), (1, 1)), ((2, 2), (), (0, 0)), ((3, 2), (1, 2), (1, 0))],
                         ids=["resnet_stem", "default_stride", "uneven"])
def test_own_quantized_max_pool_gives_pytorchs_codes(dtype, pool):
    # Bit for bit: on the input's grid the maximum of the codes is the code of the maximum. 100
    # channels leave a partial register; odd sizes, two images, windows clipped by the padding.
    kernel, stride, padding = pool
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (2, 100, 13, 10), generator=g, dtype=torch.uint8)
    x = torch._make_per_tensor_quantized_tensor(codes if dtype == torch.quint8 else (codes.int() - 128).to(torch.int8),
                                                0.05, 3).contiguous(memory_format=torch.channels_last)

    def both(x, *args):
        own = torch.ops.llga.quantized_max_pool2d(x, kernel, stride, padding, *args)
        expected = torch.quantize_per_tensor(F.max_pool2d(x.dequantize(), kernel, stride, padding, *args[:2]), *args[2:])
        assert own.shape == expected.shape and own.dtype == expected.dtype and own.q_scale() == expected.q_scale()
        assert torch.equal(own.int_repr(), expected.int_repr())
        return own

    assert both(x, [1, 1], False, 0.05, 3, dtype).is_contiguous(memory_format=torch.channels_last)
    # What the kernel does not take runs PyTorch's ops: another grid, ceil mode, dilation, NCHW codes.
    both(x, [1, 1], False, 0.04, 3, dtype)
    both(x, [1, 1], True, 0.05, 3, dtype)
    both(x, [2, 1], False, 0.05, 3, dtype)
    both(x.contiguous(), [1, 1], False, 0.05, 3, dtype)


@pytest.mark.parametrize("to", [(0.00349, 0, torch.quint8), (0.1, -3, torch.qint8), (1.7, 250, torch.quint8)])
@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8])
def test_requantize_gives_pytorchs_codes(dtype, to):
    # Bit for bit, every code of the input grid, to a finer grid (saturating), a coarser one, s8 or u8.
    codes = torch.arange(256, dtype=torch.int32).reshape(16, 16)
    codes = codes.to(torch.uint8) if dtype == torch.quint8 else (codes - 128).to(torch.int8)
    x = torch._make_per_tensor_quantized_tensor(codes, 0.0169, 4 if dtype == torch.quint8 else -2)
    for v in (x, x.t()):  # a transposed view: PyTorch's ops, the same codes
        own = torch.ops.llga.requantize(v, *to)
        expected = torch.quantize_per_tensor(v.dequantize(), *to)
        assert own.dtype == to[2] and own.q_scale() == to[0] and own.q_zero_point() == to[1]
        assert torch.equal(own.int_repr(), expected.int_repr())


class DropoutHead(nn.Module):
    """MobileNetV2's tail: conv, ReLU6, pool, flatten, dropout, linear. PT2E quantizes the dropout's
    output to a grid of its own: the flatten sits between two grids."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 40, 3, stride=2, padding=1), nn.ReLU6(inplace=True))
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(40, 10))

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), (1, 1)), 1))


@requires_int8_kernels
def test_pt2e_classifier_tail_pools_and_requantizes_in_own_kernels():
    # The pool of the conv's codes runs llga::quantized_global_avg_pool (AVX-512), not a oneDNN
    # partition of its own; the flatten reads its codes, and llga::requantize takes them to the
    # linear's grid: no dequantize or quantize in PyTorch between the groups.
    x = torch.randn(1, 3, 32, 32)
    reference = pt2e(DropoutHead(), x)
    quantizes = [n for n in reference.graph.nodes if n.target is torch.ops.quantized_decomposed.quantize_per_tensor.default]
    assert len({n.args[1] for n in quantizes[-2:]}) == 2  # the pool's grid and the linear's differ
    for compiled in (torch.compile(reference, backend="torch_llga"), torch_llga.compile(torch.export.export(reference, (x,)))):
        out, graph = warm(compiled, x)
        pools = graph.findAllNodes("llga::quantized_global_avg_pool", True)
        assert len(pools) == (1 if OWN_QUANTIZED_POOL else 0)
        assert len(graph.findAllNodes("llga::requantize", True)) == 1
        assert ["dequantize", "dequantize", "linear"] in groups_of(graph)
        assert not [g for g in groups_of(graph) if "adaptive_avg_pool2d" in g] or not OWN_QUANTIZED_POOL
        assert "aten::dequantize" not in left_in_pytorch(graph), left_in_pytorch(graph)
        assert sorted(own_kernels(graph)) == sorted(["llga::requantize"] + ["llga::quantized_global_avg_pool"] * len(pools))
        with torch.no_grad():
            torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))


@pytest.mark.skipif(not AVX2, reason="the own layer norm kernel needs AVX2 and FMA")
@pytest.mark.parametrize("n", [768, 100, 7, 1])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_own_layer_norm_matches_eager(n, affine):
    x = torch.randn(3, 5, n) * 4 + 2
    weight, bias = (torch.randn(n), torch.randn(n)) if affine else (None, None)
    x[1, 2, 0], x[2, 0, -1] = float("nan"), float("inf")  # their rows are NaN, as eager's; the rest stay
    own = torch.ops.llga.layer_norm(x, [n], weight, bias, 1e-5)
    torch.testing.assert_close(own, F.layer_norm(x, (n,), weight, bias, 1e-5), rtol=1e-5, atol=1e-5, equal_nan=True)
    strided = x[..., ::2]  # not dense: PyTorch's kernel, the same result
    torch.testing.assert_close(torch.ops.llga.layer_norm(strided, [strided.size(-1)], None, None, 1e-5),
                               F.layer_norm(strided, strided.shape[-1:]), rtol=0, atol=0, equal_nan=True)


@requires_int8_kernels
def test_pt2e_encoder_quantizes_left_to_pytorch_run_the_own_kernel():
    # The quantizes the fuser leaves to PyTorch (the input's, the attention output's, and the layer
    # norms': quirk layer_norm_quantized_output) run llga::quantize_per_tensor from 16K values on
    # (with AVX-512), with PyTorch's codes.
    x = torch.randn(2, 128, 64)
    reference = pt2e(TinyEncoder(), x)
    compiled = torch_llga.compile(torch.export.export(reference, (x,)))
    out, graph = warm(compiled, x)
    own = graph.findAllNodes("llga::quantize_per_tensor", True)
    assert len(own) == (4 if AVX512_KERNELS else 0), own
    assert own_kernels(graph).count("llga::quantize_per_tensor") == len(own)  # explain() names them
    # The two layer norms, whose outputs those quantizes read, run llga::layer_norm (AVX2).
    norms = graph.findAllNodes("llga::layer_norm", True)
    assert len(norms) == (2 if AVX2 else 0) and own_kernels(graph).count("llga::layer_norm") == len(norms)
    assert not [g for g in groups_of(graph) if "layer_norm" in g] or not AVX2
    assert sum(g.count("linear") for g in groups_of(graph)) == 5  # q, k and v as one
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))



class ConvForms(nn.Module):
    """int8 conv groups of each form runtime/int8_primitive.h runs as one oneDNN primitive: with a bias
    and without, strided, dilated, depthwise and grouped; then relu, a clamp, a residual add, a
    residual add and relu (MobileNetV2's hardtanh: test_models.py's int8 MobileNetV2). The last
    conv's output is fp32 (no quantize after it): a partition. The clamp starts above the grid's
    bottom (an observer's range holds 0), so the int8 kernel runs it; the ReLUs go before grids
    starting at 0 (PrepareQuantization)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pointwise = nn.Conv2d(16, 16, 1, bias=False)
        self.grouped = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4)
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        s = F.relu(self.stem(x))
        p = self.pointwise(F.hardtanh(self.depthwise(s), 0.5, 6.0)) + s
        g = F.relu(self.grouped(p) + s)
        return self.head(self.down(g).mean((2, 3)))


class SelfResidual(nn.Module):
    """conv(y) + y: oneDNN 3.12 compiles no partition for it; the primitive takes it."""

    def __init__(self):
        super().__init__()
        self.stem, self.conv = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.last = nn.Conv2d(16, 16, 1)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        y = F.relu(self.stem(x))
        return self.head(self.last(F.relu(self.conv(y) + y)).mean((2, 3)))


@requires_int8_kernels
def test_int8_conv_groups_run_as_onednn_primitives(monkeypatch):
    # Each int8 conv group with an int8 output runs as one convolution primitive with the
    # attributes oneDNN Graph gives its partition: the same codes bit for bit as the partitions
    # (TORCH_LLGA_OWN_KERNELS=0), on the profiled input and another.
    x = torch.randn(1, 3, 32, 32)
    reference = pt2e(ConvForms(), x)
    before = torch_llga.stats()["int8_primitives"]
    primitives = torch_llga.compile(torch.export.export(reference, (x,)))
    out, graph = warm(primitives, x)
    convs = [g for g in groups_of(graph) if "_convolution" in g]
    assert len(convs) == 5 and ["_convolution", "add", "dequantize", "dequantize", "dequantize", "quantize_per_tensor"] in convs, convs
    assert ["_convolution", "dequantize", "dequantize", "hardtanh", "quantize_per_tensor"] in convs, convs
    assert torch_llga.stats()["int8_primitives"] - before == 5  # and the head's linear
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))
    with monkeypatch.context() as m:
        m.setenv("TORCH_LLGA_OWN_KERNELS", "0")
        before = torch_llga.stats()["int8_primitives"]
        partitions = torch_llga.compile(torch.export.export(reference, (x,)))
        assert torch.equal(warm(partitions, x)[0], out)
        assert torch_llga.stats()["int8_primitives"] == before
    with torch.no_grad():
        other = torch.randn(1, 3, 32, 32)
        # The pointwise conv's sum reads s, which the grouped conv's sum reads later: copied to its
        # output; the grouped conv's sum accumulates into s itself (its last reader).
        before = torch_llga.stats()["inplace_outputs"]
        assert torch.equal(primitives(other), partitions(other))
        assert torch_llga.stats()["inplace_outputs"] - before == 2  # one a call, both models
    # conv(y) + y: fused by the primitive (oneDNN Graph would leave it unfused).
    reference = pt2e(SelfResidual(), x)
    before = torch_llga.stats()["int8_primitives"]
    out, graph = warm(torch_llga.compile(torch.export.export(reference, (x,))), x)
    assert torch_llga.stats()["int8_primitives"] - before == 3  # stem, conv(y) + y, the head's linear
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **last_linear_tolerance(reference, 2))




class LinearForms(nn.Module):
    """int8 linear groups of each form runtime/int8_primitive.h runs as one oneDNN matmul primitive:
    GELU then an int8 output, an fp32 output added to the fp32 residual stream, relu then an int8
    output, an fp32 output."""

    def __init__(self, d=64):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.fc3, self.head = nn.Linear(d, d), nn.Linear(d, 8)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x))), self.head(F.relu(self.fc3(x)))


@requires_int8_kernels
def test_int8_linear_groups_run_as_onednn_primitives(monkeypatch):
    # As the convs above: the same results bit for bit as oneDNN Graph's partitions.
    x = torch.randn(2, 16, 64)
    reference = pt2e(LinearForms(), x)
    before = torch_llga.stats()["int8_primitives"]
    primitives = torch_llga.compile(torch.export.export(reference, (x,)))
    out, graph = warm(primitives, x)
    linears = [g for g in groups_of(graph) if "linear" in g]
    assert ["add", "dequantize", "dequantize", "linear"] in linears, linears
    assert ["dequantize", "dequantize", "gelu", "linear", "quantize_per_tensor"] in linears, linears
    assert ["dequantize", "dequantize", "linear", "quantize_per_tensor"] in linears, linears  # its ReLU gone: a grid from 0
    assert torch_llga.stats()["int8_primitives"] - before == len(linears) == 4
    with torch.no_grad():
        expected = reference(x)
    # The head's output as the module's note allows; the residual sum's within a step of fc2's
    # input codes (|x| ~ 1, fc2's output ~0.1).
    torch.testing.assert_close(out[1], expected[1], **last_linear_tolerance(reference, 2))
    torch.testing.assert_close(out[0], expected[0], rtol=0, atol=0.05)
    with monkeypatch.context() as m:
        m.setenv("TORCH_LLGA_OWN_KERNELS", "0")
        partitions = torch_llga.compile(torch.export.export(reference, (x,)))
        fused = warm(partitions, x)[0]
        assert torch.equal(fused[0], out[0]) and torch.equal(fused[1], out[1])
    with torch.no_grad():
        other = torch.randn(2, 16, 64)
        a, b = primitives(other), partitions(other)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

def test_pt2e_nan_in_the_fp32_residual_runs_fused():
    # An int8 linear whose fp32 output adds the residual stream runs fused whatever that stream
    # holds (a dequantize reads codes; a matmul and an add keep NaN: its guard scans nothing), and
    # gives what the reference gives (here the next quantize turns the NaN row into codes in both).
    x = torch.randn(2, 16, 64)
    reference = pt2e(TinyEncoder(), x)
    compiled = torch_llga.compile(torch.export.export(reference, (x,)))
    warm(compiled, x)
    bad = x.clone()
    bad[0, 3, 5] = float("nan")
    with torch.no_grad():
        before = torch_llga.stats()
        compiled(x)
        clean = torch_llga.stats()
        out, expected = compiled(bad), reference(bad)
    after = torch_llga.stats()
    assert after["guard_failures"] == clean["guard_failures"]
    assert after["executions"] - clean["executions"] == clean["executions"] - before["executions"]  # every group fused
    assert torch.equal(out.isnan(), expected.isnan())
    kept = ~expected.isnan()
    torch.testing.assert_close(out[kept], expected[kept], **last_linear_tolerance(reference, 2))
