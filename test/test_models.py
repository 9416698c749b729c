"""Whole torchvision models: fused, and equal to eager.

Tolerance: fp32 sums over ~50 layers in a different order (oneDNN's blocked kernels vs PyTorch's)
drift by ~1e-5 relative per layer; 1e-4 relative (and 1e-4 of the output's magnitude absolute:
random-init MobileNets output ~1e-9) covers it with room, while a wrong op (a missing bias, a
wrong pad) shows as errors of 1e-1 of the output and more.
"""
import collections

import pytest
import torch

from conftest import check, SOME

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
    assert "linear" in ops


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
    out = subprocess.run([sys.executable, "-m", "torch_llga.check_models", "--models",
                          "squeezenet1_0,shufflenet_v2_x1_0,efficientnet_b0,convnext_tiny", "--size", "64"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "yes" in line]
    assert len(rows) == 4
