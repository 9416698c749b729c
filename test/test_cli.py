"""python -m torch_llga run / explain on saved models, and its one-line errors; the tools the docs
name (python -m torch_llga.<tool>) are in the wheel, start without the optional packages, and name
the one they miss."""
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "model.pt"
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()).eval()
    with torch.no_grad():
        torch.jit.freeze(torch.jit.trace(model, torch.rand(1, 3, 16, 16))).save(str(path))
    return str(path)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "torch_llga", *args], capture_output=True, text=True)


def test_run(saved):
    out = cli("run", saved, "--input", "1x3x16x16", "--runs", "3", "--threads", "1")
    assert out.returncode == 0, out.stderr
    assert "TorchScript" in out.stdout and "torch_llga" in out.stdout and "max abs diff" in out.stdout
    diff = float(out.stdout.rsplit("max abs diff", 1)[1])
    assert diff < 1e-5


def test_explain(saved):
    out = cli("explain", saved, "--input", "1x3x16x16")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2 partitions, 4 ops fused, 0 left to PyTorch; 100% of the ops run fused")
    assert "partition 0: 2 ops [_convolution, relu]  inputs: float32[1, 3, 16, 16]" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["run", "/no/such/model.pt", "--input", "1x3x16x16"], "no such file"),
    (["run", "{model}", "--input", "1xAx16"], "bad --input"),
    (["run", "{model}", "--input", "1x3x16"], "does not accept input"),
    (["explain", "{notmodel}", "--input", "1x3x16x16"], "is not a saved TorchScript model"),
])
def test_errors_are_one_line(saved, tmp_path, args, message):
    notmodel = tmp_path / "notes.txt"
    notmodel.write_text("not a model")
    out = cli(*[a.format(model=saved, notmodel=notmodel) for a in args])
    assert out.returncode != 0
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_help():
    out = cli("--help")
    assert out.returncode == 0 and "run" in out.stdout and "explain" in out.stdout
    out = cli("run", "--help")
    assert "--input" in out.stdout and "--dtype" in out.stdout and "--threads" in out.stdout


def test_bench_ratios_are_paired_by_round():
    from torch_llga.tools.bench import paired_ratio, ratio_cell

    # The shared machine ran rounds 2 and 5 four times slower, for both backends alike: every
    # per-round ratio is still 2.0x.
    base, llga = [4.0, 16.0, 4.2, 4.4, 16.2], [2.0, 8.0, 2.1, 2.2, 8.1]
    median, q1, q3 = paired_ratio(base, llga)
    assert median == pytest.approx(2.0) and q1 == pytest.approx(2.0) and q3 == pytest.approx(2.0)
    assert ratio_cell((median, q1, q3)) == "2.00x"
    # A difference the rounds disagree on is marked as noise.
    assert ratio_cell(paired_ratio([1.0, 1.0, 1.0, 1.0], [0.9, 1.1, 0.95, 1.05])) == "1.00x~"


def test_bench_int8_columns_time_each_door_against_each_peer():
    import argparse

    from torch_llga.tools.bench import markdown

    # Each backend 1 ms slower than the one before it, in every round.
    backends = ["torchscript_fp32", "pt2e_llga", "pt2e_llga_export", "openvino_nncf", "onnxruntime_int8"]
    results = {b: {"median_ms": 1.0 + i, "times": [1.0 + i] * 3, "warmup_ms": 9.0} for i, b in enumerate(backends)}
    table = markdown([{"model": "m", "flops": 0, "results": results}], backends,
                     argparse.Namespace(dtype="int8", batch=1, batches=[1], rounds=3, drift_inputs=0))
    head, _, row = table.splitlines()[2:5]
    cells = dict(zip(head.strip("| ").split(" | "), row.strip("| ").split(" | ")))
    # pt2e_llga's (the run has no torch_llga), then pt2e_llga_export's.
    assert cells["llga vs TS fp32"] == "0.50x"
    assert cells["llga vs OpenVINO NNCF"] == "2.00x" and cells["llga vs ORT int8"] == "2.50x"
    assert cells["llga_export vs OpenVINO NNCF"] == "1.33x" and cells["llga_export vs ORT int8"] == "1.67x"


