"""Each pass of the pipeline alone, IR in and IR out (torch_llga._C._jit_pass_*), checked with
FileCheck: what the pass must do to a small graph with profiled types, as the pipeline sees it."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.testing import FileCheck

import torch_llga  # noqa: F401  (registers the passes and operators)
from torch_llga import _C
from conftest import AVX2, FEATURES

F32 = "Float(2, 8, strides=[8, 1], requires_grad=0, device=cpu)"


def run(pass_name, ir, *passes):
    g = torch._C.parse_ir(ir)
    for name in (pass_name,) + passes:
        getattr(_C, f"_jit_pass_{name}")(g)
    g.lint()
    return g


def test_remove_mutation():
    g = run("remove_mutation", f"""
graph(%x : {F32}):
  %a : {F32} = aten::mul(%x, %x)
  %b : {F32} = aten::relu_(%a)
  return (%b)""")
    FileCheck().check("aten::mul").check("aten::relu(").check_not("aten::relu_").run(g)


def test_decompose_ops():
    # silu after a linear: x * sigmoid(x), which oneDNN takes as the linear's post-ops.
    g = run("decompose_ops", f"""
graph(%x : {F32}, %w : Float(8, 8, strides=[8, 1], requires_grad=0, device=cpu)):
  %none : NoneType = prim::Constant()
  %h : {F32} = aten::linear(%x, %w, %none)
  %y : {F32} = aten::silu(%h)
  return (%y)""")
    FileCheck().check("aten::linear").check("aten::sigmoid").check("aten::mul").check_not("aten::silu").run(g)


def test_prepare_binary():
    # x + 2 (a Scalar) -> x + tensor(2); x * 1 -> x
    g = run("prepare_binary", f"""
graph(%x : {F32}):
  %one : int = prim::Constant[value=1]()
  %two : float = prim::Constant[value=2.]()
  %a : {F32} = aten::add(%x, %two, %one)
  %b : {F32} = aten::mul(%a, %one)
  return (%b)""")
    FileCheck().check_not("aten::mul").check("aten::add").run(g)
    add = g.findNode("aten::add")
    assert add.inputsAt(1).type().kind() == "TensorType"
    assert add.inputsAt(1).toIValue().dtype == torch.float32 and add.inputsAt(1).toIValue().item() == 2


def test_prepare_quantization_folds_a_requantized_clamp():
    # quantize -> dequantize -> hardtanh -> quantize to the same parameters: hardtanh reads x.
    q = "QUInt8(2, 8, strides=[8, 1], requires_grad=0, device=cpu)"
    g = run("prepare_quantization", f"""
graph(%x : {F32}):
  %s : float = prim::Constant[value=0.05]()
  %z : int = prim::Constant[value=128]()
  %dt : int = prim::Constant[value=13]()
  %lo : float = prim::Constant[value=0.]()
  %hi : float = prim::Constant[value=6.]()
  %q1 : {q} = aten::quantize_per_tensor(%x, %s, %z, %dt)
  %d1 : {F32} = aten::dequantize(%q1)
  %c : {F32} = aten::hardtanh(%d1, %lo, %hi)
  %q2 : {q} = aten::quantize_per_tensor(%c, %s, %z, %dt)
  %d2 : {F32} = aten::dequantize(%q2)
  return (%d2)""")
    FileCheck().check("aten::hardtanh(%x").check_count("aten::quantize_per_tensor", 1, exactly=True).run(g)


def test_defer_size_check():
    # aten::size of a shape-preserving op's output reads its input instead, so it no longer waits for it.
    g = run("defer_size_check", f"""
