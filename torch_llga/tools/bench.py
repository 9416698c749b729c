"""Benchmark: torch_llga beside eager, TorchScript, PyTorch's built-in oneDNN fuser and torch.compile,
and beside OpenVINO and ONNX Runtime (benchmark-only: pip install openvino onnxruntime onnx; a checkout
pins them in requirements-bench.txt). Models from torchvision or transformers need that package; a
model whose package is not installed is skipped, with a note saying what to install.

    python -m torch_llga.tools.bench [--models resnet50,lld6] [--backends ...] [--threads 2] [--out bench_out/run]
    python -m torch_llga.tools.bench --dtype int8 --models resnet50   # torch_llga vs FX convert_fx (x86) vs fp32

Rounds are interleaved across backends so machine drift hits all alike. The times are medians over
rounds; a "llga vs X" ratio is the median of the per-round ratios (X and torch_llga timed in the same
round, seconds apart), which a slow drift of the shared machine's speed does not move. A ratio marked
"~" is not a measured difference: the middle half of its per-round ratios spans 1.00x.
A backend that fails on a model is reported as failed, with its error.

openvino: ov.convert_model, compiled for the CPU with the bench's thread count, latency hint, and the
run's precision (f32, or bf16 with --dtype bf16; with --dtype int8 it gets the reference model, whose
quantize/dequantize pairs it runs as int8); onnxruntime: torch.onnx.export (TorchScript-based) into an
InferenceSession on the CPU provider, fp32 only. Both are called with torch tensors and return one:
the conversions to and from numpy are part of their time. zentorch (AMD's ZenDNN plugin,
pip install zentorch: a benchmark extra): torch.compile(copy of the model, backend="zentorch",
dynamic=False), five warm-up calls; it optimizes on CPUs with AVX-512 only (elsewhere it is Inductor).

--dtype int8: the model is quantized the way PyTorch's FX flow does it (x86 qconfig mapping, calibrated
on a few random batches); eager, torchscript, builtin_onednn and torch_llga run its reference form
(convert_to_reference_fx: quantize/dequantize around fp32 ops), fx_x86 runs convert_fx's (PyTorch's
native int8 kernels, traced and frozen: what a PyTorch user picks today), torchscript_fp32 the fp32
model, torch_llga_fast torch_llga with TORCH_LLGA_INT8_EXACT=0 (residual adds as conv post-ops, their
requantization dropped). Differences are to the eager reference model. The same model quantized by
torchao's PT2E flow (X86InductorQuantizer's defaults; on a CPU without VNNI with reduce_range, 7-bit
activations, as the quantizer advises there; torchao is a benchmark extra), calibrated on the same
batches: pt2e_inductor runs it the way PyTorch documents (torch.compile, Inductor, freezing on),
pt2e_llga through torch.compile(backend="torch_llga"), pt2e_llga_export through
torch_llga.compile(torch.export.export(...)) (no Dynamo on each call); the columns "llga vs PT2E
Inductor", "vs OpenVINO NNCF" and "vs ORT int8" time pt2e_llga when the run has it. The other
runtimes quantize the fp32 model their own documented way on the same batches (benchmark extras):
openvino_nncf, NNCF's post-training `nncf.quantize` of the converted model (its defaults; model_type TRANSFORMER for the attention models), compiled as
openvino is; onnxruntime_int8, `quantize_static` of the exported model (QDQ, int8 activations and
weights, per-channel weights), run as onnxruntime is; their differences are to the fp32 model. An
int8 run also lists each backend's drift from the fp32 model; --drift-inputs 1000 measures it over
1,000 random inputs as well (max and mean abs difference, top-1 agreement).

    python -m torch_llga.tools.bench --dtype int8 --backends torchscript_fp32,fx_x86,torch_llga,pt2e_inductor,pt2e_llga

torch_llga_no_plans: torch_llga with small-graph plans off (oneDNN groups only), to see what the
plans change in the same run; torch_llga_no_own: its own kernels off (TORCH_LLGA_OWN_KERNELS=0:
oneDNN and PyTorch only); torch_llga_pinned: every measured choice pinned to its default
(pin_choices("*=default"): no timing), to see what measuring changes.
"""
import argparse
import contextlib
import copy
import dataclasses
import importlib
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
import warnings

import torch

import torch_llga
from torch_llga import _optional
from torch_llga.tools.bench_models import MODELS, PACKAGE



def _traced(model, inputs, dtype):
    return torch.jit.freeze(torch.jit.trace(model, inputs))


def _inductor(model, inputs, dtype):  # as PyTorch's CPU dashboard runs it: freezing on
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return torch.compile(model)


