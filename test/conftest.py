import threading
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga
from torch_llga.report import fusion_groups, unfused_ops

# torch 2.14 deprecates TorchScript with FutureWarnings; everything still works.
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)

FP32 = dict(rtol=1e-5, atol=1e-5)

# What oneDNN's kernels can do on this CPU: without bf16 kernels (AVX2 without VNNI-2) bf16 ops stay
# in PyTorch; without VNNI int8 weights do (quirks::int8_without_vnni). Tests that expect such
# partitions need them.
CPU = torch_llga._C._onednn_cpu()
# Whether oneDNN runs its AVX-512 kernels here (its ISA names every AVX-512 and AVX10 level "avx512_*").
AVX512_KERNELS = CPU["isa"].startswith("avx512")
requires_bf16_kernels = pytest.mark.skipif(not CPU["bf16"], reason=f"oneDNN has no bf16 kernels on this CPU ({CPU['isa']})")
requires_int8_kernels = pytest.mark.skipif(not CPU["int8_vnni"],
                                           reason=f"oneDNN's int8 kernels lack VNNI on this CPU ({CPU['isa']}): int8 runs in fp32")
BF16 = pytest.param(torch.bfloat16, marks=requires_bf16_kernels, id="bfloat16")
# What torch_llga's own kernels (csrc/jit/codegen/onednn/kernels/) can run here, as they ask it
# (onednn/cpu_features.h): AVX2 and FMA for all; AVX512_BF16 without AMX for the bf16 attention
# kernel (head64_bf16.cpp); AVX-512 F, BW and VL for the int8 pools (quantized_pool.cpp).
FEATURES = torch_llga._C._cpu_features()
AVX2 = FEATURES["avx2_fma"]
BF16_ATTENTION_KERNEL = FEATURES["avx512_bf16"] and not FEATURES["amx_bf16"]
OWN_QUANTIZED_POOL = FEATURES["avx512"]


@pytest.fixture(autouse=True)
def small_plans_only_where_marked(request):
    """Most tests check oneDNN's partitions on graphs of tiny tensors, which the small-graph plan
    would take whole: it is off in tests not marked small_plan (test_small_plan.py)."""
    before = torch_llga._C._small_plans()
    torch_llga._C._set_small_plans(request.node.get_closest_marker("small_plan") is not None)
    yield
    torch_llga._C._set_small_plans(before)


@pytest.fixture
def groups_on_onednn():
    """Groups pinned to oneDNN: a group's timed runs (its 2nd-4th, settings/choices.h) also run its
    ops in PyTorch, copies and all, which tests that count copies must not see."""
    torch_llga.pin_choices("fusion_group=onednn")
    yield
    torch_llga.pin_choices(None)


@pytest.fixture
def speed_rules_applied():
    """The measured speed rules (onednn_quirks.h: a GELU post-op on AVX2, a group norm) applied as
    rules, with no second form timed against them: what tests of a rule itself check."""
    torch_llga.pin_choices("speed_rule=pytorch")
    yield
    torch_llga.pin_choices(None)


class Fused:
    """A model traced (and frozen, if it is a module) with torch_llga on, run past profiling."""

    def __init__(self, model, inputs, freeze=True, runs=2):
        self.inputs = inputs
        with torch.no_grad(), torch_llga.enabled():
            if isinstance(model, torch.jit.ScriptFunction):
                self.module = model
            elif isinstance(model, torch.nn.Module):
                self.module = torch.jit.trace(model.eval(), inputs)
                if freeze:
                    self.module = torch.jit.freeze(self.module)
            else:
                self.module = torch.jit.trace(model, inputs)
            for _ in range(runs):  # profiling run, optimization, fused run
                self.output = self.module(*inputs)
            self.graph = torch.jit.last_executed_optimized_graph()
        self.groups = fusion_groups(self.graph)
        self.unfused = unfused_ops(self.graph)

    def __call__(self, *inputs):
        with torch.no_grad():
            return self.module(*inputs)


# check(..., groups=SOME): at least one group, for models whose exact groups a test does not list
# (big models; tests that assert on the groups themselves afterwards).
SOME = object()


def check(model, *inputs, groups, freeze=True, **tol):
    """Fuses model, checks its output against eager and the fusion groups formed: `groups` is the
    list expected (an explicit [] where nothing should fuse) or SOME (at least one)."""
    if isinstance(model, torch.nn.Module):
        model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    fused = Fused(model, inputs, freeze=freeze)
    torch.testing.assert_close(fused.output, expected, equal_nan=True, **(tol or FP32))
    # A further call (fuser now off) must run the fused partitions, not the guards' fallback.
    before = torch_llga.stats()
    again = fused(*inputs)
    after = torch_llga.stats()
    torch.testing.assert_close(again, expected, equal_nan=True, **(tol or FP32))
    assert after["guard_failures"] == before["guard_failures"], "a guard rejected the profiled inputs"
    assert after["kernel_fallbacks"] == before["kernel_fallbacks"]
    assert after["executions"] - before["executions"] == len(fused.groups)
    if groups is SOME:
        assert fused.groups, f"nothing fused; unfused {fused.unfused}\n{fused.graph}"
    else:
        assert fused.groups == groups, f"groups {fused.groups}, unfused {fused.unfused}\n{fused.graph}"
    return fused


# Python source of a model oneDNN 3.12 runs with its reference kernel unless the quirk
# matmul_per_batch_column_post_op keeps its add out (a 4-D matmul + a per-head bias), traced and
# fused as `m` with inputs (x, b); for tests that run it in a subprocess (quirk switches, verbose).
PER_HEAD_BIAS_MODEL = """
import warnings, torch, torch_llga
w, x, b = torch.randn(2, 8, 128, 128), torch.randn(2, 8, 128, 128), torch.randn(1, 8, 1, 128)
class M(torch.nn.Module):
    def forward(self, a, c):
        return torch.matmul(a, w) + c
torch_llga.enable()
"""


def run_in_threads(worker, n=8):
    """worker(i) for i in range(n), each in its own thread, all at once; re-raises the first
    exception any of them raised."""
    errors = []

    def guarded(i):
        try:
            worker(i)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@pytest.fixture
def all_partitions():
    """Every supported partition becomes a group, also those not worth one (a lone relu), to test each mapping alone."""
    torch_llga._C._set_fuse_all_partitions(True)
    yield
    torch_llga._C._set_fuse_all_partitions(False)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def opaque_outputs(group):
    """A fusion group's per-output layouts: 1 = may stay in oneDNN's own layout (read only by groups),
    2 = channels-last strides (groups and elementwise PyTorch ops read it), 0 = eager's strides."""
    return getattr(group, "is")("opaque_outputs")  # Node.is(), a Python keyword


class ConvNet(nn.Module):
    """Two convs with a residual add and a linear head: three groups."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x) + x)
        return self.fc(x.mean((2, 3)))
