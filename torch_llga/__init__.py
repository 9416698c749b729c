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

from . import _build

_build.check()  # before the library loads: a build for another torch fails here, in one sentence
from . import _C  # noqa: E402
from . import dynamo  # noqa: E402
from .dynamo import compile  # noqa: E402,A001  (torch_llga.compile(exported_program))

try:  # TORCH_LLGA_PASSES_OFF's names, checked once (the library reads them without a word)
    _C._set_passes_off(_C._passes_off())
except ValueError as e:
    import warnings

    warnings.warn(f"TORCH_LLGA_PASSES_OFF: {e}", stacklevel=2)

__all__ = ["enable", "disable", "is_enabled", "enabled", "stats", "onednn_version", "config", "set_shape_policy", "shape_policy",
           "set_cache_capacity", "cache_capacity", "set_buffer_pool_limit", "buffer_pool_limit", "release", "explain", "compile",
           "choices", "choice_sites", "pin_choices", "choice_pins", "passes", "own_kernel_table", "set_passes_off"]


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


def set_shape_policy(policy):
    """What a fusion group does with input sizes it was not profiled with (same rank, dtype, device):
    "compile" (default) compiles a partition for them and caches it; "fallback" runs the group's ops
    unfused in PyTorch. Groups holding an op mapped for the profiled sizes only (a reshape to fixed
    sizes, say) always fall back. Takes effect on the next call; no retracing needed."""
    if policy not in ("compile", "fallback"):
        raise ValueError(f'shape policy must be "compile" or "fallback", not {policy!r}')
    _C._set_shape_policy(policy == "compile")


def shape_policy():
    return "compile" if _C._shape_policy_is_compile() else "fallback"