def test_layer_times_averages_each_position_of_the_repeated_call():
    from torch_llga.tools.layer_times import executions, per_call

    def prim(kind, shape, ms):
        return f"onednn_verbose,v1,primitive,exec,cpu,{kind},impl:avx512,forward,src:f32,,,{shape},{ms}"

    # Three timed calls of (reorder, conv, conv), other output between the lines.
    lines = []
    for call in range(3):
        lines += [prim("reorder", "1x3x8x8", 0.1), prim("convolution", "mb1_ic3oc8", 1.0 + call),
                  "some other output", prim("convolution", "mb1_ic8oc8", 2.0)]
    rows = executions("\n".join(lines), "primitive")
    assert len(rows) == 9 and rows[0] == ("reorder", "impl:avx512", "1x3x8x8", 0.1)
    layers = per_call(rows, calls=3)
    assert [(kind, shape) for kind, _, shape, *_ in layers] == [("reorder", "1x3x8x8"), ("convolution", "mb1_ic3oc8"),
                                                                ("convolution", "mb1_ic8oc8")]
    assert [ms for *_, ms, _ in layers] == pytest.approx([0.1, 2.0, 2.0]) and [n for *_, n in layers] == [1, 1, 1]
    # The last call printed its convs in the other order (two threads): times by kind.
    swapped = rows[:6] + [rows[6], rows[8], rows[7]]
    by_kind = per_call(swapped, calls=3)
    assert [(shape, ms, n) for _, _, shape, ms, n in by_kind] == [("1x3x8x8", pytest.approx(0.1), 1),
                                                                   ("mb1_ic3oc8", pytest.approx(2.0), 1),
                                                                   ("mb1_ic8oc8", pytest.approx(2.0), 1)]
    # Calls that ran different executions give no per-layer times.
    assert per_call(rows[:8] + [("reorder", "impl:avx512", "1x3x8x8", 0.1)], calls=3) is None
    assert per_call(rows[:8], calls=3) is None


def test_layer_times_groups_partitions_by_kind():
    from torch_llga.tools.layer_times import by_partition_kind, executions, per_call

    def part(kind, ops, ms):
        return f"onednn_verbose,v1,graph,exec,cpu,1000,{kind},{ops},,in0_f32:1:strided,fpm:strict,impl,{ms}"

    lines = [part("sdp", "matmul;softmax;matmul", 0.4), part("matmul_post_ops", "linear", 1.0),
             part("sdp", "matmul;softmax;matmul", 0.5)] * 2
    parts = per_call(executions("\n".join(lines), "graph"), calls=2)
    assert [(k, ops) for k, ops, *_ in parts] == [("sdp", "matmul;softmax;matmul"), ("matmul_post_ops", "linear"),
                                                  ("sdp", "matmul;softmax;matmul")]
    assert by_partition_kind(parts) == [("matmul_post_ops", "linear", "", pytest.approx(1.0), 1),
                                        ("sdp", "matmul;softmax;matmul", "", pytest.approx(0.9), 2)]


ROOT = pathlib.Path(__file__).resolve().parent.parent
OPTIONAL = ["torchvision", "transformers", "matplotlib", "openvino", "onnxruntime", "onnx", "nncf"]


def documented_tools():
    """Every `python -m torch_llga[.tool]` the README, docs/ and BENCHMARKS.md show."""
    docs = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
    return sorted({m for doc in docs for m in re.findall(r"python -m (torch_llga(?:\.\w+)*)", doc.read_text())})


def without_optional(module, *args):
    """python -m module args, from the checkout, as if no optional package were installed (nor test/
    on the path)."""
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in OPTIONAL)
    code = f"import runpy, sys; {hide}sys.argv = [{module!r}, *sys.argv[1:]]; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)


def test_the_docs_name_the_tools():
    assert {"torch_llga", "torch_llga.tools.bench", "torch_llga.tools.check_models", "torch_llga.tools.layer_times"} <= set(documented_tools())


@pytest.mark.parametrize("module", documented_tools())
def test_documented_tool_help_runs_without_optional_packages(module):
    out = without_optional(module, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {module} ")


def test_the_wheel_holds_every_documented_tool(tmp_path):
    """setup.py's build_py (what the wheel's Python files are), without compiling anything."""
    out = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path), "build_py",
                          "--build-lib", str(tmp_path / "lib")], capture_output=True, text=True, cwd=ROOT,
                         env=dict(os.environ, TORCH_LLGA_METADATA_ONLY="1"))
    assert out.returncode == 0, out.stderr
    lib = tmp_path / "lib" / "torch_llga"
    shipped = {str(p.relative_to(lib)) for p in lib.rglob("*.py")}
    for module in documented_tools():
        assert "/".join(module.split(".")[1:] or ["__main__"]) + ".py" in shipped, module
    # The tools import only the package (never test/): all of its modules ship.
    assert shipped == {str(p.relative_to(ROOT / "torch_llga")) for p in (ROOT / "torch_llga").rglob("*.py")}


