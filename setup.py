"""Builds torch_llga._C: the oneDNN Graph fuser as a PyTorch C++ extension.

oneDNN is the copy inside torch's own libtorch_cpu.so, compiled against the headers torch ships
(<torch>/include/oneapi/dnnl): csrc/onednn/gen_stubs.py lists the C API functions those headers
declare, and csrc/onednn/torch_onednn.cpp binds them to libtorch_cpu.so when the module loads.
Nothing else to install or link.
"""
import os
import shutil
import subprocess
import sys

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

ROOT = os.path.dirname(os.path.abspath(__file__))
# Everything built depends on the torch it is built against: one build tree per torch version, so
# venvs of several torches (make test TORCH=...) share a checkout without mixing objects.
TORCH_BUILD = "torch" + torch.__version__
GENERATED = os.path.join(ROOT, "build", TORCH_BUILD, "generated")
# The torch release this build requires: the public version (2.13.0 also admits 2.13.0+cpu, the same
# source built without CUDA).
TORCH_RELEASE = torch.__version__.split("+")[0]

sys.path.insert(0, os.path.join(ROOT, "csrc", "onednn"))
import gen_stubs  # noqa: E402

gen_stubs.main(include_paths()[0], os.path.join(GENERATED, "onednn_functions.inc"))
# The torch this build is for, compiled into the library (csrc/build_info.cpp), where
# torch_llga/_build.py reads it before loading the library: another torch gets one sentence.
gen_stubs.write_if_changed(os.path.join(GENERATED, "built_for_torch.h"),
                           f'#define TORCH_LLGA_BUILT_FOR_TORCH "{torch.__version__}"\n'
                           f'#define TORCH_LLGA_BUILT_FOR_TORCH_GIT "{torch.version.git_version}"\n')


class BuildChecked(BuildExtension.with_options(use_ninja=True)):
    """The build, then a check of what it links: every oneDNN C function the library calls must be
    one of the stubs (dnnl.hpp's inline code calls C functions only gen_stubs.py's EXTRA lists
    from dnnl.h), or `import torch_llga` would fail with the loader's "undefined symbol"."""

    def build_extension(self, ext):
        super().build_extension(ext)
        if not shutil.which("nm"):
            return
        out = subprocess.run(["nm", "-D", "-u", "--format=just-symbols", self.get_ext_fullpath(ext.name)],
                             capture_output=True, text=True).stdout.split()
        unbound = sorted(name for name in out if name.startswith("dnnl_"))
        if unbound:
            sys.exit(f"torch_llga._C calls oneDNN functions csrc/onednn/gen_stubs.py does not bind: "
                     f"{', '.join(unbound)} (add them to its EXTRA)")


def sources():
    # One source list for both builds: cmake/ reads the same file.
    with open(os.path.join(ROOT, "csrc", "sources.txt")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


# TORCH_LLGA_SANITIZE=1: AddressSanitizer + UBSan build for the test suite (`make test-sanitize`).
# -O1 -g1 keeps reports symbolized (file:line) at moderate cost; UBSan stays recoverable at compile
# time so UBSAN_OPTIONS=halt_on_error=1 decides at run time. No vptr check: it references the
# typeinfo of torch classes that torch does not export (c10::DynamicType), so the module would not
# load. -fno-wrapv undoes Python's -fwrapv, which would hide signed overflow from UBSan.
# Objects and the built .so go to their own build dirs, so switching modes relinks/copies instead
# of mixing objects of the two.
# OpenMP: torch's at::parallel_for is inline and runs its body on one thread unless the caller is
# compiled with -fopenmp (it is `#pragma omp parallel` under _OPENMP). Linked to the libgomp the
# wheel ships, which torch has loaded already: one OpenMP runtime, one thread pool.
TORCH_GOMP = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
openmp_link = [TORCH_GOMP] if os.path.exists(TORCH_GOMP) else ["-fopenmp"]

SANITIZE = os.environ.get("TORCH_LLGA_SANITIZE") == "1"
if SANITIZE:
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize=vptr"]
    compile_args, link_args = ["-O1", "-g1", "-fno-omit-frame-pointer", "-fno-wrapv", *sanitize], [*sanitize, *openmp_link]
    mode = "-sanitize"
else:
    compile_args, link_args = ["-O2", "-g0"], ["-s", *openmp_link]
    mode = ""
build_dirs = {"build_temp": f"build/{TORCH_BUILD}/temp{mode}", "build_lib": f"build/{TORCH_BUILD}/lib{mode}"}

setup(
    name="torch_llga",
    version="0.1.0",
    description="A oneDNN Graph (LLGA) fuser for TorchScript on CPU",
    # The library, its command line and its tools (python -m torch_llga.tools.bench, .check_models, .demo,
    # .layer_times, .ops_doc, .suite): the tools' models and runtimes (torchvision, transformers, matplotlib, OpenVINO,
    # ONNX Runtime) are optional, and a tool names the one it misses.
    packages=find_packages(include=["torch_llga", "torch_llga.*"]),
    # The suite runner's model lists (python -m torch_llga.tools.suite): PyTorch's CPU dashboard's.
    package_data={"torch_llga.tools": ["suite_lists/*.txt", "suite_lists/README.md"]},
    # TORCH_LLGA_METADATA_ONLY=1: the Makefile's editable registration, which needs no build of its
    # own (the extension is built in place by `setup.py build_ext --inplace`).
    ext_modules=[] if os.environ.get("TORCH_LLGA_METADATA_ONLY") == "1" else [
        CppExtension(
            name="torch_llga._C",
            sources=sources(),
            include_dirs=[os.path.join(ROOT, "csrc"), GENERATED],
            extra_compile_args=[*compile_args, "-std=c++20", "-fvisibility=hidden", "-fopenmp"],
            extra_link_args=link_args,
        )
    ],
    # torch.compile(model, backend="torch_llga"): Dynamo finds backends by this entry point.
    entry_points={"torch_dynamo_backends": ["torch_llga = torch_llga.dynamo:torch_llga_backend"]},
    cmdclass={"build_ext": BuildChecked},
    options={"build_ext": build_dirs},
    python_requires=">=3.10",
    # The library is bound to the torch it was compiled against (its C++ ABI and operator symbols):
    # pip keeps the wheel to that torch release.
    install_requires=[f"torch=={TORCH_RELEASE}"],
)
