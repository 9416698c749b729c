"""Each pass of the pipeline alone, IR in and IR out (torch_llga._C._jit_pass_*), checked with
FileCheck: what the pass must do to a small graph with profiled types, as the pipeline sees it."""
import pytest
import torch
from torch.testing import FileCheck

import torch_llga  # noqa: F401  (registers the passes and operators)
from torch_llga import _C

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