def test_the_ops_doc_is_the_op_tables(tmp_path):
    """docs/ops.md's generated part is what the op table and the own kernel table give now; a stale
    part is reported in one line and --write replaces it, leaving the hand-written part."""
    out = without_optional("torch_llga.tools.ops_doc", "--check", "docs/ops.md")
    assert out.returncode == 0, out.stderr
    page = (ROOT / "docs" / "ops.md").read_text()
    stale = tmp_path / "ops.md"
    stale.write_text(page.replace("| `relu` | ReLU |", "| `relu` | Tanh |"))
    out = without_optional("torch_llga.tools.ops_doc", "--check", str(stale))
    assert out.returncode == 1
    assert out.stderr.strip() == (f"{stale} is not what the op table gives now: run python -m torch_llga.tools.ops_doc "
                                  f"--write {stale}")
    out = without_optional("torch_llga.tools.ops_doc", "--write", str(stale))
    assert out.returncode == 0, out.stderr
    assert stale.read_text() == page
    # A page without the markers gets them, with the part, at its end.
    from torch_llga.tools.ops_doc import BEGIN, END, generated_part, with_part

    written = with_part("# Ops\n\nProse.\n", "part\n")
    assert written == f"# Ops\n\nProse.\n\n{BEGIN}\n\npart\n\n{END}\n" and generated_part(written) == "part\n"


@pytest.mark.parametrize("module,args,message", [
    ("torch_llga.tools.demo", [], "the demo needs torchvision, which is not installed: pip install torchvision"),
    ("torch_llga.tools.layer_times", ["--model", "mobilenet_v2"], "mobilenet_v2 needs torchvision"),
    ("torch_llga.tools.bench", ["--models", "mlp", "--out", "x"], "needs matplotlib, which is not installed: pip install matplotlib"),
    ("torch_llga.tools.check_models", ["--models", "resnet18,gpt2"], "skipping gpt2: transformers is not installed (pip install transformers)"),
    ("torch_llga.tools.bench_llm", [], "the LLM benchmark needs transformers, which is not installed: pip install transformers"),
])
def test_a_missing_optional_package_is_named(module, args, message):
    out = without_optional(module, *args)
    assert message in out.stderr and "Traceback" not in out.stderr


def test_the_int8_peers_say_what_to_install():
    """The int8 run's other runtimes are benchmark extras: without them their cells name the package,
    and the run goes on with the others."""
    out = without_optional("torch_llga.tools.bench", "--dtype", "int8", "--models", "mlp", "--rounds", "1", "--sample-ms", "1",
                           "--backends", "torchscript_fp32,torch_llga,openvino_nncf,onnxruntime_int8")
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("| mlp |"))
    assert "failed: ImportError: openvino is not installed" in row and "failed: ImportError: onnx is not installed" in row
    assert row.split(" | ")[1].replace(".", "").isdigit(), row  # torchscript_fp32 timed


def test_int8_drift_over_random_inputs():
    # --drift-inputs N: max / mean abs difference from the fp32 model and top-1 agreement over N
    # random inputs; the fp32 model's own TorchScript agrees fully.
    out = subprocess.run([sys.executable, "-m", "torch_llga.tools.bench", "--dtype", "int8", "--models", "mlp", "--rounds", "1",
                          "--sample-ms", "1", "--backends", "torchscript_fp32,torch_llga", "--drift-inputs", "5"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    table = out.stdout.split("over 5 random inputs")[1]
    fp32, llga = next(line for line in table.splitlines() if line.startswith("| mlp |")).strip(" |").split(" | ")[1:]
    assert fp32.endswith(", 100.0%") and float(fp32.split(" / ")[0]) < 1e-4, fp32
    max_abs, rest = llga.split(" / ")
    # (the random MLP's logits lie close together: int8 changes its top-1 on some inputs)
    assert 0 < float(max_abs) < 1 and 0 <= float(rest.split(", ")[1].rstrip("%")) <= 100, llga
    bad = subprocess.run([sys.executable, "-m", "torch_llga.tools.bench", "--models", "mlp", "--drift-inputs", "5"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "use it with --dtype int8" in bad.stderr


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
def test_the_llm_bench_says_how_to_get_its_openvino_backend():
    code = ("import runpy, sys; sys.modules['optimum'] = None; sys.argv = ['torch_llga.tools.bench_llm', *sys.argv[1:]]; "
            "runpy.run_module('torch_llga.tools.bench_llm', run_name='__main__', alter_sys=True)")
    out = subprocess.run([sys.executable, "-c", code, "--backends", "openvino", "--prompt", "4", "--new-tokens", "2",
                          "--rounds", "1"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| smollm2_135m | openvino | failed: RuntimeError: needs optimum-intel: make openvino-venv, then " \
           "--openvino-python .venv-openvino/bin/python" in out.stdout
