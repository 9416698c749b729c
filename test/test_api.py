"""The Python face: the switch, the context manager, logging, and independence from PyTorch's fuser."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import torch_llga
from conftest import AVX2, Fused, check, fusion_groups


def test_enable_disable():
    assert not torch_llga.is_enabled()
    torch_llga.enable()
    assert torch_llga.is_enabled()
    torch_llga.disable()
    assert not torch_llga.is_enabled()


def test_context_manager_nests_and_restores():
    with torch_llga.enabled():
        assert torch_llga.is_enabled()
        with torch_llga.enabled(False):
            assert not torch_llga.is_enabled()
            with torch_llga.enabled():
                assert torch_llga.is_enabled()
            assert not torch_llga.is_enabled()
        assert torch_llga.is_enabled()
    assert not torch_llga.is_enabled()


def test_context_manager_restores_on_error():
    try:
        with torch_llga.enabled():
            raise ValueError
    except ValueError:
        pass
    assert not torch_llga.is_enabled()


def test_disabled_pass_changes_nothing():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        m = torch.jit.freeze(torch.jit.trace(model, x))
        for _ in range(3):
            y = m(x)
        graph = torch.jit.last_executed_optimized_graph()
    assert fusion_groups(graph) == [] and not graph.findAllNodes("llga::Guard", True)
    torch.testing.assert_close(y, model(x))


def test_ours_not_pytorchs_builtin_fuser():
    fused = check(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), torch.randn(1, 3, 16, 16),
                  groups=[["_convolution", "relu"]])
    assert torch.jit.onednn_fusion_enabled() is False
    assert not fused.graph.findAllNodes("prim::oneDNNFusionGroup", True)
    assert not fused.graph.findAllNodes("prim::oneDNNFusionGuard", True)
    assert fused.graph.findAllNodes("llga::FusionGroup", True)


def test_constant_weight_cache_on_by_default():
    assert torch_llga._C._constant_cache_enabled()
    code = "import torch_llga; print(torch_llga._C._constant_cache_enabled())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DNNL_GRAPH_CONSTANT_CACHE": "0"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_runs_on_the_onednn_inside_torch():
    # No LD_LIBRARY_PATH, no libdnnl of its own: the oneDNN torch itself reports is the one in use.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    code = "import torch_llga; print(torch_llga.onednn_version()); print(torch_llga.config()['onednn_library'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    version, library = out.stdout.split()
    assert re.search(r"MKL-DNN v(\S+) ", torch._C._show_config()).group(1) == version
    assert int(version.split(".")[0]) == 3 and int(version.split(".")[1]) >= 7
    assert os.path.samefile(library, os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    so = torch_llga._C.__file__
    assert not re.search(r"libdnnl", subprocess.run(["ldd", so], capture_output=True, text=True).stdout)
    exported = subprocess.run(["nm", "-D", so], capture_output=True, text=True, check=True).stdout
    assert not re.search(r" [TU] dnnl_", exported)  # the C API stubs stay hidden, nothing is left unresolved


def test_one_openmp_runtime_and_ours_uses_it():
    """The extension is built with OpenMP (torch's inline at::parallel_for ran our loops on one
    thread without it) and uses the libgomp torch loaded: one runtime, one thread pool."""
    so = torch_llga._C.__file__
    needed = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    assert "[libgomp.so.1]" in needed
    with open("/proc/self/maps") as f:
        gomp = {line.split()[-1] for line in f if "libgomp" in line}
    assert len(gomp) == 1, gomp
    assert os.path.samefile(gomp.pop(), os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1"))
    assert b"GOMP_parallel" in open(so, "rb").read()  # our own code opens parallel regions


def import_error(env):
    out = subprocess.run([sys.executable, "-c", "import torch_llga"], env={**os.environ, **env}, capture_output=True, text=True)
    assert out.returncode != 0
    return out.stderr.strip().splitlines()[-1]


def test_import_fails_clearly_without_a_symbol_table(tmp_path):
    # A stripped libtorch_cpu.so (same build, no .symtab): one sentence saying what is missing and what to do.
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    stripped = tmp_path / "libtorch_cpu.so"
    subprocess.run(["strip", "--strip-all", "-o", str(stripped), lib], check=True)
    line = import_error({"TORCH_LLGA_TORCH_CPU_SYMBOLS": str(stripped)})
    assert line.startswith("ImportError: torch_llga needs the symbol table of PyTorch's libtorch_cpu.so")
    assert "has none (a stripped build of torch)" in line


def test_import_fails_clearly_on_another_build(tmp_path):
    # Symbols from a file that is not the loaded build would be wrong addresses: refused.
    other = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    line = import_error({"TORCH_LLGA_TORCH_CPU_SYMBOLS": other})
    assert "which is not the build of libtorch_cpu.so loaded from" in line


def test_buffer_pool_limit_from_the_environment():
    code = "import torch_llga; print(torch_llga.buffer_pool_limit())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TORCH_LLGA_BUFFER_POOL_MB": "64"},
                         capture_output=True, text=True, check=True)
    assert int(out.stdout) == 64 << 20
    line = import_error({"TORCH_LLGA_BUFFER_POOL_MB": "1GB"})
    assert line == "ImportError: TORCH_LLGA_BUFFER_POOL_MB must be a whole number of megabytes (0 keeps nothing), not '1GB'"


def test_jit_log_shows_each_pass():
    code = """
import warnings, torch, torch_llga
warnings.filterwarnings("ignore")
torch_llga.enable()
m = torch.jit.freeze(torch.jit.trace(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval(),
                                     torch.randn(1, 3, 8, 8)))
with torch.no_grad():
    for _ in range(3): m(torch.randn(1, 3, 8, 8))
"""
    levels = ">>remove_mutation:>>decompose_ops:>>prepare_binary:>>defer_size_check:>>graph_fuser:" \
             ">>layout_propagation:>>guard_shapes"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTORCH_JIT_LOG_LEVEL": levels},
                         capture_output=True, text=True, check=True)
    for line in ["After RemoveMutation", "After DecomposeOps", "After PrepareBinary", "After DeferSizeCheck",
                 "Fusion group of [aten::_convolution, aten::relu]", "After FuseGraph", "After PropagateLayout",
                 "After InsertGuards"]:
        assert line in out.stderr, line


def test_profiler_shows_each_group_with_its_ops():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    fused = Fused(model, (torch.randn(4, 64),))
    assert fused.groups == [["linear", "relu"], ["linear"]]
    from torch.profiler import profile

    with profile() as prof:
        fused(torch.randn(4, 64))
    names = [e.key for e in prof.key_averages()]
    assert "llga::FusionGroup[linear+relu]" in names and "llga::FusionGroup[linear]" in names


@pytest.mark.skipif(not AVX2, reason="torch_llga's own kernels need AVX2 and FMA")
def test_profiler_shows_each_own_kernel():
    # A decoder step's linear (llga::row_linear) and attention of 64-wide heads (llga::head64_attention):
    # each call an event of its own, as the groups are.
    from torch.profiler import profile

    proj = nn.Linear(256, 512).eval()
    row = Fused(proj, (torch.randn(1, 2, 256),))
    q = torch.randn(1, 2, 128, 64)
    attention = Fused(lambda a: torch.nn.functional.scaled_dot_product_attention(a, a, a), (q,))
    assert "llga::row_linear" in str(row.graph) and "llga::head64_attention" in str(attention.graph)
    with profile() as prof:
        row(torch.randn(1, 2, 256))
        attention(q)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts.get("llga::row_linear") == 1 and counts.get("llga::head64_attention") == 1, counts
