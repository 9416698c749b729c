"""A build of torch_llga runs only on the torch it was compiled against: any other torch fails at
import with one sentence (what it was built for, what is running, how to rebuild), checked before
the C++ library loads, so no loader error and no wrong answer (another torch release numbers the
aten operators differently) can reach the user."""
import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest
import torch

import torch_llga
from torch_llga import _build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNING = (torch.__version__, torch.version.git_version)
IMPORT = "import warnings; warnings.simplefilter('ignore'); import torch, torch_llga"


def library():
    return torch_llga._C.__file__


def import_with(python, path, **env):
    """`import torch_llga` in a fresh interpreter with the package at `path` first on sys.path."""
    env = {**os.environ, "PYTHONPATH": str(path), **env}
    return subprocess.run([python, "-c", IMPORT], env=env, capture_output=True, text=True, cwd="/")


def assert_one_sentence(result, built_for, running):
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("ImportError: torch_llga was built for torch " + built_for), result.stderr
    assert f"and this is torch {running}" in error and "rebuild torch_llga against this torch" in error
    assert "undefined symbol" not in result.stderr and "Tensor-likes" not in result.stderr


def test_the_library_records_the_torch_it_was_built_for():
    assert _build.built_for(library()) == RUNNING


def test_the_package_requires_the_torch_release_it_was_built_for():
    release = torch.__version__.split("+")[0]
    assert f"torch=={release}" in importlib.metadata.requires("torch_llga")


@pytest.mark.parametrize("built,running,same", [
    (("2.13.0", "a" * 40), ("2.13.0+cpu", "a" * 40), True),    # one source, built with and without CUDA
    (("2.14.1+cu130", "a" * 40), ("2.13.0", "b" * 40), False),  # same oneDNN, other operator numbering
    (("2.13.0", "a" * 40), ("2.13.0", "b" * 40), False),        # a source build of another commit
    (("2.13.0", "Unknown"), ("2.13.0", "b" * 40), True),        # a side records no commit: versions whole
    (("2.13.0", "Unknown"), ("2.13.0a0", "Unknown"), False),
])
def test_which_torches_are_the_same(built, running, same):
    assert _build._same_torch(built, running) == same


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the torch_llga package, whose library a test replaces."""
    shutil.copytree(os.path.join(ROOT, "torch_llga"), tmp_path / "torch_llga",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_a_build_for_another_torch_release_fails_in_one_sentence(package_copy):
    # The library of this build, its stamp rewritten to the torch 2.13.0 release: the same oneDNN
    # as 2.14 (so no oneDNN check would notice), other aten symbol numbers.
    path = package_copy / "torch_llga" / os.path.basename(library())
    data = path.read_bytes()
    stamp = f"torch_llga built for torch {RUNNING[0]} git {RUNNING[1]};".encode()
    assert data.count(stamp) == 1
    path.write_bytes(data.replace(stamp, f"torch_llga built for torch 2.13.0 git {'0' * 40};".encode()))
    assert_one_sentence(import_with(sys.executable, package_copy), "2.13.0 (commit 000000000000)", RUNNING[0])


def test_a_library_with_missing_torch_symbols_is_never_loaded(package_copy, tmp_path):
    # What a build on torch 2.12.1 is under 2.13: a library that needs a C++ symbol this torch lacks.
    source = tmp_path / "fake.c"
    source.write_text(
        'extern void _ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE(void*);\n'
        '__attribute__((used)) const char stamp[] = "torch_llga built for torch 2.12.1+cu128 git ' + "1" * 40 + ';";\n'
        'void PyInit__C(void) { _ZN3c104impl3cow23materialize_cow_storageERNS_11StorageImplE(0); }\n')
    path = package_copy / "torch_llga" / os.path.basename(library())
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    # Loaded, it is the raw loader error users got before the check.
    raw = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"], capture_output=True, text=True)
    assert "undefined symbol" in raw.stderr
    assert_one_sentence(import_with(sys.executable, package_copy), "2.12.1+cu128", RUNNING[0])


def test_a_library_without_a_stamp_is_not_loaded(package_copy, tmp_path):
    source = tmp_path / "old.c"
    source.write_text("void PyInit__C(void) {}\n")
    path = package_copy / "torch_llga" / os.path.basename(library())
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    result = import_with(sys.executable, package_copy)
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]
    assert "does not say which torch it was built for" in error and "rebuild torch_llga" in error


@pytest.mark.skipif(not os.environ.get("TORCH_LLGA_OTHER_TORCH_PYTHON"),
                    reason="needs a venv of another torch (make test TORCH=... sets it)")
def test_this_build_under_another_installed_torch_fails_in_one_sentence():
    python = os.environ["TORCH_LLGA_OTHER_TORCH_PYTHON"]
    other = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert other != RUNNING[0]
    assert_one_sentence(import_with(python, ROOT), RUNNING[0], other)
