"""Graphs quantized with the PT2E flow (torchao's prepare_pt2e / convert_pt2e, X86InductorQuantizer)
in the form the fuser's int8 path reads: quantized tensors.

PT2E writes quantization as `quantized_decomposed` ops on plain uint8/int8 tensors. Left as they
are, TorchScript's freezing folds each weight's dequantize_per_channel into an fp32 constant and the
activations' quantize/dequantize stay outside the partitions: fp32 kernels between PyTorch's
quantize ops, slower than the fp32 model. Rewritten as torch.quantize_per_tensor / dequantize and a
per-channel quantized weight constant, the graph is the one PyTorch's FX flow produces, which the
op table maps to oneDNN's int8 kernels (dequantize -> conv/matmul -> post-ops -> quantize).

Only what means the same is rewritten: a quantize of an fp32 tensor, a weight dequantized from
constants over the dtype's full range. A quantized tensor clamps at its dtype's bounds; a reduced
range (reduce_range's 0..127, which the quantizer advises for CPUs without VNNI) clamps earlier, so
its quantize becomes a clamp of the fp32 values to the range's ends, then the quantize: the same
codes (the ends are grid points). A ReLU, ReLU6 or clamp that only the quantize reads joins that
clamp: one clamp to both bounds, one post-op in the int8 kernel instead of two. Anything else
(dynamic quantization's runtime scales, out_dtype=bfloat16) stays as PT2E wrote it and runs in
PyTorch, right and unfused.
"""
import math

import torch
import torch.fx

# dtype -> (quant_min, quant_max, the quantized dtype of that full range)
_FULL_RANGE = {torch.uint8: (0, 255, torch.quint8), torch.int8: (-128, 127, torch.qint8)}


def _is(node, name):
    """Does `node` call quantized_decomposed::<name> (its default overload: scale and zero point as numbers)?"""
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and target.namespace == "quantized_decomposed" and target._overloadname == "default"
            and target._schema.name == f"quantized_decomposed::{name}")


def _params(node):
    """(scale, zero point, quant_min, quant_max, dtype) of a per-tensor quantize/dequantize, or None
    when they are not constants or out_dtype asks for another float than fp32."""
    if node.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    scale, zero_point, quant_min, quant_max, dtype = node.args[1:6]
    if not (isinstance(scale, float) and isinstance(zero_point, int)):
        return None
    return scale, zero_point, quant_min, quant_max, dtype


def _full_range(quant_min, quant_max, dtype):
    return dtype in _FULL_RANGE and _FULL_RANGE[dtype][:2] == (quant_min, quant_max)


def _within_range(quant_min, quant_max, dtype):
    return dtype in _FULL_RANGE and _FULL_RANGE[dtype][0] <= quant_min < quant_max <= _FULL_RANGE[dtype][1]


# Ops whose outputs lie within their first input's bounds (0 among them: pools pad with zeros).
_WITHIN_INPUT_BOUNDS = {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "flatten", "view", "reshape"}


def _value_bounds(value):
    """(lowest, highest) of the values `value` can hold, when it is a dequantize of a known range
    or such a value pooled or reshaped; None otherwise."""
    while isinstance(value, torch.fx.Node) and value.op == "call_function":
        if _is(value, "dequantize_per_tensor") and _params(value):
            scale, zero_point, quant_min, quant_max, _ = _params(value)
            return (quant_min - zero_point) * scale, (quant_max - zero_point) * scale
        target = value.target
        if not (isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"
                and target._schema.name.split("::")[1] in _WITHIN_INPUT_BOUNDS):
            return None
        value = value.args[0]
    return None


def _clamp_bounds(x, scale, zero_point, quant_min, quant_max, dtype):
    """{"min": ..., "max": ...}: the fp32 values at the ends of a reduced range, where a quantize
    of x to the full range must clamp first to give the reduced range's codes. Empty at full range,
    and where x's values lie within the range already (a pool of a tensor quantized to the range:
    the clamp would change nothing, and oneDNN 3.12 cannot compile an int8 pool with one). The ends
    are grid points, so a value a rounding beyond one still gets its code."""
    full_min, full_max = _FULL_RANGE[dtype][:2]
    lowest, highest = _value_bounds(x) or (-math.inf, math.inf)
    bounds = {}
    if quant_min > full_min and lowest < (quant_min - zero_point) * scale:
        bounds["min"] = (quant_min - zero_point) * scale
    if quant_max < full_max and highest > (quant_max - zero_point) * scale:
        bounds["max"] = (quant_max - zero_point) * scale
    return bounds


# An activation that clamps (in place or not), and the bounds it clamps to, from its arguments.
_CLAMPS = {"relu": lambda args, kwargs: (0.0, math.inf),
           "hardtanh": lambda args, kwargs: (args[1] if len(args) > 1 else kwargs.get("min_val", -1.0),
                                             args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)),
           "clamp": lambda args, kwargs: (args[1] if len(args) > 1 else kwargs.get("min"),
                                          args[2] if len(args) > 2 else kwargs.get("max"))}


