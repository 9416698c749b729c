"""Whole torchvision models: fused, and equal to eager.

Tolerance: fp32 sums over ~50 layers in a different order (oneDNN's blocked kernels vs PyTorch's)
drift by ~1e-5 relative per layer; 1e-4 relative (and 1e-4 of the output's magnitude absolute:
random-init MobileNets output ~1e-9) covers it with room, while a wrong op (a missing bias, a
wrong pad) shows as errors of 1e-1 of the output and more.
"""
import collections

import pytest
import torch

from conftest import AVX2, check, SOME

MODEL_TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,min_groups", [("resnet50", 6), ("mobilenet_v2", 10)])
def test_torchvision_model(name, min_groups):
    torchvision = pytest.importorskip("torchvision", reason="no torchvision release for this torch")
    model = getattr(torchvision.models, name)().eval()
    x = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        scale = model(x).abs().max().item()
    assert scale > 0
    fused = check(model, x, rtol=1e-4, atol=1e-4 * scale, groups=SOME)
    assert len(fused.groups) >= min_groups
    ops = collections.Counter(op for g in fused.groups for op in g)
    total_convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert ops["_convolution"] == total_convs  # every conv runs in oneDNN
    # the classifier: one row over a weight of 1M+ values, torch_llga's row kernel (oneDNN without AVX2)
    assert "llga::row_linear(" in str(fused.graph) if AVX2 else "linear" in ops


def test_bert_from_transformers():
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        return_dict=False, torchscript=True)
    bert = BertModel(config).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask)[0]

    ids = torch.randint(0, config.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    fused = check(Encoder(), ids, mask, **MODEL_TOL, groups=SOME)
    ops = collections.Counter(op for g in fused.groups for op in g)
    assert ops["linear"] == 2 * 6  # q, k, v, attention output, two feed-forward
    assert ops["layer_norm"] >= 2 * 2


def test_check_models_sweep_subset():
    import subprocess
    import sys

    pytest.importorskip("torchvision", reason="no torchvision release for this torch")
    out = subprocess.run([sys.executable, "-m", "torch_llga.tools.check_models", "--models",
                          "squeezenet1_0,shufflenet_v2_x1_0,efficientnet_b0,convnext_tiny", "--size", "64"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "yes" in line]
    assert len(rows) == 4


def compute_ops_left(fused, *names):
    """The unfused ops of these kinds (convolutions, products, norms, pooling, resampling)."""
    return [op for op in fused.unfused if any(n in op for n in names)]


COMPUTE = ("conv", "linear", "matmul", "bmm", "norm", "pool", "upsample", "softmax", "scaled_dot")


def test_segmentation_model():
    # DeepLabV3 (MobileNetV3 backbone, ASPP head): every conv fused, and the ASPP's pooled branch and
    # the head's upsampling; the resize to the input's size stays in PyTorch (its size is computed
    # from the input at run time, which guards, checking tensors only, could not vouch for).
    torchvision = pytest.importorskip("torchvision", reason="no torchvision release for this torch")
    from torch_llga.tools.bench_models import FirstOf

    model = FirstOf(torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None)).eval()
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        scale = model(x).abs().max().item()
    fused = check(model, x, rtol=1e-4, atol=1e-4 * scale, groups=SOME)
    ops = collections.Counter(op for g in fused.groups for op in g)
    assert ops["_convolution"] == sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert compute_ops_left(fused, *COMPUTE) == ["upsample_bilinear2d", "upsample_bilinear2d"]


def test_diffusion_unet():
    # diffusers' UNet2DConditionModel at a small width: convs with their residual adds, the
    # attention's linears and SDPA, the upsampler's interpolate; group norm stays in PyTorch (quirk
    # group_norm_slow_kernel). At 24x24 the first level's self-attention (4 heads of 8 over 576
    # positions) is torch_llga's small-head kernel, on CPUs with AVX2.
    # (diffusers' attention_head_dim is the number of heads).
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
                                          block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=32,
                                          attention_head_dim=4, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                          up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
    from torch_llga.tools.bench_models import FirstOf

    model = FirstOf(unet, return_dict=False).eval()
    inputs = (torch.randn(1, 4, 24, 24), torch.tensor([10.0]), torch.randn(1, 8, 32))
    fused = check(model, *inputs, **MODEL_TOL, groups=SOME)
    ops = collections.Counter(op for g in fused.groups for op in g)
    assert ops["_convolution"] == sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert ops["upsample_nearest2d"] == 1
    assert set(compute_ops_left(fused, *COMPUTE)) == {"group_norm"}
    if AVX2:
        assert "llga::small_head_attention" in str(fused.graph)


def test_speech_encoder():
    # Whisper's encoder (a tiny width): the two 1-D convs with their GELU, every linear, attention.
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from torch_llga.tools.bench_models import FirstOf

    config = WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
                           max_source_positions=50)
    model = FirstOf(WhisperEncoder(config), return_dict=False).eval()
    fused = check(model, torch.randn(1, 16, 100), **MODEL_TOL, groups=SOME)
    assert [["_convolution", "gelu"]] * 2 == [g for g in fused.groups if "_convolution" in g]
    assert compute_ops_left(fused, *COMPUTE) == []


def test_t5_encoder():
    # T5's RMS norm is written out (pow, mean, rsqrt, mul): composed into one RMSNorm op.
    from transformers import T5Config, T5EncoderModel

    from torch_llga.tools.bench_models import FirstOf

    config = T5Config(d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16, vocab_size=100)
    model = FirstOf(T5EncoderModel(config), return_dict=False).eval()
    fused = check(model, torch.randint(0, 100, (1, 12)), **MODEL_TOL, groups=SOME)
    ops = collections.Counter(op for g in fused.groups for op in g)
    assert ops["rms_norm"] == 2 * 2 + 1 and ops["linear"] == 2 * 4  # q, k, v (bias-free) merged into one
    assert compute_ops_left(fused, *COMPUTE) == []
