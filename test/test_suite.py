"""The suite runner (python -m torch_llga.tools.suite) over PyTorch's CPU model lists: a model's row
(torch_llga's ways equal to eager, something fused, the markdown naming it), the lists in the wheel,
and a timm row saying what to install when timm is missing."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def suite(*args, hide=()):
    """python -m torch_llga.tools.suite args, from the checkout; the packages in `hide` as if not installed."""
    hidden = "".join(f"sys.modules[{name!r}] = None; " for name in hide)
    code = (f"import runpy, sys; {hidden}sys.argv = ['torch_llga.tools.suite', *sys.argv[1:]]; "
            "runpy.run_module('torch_llga.tools.suite', run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (the model is one of its)")
def test_a_hugging_face_model_of_the_list(tmp_path):
    # ElectraForCausalLM cut to 2 layers on 32 tokens, one round, without Inductor (whose compile alone
    # takes longer than the rest): the runner's whole path, in seconds.
    out = suite("--list", "huggingface", "--models", "ElectraForCausalLM", "--layers", "2", "--seq", "32", "--rounds", "1",
                "--sample-ms", "1", "--ways", "eager,torch_llga_compile,torch_llga,torchscript", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "suite.json").read_text())["rows"]
    assert [row["model"] for row in rows] == ["ElectraForCausalLM"]
    row = rows[0]
    assert "error" not in row, row["error"]
    for way in ("torch_llga", "torch_llga_compile", "torchscript"):
        assert row["results"][way]["equal"], (way, row["results"][way])
        assert row["results"][way]["times"], way
    assert row["results"]["torch_llga"]["fused_share"] > 0
    assert row["results"]["torch_llga_compile"]["partitions_per_call"] > 0
    markdown = (tmp_path / "suite.md").read_text()
    assert "| ElectraForCausalLM | 1 x 32 tokens |" in markdown and "yes (" in markdown
    assert "[1/1] ElectraForCausalLM: round 1/1" in out.stderr


def test_without_timm_its_rows_say_what_to_install():
    out = suite("--list", "timm", "--models", "lcnet_050,mobilevit_s", "--rounds", "1", hide=["timm"])
    assert out.returncode == 0, out.stderr
    for model in ("lcnet_050", "mobilevit_s"):
        row = next(line for line in out.stdout.splitlines() if line.startswith(f"| {model} |"))
        assert "not run: timm is not installed (pip install timm), a benchmark extra" in row, row


def test_the_wheel_ships_the_lists(tmp_path):
    """setup.py's build_py (the wheel's files), without compiling anything; the lists are PyTorch's."""
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], capture_output=True,
                         text=True, cwd=ROOT, env=dict(os.environ, TORCH_LLGA_METADATA_ONLY="1"))
    assert out.returncode == 0, out.stderr
    from torch_llga.tools.suite import read_list

    for name in ("timm_models_list_cpu.txt", "huggingface_models_list_cpu.txt"):
        shipped = tmp_path / "torch_llga" / "tools" / "suite_lists" / name
        assert shipped.read_text().startswith("# From pytorch/pytorch benchmarks/dynamo/" + name)
    assert ("lcnet_050", 64) in read_list("timm") and ("BertForMaskedLM", 16) in read_list("huggingface")