def _fresh(y):
    """Is y a new tensor an op of the graph computes (no input, state, or view of one)?"""
    target = getattr(y, "target", None)
    return (isinstance(y, torch.fx.Node) and y.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and not any(r.alias_info for r in target._schema.returns))


def _activation_clamp(x):
    """(input, lowest, highest) when x is a ReLU, hardtanh (ReLU6) or clamp with constant bounds of a
    value nothing else reads; else None. Its in-place form (relu_, as ReLU(inplace=True) exports)
    only on a fresh tensor: through a view, or on an input or a weight, dropping the op would drop
    a write someone sees."""
    target = getattr(x, "target", None)
    if not (x.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target.namespace == "aten"):
        return None
    name = target._schema.name.split("::")[1].rstrip("_")
    if name not in _CLAMPS or target._overloadname not in ("default", ""):
        return None
    y = x.args[0]
    lowest, highest = _CLAMPS[name](x.args, x.kwargs)
    lowest = -math.inf if lowest is None else lowest
    highest = math.inf if highest is None else highest
    if not (isinstance(y, torch.fx.Node) and len(y.users) == 1 and len(x.users) == 1
            and isinstance(lowest, (int, float)) and isinstance(highest, (int, float))):
        return None
    if target._schema.is_mutable and not _fresh(y):
        return None
    return y, float(lowest), float(highest)


def _fp32(value):
    """Is this node's value an fp32 tensor? (PT2E quantizes bf16 too, torch.quantize_per_tensor fp32 only.)"""
    example = value.meta.get("val", value.meta.get("example_value")) if isinstance(value, torch.fx.Node) else None
    return isinstance(example, torch.Tensor) and example.dtype == torch.float32


def lower(graph, is_constant):
    """Rewrites `graph`'s PT2E quantization as quantized tensors (see the module's note).
    is_constant(node): is this node a constant of the graph (a frozen state input)? Returns the
    number of ops rewritten."""
    rewritten = 0
    quantizes = {}  # each quantize to rewrite: its parameters and clamp, read off PT2E's own ops first
    for node in graph.nodes:
        params = _params(node) if _is(node, "quantize_per_tensor") else None
        if params and _within_range(*params[2:]) and _fp32(node.args[0]):
            quantizes[node] = params, _clamp_bounds(node.args[0], *params)
    for node in list(graph.nodes):
        if node in quantizes:
            params, bounds = quantizes[node]
            scale, zero_point, _, _, dtype = params
            with graph.inserting_before(node):
                x = node.args[0]
                activation, replaced = _activation_clamp(x) if bounds else None, None
                if activation:  # clamp(clamp(y, a, b), c, d) is clamp(y, max(a, c), min(b, d)), unless that is empty
                    y, lowest, highest = activation
                    lowest = max(lowest, bounds.get("min", -math.inf))
                    highest = min(highest, bounds.get("max", math.inf))
                    if lowest <= highest:
                        merged = {k: v for k, v in (("min", lowest), ("max", highest)) if math.isfinite(v)}
                        replaced, x, bounds = x, y, merged
                if bounds:
                    x = graph.call_function(torch.clamp, (x,), bounds)
                    x.meta = node.args[0].meta.copy()
                quantized = graph.call_function(torch.quantize_per_tensor,
                                                (x, scale, zero_point, _FULL_RANGE[dtype][2]))
            for user in list(node.users):
                with graph.inserting_before(user):
                    if _is(user, "dequantize_per_tensor") and _params(user) == params and user.args[0] is node:
                        dequantized = graph.call_method("dequantize", (quantized,))
                        dequantized.meta = user.meta.copy()  # its example value: the sizes dynamo.py follows
                        user.replace_all_uses_with(dequantized)
                        graph.erase_node(user)
                    else:  # a reader of the integers themselves
                        ints = graph.call_method("int_repr", (quantized,))
                        ints.meta = node.meta.copy()
                        user.replace_input_with(node, ints)
            graph.erase_node(node)
            if replaced is not None:  # the activation the clamp took over
                graph.erase_node(replaced)
            rewritten += 1
        elif _is(node, "dequantize_per_channel") and node.kwargs.get("out_dtype") in (None, torch.float32):
            weight, scales, zero_points, axis, quant_min, quant_max, dtype = node.args[:7]
            if not (_full_range(quant_min, quant_max, dtype) and is_constant(weight) and is_constant(scales)
                    and (zero_points is None or is_constant(zero_points))):
                continue
            with graph.inserting_before(node):
                if zero_points is None:
                    zero_points = graph.call_function(torch.zeros_like, (scales,), {"dtype": torch.int64})
                scales = graph.call_method("double", (scales,))
                quantized = graph.call_function(torch._make_per_channel_quantized_tensor,
                                                (weight, scales, zero_points, axis))
                dequantized = graph.call_method("dequantize", (quantized,))
                dequantized.meta = node.meta.copy()
                node.replace_all_uses_with(dequantized)
            graph.erase_node(node)
            rewritten += 1
    if rewritten:
        graph.lint()
    return rewritten
