"""torch_llga: a oneDNN Graph (LLGA) fuser for TorchScript inference on CPU.

    import torch, torch_llga
    torch_llga.enable()
    m = torch.jit.freeze(torch.jit.trace(model.eval(), example))
    with torch.no_grad():
        m(x); m(x)          # profiling run, then the optimized (fused) graph

The pass runs when the profiling executor optimizes a graph (its second call), so the switch must be
on by then; a module already optimized keeps the graph it got.
"""
import contextlib

import torch  # noqa: F401  (loads libtorch before our extension)

from . import _C

__all__ = ["enable", "disable", "is_enabled", "enabled", "stats", "onednn_version"]


def enable():
    """Turn the fuser on for graphs optimized from now on."""
    _C._set_enabled(True)


def disable():
    """Turn the fuser off: the pass then leaves graphs unchanged."""
    _C._set_enabled(False)


def is_enabled():
    return _C._is_enabled()


@contextlib.contextmanager
def enabled(on=True):
    """`with torch_llga.enabled():` turns the fuser on (or off with False) and restores the previous
    state on exit, so blocks nest."""
    previous = is_enabled()
    _C._set_enabled(bool(on))
    try:
        yield
    finally:
        _C._set_enabled(previous)


def stats():
    """Process-wide counters: fused executions, partition compilations, guard failures (calls whose
    inputs differed from the profile and ran unfused) and kernel fallbacks (oneDNN could not compile)."""
    return dict(_C._stats())


def onednn_version():
    return _C._onednn_version()