graph(%x : {F32}):
  %zero : int = prim::Constant[value=0]()
  %r : {F32} = aten::relu(%x)
  %n : int = aten::size(%r, %zero)
  return (%r, %n)""")
    FileCheck().check("aten::size(%x").run(g)


MLP = f"""
graph(%x : {F32}, %w1 : Float(16, 8, strides=[8, 1], requires_grad=0, device=cpu),
      %w2 : Float(4, 16, strides=[16, 1], requires_grad=0, device=cpu)):
  %none : NoneType = prim::Constant()
  %h : Float(2, 16, strides=[16, 1], requires_grad=0, device=cpu) = aten::linear(%x, %w1, %none)
  %r : Float(2, 16, strides=[16, 1], requires_grad=0, device=cpu) = aten::relu(%h)
  %y : Float(2, 4, strides=[4, 1], requires_grad=0, device=cpu) = aten::linear(%r, %w2, %none)
  return (%y)"""


@pytest.mark.small_plan
def test_plan_small_graph():
    # A whole graph of tiny tensors -> one llga::SmallPlan; with an op it has no step for, unchanged.
    small = f"""
graph(%x : {F32}, %y : {F32}):
  %one : int = prim::Constant[value=1]()
  %a : {F32} = aten::add(%x, %y, %one)
  %b : {F32} = aten::{{op}}(%a)
  return (%b)"""
    g = run("plan_small_graph", small.format(op="relu"))
    assert [n.kind() for n in g.nodes() if n.kind() != "prim::Constant"] == ["llga::SmallPlan"]
    assert [n.kind() for n in g.findNode("llga::SmallPlan").g("Subgraph").nodes() if n.kind().startswith("aten::")] == \
        ["aten::add", "aten::relu"]
    g = run("plan_small_graph", small.format(op="erf"))  # no step for erf
    assert [n.kind() for n in g.nodes() if n.kind() != "prim::Constant"] == ["aten::add", "aten::erf"]


def test_fuse_graph():
    g = run("fuse_graph", MLP)
    groups = g.findAllNodes("llga::FusionGroup")
    assert [[n.kind() for n in grp.g("Subgraph").nodes() if n.kind() != "prim::Constant"] for grp in groups] == [
        ["aten::linear", "aten::relu"], ["aten::linear"]]
    assert [n.kind() for n in g.nodes() if n.kind() != "prim::Constant"] == ["llga::FusionGroup"] * 2


def test_propagate_layout():
    # The first group's output is read by the second group only: it may stay in oneDNN's layout.
    g = run("fuse_graph", MLP, "propagate_layout")
    assert [getattr(grp, "is")("opaque_outputs") for grp in g.findAllNodes("llga::FusionGroup")] == [[1], [0]]


def test_propagate_layout_past_size_reads():
    # aten::size reads sizes only (transformers' layers read their input's): still groups only. Read
    # as a reader, Whisper's residual stream went to PyTorch in eager's transposed strides and was
    # copied twice a layer.
    mlp_with_size = MLP.replace("  return (%y)", "  %zero : int = prim::Constant[value=0]()\n"
                                "  %n : int = aten::size(%r, %zero)\n  return (%y, %n)")
    g = run("fuse_graph", mlp_with_size, "propagate_layout")
    assert [getattr(grp, "is")("opaque_outputs") for grp in g.findAllNodes("llga::FusionGroup")] == [[1], [0]]


def test_insert_guards():
    g = run("fuse_graph", MLP, "insert_guards")
    FileCheck().check("llga::Guard").check("prim::If").check("llga::FusionGroup").check("prim::FallbackGraph").run(g)
    assert len(g.findAllNodes("llga::Guard")) == 2  # one per group


def test_speed_choices():
    # A group holding an op a measured speed rule would keep out (group_norm_slow_kernel) gets two
    # forms under llga::SpeedChoice: the group (block 0), its ops fused again with the rule applied
    # (block 1: the group norm in PyTorch); each form ends its timing with llga::SpeedChoiceEnd.
    # Pinned to the rule's side, the rule applies in the fuser and no second form is made.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = nn.Conv2d(4, 8, 3, padding=1), nn.GroupNorm(2, 8)

        def forward(self, x):
            return torch.relu(self.norm(self.conv(x)))

    g = traced_graph(Block(), torch.randn(1, 4, 8, 8))
    for name in ("fuse_graph", "speed_choices"):
        getattr(_C, f"_jit_pass_{name}")(g)
    g.lint()
    [choice] = g.findAllNodes("llga::SpeedChoice")
    assert choice.s("speed_rules") == "group_norm_slow_kernel"
    [branch] = [n for n in g.nodes() if n.kind() == "prim::If"]
    fused, ruled = branch.blocks()
    assert [kinds_in(grp) for grp in fused.findAllNodes("llga::FusionGroup")] == [["aten::group_norm", "aten::relu"]]
    assert "aten::group_norm" in [n.kind() for n in ruled.nodes()]
    assert all(list(b.nodes())[-1].kind() == "llga::SpeedChoiceEnd" for b in (fused, ruled))
    torch_llga.pin_choices(speed_rule="pytorch")
    try:
        g = traced_graph(Block(), torch.randn(1, 4, 8, 8))
        _C._jit_pass_fuse_graph(g)
        _C._jit_pass_speed_choices(g)
        assert not g.findAllNodes("llga::SpeedChoice") and "aten::group_norm" in kinds(g)
    finally:
        torch_llga.pin_choices(None)


def kinds_in(group):
    return [n.kind() for n in group.g("Subgraph").nodes() if n.kind().startswith("aten::")]


def traced_graph(model, *inputs):
    """A traced graph with the weights as constants and every value typed with its traced sizes
    (as the pipeline sees a frozen, profiled graph)."""
    model = model.eval().requires_grad_(False)
    with torch.no_grad():
        g = torch.jit.trace(lambda *xs: model(*xs), inputs).graph
    # As the executor hands graphs over: constants folded, chunk + ListUnpack as prim::ConstantChunk.
    torch._C._jit_pass_constant_propagation(g)
    torch._C._jit_pass_canonicalize_graph_fuser_ops(g)
    return g


def kinds(g):
    return [n.kind() for n in g.nodes() if n.kind() not in ("prim::Constant", "prim::ListConstruct", "prim::GetAttr")]


def test_every_pass_has_an_ir_entry_and_a_switch():
    names = [p["name"] for p in torch_llga.passes()]
    assert names[0] == "remove_mutation" and names[-1] == "own_kernels_after_guards" and len(set(names)) == len(names)
    for name in names:
        assert callable(getattr(_C, f"_jit_pass_{name}")), name
    # Each pass has an IR-in/IR-out test in this file.
    source = open(__file__).read()
    assert [n for n in names if f'"{n}"' not in source and f"_jit_pass_{n}(" not in source] == []
    required = [p["name"] for p in torch_llga.passes() if p["required"]]
    assert required == ["remove_mutation", "prepare_binary", "prepare_quantization", "insert_guards"]
    with pytest.raises(ValueError, match="cannot be switched off"):
        torch_llga.set_passes_off("insert_guards")
    with pytest.raises(ValueError, match="no pass or own kernel 'row_linears'; known: .*row_linear"):
        torch_llga.set_passes_off(["row_linears"])
    assert _C._passes_off() == []


def test_a_switched_off_pass_or_own_kernel_does_not_run():
    model = nn.Sequential(nn.Linear(300, 1100), nn.ReLU(), nn.Linear(1100, 600))
    x = torch.randn(1, 300)
    try:
        for off, own in [((), 2), ("row_linear", 0), ("own_kernels_before_fuser", 0)]:
            torch_llga.set_passes_off(off)
            with torch.no_grad(), torch_llga.enabled():
                m = torch.jit.freeze(torch.jit.trace(model.eval(), x))
                m(x)
                y = m(x)
                graph = str(torch.jit.last_executed_optimized_graph())
            assert graph.count("llga::row_linear(") == (own if AVX2 else 0), (off, graph)
            torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
        torch_llga.set_passes_off("fuse_graph")
        with torch.no_grad(), torch_llga.enabled():
            m = torch.jit.freeze(torch.jit.trace(model.eval(), torch.randn(8, 300)))
            m(torch.randn(8, 300))
            m(torch.randn(8, 300))
            assert "llga::FusionGroup" not in str(torch.jit.last_executed_optimized_graph())
    finally:
        torch_llga.set_passes_off(())


def test_own_kernel_table():
    rows = torch_llga.own_kernel_table()
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names) and {"row_linear", "widened_linear", "decode_attention"} <= set(names)
    sites = {s["site"] for s in torch_llga.choice_sites()}
    assert all(r["choice"] in sites for r in rows if r["choice"]), rows
    assert {r["phase"] for r in rows} == {"early", "before_fuser", "after_guards", "inside_pass"}
    for r in rows:
        if r["phase"] != "inside_pass":
            assert callable(getattr(_C, f"_jit_pass_own_{r['name']}")), r


def test_compose_rms_norm():
    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(64))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    g = traced_graph(Llama(), torch.randn(2, 64))
    _C._jit_pass_compose_rms_norm(g)
    torch._C._jit_pass_dce(g)
    assert kinds(g) == ["aten::rms_norm"], g


def test_split_chunked_linears():
    class Geglu(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(32, 128)

        def forward(self, x):
            h, gate = self.proj(x).chunk(2, -1)
            return h * F.gelu(gate)

    g = traced_graph(Geglu(), torch.randn(4, 32))
    _C._jit_pass_split_chunked_linears(g)
    torch._C._jit_pass_dce(g)
    assert kinds(g).count("aten::linear") == 2 and "aten::chunk" not in kinds(g), g


def test_merge_parallel_linears():
    class Qkv(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(64, 64, bias=False) for _ in range(3))

        def forward(self, x):
            return self.q(x) * self.k(x) + self.v(x)

    g = traced_graph(Qkv(), torch.randn(4, 64))
    _C._jit_pass_merge_parallel_linears(g)
    torch._C._jit_pass_dce(g)
    assert kinds(g).count("aten::linear") == 1 and kinds(g).count("aten::slice") == 3, g


@pytest.mark.skipif(not AVX2, reason="torch_llga's own kernels need AVX2 and FMA")
def test_own_kernels_before_fuser():
    # A linear of one row over 330K weights: llga::row_linear; of 8 rows: left for the fuser.
    model = nn.Sequential(nn.Linear(300, 1100), nn.ReLU())
    g = traced_graph(model, torch.randn(1, 300))
    _C._jit_pass_own_kernels_before_fuser(g)
    assert kinds(g) == ["llga::row_linear", "aten::relu"], g
    g = traced_graph(model, torch.randn(8, 300))
    _C._jit_pass_own_kernels_before_fuser(g)
    assert kinds(g) == ["aten::linear", "aten::relu"], g


@pytest.mark.skipif(not AVX2, reason="torch_llga's own kernels need AVX2 and FMA")
def test_own_kernels_early():
    # A decoder's step: one query over a cache of 64-wide heads -> llga::decode_attention.
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    g = torch.jit.trace(attend, (torch.randn(1, 4, 1, 64), torch.randn(1, 4, 32, 64), torch.randn(1, 4, 32, 64))).graph
    _C._jit_pass_own_kernels_early(g)
    torch._C._jit_pass_dce(g)
    assert kinds(g) == ["llga::decode_attention"], g


@pytest.mark.skipif(not FEATURES["avx512"], reason="torch_llga's quantize kernel needs AVX-512")
def test_own_kernels_after_guards():
    # PyTorch's quantize of an fp32 tensor of 16K+ values -> llga::quantize_per_tensor.
    def quantize(x):
        return torch.quantize_per_tensor(x, 0.1, 3, torch.quint8)

    g = torch.jit.trace(quantize, torch.randn(1, 16, 32, 32)).graph
    _C._jit_pass_own_kernels_after_guards(g)
    torch._C._jit_pass_dce(g)
    assert kinds(g) == ["llga::quantize_per_tensor"], g


def test_in_place_activations():
    # A GELU left to PyTorch that alone reads a group's fresh output: gelu_ on it.
    g = run("fuse_graph", MLP, "insert_guards")
    out = next(g.outputs())
    gelu = g.create("aten::gelu", [out, g.insertConstant("none")])
    g.appendNode(gelu)
    gelu.output().setType(out.type())
    g.eraseOutput(0)
    g.registerOutput(gelu.output())
    _C._jit_pass_in_place_activations(g)
    FileCheck().check("llga::FusionGroup").check("aten::gelu_").check_not("aten::gelu(").run(g)
