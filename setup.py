"""Builds torch_llga._C: the oneDNN Graph fuser as a PyTorch C++ extension.

oneDNN v3.2 comes from the pinned PyPI wheels (onednn-cpu-gomp / onednn-devel-cpu-gomp), which
install libdnnl into <env>/lib and its headers into <env>/include. torch ships newer oneDNN headers
of its own, so oneDNN's include dir goes first; an rpath to <env>/lib lets `import torch_llga`
find libdnnl without LD_LIBRARY_PATH.
"""
import glob
import os
import sys

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def onednn_prefix():
    for prefix in (sys.prefix, sys.base_prefix, os.environ.get("ONEDNN_ROOT", "")):
        if prefix and os.path.exists(os.path.join(prefix, "include", "oneapi", "dnnl", "dnnl_graph.hpp")):
            return prefix
    sys.exit("oneDNN v3.2 headers not found: pip install -r requirements.txt "
             "(onednn-devel-cpu-gomp==2023.2.0), or set ONEDNN_ROOT")


def sources():
    # One source list for both builds: cmake/ reads the same file.
    with open(os.path.join(ROOT, "csrc", "sources.txt")) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


prefix = onednn_prefix()
lib_dir = os.path.join(prefix, "lib")

# TORCH_LLGA_SANITIZE=1: AddressSanitizer + UBSan build for the test suite (`make test-sanitize`).
# -O1 -g1 keeps reports symbolized (file:line) at moderate cost; UBSan stays recoverable at compile
# time so UBSAN_OPTIONS=halt_on_error=1 decides at run time. No vptr check: it references the
# typeinfo of torch classes that torch does not export (c10::DynamicType), so the module would not
# load. -fno-wrapv undoes Python's -fwrapv, which would hide signed overflow from UBSan.
# Objects and the built .so go to their own build dirs, so switching modes relinks/copies instead
# of mixing objects of the two.
SANITIZE = os.environ.get("TORCH_LLGA_SANITIZE") == "1"
if SANITIZE:
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize=vptr"]
    compile_args, link_args = ["-O1", "-g1", "-fno-omit-frame-pointer", "-fno-wrapv", *sanitize], sanitize
    build_dirs = {"build_temp": "build/temp-sanitize", "build_lib": "build/lib-sanitize"}
else:
    compile_args, link_args = ["-O2", "-g0"], ["-s"]
    build_dirs = {}

setup(
    name="torch_llga",
    version="0.1.0",
    description="A oneDNN Graph (LLGA) fuser for TorchScript on CPU",
    packages=find_packages(include=["torch_llga", "torch_llga.*"]),
    ext_modules=[
        CppExtension(
            name="torch_llga._C",
            sources=sources(),
            include_dirs=[os.path.join(prefix, "include"), os.path.join(ROOT, "csrc")],
            library_dirs=[lib_dir],
            libraries=["dnnl"],
            extra_compile_args=[*compile_args, "-std=c++20", "-fvisibility=hidden"],
            extra_link_args=[f"-Wl,-rpath,{lib_dir}", *link_args],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    options={"build_ext": build_dirs},
    python_requires=">=3.10",
)
