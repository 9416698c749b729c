"""Memory stays flat over many calls, and torch_llga.release() frees what torch_llga holds."""
import gc
import io
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import torch_llga

from conftest import FP32, check, requires_int8_kernels, SOME

# Under `make test-sanitize` resident memory measures AddressSanitizer: its quarantine keeps freed
# memory resident (plain TorchScript alone grew 62 MB per dropped module there, against 37).
SANITIZED = pytest.mark.skipif(os.environ.get("TORCH_LLGA_SANITIZE") == "1",
                               reason="ASan's quarantine keeps freed memory resident")


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def small_convnet():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()


@SANITIZED
def test_resident_memory_flat_over_10000_calls():
    x = torch.randn(1, 3, 16, 16)
    fused = check(small_convnet(), x, rtol=1e-4, atol=1e-4, groups=SOME)
    assert len(fused.groups) >= 2
    for _ in range(500):  # warm-up: allocator pools, caches
        fused(x)
    before, start = rss_mb(), torch_llga.stats()
    for _ in range(10_000):
        fused(x)
    grown = rss_mb() - before
    assert torch_llga.stats()["executions"] - start["executions"] == 10_000 * len(fused.groups)
    assert grown < 0.01 * before, f"resident memory grew {grown:.1f} MB over 10,000 calls (from {before:.0f} MB)"


def test_release_frees_compiled_partitions():
    x = torch.randn(1, 3, 16, 16)
    model = small_convnet()
    alive = torch_llga.stats()["cached_partitions"]
    fused = check(model, x, rtol=1e-4, atol=1e-4, groups=SOME)
    assert torch_llga.stats()["cached_partitions"] - alive == len(fused.groups)
    assert torch_llga.release(fused.module) == len(fused.groups)
    assert torch_llga.stats()["cached_partitions"] == alive
    with torch.no_grad():  # the module still works: it compiles again
        torch.testing.assert_close(fused(x), model(x), rtol=1e-4, atol=1e-4)
    assert torch_llga.stats()["cached_partitions"] - alive == len(fused.groups)
    torch_llga.release(fused.module)


def test_release_frees_a_compiled_programs_partitions():
    # torch_llga.compile(program) traces the program into frozen scripts, which PyTorch keeps until
    # exit: release(compiled) frees their partitions before the program is dropped.
    x = torch.randn(1, 3, 16, 16)
    model = small_convnet()
    alive = torch_llga.stats()["cached_partitions"]
    compiled = torch_llga.compile(torch.export.export(model, (x,)))
    with torch.no_grad():
        compiled(x), compiled(x)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    made = torch_llga.stats()["cached_partitions"] - alive
    assert made > 0
    assert torch_llga.release(compiled) == made
    assert torch_llga.stats()["cached_partitions"] == alive
    with torch.no_grad():  # it still works: it compiles again
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert torch_llga.stats()["cached_partitions"] - alive == made
    assert torch_llga.release(compiled) == made
    with pytest.raises(TypeError, match="torch_llga.compile returned"):
        torch_llga.release(model)


def test_dropped_compiled_programs_free_their_partitions():
    # The scripts torch_llga.compile and the torch.compile backend trace are reloaded into a
    # compilation unit of their own (PyTorch's global one keeps a traced module's code, and once
    # frozen its weights and compiled partitions, until exit): dropped, they free them.
    x = torch.randn(1, 3, 16, 16)
    model = small_convnet()
    program = torch.export.export(model, (x,))
    gc.collect()  # what earlier tests dropped, freed before counting
    alive = torch_llga.stats()["cached_partitions"]
    for door in ("export", "export", "torch.compile"):
        compiled = torch_llga.compile(program) if door == "export" else torch.compile(model, backend="torch_llga")
        with torch.no_grad():
            compiled(x), compiled(x)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
        assert torch_llga.stats()["cached_partitions"] > alive, door
        del compiled
        torch._dynamo.reset()  # Dynamo's cache holds the backend's callable
        gc.collect()
        assert torch_llga.stats()["cached_partitions"] == alive, door


def test_a_trace_no_archive_holds_keeps_its_weights_and_place():
    # An autograd.Function traces to a PythonOp, which torch.jit.save refuses: the traced module
    # stays in PyTorch's unit, as before, with its weights back in place.
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((3,), 3.0))

        def forward(self, x):
            return Double.apply(x) * self.scale

    x = torch.randn(3)
    traced = torch.jit.trace(Scaled(), x, check_trace=False)
    assert torch_llga.dynamo._in_own_unit(traced) is traced
    torch.testing.assert_close(traced(x), x * 6, rtol=0, atol=0)


