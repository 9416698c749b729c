"""The CMake package for libtorch programs: build and install libtorch_llga with CMake, build the
example program against it with find_package(TorchLLGA), run it on a model saved from Python; and
preload the library into a program that never mentions torch_llga."""
import os
import subprocess
import sys

import pytest
import torch
import torch.utils
from resnet import resnet18

import torch_llga
from conftest import ConvNet, fusion_groups
from torch_llga.tools.bench_models import MODELS

# Under `make test-sanitize` this module only costs time: it builds a separate, unsanitized
# libtorch_llga with CMake (minutes longer with the ASan runtime preloaded into every compiler) and
# runs its programs in a clean environment, so no sanitized code would run.
pytestmark = pytest.mark.skipif(os.environ.get("TORCH_LLGA_SANITIZE") == "1",
                                reason="CMake build is not sanitized; nothing sanitized would run")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def cmake(*args, cwd=ROOT):
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ["PATH"]}  # the venv's ninja
    subprocess.run(["cmake", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmake")
    prefix = tmp / "install"
    cmake("-S", ROOT, "-B", str(tmp / "lib"), "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
          f"-DCMAKE_INSTALL_PREFIX={prefix}")
    cmake("--build", str(tmp / "lib"), "-j2")
    cmake("--install", str(tmp / "lib"))
    cmake("-S", os.path.join(ROOT, "examples", "cpp"), "-B", str(tmp / "example"), "-G", "Ninja",
          f"-DCMAKE_PREFIX_PATH={prefix}")
    cmake("--build", str(tmp / "example"))
    model = tmp / "resnet18.pt"
    with torch.no_grad():
        torch.jit.freeze(torch.jit.trace(resnet18().eval(), torch.rand(1, 3, 64, 64))).save(str(model))
        # A model small enough for a small-graph plan, its inputs and eager's output.
        small, inputs = MODELS["deep_and_wide_64"](1)
        small_model = tmp / "deep_and_wide.pt"
        torch.jit.freeze(torch.jit.trace(small.eval(), inputs)).save(str(small_model))
        torch.save({"inputs": inputs, "expected": small(*inputs)}, str(tmp / "deep_and_wide_io.pt"))
        # torch.export's way in: a program with a dynamic batch, saved by torch_llga.compile(...).save.
        cnn = ConvNet().eval()
        batch = torch.export.Dim("batch", min=1, max=64)
        program = torch.export.export(cnn, (torch.rand(2, 3, 16, 16),), dynamic_shapes=({0: batch},))
        torch_llga.compile(program).save(str(tmp / "exported.pt"))
        x = [torch.rand(b, 3, 16, 16) for b in (2, 5)]
        torch.save({"inputs": x, "expected": [cnn(t) for t in x]}, str(tmp / "exported_io.pt"))
    return {"prefix": prefix, "example": tmp / "example" / "run_model", "model": model,
            "small_model": small_model, "small_io": tmp / "deep_and_wide_io.pt",
            "exported": tmp / "exported.pt", "exported_io": tmp / "exported_io.pt"}


def clean_env(**extra):
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **extra}  # no LD_LIBRARY_PATH


def test_cpp_example_runs_fused_and_agrees(built):
    out = subprocess.run([str(built["example"]), str(built["model"]), "1x3x64x64", "5"], env=clean_env(),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "outputs agree" in out.stdout and "torch_llga" in out.stdout


def test_package_installs_header_and_config(built):
    prefix = built["prefix"]
    assert (prefix / "include" / "torch_llga.h").exists()
    assert (prefix / "lib" / "cmake" / "TorchLLGA" / "TorchLLGAConfig.cmake").exists()
    assert (prefix / "lib" / "libtorch_llga.so").exists()


PRELOADED = """
import warnings, torch
warnings.filterwarnings("ignore")
m = torch.jit.load({model!r})
x = torch.rand(1, 3, 64, 64)
with torch.no_grad():
    m(x); m(x); y = m(x)
g = torch.jit.last_executed_optimized_graph()
print(len(g.findAllNodes("llga::FusionGroup", True)))
"""


@pytest.mark.parametrize("enable,fused", [("1", True), ("0", False)])
def test_preloaded_library_fuses_without_code_changes(built, enable, fused):
    lib = built["prefix"] / "lib" / "libtorch_llga.so"
    out = subprocess.run([sys.executable, "-c", PRELOADED.format(model=str(built["model"]))],
                         env=clean_env(LD_PRELOAD=str(lib), TORCH_LLGA_ENABLE=enable),
                         capture_output=True, text=True, check=True)
    groups = int(out.stdout.strip().splitlines()[-1])
    assert (groups > 0) == fused


PRELOADED_PLAN = """
import warnings, torch
warnings.filterwarnings("ignore")
m = torch.jit.load({model!r})
io = torch.load({io!r})
with torch.no_grad():
    m(*io["inputs"]); m(*io["inputs"]); y = m(*io["inputs"])
g = torch.jit.last_executed_optimized_graph()
print(len(g.findAllNodes("llga::SmallPlan", True)), (y - io["expected"]).abs().max().item())
"""


def test_preloaded_library_runs_small_graph_plans(built):
    lib = built["prefix"] / "lib" / "libtorch_llga.so"
    out = subprocess.run([sys.executable, "-c", PRELOADED_PLAN.format(model=str(built["small_model"]), io=str(built["small_io"]))],
                         env=clean_env(LD_PRELOAD=str(lib), TORCH_LLGA_ENABLE="1"), capture_output=True, text=True, check=True)
    plans, diff = out.stdout.strip().splitlines()[-1].split()
    assert int(plans) == 1 and float(diff) <= 1e-5


@pytest.mark.parametrize("batch", ["2", "7"])
def test_exported_program_saved_runs_fused_in_a_cpp_program(built, batch):
    out = subprocess.run([str(built["example"]), str(built["exported"]), f"{batch}x3x16x16", "3"], env=clean_env(),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "outputs agree" in out.stdout


PRELOADED_EXPORTED = """
import warnings, torch
warnings.filterwarnings("ignore")
m = torch.jit.load({model!r})
io = torch.load({io!r})
with torch.no_grad():
    for x, expected in zip(io["inputs"], io["expected"]):
        m(x); m(x); y = m(x)
        g = torch.jit.last_executed_optimized_graph()
        print(len(g.findAllNodes("llga::FusionGroup", True)), (y - expected).abs().max().item())
"""


def test_exported_program_saved_fuses_with_the_environment_switch(built):
    # A program that never imports torch_llga, the library preloaded, TORCH_LLGA_ENABLE=1: the
    # saved program fuses at the batch it was exported with and at another one.
    lib = built["prefix"] / "lib" / "libtorch_llga.so"
    out = subprocess.run([sys.executable, "-c", PRELOADED_EXPORTED.format(model=str(built["exported"]), io=str(built["exported_io"]))],
                         env=clean_env(LD_PRELOAD=str(lib), TORCH_LLGA_ENABLE="1"), capture_output=True, text=True, check=True)
    for line in out.stdout.strip().splitlines()[-2:]:
        groups, diff = line.split()
        assert int(groups) == 3 and float(diff) <= 1e-5
