"""torch_llga.explain(): the partitions, every op left to PyTorch with its reason, guard fallbacks."""
import torch
import torch.nn as nn

import torch_llga


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = torch.sin(y)                       # no oneDNN mapping
        y = self.fc(y.mean((2, 3)))
        return y * 2.0, y.double() * 3.0       # a lone cheap op; a float64 op


def reasons(report):
    return dict(report.unfused)


def test_explain_reports_partitions_and_reasons(capsys):
    report = torch_llga.explain(Mixed(), torch.randn(1, 3, 16, 16))
    assert [g["ops"] for g in report.groups] == [["_convolution", "relu"], ["linear"]]
    assert report.groups[0]["inputs"] == ["float32[1, 3, 16, 16]"]
    why = reasons(report)
    assert why["sin"] == "no oneDNN mapping"
    assert why["mul"].startswith("cheap ops too small to pay for a group") or \
        why["mul"] == "dtype Double not supported (float32, bfloat16 are)"
    assert "dtype Double not supported (float32, bfloat16 are)" in [r for op, r in report.unfused if op == "mul"]
    assert "cheap ops too small" in str(report)
    assert 0 < report.fused_share < 1
    assert report.guard_fallbacks == 0
    printed = capsys.readouterr().out
    assert printed.startswith("2 partitions, 3 ops fused, 5 left to PyTorch") and "sin: no oneDNN mapping" in printed


def test_explain_reports_guard_fallbacks():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad(), torch_llga.enabled():
        module = torch.jit.freeze(torch.jit.trace(model, x))
        module(x), module(x)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("nan")
    report = torch_llga.explain(module, bad, verbose=False)
    assert report.guard_fallbacks >= 1 and report.nonfinite_fallbacks >= 1
    assert "guard fell back" in str(report)


def test_explain_misuse_is_a_clear_error():
    import pytest

    with pytest.raises(TypeError, match="needs the inputs"):
        torch_llga.explain(nn.ReLU())
    with pytest.raises(TypeError, match="nn.Module or a TorchScript module"):
        torch_llga.explain(lambda x: x, torch.randn(2))


def test_explain_handles_multi_output_ops():
    class TopClass(nn.Module):
        def forward(self, x):
            values, indices = torch.max(torch.relu(x), dim=1)  # aten::max.dim: two outputs
            return values, indices

    report = torch_llga.explain(TopClass(), torch.randn(4, 8), verbose=False)
    assert dict(report.unfused)["max"] == "no oneDNN mapping"