@SANITIZED
def test_scratch_memory_is_reused_not_faulted_in_on_every_call():
    """A MobileNetV2 block at 56x56: oneDNN runs the 1x1 conv fused with the depthwise one through
    a 1.8 MB intermediate and reorders the NCHW input, in buffers it allocates on every execution.
    Fresh from the kernel each time, they cost a page fault per page (with transparent huge pages,
    a 2 MiB page zeroed per fault: 6.8 ms a call against 0.6 measured); the buffer pool keeps them
    (onednn/buffer_pool.cpp)."""
    import resource

    model = nn.Sequential(nn.Conv2d(24, 144, 1), nn.ReLU6(), nn.Conv2d(144, 144, 3, padding=1, groups=144),
                          nn.ReLU6(), nn.Conv2d(144, 24, 1)).eval()
    x = torch.randn(1, 24, 56, 56)
    fused = check(model, x, groups=[["_convolution", "hardtanh", "_convolution", "hardtanh"], ["_convolution"]])
    for _ in range(5):
        fused(x)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        fused(x)
    per_call = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 50
    assert per_call < 2, f"{per_call} page faults a call"
    # What the pool keeps between calls shows in stats(), within its cap; release() gives it back.
    assert 1 << 20 < torch_llga.stats()["kept_buffer_bytes"] <= 256 << 20
    torch_llga.release(fused.module)
    assert torch_llga.stats()["kept_buffer_bytes"] == 0


@SANITIZED
def test_small_buffers_are_kept_too():
    """Partitions whose outputs are a few KiB get them from the pool as well (glibc's aligned
    allocation of small buffers first merges its free chunks: ~5% of a small partition's time)."""
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 1)).eval()
    x = torch.randn(1, 8, 8, 8)  # 2 KiB tensors
    fused = check(model, x, groups=[["_convolution", "relu"], ["_convolution"]])
    torch_llga.release(fused.module)  # the pool emptied: what it keeps next is this model's
    assert torch_llga.stats()["kept_buffer_bytes"] == 0
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x), **FP32)
    assert 0 < torch_llga.stats()["kept_buffer_bytes"] < 64 << 10


@SANITIZED
def test_a_dead_tensors_buffer_is_reused_for_a_smaller_one():
    """Each group's output takes the buffer freed last whose size is within 2x of it, not only one
    of its exact size: the dead tensor's lines are likeliest still in the caches (onednn/buffer_pool.cpp).
    Six 1x1 convs at 64x64 whose outputs shrink 1 MiB, 960, 896, ... 704 KiB: exact sizes would
    keep a buffer of each (5.2 MiB); reused, two take turns."""
    channels = [64, 60, 56, 52, 48, 44]
    layers = []
    for a, b in zip([8] + channels, channels):
        layers += [nn.Conv2d(a, b, 1), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).eval()
    x = torch.randn(1, 8, 64, 64)
    fused = check(model, x, groups=[["_convolution", "relu"]] * 5 + [["_convolution"]])
    torch_llga.release(fused.module)  # the pool emptied: what it keeps next is this model's
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fused(x), model(x), **FP32)
    kept = torch_llga.stats()["kept_buffer_bytes"]
    assert 1 << 20 <= kept < 3 << 20, kept
    torch_llga.release(fused.module)


@SANITIZED
def test_buffer_pool_limit_bounds_what_is_kept():
    """A server with many models bounds the pool: lowering the limit frees what is over it at once,
    0 keeps nothing (each call then faults its scratch in again, and computes the same)."""
    model = nn.Sequential(nn.Conv2d(24, 144, 1), nn.ReLU(), nn.Conv2d(144, 24, 1)).eval()
    x = torch.randn(1, 24, 56, 56)
    fused = check(model, x, groups=[["_convolution", "relu"], ["_convolution"]])
    default = torch_llga.buffer_pool_limit()
    assert default == 256 << 20 and torch_llga.config()["buffer_pool_limit"] == default
    try:
        fused(x)
        kept = torch_llga.stats()["kept_buffer_bytes"]
        assert kept > 1 << 20  # the 144-channel tensor between the groups (1.8 MB) among them
        torch_llga.set_buffer_pool_limit(kept - 1)
        assert torch_llga.stats()["kept_buffer_bytes"] <= kept - 1
        assert torch_llga.buffer_pool_limit() == kept - 1
        torch_llga.set_buffer_pool_limit(0)
        assert torch_llga.stats()["kept_buffer_bytes"] == 0
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(fused(x), model(x), **FP32)
        assert torch_llga.stats()["kept_buffer_bytes"] == 0
        with pytest.raises(ValueError, match="int number of bytes >= 0"):
            torch_llga.set_buffer_pool_limit(-1)
    finally:
        torch_llga.set_buffer_pool_limit(default)
        torch_llga.release(fused.module)


