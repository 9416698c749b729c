"""The torch this build of torch_llga was compiled against, checked before its C++ library loads.

The library is bound to one torch release: another one numbers the aten operators differently (the
fuser would match the wrong ops and compute wrong values) or lacks C++ symbols the library uses (a
loader error). The torch it was built for is a string inside the library file (csrc/build_info.cpp),
read here without loading it.
"""
import importlib.util
import re

import torch

_STAMP = re.compile(rb"torch_llga built for torch ([0-9A-Za-z.+_-]+) git ([0-9a-zA-Z]+);")


def built_for(library_path):
    """(version, git commit) of the torch the library at library_path was built against, or None."""
    with open(library_path, "rb") as f:
        found = _STAMP.search(f.read())
    return (found[1].decode(), found[2].decode()) if found else None


def _same_torch(built, running):
    (built_version, built_git), (running_version, running_git) = built, running
    if "Unknown" in (built_git, running_git):  # a build that records no commit: compare versions whole
        return built_version == running_version
    # 2.13.0 and 2.13.0+cpu are one source built with and without CUDA: the same operators and ABI.
    return built_version.split("+")[0] == running_version.split("+")[0] and built_git == running_git


def check(package="torch_llga"):
    """Raises ImportError, in one sentence, unless the package's library was built for this torch."""
    rebuild = ("rebuild torch_llga against this torch (`pip install --no-build-isolation --force-reinstall .` "
               "in its source, or `make build` in a checkout)")
    spec = importlib.util.find_spec(f"{package}._C")
    if spec is None or not spec.origin:
        raise ImportError(f"torch_llga's C++ library ({package}._C) is not built: {rebuild}")
    built = built_for(spec.origin)
    running = (torch.__version__, torch.version.git_version or "Unknown")
    if built is None:
        raise ImportError(f"{spec.origin} does not say which torch it was built for (a build older than this "
                          f"check, or not torch_llga's): {rebuild}")
    if not _same_torch(built, running):
        raise ImportError(f"torch_llga was built for torch {built[0]} (commit {built[1][:12]}) and this is torch "
                          f"{running[0]} (commit {running[1][:12]}): {rebuild}, or install torch "
                          f"{built[0].split('+')[0]}")
