"""bf16: models cast with .to(torch.bfloat16), and models traced under torch.autocast (the JIT's own
autocast pass off), run as bf16 partitions with the casts at their borders."""
import pytest
import torch
import torch.nn as nn
from resnet import resnet18

import torch_llga

from conftest import check, SOME, requires_bf16_kernels

# bf16 keeps 8 bits of mantissa: one rounding is ~0.4% relative, and fused kernels round at other
# points than eager's op-by-op kernels (accumulation stays fp32 in both).
BF16 = dict(rtol=3e-2, atol=3e-2)


@pytest.fixture
def jit_autocast_off():
    previous = torch._C._jit_set_autocast_mode(False)
    yield
    torch._C._jit_set_autocast_mode(previous)


@requires_bf16_kernels
def test_model_cast_to_bf16():
    model = resnet18().eval().to(torch.bfloat16)
    x = torch.randn(1, 3, 64, 64, dtype=torch.bfloat16)
    fused = check(model, x, **BF16, groups=SOME)
    assert len(fused.groups) >= 10 and ["_convolution", "add", "relu"] in fused.groups
    assert fused.output.dtype == torch.bfloat16


@requires_bf16_kernels
def test_model_traced_under_autocast(jit_autocast_off):
    model = resnet18().eval().requires_grad_(False)  # autocast's casts of
    x = torch.randn(1, 3, 64, 64)                                        # grad params cannot be constants
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
        traced = torch.jit.freeze(torch.jit.trace(model, x, check_trace=False))
    report = torch_llga.explain(traced, x, verbose=False)
    assert ["_convolution", "add", "relu"] in [g["ops"] for g in report.groups]
    assert all(i.startswith("bfloat16") for g in report.groups for i in g["inputs"])  # bf16 partitions
    assert any(op == "to" and why.startswith("cheap ops too small to pay for a group") for op, why in report.unfused)
    assert report.fused_share >= 0.85  # left: the casts, the classifier's pooling and flatten
    with torch.no_grad():
        out = traced(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, **BF16)


class LinearAddFp32InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 8).to(torch.bfloat16)
        self.register_buffer("offset", torch.tensor([0.5]))  # fp32

    def forward(self, x):
        return self.linear(x).add_(self.offset)


def test_in_place_add_of_an_fp32_tensor_stays_bf16():
    # In place, a bf16 tensor plus an fp32 one stays bf16; the functional add would promote to fp32
    # (found by fuzzing): such an in-place op is left as it is.
    fused = check(LinearAddFp32InPlace(), torch.randn(3, 4, dtype=torch.bfloat16), **BF16, groups=[])  # the linear
    # alone would be a group, but its output is written in place: it keeps its place in PyTorch
    assert fused.output.dtype == torch.bfloat16


class DenseLayerHead(nn.Module):
    """DenseNet's cat -> batch_norm -> relu on bf16 features, its running statistics left fp32 (as
    under autocast, which casts no BatchNorm parameters)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(32).eval()
        with torch.no_grad():  # statistics other than 0 and 1, so that a wrong one shows
            self.norm.running_mean.uniform_(-1, 1), self.norm.running_var.uniform_(0.5, 2)
            self.norm.weight.uniform_(0.5, 2), self.norm.bias.uniform_(-1, 1)

    def forward(self, a, b):
        return torch.relu(self.norm(torch.cat([a, b], 1)))


@requires_bf16_kernels
def test_bf16_batch_norm_with_fp32_statistics():
    a, b = (torch.randn(1, 16, 14, 14, dtype=torch.bfloat16) for _ in range(2))
    fused = check(DenseLayerHead(), a, b, groups=[["batch_norm", "relu"]], **BF16)  # cat: too small alone
    assert fused.output.dtype == torch.bfloat16


class ResidualLayerNorm(nn.Module):
    """BERT's residual block: LN(dense(x) + x)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(self.dense(x) + x)


@requires_bf16_kernels
def test_bf16_layer_norm_is_fused():
    # oneDNN forms no partition of a bf16 LayerNorm with bf16 weights; DecomposeOps gives it fp32
    # copies of the frozen ones (PyTorch widens them to fp32 itself: the same values).
    model = ResidualLayerNorm().eval().to(torch.bfloat16)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    fused = check(model, x, groups=[["linear", "add"], ["layer_norm"]], **BF16)
    assert fused.output.dtype == torch.bfloat16
    # Alone, one rounding of fp32 math on both sides: within one bf16 ulp.
    check(model.norm, x, groups=[["layer_norm"]], rtol=2 ** -7, atol=1e-6)
    # Unfrozen, the weights are no constants: the layer norm stays in PyTorch.
    fused = check(model, x, groups=[["linear", "add"]], freeze=False, **BF16)
    assert "layer_norm" in fused.unfused


def test_bf16_layer_norm_with_one_constant_parameter_stays_as_it_was():
    # Review finding: widening only the constant weight would hand PyTorch's kernel an fp32 weight
    # with a bf16 bias, which it rejects. Both are widened or neither.
    w = torch.randn(64, dtype=torch.bfloat16)

    def f(x, b):
        return torch.nn.functional.layer_norm(x, (64,), w, b * 2)

    x, b = torch.randn(2, 16, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    fused = check(f, x, b, groups=[], **BF16)
    assert "layer_norm" in fused.unfused


conv1d = nn.Conv1d(4, 8, 3, padding=1).requires_grad_(False)
upconv = nn.ConvTranspose2d(4, 8, 2, stride=2).requires_grad_(False)
prelu = nn.PReLU(8).requires_grad_(False)


@requires_bf16_kernels
@pytest.mark.usefixtures("all_partitions")
@pytest.mark.parametrize("ops,fn,shape", [
    (["_convolution"], lambda a: upconv(a), (1, 4, 8, 8)),
    (["upsample_nearest2d"], lambda a: torch.nn.functional.interpolate(a, scale_factor=2), (1, 4, 8, 8)),
    (["upsample_bilinear2d"], lambda a: torch.nn.functional.interpolate(a, scale_factor=2, mode="bilinear"), (1, 4, 8, 8)),
    (["mean"], lambda a: a.mean((2, 3), keepdim=True), (2, 4, 8, 8)),
    (["amax"], lambda a: a.amax(-1), (2, 4, 16)),
    (["prelu"], lambda a: prelu(a), (2, 8, 6, 6)),
    (["softplus"], lambda a: torch.nn.functional.softplus(a), (2, 8, 16)),
    (["maximum"], lambda a: torch.maximum(a, a.flip(-1)), (2, 8, 16)),
    (["max_pool1d"], lambda a: torch.nn.functional.max_pool1d(conv1d(a), 2), (2, 4, 16)),
])
def test_new_ops_in_bf16(ops, fn, shape):
    # The ops past classifiers in bf16 (fp32 in test_ops.py); 1-D pooling after the conv that feeds it.
    x = torch.randn(*shape).to(torch.bfloat16)
    module = lambda a: fn(a)  # noqa: E731
    for m in (conv1d, upconv, prelu):
        m.to(torch.bfloat16)
    try:
        fused = check(module, x, **BF16, groups=SOME)
        assert ops in fused.groups, fused.groups
    finally:
        for m in (conv1d, upconv, prelu):
            m.to(torch.float32)