# Builds, runs and drops 4 modules of 37 MB of conv weights each; prints resident growth per module.
GROWTH = r"""
import gc, os, sys, warnings
import torch, torch.nn as nn, torch_llga
warnings.filterwarnings("ignore")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
torch.set_num_threads(1)
if sys.argv[1] == "llga":
    torch_llga.enable()
x = torch.randn(1, 512, 7, 7)
sizes = []
for i in range(4):
    m = nn.Sequential(*[nn.Sequential(nn.Conv2d(512, 512, 3, padding=1), nn.ReLU()) for _ in range(4)]).eval()
    with torch.no_grad():
        t = torch.jit.freeze(torch.jit.trace(m, x)); t(x); t(x); t(x)
    del m
    torch_llga.release(t)
    del t
    gc.collect()
    sizes.append(rss())
print((sizes[-1] - sizes[0]) / 3)
"""


def module_growth_mb(backend, **env):
    out = subprocess.run([sys.executable, "-c", GROWTH, backend], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return float(out.stdout.split()[-1])


@SANITIZED
def test_dropped_modules_keep_only_what_pytorch_keeps():
    """PyTorch keeps every traced/frozen module's code and frozen weights until exit (37 MB per module
    here, plain TorchScript). With the weight cache off, release() leaves only oneDNN's primitive
    cache entries on top (bounded: 1024 primitives; ~7 MB per module here, against 37 MB of weights).
    With the weight cache on, release() empties it too (oneDNN 3.12's capacity call; v3.2 had no
    eviction call and kept every dropped module's reordered weights)."""
    plain = module_growth_mb("plain")
    released = module_growth_mb("llga", DNNL_GRAPH_CONSTANT_CACHE="0")
    cached = module_growth_mb("llga")
    assert 30 < plain < 45, plain  # the frozen weights PyTorch retains
    assert released < plain + 10, (released, plain)
    assert cached < plain + 10, (cached, plain)


# Loads a saved model of 9.4 MB of conv weights 16 times, each run fused, checked and dropped;
# prints resident MB after each, then the constant cache's flushes.
RELOADS = r"""
import gc, io, os, sys, warnings
import torch, torch.nn as nn, torch_llga
warnings.filterwarnings("ignore")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
torch.set_num_threads(1)
torch_llga.enable()
x = torch.randn(1, 256, 7, 7)
m = nn.Sequential(*[nn.Sequential(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU()) for _ in range(4)]).eval()
buf = io.BytesIO()
torch.jit.save(torch.jit.trace(m, x), buf)
sizes = []
for i in range(16):
    t = torch.jit.freeze(torch.jit.load(io.BytesIO(buf.getvalue())).eval())
    with torch.no_grad():
        before = torch_llga.stats()["executions"]
        t(x); t(x); y = t(x)
        assert torch_llga.stats()["executions"] - before == 8, "the four groups did not run fused twice"
        torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-4)
    del t
    gc.collect()
    sizes.append(rss())
print(*sizes, torch_llga.stats()["constant_cache_flushes"])
"""


# Loads a PT2E int8 model of four 3x3 convs (590 KB of int8 weights each) 8 times through
# torch.export, each run (the same values each time, near the PT2E reference) and dropped; prints
# its int8 primitives, then the constant cache's flushes.
INT8_RELOADS = r"""
import gc, warnings
import torch, torch.nn as nn, torch_llga
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
x = torch.randn(1, 256, 7, 7).contiguous(memory_format=torch.channels_last)
m = nn.Sequential(*[nn.Sequential(nn.Conv2d(256, 256, 3, padding=1), nn.ReLU()) for _ in range(4)]).eval()
quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
prepared = prepare_pt2e(torch.export.export(m, (x,), strict=True).module(), quantizer)
with torch.no_grad():
    prepared(x)
program = torch.export.export(convert_pt2e(prepared), (x,))
outputs = []
for _ in range(8):
    compiled = torch_llga.compile(program)
    with torch.no_grad():
        compiled(x), compiled(x)
        outputs.append(compiled(x))
    del compiled
    gc.collect()
# every reload computes what the first did, flush or not
assert all(torch.equal(o, outputs[0]) for o in outputs), "a reload computed other values"
with torch.no_grad():
    reference = program.module()(x)
assert (outputs[0] - reference).abs().max() <= 0.05 * reference.abs().max(), "far from the PT2E reference"
print(torch_llga.stats()["int8_primitives"], torch_llga.stats()["constant_cache_flushes"])
"""


@requires_int8_kernels
def test_int8_primitive_groups_leave_nothing_in_the_constant_cache():
    """A group run as an int8 primitive keeps its reordered weights itself, freed with it, none in
    oneDNN's constant cache: dropping it is no reason to empty the cache, which costs every live
    model a reorder of its weights. Here three of the four convs are primitives (the last one's
    fp32 output is a oneDNN Graph partition's): 8 drops leave 4.7 MB of dead cache entries, one
    flush at most (counting the primitives' weights too: 19 MB, a flush every other drop)."""
    pytest.importorskip("torchao")
    out = subprocess.run([sys.executable, "-c", INT8_RELOADS], capture_output=True, text=True, check=True)
    primitives, flushes = (int(v) for v in out.stdout.split())
    assert primitives == 8 * 3, out.stdout
    assert flushes <= 1, out.stdout


@SANITIZED
def test_reloading_a_model_without_release_keeps_memory_bounded():
    """A server swapping models drops the old one without release(). oneDNN 3.12 keeps every
    reordered weight in its constant cache until the cache is emptied whole (its entries outlive
    their partitions), so each reload would add the model's weights (9.4 MB here: 94 MB over the
    last 10 reloads). The cache is flushed once the dropped groups' weights reach the live ones'
    (and 4 MB): here at every reload."""
    out = subprocess.run([sys.executable, "-c", RELOADS], capture_output=True, text=True, check=True)
    *sizes, flushes = out.stdout.split()
    sizes = [float(s) for s in sizes]
    assert int(flushes) >= 6, out.stdout
    grown = max(sizes[-4:]) - max(sizes[2:6])
    assert grown < 30, f"resident memory grew {grown:.0f} MB over 10 reloads: {sizes}"


class TwoBranches(nn.Module):
    """Linears on a strided input and on each other's output, a tanh: five small oneDNN groups."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1, self.w2 = torch.randn(8, 12, generator=g), torch.randn(4, 8, generator=g)
        self.w3, self.w4 = torch.randn(8, 12, generator=g), torch.randn(2, 12, generator=g)
        self.conv = torch.randn(1, 2, 1, generator=g)

    def forward(self, x):
        v1 = nn.functional.linear(x.contiguous(), self.w1)
        return (nn.functional.conv1d(x, self.conv, padding=1), nn.functional.linear(v1, self.w2),
                torch.tanh(nn.functional.linear(x, self.w3)), nn.functional.linear(x, self.w4))


def test_reloaded_models_use_their_own_weights():
    """A process that loads a model, drops it and loads another of the same architecture (a server
    taking a new checkpoint) must run the new weights. torch.jit.load's compilation unit is freed
    with its module, and oneDNN 3.12's compiled-partition cache matched the new partitions to the
    freed ones by their ops' addresses: 34 of 40 reloads ran the old weights
    (onednn_quirks.h: stale_compiled_partition_cache)."""
    x = (torch.randint(-6, 7, (3, 2, 24)) * 0.5)[..., ::2]  # a strided input, as the fuzzer drew it
    saved = []
    for seed in range(3):
        buf = io.BytesIO()
        model = TwoBranches(seed).eval()
        torch.jit.save(torch.jit.trace(model, x, check_trace=False), buf)
        saved.append((buf.getvalue(), model))
    wrong = []
    with torch_llga.enabled(), torch.no_grad():
        for i in range(24):
            data, model = saved[i % len(saved)]
            loaded = torch.jit.freeze(torch.jit.load(io.BytesIO(data)).eval())
            before = torch_llga.stats()["executions"]
            loaded(x)
            got = loaded(x)  # the profiling run, then the fused graph
            # Four groups: the linears of w3 and w4 read x, one matmul (merge_parallel_linears.cpp).
            assert torch_llga.stats()["executions"] - before == 4, "not all four groups ran"
            expected = model(x)
            if any(not torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, expected)):
                wrong.append(i)
            del loaded
            gc.collect()
    assert not wrong, f"reloads {wrong} of 24 ran with another model's weights"
