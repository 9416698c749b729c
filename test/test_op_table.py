"""The op table is where every fact about an op lives. These tests walk it, so an op added to the
table is checked by every pass that asks about its family, with no list to update here:

- every op with a oneDNN mapping is named by a test of its own;
- every unary elementwise op (kEltwise, `(Tensor self) -> Tensor`) fuses alone, has its in-place
  form made functional (RemoveMutation), keeps its input's sizes and dtype in type inference
  (kShapePreserving: DeferSizeCheck reads the input's sizes instead), and explain() has no
  reason for it;
- every arithmetic binary op (kAdditive, kMultiplicative) takes a Python scalar (PrepareBinary)
  and fuses with it.
"""
import pathlib
import re

import pytest
import torch
from torch.testing import FileCheck

import torch_llga
from conftest import check

TABLE = torch_llga._C._op_table()
F32 = "Float(2, 8, strides=[8, 1], requires_grad=0, device=cpu)"


def op_name(schema):
    """aten::relu(Tensor self) -> Tensor: 'relu'; aten::add.Tensor(...): 'add'."""
    return re.match(r"\w+::(\w+)", schema).group(1)


MAPPED = [e for e in TABLE if e["onednn"]]
UNARY = [e for e in MAPPED if "kEltwise" in e["flags"] and "(Tensor self) -> Tensor" in e["schema"]]
ARITHMETIC = [e for e in MAPPED if {"kAdditive", "kMultiplicative"} & set(e["flags"])]


def ids(e):
    return op_name(e["schema"])


def unary_fn(name):
    return getattr(torch, name, None) or getattr(torch.nn.functional, name)


def unary_input(name):
    x = torch.randn(2, 8, 16)
    return x.abs() + 0.1 if name in ("log", "sqrt") else x


def test_the_table_is_walked():
    names = {op_name(e["schema"]) for e in MAPPED}
    assert {"conv2d", "linear", "relu", "add", "layer_norm", "mish"} <= names
    assert len(UNARY) >= 10 and {op_name(e["schema"]) for e in ARITHMETIC} == {"add", "sub", "mul", "div"}


@pytest.mark.parametrize("entry", MAPPED, ids=lambda e: e["schema"].split("(")[0])
def test_every_mapped_op_has_a_test_of_its_own(entry):
    """Adding an op is one entry and one test, which names it (in the groups it expects, or as the
    module or function it calls: nn.Conv1d for conv1d)."""
    sources = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*.py") if p.name != "test_op_table.py")
    name = op_name(entry["schema"])
    assert re.search(rf"\b{name}\b", sources, re.IGNORECASE), f"no test names {name}"


@pytest.mark.usefixtures("all_partitions")
@pytest.mark.parametrize("entry", UNARY, ids=ids)
def test_unary_op_fuses_alone(entry):
    name = op_name(entry["schema"])
    check(unary_fn(name), unary_input(name), groups=[[name]])


@pytest.mark.parametrize("entry", [e for e in UNARY if hasattr(torch.Tensor, ids(e) + "_")], ids=ids)
def test_in_place_form_is_made_functional(entry):
    name = op_name(entry["schema"])
    g = torch._C.parse_ir(f"""
graph(%x : {F32}):
  %a : {F32} = aten::mul(%x, %x)
  %b : {F32} = aten::{name}_(%a)
  return (%b)""")
    torch_llga._C._jit_pass_remove_mutation(g)
    FileCheck().check(f"aten::{name}(").check_not(f"aten::{name}_").run(g)


@pytest.mark.parametrize("entry", UNARY, ids=ids)
def test_unary_op_keeps_its_input_sizes(entry):
    """aten::size of the op's output reads its input instead (DeferSizeCheck), so the op can fuse."""
    name = op_name(entry["schema"])
    g = torch._C.parse_ir(f"""
graph(%x : {F32}):
  %zero : int = prim::Constant[value=0]()
  %a : {F32} = aten::{name}(%x)
  %n : int = aten::size(%a, %zero)
  return (%a, %n)""")
    torch_llga._C._jit_pass_defer_size_check(g)
    size = g.findNode("aten::size")
    assert size.inputsAt(0).debugName() == "x", str(g)


class Unary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a):
        return self.fn(a)


def test_explain_has_no_reason_for_a_fused_unary_op():
    torch_llga._C._set_fuse_all_partitions(True)
    try:
        for entry in UNARY:
            name = op_name(entry["schema"])
            report = torch_llga.explain(Unary(unary_fn(name)), unary_input(name), verbose=False)
            assert [g["ops"] for g in report.groups] == [[name]] and not report.unfused, (name, str(report))
    finally:
        torch_llga._C._set_fuse_all_partitions(False)


@pytest.mark.usefixtures("all_partitions")
@pytest.mark.parametrize("entry", ARITHMETIC, ids=ids)
def test_arithmetic_op_takes_a_scalar(entry):
    name = op_name(entry["schema"])
    fn = getattr(torch, name)
    check(lambda a: fn(a, 1.5), torch.randn(4, 16), groups=[[name]])