def _zentorch(model, inputs, dtype):  # AMD's ZenDNN plugin (benchmark extra), its documented recipe
    bench_import("zentorch")
    # Compiling rewrites the module's weights in place (eager calls of it then differ): a copy.
    return torch.compile(copy.deepcopy(model), backend="zentorch", dynamic=False)


@dataclasses.dataclass(frozen=True)
class Way:
    """One backend: how it prepares a model (model, inputs, dtype) -> callable, the state its calls
    run in (a context manager factory), and which runs and which model it takes."""
    prepare: object = _traced
    switch: object = lambda: torch_llga.enabled(False)  # noqa: E731
    int8_only: bool = False   # an int8 comparison: --dtype int8 only
    default: bool = True      # in the default set of its dtype's run (else asked for by name)
    pt2e: bool = False        # runs the PT2E-quantized model (torchao), not FX's
    own_int8: bool = False    # takes the fp32 model (and quantizes it itself)
    warmup_calls: int = 0     # untimed calls after the first two (a peer's documented recipe; torch_llga's choices)


# torch_llga's measured choices are made in a model's first calls (a group's on its 2nd-4th, a speed
# rule's two forms over 16: passes/speed_choices.cpp): what a service runs once warm is timed.
LLGA_WARMUP = 16

WAYS = {
    "eager": Way(prepare=lambda m, i, d: m),
    "torchscript": Way(),
    "builtin_onednn": Way(switch=lambda: BuiltinFuser()),
    "torch_compile": Way(prepare=_inductor),
    "torch_llga": Way(switch=torch_llga.enabled, warmup_calls=LLGA_WARMUP),
    # torch_llga as a torch.compile backend (dynamo.py)
    "torch_llga_compile": Way(prepare=lambda m, i, d: torch.compile(m, backend="torch_llga"), warmup_calls=LLGA_WARMUP),
    "fx_x86": Way(int8_only=True),
    "torchscript_fp32": Way(int8_only=True, own_int8=True),
    "torch_llga_fast": Way(switch=torch_llga.enabled, int8_only=True, warmup_calls=LLGA_WARMUP),
    # PyTorch's documented x86 int8 recipe: PT2E, then Inductor, frozen
    "pt2e_inductor": Way(prepare=_inductor, int8_only=True, pt2e=True),
    "pt2e_llga": Way(prepare=lambda m, i, d: torch.compile(m, backend="torch_llga"), int8_only=True, pt2e=True,
                     warmup_calls=LLGA_WARMUP),
    # the same model through torch.export and torch_llga.compile: no Dynamo per call
    "pt2e_llga_export": Way(prepare=lambda m, i, d: torch_llga.compile(torch.export.export(m, tuple(i))),
                            int8_only=True, pt2e=True, warmup_calls=LLGA_WARMUP),
    "openvino": Way(prepare=lambda m, i, d: openvino_fn(m, i, d)),
    "onnxruntime": Way(prepare=lambda m, i, d: onnxruntime_fn(m, i, d)),
    "openvino_nncf": Way(prepare=lambda m, i, d: openvino_nncf_fn(m, i), int8_only=True, own_int8=True),
    "onnxruntime_int8": Way(prepare=lambda m, i, d: onnxruntime_fn(m, i, d, quantize=True), int8_only=True, own_int8=True),
    "zentorch": Way(prepare=_zentorch, warmup_calls=3),  # its recipe: five warm-up calls
    "torch_llga_no_plans": Way(switch=lambda: without_small_plans(), default=False, warmup_calls=LLGA_WARMUP),
    "torch_llga_no_own": Way(switch=lambda: llga_variant(env={"TORCH_LLGA_OWN_KERNELS": "0"}), default=False,
                             warmup_calls=LLGA_WARMUP),
    "torch_llga_pinned": Way(switch=lambda: llga_variant(pins="*=default"), default=False),
}
BACKENDS = list(WAYS)
INT8_ONLY = {b for b, w in WAYS.items() if w.int8_only}
PT2E = {b for b, w in WAYS.items() if w.pt2e}
OWN_INT8 = {b for b, w in WAYS.items() if w.own_int8}
NOT_DEFAULT = INT8_ONLY | {b for b, w in WAYS.items() if not w.default}  # asked for by name
INT8_DEFAULT_BACKENDS = "torchscript_fp32,fx_x86,torch_llga"
# Untimed calls before each sample, for this long: ONNX Runtime's worker threads spin 40-75 ms after
# its last call (measured here), on a core the backend timed next needs (2x slower ResNet-18 calls).
SETTLE_MS = 100