def set_cache_capacity(n):
    """Compiled partitions each fusion group keeps (one per input shape and layout); the least
    recently used is dropped when a new one needs room. Default 16."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"cache capacity must be an int >= 1, not {n!r}")
    _C._set_cache_capacity(n)


def cache_capacity():
    return _C._cache_capacity()


def set_buffer_pool_limit(nbytes):
    """The most memory kept for reuse from freed oneDNN buffers and LLGA tensors (scratch space and
    the tensors between groups, which every call would otherwise take fresh from the system, a
    page fault per page). Default 256 MB, or TORCH_LLGA_BUFFER_POOL_MB; 0 keeps nothing. Lowering
    it frees what is over at once, the buffers kept longest first."""
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValueError(f"buffer pool limit must be an int number of bytes >= 0, not {nbytes!r}")
    _C._set_buffer_pool_limit(nbytes)


def buffer_pool_limit():
    return _C._buffer_pool_limit()


def release(module=None):
    """Frees the compiled oneDNN partitions of a module's fusion groups (a TorchScript module, or
    what torch_llga.compile(program) returned), or of every module when none is given, and
    empties oneDNN's constant weight cache (the reordered weights of every module: the others
    reorder theirs again on their next call) and the buffers kept for reuse (scratch memory and
    LLGA tensors, up to buffer_pool_limit()); returns how many partitions were freed.
    The module still works: its next call compiles again.

    Why this exists: PyTorch keeps the code of every traced or frozen module (its graph, frozen
    weights and executor, and so our compiled partitions) in its global compilation unit until
    the process exits, even after the module is deleted. Call this before dropping a module.
    (torch_llga.compile's and the torch.compile backend's scripts have compilation units of their
    own, freed with them: for those it frees the partitions of a program kept.)"""
    if module is None:
        released = _C._release_all()
    elif isinstance(module, dynamo.CompiledProgram):
        released = sum(_release_script(script) for script in module.scripts.scripts.values())
    elif isinstance(module, torch.jit.ScriptModule):
        released = _release_script(module)
    else:
        raise TypeError(f"release() takes a TorchScript module (torch.jit.trace/script/freeze) or what "
                        f"torch_llga.compile returned, not {type(module).__name__}")
    # oneDNN's constant cache can only be emptied whole: other modules reorder their weights once more
    # on their next call.
    _C._flush_constant_cache()
    return released


def _release_script(module):
    try:
        state = module.get_debug_state()
    except RuntimeError:  # never optimized (called fewer than twice): nothing compiled
        return 0
    return sum(_C._release(plan.graph) for plan in state.execution_plans.values())


def explain(module, *inputs, verbose=True):
    """Fuses `module` for `inputs` and reports what happened: each partition (its ops, input sizes
    and dtypes), every op left to PyTorch with the reason, guard fallbacks on these inputs, and the
    share of ops that run fused. Prints the report (unless verbose=False) and returns it.

    An nn.Module is traced and frozen here (in eval mode); a TorchScript module is used as it is."""
    from .report import Explanation

    if not inputs:
        raise TypeError("explain(module, *inputs) needs the inputs to run the module with")
    with torch.no_grad(), enabled():
        if not isinstance(module, torch.jit.ScriptModule):
            if not isinstance(module, torch.nn.Module):
                raise TypeError(f"explain() takes an nn.Module or a TorchScript module, not {type(module).__name__}")
            module = torch.jit.freeze(torch.jit.trace(module.eval(), inputs))
        first = max((c["seq"] for c in _C._choices()), default=0)
        module(*inputs)  # profiling run
        module(*inputs)  # optimized (fused) run
        for _ in range(4):  # the measured choices: the groups' timed calls
            module(*inputs)
        if torch.jit.last_executed_optimized_graph().findNode("llga::SpeedChoice", True) is not None:
            for _ in range(12):  # a speed rule's two forms: each run untimed, then timed in turn
                module(*inputs)
        before = stats()
        module(*inputs)
        after = stats()
        graph = torch.jit.last_executed_optimized_graph()
    report = Explanation(graph, after["guard_failures"] - before["guard_failures"],
                         after["nonfinite_fallbacks"] - before["nonfinite_fallbacks"],
                         [c for c in _C._choices() if c["seq"] > first])
    if verbose:
        print(report)
    return report


def stats():
    """Process-wide counters:
    executions: fused partition executions; compilations: partitions compiled;
    int8_primitives: of those, int8 convolution and linear groups built as one oneDNN convolution
    or matmul primitive (not run through oneDNN Graph: the same kernel, less work a call;
    TORCH_LLGA_OWN_KERNELS=0 turns that off);
    partitionings: graphs oneDNN was asked to partition (one per block of a fused graph, and one
    per group the first time a call brings it other input sizes);
    guard_failures: calls that ran a group unfused because its inputs differed from what it was
    built for (sizes, dtype, device, grad) or held NaN/Inf (also counted in nonfinite_fallbacks);
    kernel_fallbacks: calls run unfused because oneDNN could not compile the partition, or (a
    shape-free group at new sizes) an op of the group stays out of oneDNN at those sizes;
    unfused_by_choice: calls of groups whose measured (or pinned) choice is PyTorch's ops;
    slow_partitions: compiled partitions that run unfused because PyTorch ran their ops faster
    (measured choice "fusion_group": timed on their 2nd to 4th executions, kept unless PyTorch's
    ops beat them by 1.5x plus 50 us in every round; a reference kernel, say);
    measured_choices: choices made by timing the candidates (choices() lists them);
    inplace_outputs: outputs computed in the memory of an input nothing else held (a conv or linear
    with a residual add accumulates into the added tensor instead of copying it first);
    evictions: compiled partitions dropped from a full cache; cached_partitions: compiled partitions
    alive now (they go with their module);
    plan_runs: calls of small-graph plans (a whole graph of tiny tensors run as one native step);
    plan_compilations: small-graph plans compiled (one per plan);
    plan_misses: calls with other inputs than a plan was compiled for (its profiled sizes): they run
    the graph as the executor profiles it again for them, fused by groups of any sizes;
    kept_buffer_bytes: memory of freed oneDNN buffers and LLGA tensors kept for the next call
    (at most buffer_pool_limit(); release() gives it back);
    to_dense_compilations: reorders compiled to hand LLGA tensors to PyTorch's ops (a fallback
    reading a group's oneDNN-layout output), one per layout, cached;
    constant_cache_flushes: times oneDNN's constant weight cache was emptied because the weights of
    dropped modules' groups (which oneDNN keeps until then) outweighed the live ones';
    compile_scripts: TorchScript scripts traced for torch.compile graphs and exported programs (one
    per graph, and one per value of an int argument that is no input's size)."""
    return {**_C._stats(), "compile_scripts": dynamo.traced_scripts}


def choice_sites():
    """Where torch_llga chooses between ways to run the same ops by timing them on this machine:
    per site its candidates (the first the default, kept unless another is faster by the margin)."""
    return _C._choice_sites()


def choices():
    """Every choice made so far (the last 10,000): site, subject (the group or op), key (the sizes
    and dtypes it was made for), chosen candidate, how ("measured" or "pinned") and each timed
    candidate's best time in microseconds. A fused group is timed against its ops run by PyTorch
    on its 3rd to 5th calls (one extra run when the partition is clearly faster); an own kernel
    against PyTorch's op on its first call at new sizes."""
    return _C._choices()


def pin_choices(pins=None, **by_site):
    """Pin choices instead of measuring them, for reproducible kernels (and tests):
    pin_choices(row_linear="pytorch", fusion_group="onednn"), pin_choices("*=default") (every site
    its default), pin_choices(None) to measure again. Also TORCH_LLGA_CHOICES="site=candidate,...".
    Applies to choices made from now on; choice_sites() lists the sites and candidates."""
    if pins is not None and by_site:
        raise TypeError("pin_choices takes a spec string or keyword pins, not both")
    spec = pins if pins is not None else ",".join(f"{k}={v}" for k, v in by_site.items())
    if not isinstance(spec, str):
        raise TypeError(f"pin_choices takes a 'site=candidate,...' string or keywords, not {type(spec).__name__}")
    _C._set_choice_pins(spec)


def choice_pins():
    """The pins in force, as "site=candidate,..." ("" when every choice is measured)."""
    return _C._choice_pins()


def passes():
    """The pipeline's passes in order: name, what it does, and whether it is required (the others
    can be switched off by name, for A/B comparisons: set_passes_off, TORCH_LLGA_PASSES_OFF)."""
    return _C._passes()


def own_kernel_table():
    """torch_llga's own kernels: per row its name (the switch), the op it puts in the graph, what it
    takes, dtypes, CPU features, the choice site that times it against PyTorch's op ("" for a
    rule) and the pipeline phase that applies it."""
    return _C._own_kernel_table()


def set_passes_off(names=()):
    """Switch passes or own-kernel rows off by name for graphs optimized from now on (names from
    passes() and own_kernel_table(); passes required for correct results cannot be); () turns every
    one on again. Also TORCH_LLGA_PASSES_OFF="name,..." at start-up."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    _C._set_passes_off(list(names))


def onednn_version():
    """The version of the oneDNN in use: the one inside PyTorch's libtorch_cpu.so."""
    return _C._onednn_version()


def config():
    """What torch_llga runs on: torch's version, the oneDNN inside it (version and library),
    the instruction set its kernels use here and whether they have int8 VNNI and bf16 kernels
    (without them int8 weights and bf16 ops stay in PyTorch), whether oneDNN's constant weight
    cache is on, whether graphs of tiny tensors run as small-graph plans (TORCH_LLGA_SMALL_PLANS=0
    turns that off), the buffer pool's limit, and which instruction sets torch_llga's own kernels
    find here (cpu_features: AVX2+FMA for all of them, AVX-512 for the int8 pools, ...)."""
    cpu = _C._onednn_cpu()
    return {"torch": torch.__version__, "onednn": onednn_version(), "onednn_library": _C._onednn_library(),
            "cpu_isa": cpu["isa"], "int8_vnni": cpu["int8_vnni"], "bf16_kernels": cpu["bf16"],
            "constant_cache": _C._constant_cache_enabled(), "small_plans": _C._small_plans(),
            "buffer_pool_limit": buffer_pool_limit(), "threads": torch.get_num_threads(),
            "choice_pins": choice_pins(), "passes_off": _C._passes_off(),
            "cpu_features": [name for name, has in _C._cpu_features().items() if has]}
