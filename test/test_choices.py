"""Choices between ways to run the same ops, made by timing them on the machine at hand
(settings/choices.h): every branch forced by a pin, the values right whichever runs, and the
recorded choice following the times that were measured."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga
from conftest import AVX2, CPU, FP32, PER_HEAD_BIAS_MODEL, SOME, Fused, check

SITES = {s["site"]: s for s in torch_llga.choice_sites()}


@pytest.fixture(autouse=True)
def quiet_machine():
    """The machine taken as quiet: these tests expect timings, which a busy machine defers."""
    torch_llga._C._test_machine_busy(0)
    yield
    torch_llga._C._test_machine_busy(-1)


@pytest.fixture
def pins():
    """Pins for one test; every choice is measured again afterwards."""
    yield torch_llga.pin_choices
    torch_llga.pin_choices(None)


def new_choices(since, site):
    return [c for c in torch_llga.choices() if c["seq"] > since and c["site"] == site]


def last_seq():
    return max((c["seq"] for c in torch_llga.choices()), default=0)


def follows_the_times(c):
    """The recorded choice is the one the site's rule gives for the recorded best times: the
    default unless another candidate is faster by the margin."""
    site = SITES[c["site"]]
    times = c["best_us"]
    default = site["default"]
    margin, margin_us = (c["margin"], c["margin_us"]) if c.get("margin") else (site["margin"], site["margin_us"])
    faster = [n for n, t in times.items() if n != default and t * margin + margin_us < times[default] and t < times[default]]
    if c["site"] == "fusion_group" and c["chosen"] == default:
        # A group's ops leave their partition only when PyTorch also wins on the calling thread's
        # CPU time (not recorded): a wall-clock win alone can be a descheduled OpenMP thread.
        return True
    return c["chosen"] == (min(faster, key=times.get) if faster else default)


def test_sites_and_pins_are_checked():
    assert {"fusion_group", "row_linear", "rms_norm_row_linear", "widened_linear", "layer_norm"} <= set(SITES)
    assert all(s["candidates"][0] == s["default"] for s in SITES.values())
    with pytest.raises(ValueError, match="no choice site 'rowlinear'.*row_linear: own pytorch"):
        torch_llga.pin_choices(rowlinear="own")
    with pytest.raises(ValueError, match="site 'row_linear' has no candidate 'onednn'"):
        torch_llga.pin_choices("row_linear=onednn")
    with pytest.raises(ValueError, match="site=candidate"):
        torch_llga.pin_choices("row_linear")
    assert torch_llga.choice_pins() == ""
    try:
        torch_llga.pin_choices("*=default")
        assert torch_llga.choice_pins().split(",") == [f"{s}={v['default']}" for s, v in SITES.items()]
    finally:
        torch_llga.pin_choices(None)
    assert torch_llga.choice_pins() == ""


@pytest.mark.skipif(not AVX2, reason="torch_llga's row linear kernel needs AVX2 and FMA")
@pytest.mark.parametrize("pin", ["own", "pytorch", None])
def test_row_linear_runs_what_is_pinned_or_measured(pins, pin):
    # A decoder step's linear: the own kernel or PyTorch's at::linear, pinned or timed at the first
    # call of each size; right either way; the record names what runs and why.
    if pin:
        pins(row_linear=pin)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 1100), nn.ReLU(), nn.Linear(1100, 600, bias=False))
    x = torch.randn(1, 3, 300)
    since = last_seq()
    fused = check(model, x, groups=[])
    assert str(fused.graph).count("llga::row_linear(") == 2
    made = new_choices(since, "row_linear")
    assert len(made) == 2 and {c["subject"] for c in made} == {"llga::row_linear"}, made
    assert sorted(c["key"] for c in made) == ["3 rows x [1100, 300] Float", "3 rows x [600, 1100] Float"]
    for c in made:
        if pin:
            assert c["chosen"] == pin and c["how"] == "pinned" and c["best_us"] == {}
        else:
            assert c["how"] == "measured" and set(c["best_us"]) <= {"own", "pytorch"} and follows_the_times(c), c
    # Made once a size: later calls at the same sizes add no record.
    for _ in range(3):
        torch.testing.assert_close(fused(x), model(x), **FP32)
    assert len(new_choices(since, "row_linear")) == 2


@pytest.mark.skipif(not AVX2, reason="torch_llga's row linear kernel needs AVX2 and FMA")
@pytest.mark.parametrize("pin", ["own", "pytorch"])
def test_rms_norm_row_linear_runs_what_is_pinned(pins, pin):
    pins(rms_norm_row_linear=pin)
    torch.manual_seed(0)
    weight, proj = torch.rand(576) + 0.5, nn.Linear(576, 960).requires_grad_(False)

    def fn(x):
        return proj(F.rms_norm(x, (576,), weight, 1e-6))

    x = torch.randn(1, 2, 576)
    since = last_seq()
    with torch.no_grad():
        fused = Fused(fn, (x,))
        assert str(fused.graph).count("llga::rms_norm_row_linear(") == 1
        torch.testing.assert_close(fused(x), fn(x), **FP32)
    made = new_choices(since, "rms_norm_row_linear")
    assert [(c["chosen"], c["how"]) for c in made] == [(pin, "pinned")]


@pytest.mark.skipif(CPU["bf16"] or not AVX2, reason="bf16 linears are widened only without oneDNN bf16 kernels")
@pytest.mark.parametrize("pin", ["own", "pytorch", None])
def test_widened_linear_runs_what_is_pinned_or_measured(pins, pin):
    if pin:
        pins(widened_linear=pin)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 1100), nn.GELU(), nn.Linear(1100, 600)).eval().bfloat16()
    x = torch.randn(16, 300).bfloat16()
    since = last_seq()
    # bf16: both round fp32 sums to bf16, in different orders (test_patterns.py BF16_TOLERANCE)
    check(model, x, groups=[], rtol=2e-2, atol=2e-2)
    made = new_choices(since, "widened_linear")
    assert len(made) == 2, made
    for c in made:
        assert c["chosen"] == pin and c["how"] == "pinned" if pin else c["how"] == "measured" and follows_the_times(c)
    if not pin:  # eager's bf16 matmul here is a plain loop, many times slower than fp32 GEMMs
        assert all(c["chosen"] == "own" for c in made), made


ATTENTION = {  # site: (q, k, v sizes it takes, the kernel's node)
    "head64_attention": ((1, 2, 128, 64), (1, 2, 160, 64), "llga::head64_attention"),
    "small_head_attention": ((1, 2, 100, 8), (1, 2, 600, 8), "llga::small_head_attention"),
    "decode_attention": ((1, 2, 1, 64), (1, 2, 300, 64), "llga::decode_attention"),
    "long_attention": ((1, 2, 40, 32), (1, 2, 1100, 32), "llga::long_attention"),
}


@pytest.mark.skipif(not AVX2, reason="torch_llga's attention kernels need AVX2 and FMA")
@pytest.mark.parametrize("site, pin", [(s, p) for s in ATTENTION for p in SITES[s]["candidates"] + [None]])
def test_attention_kernels_run_what_is_pinned_or_measured(pins, site, pin):
    # Each own attention kernel, oneDNN's SDPA kernel (where a site has it) or PyTorch's
    # scaled_dot_product_attention, pinned or timed at the first call of each size; right either
    # way (fp32 sums over a few hundred keys in another order: atol 5e-5, as test_patterns.py's
    # attention tests); the record names what runs and why.
    if pin:
        pins(**{site: pin})
    q_size, kv_size, node = ATTENTION[site]
    torch.manual_seed(0)
    q, k, v = torch.randn(q_size), torch.randn(kv_size), torch.randn(kv_size)
    since = last_seq()
    fused = check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), q, k, v, groups=[], rtol=1e-5, atol=5e-5)
    assert str(fused.graph).count(node + "(") == 1, fused.graph
    made = new_choices(since, site)
    assert len(made) == 1 and made[0]["subject"] == node, made
    [c] = made
    if pin:
        assert c["chosen"] == pin and c["how"] == "pinned", c
    else:
        assert c["how"] == "measured" and set(c["best_us"]) == set(SITES[site]["candidates"]) and follows_the_times(c), c
    for _ in range(2):  # made once a size
        torch.testing.assert_close(fused(q, k, v), F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=5e-5)
    assert len(new_choices(since, site)) == 1


class MaskedSelfAttention(nn.Module):
    """BERT's attention: heads split from projections, a boolean padding mask, heads merged."""

    def __init__(self, dim=128, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, n, c = x.shape
        split = lambda t: t.view(b, n, self.heads, c // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), attn_mask=mask)
        return a.transpose(1, 2).reshape(b, n, c)


@pytest.mark.skipif(not AVX2, reason="torch_llga's head-64 attention kernel needs AVX2 and FMA")
@pytest.mark.parametrize("pin", ["own", "onednn", "pytorch"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_masked_head64_attention_is_right_whichever_runs(pins, pin, mask_dtype):
    # oneDNN's SDPA built for the call's sizes reads the heads' strided views and the mask as the
    # own kernel does, writes the [B, L, H, D] memory the heads' merge reads, and gives a fully
    # masked row PyTorch's zeros (batch 2: the second sequence's row 3 masked whole).
    pins(head64_attention=pin)
    torch.manual_seed(0)
    x = torch.randn(2, 130, 128)
    keep = torch.rand(2, 1, 130, 130) > 0.3
    keep[1, :, 3] = False
    mask = keep if mask_dtype == torch.bool else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    since = last_seq()
    fused = check(MaskedSelfAttention(), x, mask, groups=SOME, rtol=1e-5, atol=5e-5)
    attention = fused.graph.findNode("llga::head64_attention")
    assert attention is not None and attention.inputsAt(5).toIValue() is True, fused.graph  # merged heads
    assert [(c["chosen"], c["how"]) for c in new_choices(since, "head64_attention")] == [(pin, "pinned")]
    assert fused.output[1, 3].abs().max() == 0


@pytest.mark.skipif(not AVX2, reason="torch_llga's head-64 attention kernel needs AVX2 and FMA")
@pytest.mark.parametrize("pin", ["own", "onednn", "pytorch"])
def test_head64_attention_of_one_head_and_a_sliced_mask_is_right_whichever_runs(pins, pin):
    # Layouts oneDNN misreads when handed as they are: one head (size-1 dims with odd strides in the
    # heads' views and the merged-heads output) and a float mask sliced from a wider one; and NaN.
    pins(head64_attention=pin)
    torch.manual_seed(0)
    x = torch.randn(1, 130, 64)
    wide = torch.randn(1, 1, 130, 200)
    mask = wide[..., 10:140]
    model = MaskedSelfAttention(dim=64, heads=1).eval()
    fused = check(model, x, mask, groups=SOME, rtol=1e-5, atol=5e-5)
    assert fused.graph.findNode("llga::head64_attention") is not None, fused.graph
    x[0, 5, 3] = float("nan")
    with torch.no_grad():
        torch.testing.assert_close(fused(x, mask), model(x, mask), equal_nan=True, rtol=1e-5, atol=5e-5)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return self.conv2(F.relu(self.conv1(x))).relu() + 1


@pytest.mark.parametrize("pin", ["onednn", "pytorch"])
def test_a_fused_group_runs_what_is_pinned(pins, pin):
    pins(fusion_group=pin)
    model, x = ConvNet().eval(), torch.randn(1, 3, 24, 24)
    since = last_seq()
    fused = Fused(model, (x,))
    assert fused.groups, fused.graph
    before = torch_llga.stats()
    torch.testing.assert_close(fused(x), model(x), **FP32)
    after = torch_llga.stats()
    made = new_choices(since, "fusion_group")
    assert [(c["chosen"], c["how"]) for c in made] == [(pin, "pinned")] * len(fused.groups), made
    if pin == "pytorch":
        assert after["executions"] == before["executions"]
        assert after["unfused_by_choice"] - before["unfused_by_choice"] == len(fused.groups)
    else:
        assert after["executions"] - before["executions"] == len(fused.groups)


def test_a_dropped_modules_choices_go_with_it(tmp_path):
    # A service that reloads its models keeps the records of what is alive, not a growing history:
    # a loaded module's records go when it is dropped (a traced one's code, and so its groups, live
    # in PyTorch's global compilation unit until exit: release() drops their records instead).
    import gc

    model, x = ConvNet().eval(), torch.randn(1, 3, 24, 24)
    with torch.no_grad():
        torch.jit.save(torch.jit.freeze(torch.jit.trace(model, x)), str(tmp_path / "m.pt"))
    since = last_seq()
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    with torch.no_grad(), torch_llga.enabled():
        for _ in range(6):
            torch.testing.assert_close(loaded(x), model(x), **FP32)
    assert len(new_choices(since, "fusion_group")) == 2
    del loaded
    gc.collect()
    assert new_choices(since, "fusion_group") == []
    fused = Fused(model, (x,), runs=6)
    assert len(new_choices(since, "fusion_group")) == len(fused.groups) == 2
    torch_llga.release(fused.module)
    assert new_choices(since, "fusion_group") == []


def test_a_fused_groups_choice_is_measured_and_reported():
    # Each group's compiled partition: its 2nd to 4th executions also run its ops in PyTorch, timed
    # (one extra run when the partition is clearly faster); the choice follows the best times, and
    # explain() reports it under the group.
    model, x = ConvNet().eval(), torch.randn(1, 3, 24, 24)
    since = last_seq()
    fused = Fused(model, (x,), runs=6)
    made = new_choices(since, "fusion_group")
    assert len(made) == len(fused.groups) and all(c["how"] == "measured" and follows_the_times(c) for c in made), made
    assert all(set(c["best_us"]) == {"onednn", "pytorch"} for c in made)
    torch.testing.assert_close(fused(x), model(x), **FP32)
    report = torch_llga.explain(model, x, verbose=False)
    assert all(len(g["choices"]) == 1 for g in report.groups), report.groups
    assert "runs by onednn (measured: onednn" in str(report) or "runs by pytorch (measured" in str(report), str(report)


def test_a_partition_slower_than_pytorch_runs_unfused():
    # oneDNN runs some partitions with a reference kernel, hundreds of times slower than PyTorch's
    # ops. The known ones stay out of partitions (onednn_quirks.h); any other loses the measured
    # choice. With the quirk for a per-head bias turned off, that matmul + add is such a partition
    # (its reference kernel: ~0.25 s a call here, not 1 ms).
    code = PER_HEAD_BIAS_MODEL + """
with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = torch.jit.freeze(torch.jit.trace(M().eval(), (x, b)))
    for _ in range(5):  # profiling, compiling + warm-up execution, three timed executions
        m(x, b)
    before = torch_llga.stats()
    y = m(x, b)
    after = torch_llga.stats()
torch.testing.assert_close(y, torch.matmul(x, w) + b, rtol=1e-5, atol=1e-5)
assert before["slow_partitions"] == 1, before
assert after["unfused_by_choice"] == before["unfused_by_choice"] + 1 and after["executions"] == before["executions"]
assert [str(c.message) for c in caught if "faster than oneDNN" in str(c.message)], [str(c.message) for c in caught]
[c] = [c for c in torch_llga.choices() if c["site"] == "fusion_group"]
assert c["chosen"] == "pytorch" and c["how"] == "measured" and c["best_us"]["onednn"] > 5 * c["best_us"]["pytorch"], c
print("ok")
"""
    env = {**os.environ, "TORCH_LLGA_QUIRKS_OFF": "matmul_per_batch_column_post_op", "TORCH_LLGA_SMALL_PLANS": "0",
           "TORCH_LLGA_MACHINE_BUSY": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


CAPPED = """
import json, torch, torch.nn as nn, torch.nn.functional as F, torch_llga
torch_llga.enable()
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.Flatten(),
                      nn.Linear(32 * 16 * 16, 10)).eval()
x = torch.randn(1, 3, 16, 16)
with torch.no_grad():
    m = torch.jit.freeze(torch.jit.trace(model, x))
    for _ in range(6):
        y = m(x)
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
print(json.dumps({"isa": torch_llga.config()["cpu_isa"], "choices": torch_llga.choices()}))
"""


@pytest.mark.parametrize("isa", ["SSE41", "AVX2", None])
def test_the_choice_is_made_on_the_kernels_oneDNN_runs(isa):
    # oneDNN capped to older instruction sets (ONEDNN_MAX_CPU_ISA) runs slower kernels: whatever the
    # cap, the values are eager's and every choice recorded follows its own measured times.
    env = {**os.environ, "TORCH_LLGA_SMALL_PLANS": "0", "TORCH_LLGA_MACHINE_BUSY": "0"}
    env.pop("TORCH_LLGA_CHOICES", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    out = subprocess.run([sys.executable, "-c", CAPPED], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    if isa == "SSE41":
        assert result["isa"] == "sse41", result["isa"]
    made = result["choices"]
    # Two groups (conv + relu, conv), and the one-row classifier on the own kernel where it runs.
    assert [c["site"] for c in made if c["site"] == "fusion_group"] == ["fusion_group"] * 2, made
    assert all(c["how"] == "measured" and follows_the_times(c) for c in made), made


def test_pins_from_the_environment():
    code = "import torch_llga; print(torch_llga.choice_pins())"
    env = {**os.environ, "TORCH_LLGA_CHOICES": "row_linear=pytorch, fusion_group=onednn"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "row_linear=pytorch,fusion_group=onednn", out.stderr
    env["TORCH_LLGA_CHOICES"] = "row_linear=fast"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "" and "TORCH_LLGA_CHOICES ignored: site 'row_linear' has no candidate 'fast'" in out.stderr


def test_no_timing_while_the_machine_is_busy():
    # More runnable threads than cores (/proc/stat): timings would measure the other work too. The
    # default runs meanwhile, untimed; after 64 busy calls it is kept, and says why; values right.
    model, x = ConvNet().eval(), torch.randn(1, 3, 24, 24)
    torch_llga._C._test_machine_busy(1)
    try:
        since = last_seq()
        fused = Fused(model, (x,))
        before = torch_llga.stats()
        for _ in range(10):
            torch.testing.assert_close(fused(x), model(x), **FP32)
        assert new_choices(since, "fusion_group") == []
        assert torch_llga.stats()["executions"] - before["executions"] == 10 * len(fused.groups)
        for _ in range(60):
            fused(x)
        made = new_choices(since, "fusion_group")
        assert [(c["chosen"], c["how"]) for c in made] == [("onednn", "kept: machine busy")] * len(fused.groups), made
    finally:
        torch_llga._C._test_machine_busy(-1)


class NormBlock(nn.Module):
    """conv + group norm + SiLU, a diffusion UNet's block: the group norm is what a measured speed
    rule (quirk group_norm_slow_kernel, on every CPU) keeps out of oneDNN."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16)
        nn.init.uniform_(self.norm.weight, -1, 1)
        nn.init.uniform_(self.norm.bias, -1, 1)

    def forward(self, x):
        return F.silu(self.norm(self.conv(x)))


def speed_choices(graph):
    return graph.findAllNodes("llga::SpeedChoice", True)


@pytest.mark.parametrize("pin", ["pytorch", "onednn"])
def test_a_speed_rule_runs_what_is_pinned(pins, pin):
    # Pinned, a speed rule is applied (its default) or not, in one form: no second one is timed.
    pins(speed_rule=pin)
    model, x = NormBlock().eval(), torch.randn(2, 8, 12, 12)
    fused = Fused(model, (x,))
    assert not speed_choices(fused.graph), fused.graph
    if pin == "pytorch":
        assert not any("group_norm" in g for g in fused.groups) and "group_norm" in fused.unfused, fused.graph
    else:
        assert any("group_norm" in g for g in fused.groups), fused.graph
    torch.testing.assert_close(fused(x), model(x), **FP32)


def test_a_speed_rule_is_measured_against_the_fused_form():
    # Unpinned, the group a speed rule would split runs in two forms: fused, and with the rule
    # applied (the group norm in PyTorch). Each form runs a few calls untimed (its groups compile
    # and check themselves), then they alternate, timed; the faster by the site's margin stays.
    # Right on every call, whichever form runs; the record follows the times; explain() shows it.
    model, x = NormBlock().eval(), torch.randn(2, 8, 12, 12)
    expected = model(x)
    since = last_seq()
    fused = Fused(model, (x,))
    [choice] = speed_choices(fused.graph)
    assert choice.s("speed_rules") == "group_norm_slow_kernel"
    # Until measured, the rule's form is the one reported (it is the default).
    assert not any("group_norm" in g for g in fused.groups), fused.graph
    for _ in range(20):
        torch.testing.assert_close(fused(x), expected, **FP32)
    [made] = new_choices(since, "speed_rule")
    assert made["how"] == "measured" and set(made["best_us"]) == {"pytorch", "onednn"} and follows_the_times(made), made
    assert "group_norm" in made["subject"] and "group_norm_slow_kernel" in made["subject"]
    from torch_llga.report import fusion_groups

    runs_fused = any("group_norm" in g for g in fusion_groups(torch.jit.last_executed_optimized_graph()))
    assert runs_fused == (made["chosen"] == "onednn")
    report = torch_llga.explain(model, x, verbose=False)
    assert "speed rules' choices" in str(report) and "against group_norm_slow_kernel" in str(report), str(report)


def test_a_speed_rule_is_not_timed_while_the_machine_is_busy():
    torch_llga._C._test_machine_busy(1)
    model, x = NormBlock().eval(), torch.randn(2, 8, 12, 12)
    since = last_seq()
    fused = Fused(model, (x,))
    for _ in range(20):
        torch.testing.assert_close(fused(x), model(x), **FP32)
    assert new_choices(since, "speed_rule") == []  # the rule's form runs, untimed, until a quiet call