class Backend:
    """A model prepared one way; call() runs it once in the state it needs (fuser switches)."""

    def __init__(self, name, model, inputs, dtype, more_inputs=()):
        # more_inputs: input sets of other batch sizes (--batches), called in turn with `inputs`
        self.name, self.inputs, self.rotation = name, inputs, [inputs, *more_inputs]
        t0 = time.perf_counter()
        way = WAYS[name]
        with torch.no_grad(), self.switch():
            self.fn = way.prepare(model, inputs, dtype)
            self.output = self.fn(*inputs)  # profiling run (TorchScript) / compilation (Inductor)
            with fast_int8(name == "torch_llga_fast"):
                self.output = self.fn(*inputs)  # optimization and first optimized run
            for other in more_inputs:  # each size twice: Dynamo's recompilation, new partitions
                self.fn(*other), self.fn(*other)
            self.warmup_ms = (time.perf_counter() - t0) * 1e3  # the first two calls (each size's)
            for _ in range(way.warmup_calls):
                self.fn(*inputs)

    def switch(self):
        return WAYS[self.name].switch()

    def time_ms(self, repeat, settle_ms=0):
        with torch.no_grad(), self.switch():
            # Untimed calls first, for settle_ms (one call at least if not 0): the backend timed
            # before may have left its worker threads spinning and its data in the caches.
            t = time.perf_counter()
            while (time.perf_counter() - t) * 1e3 < settle_ms:
                self.fn(*self.inputs)
            rotation, n = self.rotation, len(self.rotation)
            t = time.perf_counter()
            for i in range(repeat * n):
                self.fn(*rotation[i % n])
            return (time.perf_counter() - t) * 1e3 / repeat  # a call of each size


@contextlib.contextmanager
def without_small_plans():
    """torch_llga on, small-graph plans off, while the pass runs (and plans are read)."""
    previous = torch_llga._C._small_plans()
    torch_llga._C._set_small_plans(False)
    try:
        with torch_llga.enabled():
            yield
    finally:
        torch_llga._C._set_small_plans(previous)


@contextlib.contextmanager
def llga_variant(env=None, pins=None):
    """torch_llga on with environment variables set (read when a graph is optimized) or choices
    pinned (read when a choice is made), restored on exit."""
    previous_env = {k: os.environ.get(k) for k in env or {}}
    previous_pins = torch_llga.choice_pins()
    os.environ.update(env or {})
    if pins is not None:
        torch_llga.pin_choices(pins)
    try:
        with torch_llga.enabled():
            yield
    finally:
        for k, v in previous_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        torch_llga.pin_choices(previous_pins)


@contextlib.contextmanager
def fast_int8(on):
    """TORCH_LLGA_INT8_EXACT=0 while the pass runs: residual adds join their conv, unrequantized."""
    previous = os.environ.get("TORCH_LLGA_INT8_EXACT")
    if on:
        os.environ["TORCH_LLGA_INT8_EXACT"] = "0"
    try:
        yield
    finally:
        if on and previous is None:
            del os.environ["TORCH_LLGA_INT8_EXACT"]
        elif on:
            os.environ["TORCH_LLGA_INT8_EXACT"] = previous


def bench_import(module):
    """A benchmark-only dependency (requirements-bench.txt), imported when its backend is asked for."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(_optional.not_installed(module)) from e


def numpy_ready(x):
    """x as numpy can hold it: numpy has no bf16, so bf16 crosses as fp32 (the runtime casts inside)."""
    return (x.float() if x.dtype == torch.bfloat16 else x).contiguous()


def openvino_config(dtype, threads=None):
    return {"INFERENCE_NUM_THREADS": threads or torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY",
            # bf16 on its own on AVX512_BF16 CPUs unless told f32
            "INFERENCE_PRECISION_HINT": "bf16" if dtype == "bf16" else "f32"}


def openvino_fn(model, inputs, dtype):
    """model converted and compiled by OpenVINO for the CPU, as a function of torch tensors."""
    ov = bench_import("openvino")
    if dtype == "bf16":  # OpenVINO's way to bf16: the fp32 model with a bf16 precision hint
        model = copy.deepcopy(model).float()
    return openvino_run(ov.convert_model(model, example_input=tuple(map(numpy_ready, inputs))), dtype)


def openvino_nncf_fn(model, inputs):
    """model converted by OpenVINO and quantized by NNCF on calibration_batches(), as a function of
    torch tensors (NNCF: a benchmark extra)."""
    ov, nncf = bench_import("openvino"), bench_import("nncf")
    converted = ov.convert_model(model, example_input=tuple(map(numpy_ready, inputs)))
    batches = [tuple(numpy_ready(x).numpy() for x in batch) for batch in calibration_batches(inputs)]
    # NNCF's guidance for attention models: keep their softmax/attention matmuls as it decides for them.
    transformer = any("attention" in type(m).__name__.lower() for m in model.modules())
    quantized = nncf.quantize(converted, nncf.Dataset(batches), subset_size=len(batches),
                              model_type=nncf.ModelType.TRANSFORMER if transformer else None)
    return openvino_run(quantized, "int8")


def openvino_run(converted, dtype):
    """An OpenVINO model compiled for the CPU, as a function of torch tensors."""
    ov = bench_import("openvino")
    compiled = ov.Core().compile_model(converted, "CPU", openvino_config(dtype))
    request = compiled.create_infer_request()

    # The infer request, its inputs set as zero-copy tensors, then infer(): about half the per-call
    # time of compiled(inputs) or request.infer(inputs) on MLP and DeepAndWide, measured here. The
    # output is copied: OpenVINO reuses its buffer.
    def run(*args):
        arrays = [numpy_ready(x).numpy() for x in args]  # alive through infer(): the ov.Tensors don't hold them
        for i, array in enumerate(arrays):
            request.set_input_tensor(i, ov.Tensor(array, shared_memory=True))
        request.infer()
        return torch.from_numpy(request.get_output_tensor(0).data.copy())

    return run


def onnxruntime_fn(model, inputs, dtype, quantize=False):
    """model exported to ONNX and run by ONNX Runtime's CPU provider, as a function of torch tensors;
    quantize: the fp32 model quantized first by its quantize_static on calibration_batches()."""
    if dtype != "fp32" and not quantize:
        reason = {"bf16": "its CPU provider has no bf16 Gemm, ONNX's Conv no bf16",
                  "int8": "torch.onnx.export fails on FX's reference int8 model (onnxruntime_int8 quantizes the fp32 one)"}[dtype]
        raise ValueError(f"not applicable to {dtype}, fp32 only: {reason}")
    bench_import("onnx")  # what torch.onnx.export writes with
    ort = bench_import("onnxruntime")
    names = [f"input_{i}" for i in range(len(inputs))]
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as tmp:  # the session keeps the model in memory
        path = os.path.join(tmp, "model.onnx")
        # The TorchScript-based exporter: the torch.export-based default needs onnxscript too.
        torch.onnx.export(model, inputs, path, input_names=names, dynamo=False)
        if quantize:
            path = onnxruntime_quantized(path, names, inputs)
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name

    def run(*args):
        feed = {n: numpy_ready(x).numpy() for n, x in zip(names, args)}
        return torch.from_numpy(session.run([output], feed)[0])

    return run


def onnxruntime_quantized(path, names, inputs):
    """The ONNX model at path quantized by ONNX Runtime's quantize_static (QDQ, its default int8
    activations and weights, per channel as its docs advise for convolutions), calibrated on
    calibration_batches(), after its recommended pre-processing; returns the new file's path."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{n: numpy_ready(x).numpy() for n, x in zip(names, batch)}
                               for batch in calibration_batches(inputs)])

        def get_next(self):
            return next(self.feeds, None)

    prepared, quantized = path.replace(".onnx", "_pre.onnx"), path.replace(".onnx", "_int8.onnx")
    quant_pre_process(path, prepared)
    quantize_static(prepared, quantized, Batches(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    return quantized


class BuiltinFuser:
    """PyTorch's own oneDNN fuser, on for the duration: the baseline we compare against."""

    def __enter__(self):
        torch.jit.enable_onednn_fusion(True)

    def __exit__(self, *exc):
        torch.jit.enable_onednn_fusion(False)


def first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def flops_of(model, inputs):
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*inputs)
    return counter.get_total_flops()


def progress(text):
    sys.stderr.write(f"\r\033[K{text}")
    sys.stderr.flush()


def random_inputs_like(inputs, seed):
    """Random inputs shaped like the example's, from what the int8 flows calibrate on: floats uniform
    in [0, 1) (as calibration_batches(); normal ones, out of the calibrated range, saturated every
    int8 model alike), integer inputs (token ids) uniform below the example's largest value plus one;
    an input of one value throughout (a mask of ones) as it is."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if x.is_floating_point():
            out.append(torch.rand(x.shape, generator=g, dtype=x.dtype))
        elif x.numel() and bool((x == x.flatten()[0]).all()):
            out.append(x)
        else:
            out.append(torch.randint(0, int(x.max()) + 1, x.shape, generator=g, dtype=x.dtype))
    return tuple(out)


def drift_over_inputs(model, ready, inputs, n):
    """Each backend's output against the fp32 model's on n random inputs: {backend: max abs, mean abs
    difference, share of rows whose top-1 (argmax over the last dim) agrees}."""
    acc = {b.name: {"max": 0.0, "sum": 0.0, "count": 0, "agree": 0, "rows": 0} for b in ready}
    for i in range(n):
        progress(f"drift: input {i + 1}/{n}")
        x = random_inputs_like(inputs, 1000 + i)
        with torch.no_grad():
            ref = first(model(*x)).float()
            for b in ready:
                out = first(b.fn(*x)).float()
                a, d = acc[b.name], (out - ref).abs()
                a["max"], a["sum"], a["count"] = max(a["max"], d.max().item()), a["sum"] + d.sum().item(), a["count"] + d.numel()
                a["agree"] += int((out.argmax(-1) == ref.argmax(-1)).sum())
                a["rows"] += ref.argmax(-1).numel()
    return {name: {"max_abs": a["max"], "mean_abs": a["sum"] / a["count"], "top1_agreement": a["agree"] / a["rows"],
                   "inputs": n} for name, a in acc.items()}


def calibration_batches(inputs, n=4):
    """The batches every int8 flow calibrates on: random ones like the inputs, the same for all."""
    generator = torch.Generator().manual_seed(0)
    return [tuple(torch.rand(x.shape, generator=generator, dtype=x.dtype) if x.is_floating_point() else x
                  for x in inputs) for _ in range(n)]


def quantized_int8(model, inputs):
    """(reference, native): model quantized by FX with the x86 qconfig mapping, calibrated on
    calibration_batches(); as convert_to_reference_fx and as convert_fx make it."""
    from torch.ao.quantization import get_default_qconfig_mapping
    from torch.ao.quantization.quantize_fx import convert_fx, convert_to_reference_fx, prepare_fx

    torch.backends.quantized.engine = "x86"
    prepared = prepare_fx(copy.deepcopy(model), get_default_qconfig_mapping("x86"), inputs)
    with torch.no_grad():
        for batch in calibration_batches(inputs):
            prepared(*batch)
    return convert_to_reference_fx(copy.deepcopy(prepared)), convert_fx(prepared)


def quantized_pt2e(model, inputs):
    """model quantized by torchao's PT2E flow with X86InductorQuantizer's defaults, calibrated on
    calibration_batches() (torchao: a benchmark extra). Without VNNI, reduce_range: the quantizer's
    advice for such CPUs (8-bit activations overflow their int8 kernels' 16-bit pair sums)."""
    bench_import("torchao")
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    try:  # strict: the quantizer rejects the non-strict export of a module reusing one ReLU (ResNets)
        exported = torch.export.export(copy.deepcopy(model), inputs, strict=True).module()
    except Exception:  # noqa: BLE001 - what strict export cannot trace (transformers' models)
        exported = torch.export.export(copy.deepcopy(model), inputs).module()
    # What the model computes and drops (BERT's pooler behind BertWrapper) goes: the quantizer's
    # fusion patterns fail on an op nothing reads (IndexError in _get_output_nodes_of_partitions).
    exported.graph.eliminate_dead_code()
    exported.recompile()
    config = xiq.get_default_x86_inductor_quantization_config(reduce_range=not torch_llga.config()["int8_vnni"])
    quantizer = xiq.X86InductorQuantizer().set_global(config)
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in calibration_batches(inputs):
            prepared(*batch)
    return convert_pt2e(prepared)


def bench_model(name, backends, args):
    torch.manual_seed(0)
    model, inputs = MODELS[name](args.batch)
    model = model.eval()
    if args.dtype == "bf16":
        model = model.to(torch.bfloat16)
        inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    more_inputs = [MODELS[name](args.batch * b)[1] for b in args.batches[1:]]
    if args.dtype == "bf16":
        more_inputs = [tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in m) for m in more_inputs]
    flops = [flops_of(model, i) for i in (inputs, *more_inputs)]  # a sample times one call of each
    row = {"model": name, "flops": sum(flops) if all(flops) else 0, "results": {}}
    models = dict.fromkeys(backends, model)  # the model each backend runs
    if args.dtype == "int8":
        progress(f"{name}: quantizing")
        try:
            reference, native = quantized_int8(model, inputs)
        except Exception as e:  # noqa: BLE001 - FX's backends report it; PT2E and the peers go on
            reference = native = RuntimeError(f"FX: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        models = {b: model if b in OWN_INT8 else native if b == "fx_x86" else reference for b in backends}
        if PT2E & set(backends):
            try:
                pt2e = quantized_pt2e(model, inputs)
                models.update({b: pt2e for b in PT2E & set(backends)})
            except Exception as e:  # noqa: BLE001 - reported in those backends' cells
                models.update({b: e for b in PT2E & set(backends)})
    with torch.no_grad():
        fp32 = first(model(*inputs)).float()
        int8_reference = args.dtype == "int8" and not isinstance(reference, Exception)
        expected = first(reference(*inputs)) if int8_reference else fp32
    ready = []
    for b in backends:
        progress(f"{name}: preparing {b}")
        try:
            if isinstance(models[b], Exception):
                raise RuntimeError(f"quantization: {type(models[b]).__name__}: {models[b]}")
            backend = Backend(b, models[b], inputs, args.dtype, more_inputs)
            out = first(backend.output).float()
            # int8: the difference to the fp32 model too (its drift), and to the reference of its own flow
            if b in PT2E:
                with torch.no_grad():
                    own = first(models[b](*inputs)).float()
            own = own if b in PT2E else fp32 if b in OWN_INT8 else expected.float()
            diff = (out - own).abs().max().item()
            row["results"][b] = {"warmup_ms": backend.warmup_ms, "max_abs_diff": diff, "times": [],
                                 "fp32_max_abs_diff": (out - fp32).abs().max().item(),
                                 "fp32_mean_abs_diff": (out - fp32).abs().mean().item()}
            ready.append(backend)
        except Exception as e:  # reported, not dropped
            row["results"][b] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    if not ready:
        return row
    if args.dtype == "int8" and args.drift_inputs:
        for b, drift in drift_over_inputs(model, ready, inputs, args.drift_inputs).items():
            row["results"][b]["drift"] = drift
    time_interleaved(ready, row["results"], args.rounds, args.sample_ms, lambda r: progress(f"{name}: round {r}/{args.rounds}"))
    return row


def time_interleaved(ready, results, rounds, sample_ms, say):
    """Times every backend once a round, in a new order each round; appends each sample to
    results[name]["times"] and sets results[name]["median_ms"]."""
    # Calls per sample: enough that one sample lasts about sample_ms (timer and scheduler noise).
    once = min(bk.time_ms(1) for bk in ready)
    repeat = max(1, min(10000, round(sample_ms / max(once, 1e-3))))
    for r in range(rounds):
        say(r + 1)
        # A new order each round (seeded: runs repeat): a backend timed right after another pays for
        # what that one left in the caches and threads (measurable on microsecond models). Rotating
        # one order kept each backend's predecessor the same in every round (torch_llga always
        # followed the built-in fuser); shuffled, each follows each other one in some rounds.
        for backend in random.Random(r).sample(ready, len(ready)):
            results[backend.name]["times"].append(backend.time_ms(repeat, SETTLE_MS))
    for backend in ready:
        results[backend.name]["median_ms"] = statistics.median(results[backend.name]["times"])


def paired_ratio(base_times, times):
    """(median, lower quartile, upper quartile) of base/time over the rounds both were timed in."""
    ratios = sorted(a / b for a, b in zip(base_times, times))
    if len(ratios) < 2:
        return (ratios[0],) * 3
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return median, q1, q3


def ratio_spread(row, base, b):
    """How much faster b is than base in this run (paired_ratio), or None if either failed."""
    r = row["results"]
    if r.get(base, {}).get("times") and r.get(b, {}).get("times"):
        return paired_ratio(r[base]["times"], r[b]["times"])
    return None


def ratio(row, base, b):
    spread = ratio_spread(row, base, b)
    return spread[0] if spread else None


def ratio_cell(spread):
    if not spread:
        return "-"
    median, q1, q3 = spread
    return f"{median:.2f}x" + ("~" if q1 <= 1.0 <= q3 else "")


def ratio_columns(backends):
    """(heading, baseline backend) of the "torch_llga vs ..." columns: the baselines in this run."""
    cols = [("TS", "torchscript"), ("built-in", "builtin_onednn"), ("fx x86", "fx_x86"), ("TS fp32", "torchscript_fp32"),
            ("PT2E Inductor", "pt2e_inductor"), ("OpenVINO", "openvino"), ("ORT", "onnxruntime"),
            ("OpenVINO NNCF", "openvino_nncf"), ("ORT int8", "onnxruntime_int8"), ("zentorch", "zentorch"),
            ("no plans", "torch_llga_no_plans"), ("no own kernels", "torch_llga_no_own"),
            ("choices pinned", "torch_llga_pinned")]
    return [(h, b) for h, b in cols if b in backends]


INT8_PEERS = ("pt2e_inductor", "openvino_nncf", "onnxruntime_int8")


def llga_side(base, backends):
    """The torch_llga backend a "llga vs base" column times: against the int8 peers (and in a run
    without torch_llga, against any baseline), the PT2E model through torch_llga when the run has it
    (the same quantization flow as Inductor's), else torch_llga."""
    pt2e = "pt2e_llga" in backends or base == "pt2e_inductor"
    return "pt2e_llga" if pt2e and (base in INT8_PEERS or "torch_llga" not in backends) else "torch_llga"


def door_columns(backends):
    """(heading, baseline, torch_llga backend) of the columns for torch_llga's other doors: its
    torch.compile backend beside Inductor's, and the PT2E model through torch.export and
    torch_llga.compile beside each int8 peer."""
    cols = [("llga_compile vs Inductor", "torch_compile", "torch_llga_compile")] \
        if {"torch_compile", "torch_llga_compile"} <= set(backends) else []
    if "pt2e_llga_export" in backends:
        cols += [(f"llga_export vs {h}", b, "pt2e_llga_export") for h, b in ratio_columns(backends) if b in INT8_PEERS]
    return cols


def cpu_name():
    return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")


def markdown(rows, backends, args):
    head = f"{cpu_name()} (oneDNN ISA {torch_llga.config()['cpu_isa']}); torch {torch.__version__}, " \
           f"oneDNN {torch_llga.onednn_version()} (torch's own, for every backend), " \
           f"{torch.get_num_threads()} threads, {args.dtype}, batch {args.batch}" + \
           (f" x ({', '.join(map(str, args.batches))}) in turn (ms: one call of each)" if len(args.batches) > 1 else "") + \
           f"; median ms over {args.rounds} rounds; " \
           f"ratios: median of per-round ratios, ~ where their middle half spans 1.00x"
    cols = ratio_columns(backends)
    # Preparation and first calls: torch_llga's and the built-in fuser's, and the other runtimes' in this run.
    llga_runs = [b for b in ("torch_llga", "pt2e_llga", "pt2e_llga_export") if b in backends] or ["torch_llga"]
    warm = llga_runs + ["builtin_onednn"] + [b for b in ("openvino", "onnxruntime", "openvino_nncf", "onnxruntime_int8",
                                                         "zentorch") if b in backends]
    warm_heading = " / ".join({"torch_llga": "llga", "builtin_onednn": "built-in"}.get(b, b) for b in warm)
    door_cols = door_columns(backends)
    lines = [head, "", "| model | " + " | ".join(backends) + "".join(f" | llga vs {h}" for h, _ in cols) +
             "".join(f" | {h}" for h, _, _ in door_cols) +
             f" | llga GFLOP/s | first 2 calls ms ({warm_heading}) |",
             "|---" * (len(backends) + len(cols) + len(door_cols) + 3) + "|"]
    for row in rows:
        cells = []
        for b in backends:
            res = row["results"].get(b, {})
            cells.append(f"{res['median_ms']:.3f}" if "median_ms" in res else f"failed: {res.get('error', '?')}")
        spreads = [ratio_spread(row, base, llga_side(base, backends)) for _, base in cols] + \
                  [ratio_spread(row, base, llga) for _, base, llga in door_cols]
        llga = row["results"].get("torch_llga", {})
        gflops = f"{row['flops'] / llga['median_ms'] / 1e6:.0f}" if "median_ms" in llga and row["flops"] else "-"
        warmups = "/".join(f"{row['results'].get(b, {}).get('warmup_ms', float('nan')):.0f}" for b in warm)
        cells += [ratio_cell(sp) for sp in spreads] + [gflops, warmups]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    if args.dtype == "int8":  # each backend's drift from the fp32 model: max / mean abs difference of the output
        lines += ["", "drift from fp32 (max / mean abs difference of the output):", "",
                  "| model | " + " | ".join(backends) + " |", "|---" * (len(backends) + 1) + "|"]
        for row in rows:
            cells = [f"{r['fp32_max_abs_diff']:.3g} / {r['fp32_mean_abs_diff']:.3g}" if "fp32_max_abs_diff" in r else "-"
                     for r in (row["results"].get(b, {}) for b in backends)]
            lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
        if args.drift_inputs:
            lines += ["", f"drift from fp32 over {args.drift_inputs} random inputs (max / mean abs difference of the "
                      "output; top-1 agreement: rows whose argmax over the last dim is the fp32 model's):", "",
                      "| model | " + " | ".join(backends) + " |", "|---" * (len(backends) + 1) + "|"]
            for row in rows:
                cells = [f"{d['max_abs']:.3g} / {d['mean_abs']:.3g}, {100 * d['top1_agreement']:.1f}%" if d else "-"
                         for d in (row["results"].get(b, {}).get("drift") for b in backends)]
                lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    ratios = [ratio(row, "builtin_onednn", "torch_llga") for row in rows]
    ratios = [r for r in ratios if r]
    if ratios:
        lines.append("")
        lines.append(f"geometric mean, torch_llga vs built-in fuser: "
                     f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}x over {len(ratios)} models")
    return "\n".join(lines)


def plot(rows, backends, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(rows)), 4))
    width = 0.8 / len(backends)
    base = "torchscript" if "torchscript" in backends else backends[0]
    for i, b in enumerate(backends):
        # Speed relative to TorchScript: taller is faster.
        vals = [ratio(row, base, b) or 0 for row in rows]
        ax.bar([k + i * width for k in range(len(rows))], vals, width, label=b)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(rows))], [r["model"] for r in rows], rotation=30, ha="right")
    ax.set_ylabel(f"speed vs {base} (x)")
    ax.axhline(1, color="gray", lw=0.5)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None, prog="python -m torch_llga.tools.bench"):
    warnings.filterwarnings("ignore")  # the run's own output only (importing this module changes nothing)
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,resnet18_64,mobilenet_v2,mobilenet_v3_large,vit_b_16,bert_base,"
                        "deep_and_wide,deep_and_wide_64,lld6,xml_cnn,mlp,conv3x3_512",
                        help="comma-separated, from: " + ", ".join(MODELS))
    parser.add_argument("--backends", help="comma-separated, from: " + ", ".join(BACKENDS) +
                        f"; default: all but {', '.join(sorted(NOT_DEFAULT))} ({INT8_DEFAULT_BACKENDS} with --dtype int8)")
    parser.add_argument("--batch", type=int, default=1, help="batch multiplier (models keep their own base batch)")
    parser.add_argument("--batches", default="1",
                        help="comma-separated batch multipliers called in turn, e.g. 1,2,3: a sample times one call "
                             "of each (what a service sees; torch.compile backends recompile for dynamic sizes)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", choices=["fp32", "bf16", "int8"], default="fp32")
    parser.add_argument("--rounds", type=int, default=15)
    # 30 ms samples spread XML-CNN's per-round ratios by +-10% on the shared 2-core machine; a
    # whole fp32 run at 150 ms takes about three minutes.
    parser.add_argument("--sample-ms", type=float, default=150.0,
                        help="timed calls per backend per round: enough for about this long (at least one)")
    parser.add_argument("--drift-inputs", type=int, default=0, metavar="N",
                        help="with --dtype int8: each backend's drift from the fp32 model over N random inputs "
                             "(max and mean abs difference, top-1 agreement), besides the example's")
    parser.add_argument("--json", help="write the raw results here")
    parser.add_argument("--out", help="write <out>.md (the table) and <out>.png (a bar chart: needs matplotlib)")
    args = parser.parse_args(argv)

    models = [m for m in args.models.split(",") if m]
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
        assert args.batches and min(args.batches) >= 1
    except (ValueError, AssertionError):
        parser.error(f"--batches takes positive ints, comma-separated, not {args.batches!r}")
    if args.batches[0] != 1:
        parser.error("--batches starts with 1 (the --batch the models are built and checked with)")
    if args.backends is None:
        args.backends = INT8_DEFAULT_BACKENDS if args.dtype == "int8" else ",".join(b for b in BACKENDS if b not in NOT_DEFAULT)
    backends = [b for b in args.backends.split(",") if b]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    for b in backends:
        if b not in BACKENDS:
            parser.error(f"unknown backend {b!r}; choose from {', '.join(BACKENDS)}")
        if b in INT8_ONLY and args.dtype != "int8":
            parser.error(f"backend {b} is an int8 comparison: use it with --dtype int8")
    if args.drift_inputs and args.dtype != "int8":
        parser.error("--drift-inputs measures int8 drift: use it with --dtype int8")
    if args.out and not _optional.installed("matplotlib"):
        parser.error(_optional.missing("--out (its chart)", "matplotlib"))
    for m in list(models):
        if m in PACKAGE and not _optional.installed(PACKAGE[m]):
            print(f"skipping {m}: {_optional.not_installed(PACKAGE[m])}", file=sys.stderr)
            models.remove(m)
    if not models:
        sys.exit("no model to run")
    torch.set_num_threads(args.threads)

    rows = []
    for i, name in enumerate(models):
        progress(f"[{i + 1}/{len(models)}] {name}")
        rows.append(bench_model(name, backends, args))
    progress("")
    table = markdown(rows, backends, args)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    if args.out:
        with open(args.out + ".md", "w") as f:
            f.write(table + "\n")
        plot(rows, backends, args.out + ".png")


if __name__ == "__main__":
    main()
