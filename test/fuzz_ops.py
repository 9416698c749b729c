"""The ops test_fuzz.py draws programs from: how each draws its arguments, runs, and how far a fused
result may honestly lie from eager's.

Error bounds. Each op bounds |fused - eager| of its output from its inputs' bounds (`prop`: how the
op amplifies a difference it is given, measured on the actual values) plus what the two
implementations may differ by themselves (`disc`: accumulation order of a reduction or matmul, an
approximated transcendental, both in fp32 arithmetic also for bf16 data; a bf16 intermediate eager
rounds where a fused chain keeps fp32), plus one rounding of the output when its inputs already
differ. Ops that give bit-identical results on identical inputs (selection, casts, IEEE fp32
arithmetic) keep an exact value exact, so discontinuous ops (round, casts to int/bool) are drawn only
on exact values. The bounds are worst cases: a chain of matmuls compounds them.
"""
import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64
FLOATS = (F32, BF16, F64)
INTS = (torch.int32, torch.int64)
MAPPED = (F32, BF16)  # the dtypes torch_llga hands to oneDNN
UNIT = {F32: 2.0 ** -24, BF16: 2.0 ** -8, F64: 2.0 ** -53}  # unit roundoff


def unit(dtype):
    return UNIT.get(dtype, 0.0)


def acc_unit(dtype):
    """Roundoff of the accumulator: bf16 reductions accumulate in fp32 in PyTorch and oneDNN."""
    return 2.0 ** -53 if dtype == F64 else 2.0 ** -24


def mag(t):
    """Largest magnitude in t (as a Python float)."""
    if t.numel() == 0:
        return 0.0
    return float(t.detach().abs().max()) if t.dtype != torch.bool else 1.0


def d64(t):
    return t.detach().to(F64)


class Op:
    """One kind of step. `category`: exact (identical results on identical inputs, any dtype),
    ieee (identical in fp32 only: fused bf16 chains skip eager's intermediate rounding), approx."""
    name = "?"
    category = "approx"
    c = 8  # disc in units of roundoff times the output's magnitude
    allocates = True  # its output is a new tensor (not a view or its input itself)
    mutates = False  # an in-place op: writes its first input

    def applies(self, v):
        return v.dtype in FLOATS and v.rank >= 1

    def draw(self, b, v):
        """Returns (args, params, tensors) for a step on value v, or None."""
        return [v.name], {}, {}

    def forward(self, xs, p, t):
        raise NotImplementedError

    def identical(self, p):
        return True

    def prop(self, xs, es, out, p, t):
        return es[0]

    def disc(self, xs, out, p, t):
        return self.c * acc_unit(out.dtype) * mag(out) if self.category == "approx" else 0.0

    def code(self, args, p, t):
        return f"{self.name}({', '.join(args)}, {p})"


class Unary(Op):
    def __init__(self, name, fn, category="approx", lip=1.0, c=8, kinds=FLOATS, params=None, code=None,
                 exact_input=False, disc=None, allocates=True):
        self.name, self.fn, self.category, self.lip, self.c, self.allocates = name, fn, category, lip, c, allocates
        self.kinds, self.params, self._code, self.exact_input, self._disc = kinds, params, code, exact_input, disc

    def applies(self, v):
        return v.dtype in self.kinds and v.rank >= 1 and (v.exact or not self.exact_input)

    def draw(self, b, v):
        return [v.name], (self.params(b, v) if self.params else {}), {}

    def forward(self, xs, p, t):
        return self.fn(xs[0], **p)

    def prop(self, xs, es, out, p, t):
        lip = self.lip(xs[0], out, p) if callable(self.lip) else self.lip
        return lip * es[0]

    def disc(self, xs, out, p, t):
        if self._disc:
            return self._disc(xs[0], out, p)
        return super().disc(xs, out, p, t)

    def code(self, args, p, t):
        return self._code.format(*args, **p) if self._code else f"{self.name}({args[0]}{''.join(f', {k}={v!r}' for k, v in p.items())})"


def _clamp_params(b, v):
    if v.dtype in INTS:
        lo, hi = b.choice([None, -2, 0, 1]), b.choice([None, -1, 0, 3])
    else:
        lo, hi = b.choice([None, -1.0, -0.5, 0.0, 0.5]), b.choice([None, -0.25, 0.0, 0.5, 1.0, 2.0])
    if lo is None and hi is None:
        hi = 1 if v.dtype in INTS else 1.0
    return dict(min=lo, max=hi)  # min > max is allowed: PyTorch returns max


def _hardtanh_params(b, v):
    return dict(min_val=b.choice([-1.0, -0.5, 0.0, -3.0]), max_val=b.choice([0.5, 1.0, 6.0]))


def _softmax_params(b, v):
    p = dict(dim=b.int(-v.rank, v.rank - 1))
    if v.dtype == BF16 and b.draw(st.integers(0, 3)) == 0:
        p["dtype"] = F32  # computed and returned in fp32: stays in PyTorch
    return p


def _softmax_disc(x, out, p):
    k = x.shape[p["dim"]]
    return (8 + k) * acc_unit(out.dtype) * (mag(out) + 1)  # the sum of k exponentials; log_softmax adds log(sum)


def _gelu_disc(x, out, p):
    if p["approximate"] == "none":
        # x/2 (1 + erf(x/sqrt 2)) cancels for negative x: eager fp32 is up to 1.05e-6 (18 units)
        # off fp64 absolutely for x in [-5, -3], 22% relatively; oneDNN's differs as much. A layer
        # norm over such tiny values (variance far under eps) multiplied it into 2.3e-4 (Zen 4 fuzz).
        return 8 * acc_unit(out.dtype) * mag(out) + 32 * acc_unit(out.dtype)
    m = mag(x)  # tanh-gelu may be decomposed into nine ops: in bf16 those left unfused round, x^3 the largest
    return 16 * unit(out.dtype) * (mag(out) + m + 0.05 * m ** 3)


def _silu_disc(x, out, p):  # may be decomposed into x * sigmoid(x): a bf16 sigmoid rounds
    return 8 * acc_unit(out.dtype) * mag(out) + 2 * unit(out.dtype) * mag(x)


def _positive_disc(x, out, p):  # f(|x| + 1): eager rounds |x| + 1 in bf16, a fused chain need not
    return 8 * acc_unit(out.dtype) * mag(out) + unit(out.dtype) * (mag(x) + 1)


def _log_disc(x, out, p):
    # oneDNN 3.12's fp32 log is an approximation: 9 ulps of the output's magnitude alone, 27 as an
    # add's post-op (1M points over [1, 9]; PyTorch's: 1): 2e-6 relative, within fp32's 1e-5.
    return 48 * acc_unit(out.dtype) * (mag(out) + 1) + unit(out.dtype) * (mag(x) + 1)


ANY = FLOATS + INTS
UNARY = [
    Unary("relu", torch.relu, "exact", kinds=ANY),
    Unary("abs", torch.abs, "exact", kinds=ANY),
    Unary("neg", torch.neg, "exact", kinds=ANY),  # not mapped: a wildcard between partitions
    Unary("relu6", F.relu6, "exact"),
    Unary("hardtanh", F.hardtanh, "exact", params=_hardtanh_params),
    Unary("clamp", torch.clamp, "exact", kinds=ANY, params=_clamp_params),
    Unary("leaky_relu", F.leaky_relu, "ieee", lip=lambda x, o, p: max(1.0, abs(p["negative_slope"])),
          params=lambda b, v: dict(negative_slope=b.choice([0.01, 0.2, 1.0, -0.5, 2.0]))),
    Unary("elu", F.elu, lip=lambda x, o, p: max(1.0, p["alpha"]), params=lambda b, v: dict(alpha=b.choice([1.0, 0.5, 2.0]))),
    Unary("selu", F.selu, lip=1.76),  # not mapped (elu with scale != 1)
    Unary("gelu", F.gelu, lip=1.13, params=lambda b, v: dict(approximate=b.choice(["none", "tanh"])), disc=_gelu_disc),
    Unary("sigmoid", torch.sigmoid, lip=0.25, kinds=ANY),
    Unary("tanh", torch.tanh, kinds=ANY),
    Unary("exp", torch.exp, lip=lambda x, o, p: mag(o), kinds=ANY),
    Unary("hardswish", F.hardswish, lip=1.5, c=4),
    Unary("hardsigmoid", F.hardsigmoid, lip=0.17, c=4),
    Unary("silu", F.silu, lip=1.1, disc=_silu_disc),
    Unary("square", torch.square, "ieee", lip=lambda x, o, p: 2 * mag(x), kinds=ANY),
    Unary("pow2", lambda x: x.pow(2.0), "ieee", lip=lambda x, o, p: 2 * mag(x), code="{0}.pow(2.0)"),
    Unary("pow3", lambda x: x.pow(3.0), lip=lambda x, o, p: 3 * mag(x) ** 2, code="{0}.pow(3.0)"),
    Unary("round", torch.round, "exact", exact_input=True),  # discontinuous: exact inputs only
    Unary("log1", lambda x: (x.abs() + 1).log(), kinds=ANY, disc=_log_disc, code="({0}.abs() + 1).log()"),
    Unary("sqrt1", lambda x: (x.abs() + 1).sqrt(), lip=0.5, kinds=ANY, disc=_positive_disc, code="({0}.abs() + 1).sqrt()"),
    Unary("powhalf", lambda x: (x.abs() + 1).pow(0.5), lip=0.5, disc=_positive_disc, code="({0}.abs() + 1).pow(0.5)"),
    Unary("contiguous", lambda x: x.contiguous(), "exact", kinds=ANY + (torch.bool,), code="{0}.contiguous()", allocates=False),
    Unary("dropout", lambda x: F.dropout(x, 0.5, False), "exact", code="F.dropout({0}, 0.5, False)", allocates=False),
    Unary("softmax", F.softmax, lip=lambda x, o, p: 2 * mag(o), params=_softmax_params, disc=_softmax_disc),
    Unary("log_softmax", F.log_softmax, lip=2.0, params=_softmax_params, disc=_softmax_disc),
]


# ---- binary elementwise ----------------------------------------------------------------------

BINARY_FNS = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum}


def broadcast_shape_like(b, shape):
    """A shape that broadcasts against `shape`: leading dims dropped, some dims 1."""
    drop = b.int(0, len(shape))
    return tuple(1 if b.draw(st.integers(0, 2)) == 0 else s for s in shape[drop:])


def other_dtype(b, dtype):
    """Mostly the same dtype; sometimes another, to exercise type promotion."""
    if b.draw(st.integers(0, 5)) > 0:
        return dtype
    return b.choice([F32, BF16, F64, torch.int32, torch.bool])


class Binary(Op):
    """x op y with y a scalar, x itself, another value, a new input or a constant (broadcasting)."""

    def __init__(self, name):
        self.name = name
        self.category = "exact" if name == "maximum" else "ieee"

    def applies(self, v):
        if v.dtype == torch.bool:
            return self.name in ("add", "mul")
        return v.dtype in FLOATS + INTS

    def draw(self, b, v):
        p = {}
        mode = b.choice(["scalar", "self", "value", "input", "const"] if self.name != "maximum" else ["self", "value", "input"])
        if mode == "scalar":
            p["scalar"] = b.choice([2, 1, 0, -1, 3] if v.dtype in INTS + (torch.bool,) else [0.5, 1.0, 0.0, 2.0, -1.5, 3.0, 1e-3, 2])
            if self.name == "div" and p["scalar"] == 0:
                p["scalar"] = 2
            p["reversed"] = b.draw(st.integers(0, 3)) == 0
            return [v.name], p, {}
        if mode == "self":
            y = v.name
        elif mode == "value":
            others = [o for o in b.values if o.rank >= 1 and _broadcasts(o.shape, v.shape) and self._dtype_ok(o.dtype, v.dtype)]
            if not others:
                return None
            y = b.choice([o.name for o in others])
        else:
            shape = broadcast_shape_like(b, v.shape)
            dtype = other_dtype(b, v.dtype)
            if not self._dtype_ok(dtype, v.dtype):
                dtype = v.dtype
            if mode == "input":
                y = b.new_input(shape, dtype)
            else:
                if b.draw(st.integers(0, 4)) == 0:
                    shape = ()  # a 0-dim constant: prepare_binary turns it into a [1] tensor
                y = b.new_const(shape, dtype)
        args = [v.name, y]
        if b.flag():
            args.reverse()
        if self.name in ("add", "sub") and all(b.dtype_of(a) in FLOATS for a in args) and b.draw(st.integers(0, 3)) == 0:
            p["alpha"] = b.choice([2.0, -1.0, 0.5])
        return args, p, {}

    def _dtype_ok(self, a, c):
        if torch.bool in (a, c) and self.name == "sub":
            return False
        return True

    def identical(self, p):
        # alpha: eager computes x + alpha * y in one kernel (maybe a fused multiply-add), the fuser
        # splits it into mul + add; div: keep it out of the exact set (reciprocal tricks).
        return "alpha" not in p and self.name != "div"

    def forward(self, xs, p, t):
        fn = BINARY_FNS[self.name]
        if "scalar" in p:
            x, s = xs[0], p["scalar"]
            if self.name == "div" and p["reversed"]:
                return s / (x.abs() + 1)
            return _reversed(self.name, s, x) if p["reversed"] else fn(x, s)
        x, y = xs
        if self.name == "div":
            return x / (_den(y))
        if "alpha" in p:
            return fn(x, y, alpha=p["alpha"])
        return fn(x, y)

    def prop(self, xs, es, out, p, t):
        if "scalar" in p:
            s = abs(p["scalar"])
            x, e = xs[0], es[0]
            if self.name == "mul":
                return s * e
            if self.name == "div":
                return e * s if p["reversed"] else e / s
            return e
        (x, y), (ex, ey) = xs, es
        if self.name == "mul":
            return mag(y) * ex + mag(x) * ey + ex * ey
        if self.name == "div":  # the denominator |y| + 1 >= 1
            return ex + mag(x) * ey
        if self.name == "maximum":
            return max(ex, ey)
        return ex + abs(p.get("alpha", 1.0)) * ey

    def disc(self, xs, out, p, t):
        u, m = unit(out.dtype), mag(out)
        if "scalar" in p:  # prepare_binary rounds a scalar to a bf16 tensor; eager keeps it fp32
            s = abs(p["scalar"])
            if self.name == "div":  # s / (|x| + 1) also rounds |x| + 1 in eager
                return u * m + (u * s * (mag(xs[0]) + 1) if p["reversed"] else 0.0)
            return u * s * (mag(xs[0]) if self.name == "mul" else 1.0)
        if "alpha" in p:  # eager computes x + alpha * y in fp32; split, a bf16 alpha * y may round
            return u * abs(p["alpha"]) * mag(xs[1]) + 2 * acc_unit(out.dtype) * m
        if self.name == "div":  # the denominator |y| + 1 rounds in eager's bf16
            return u * m + 2 * acc_unit(out.dtype) * m
        return 0.0

    def code(self, args, p, t):
        op = {"add": "+", "sub": "-", "mul": "*", "div": "/"}.get(self.name)
        if "scalar" in p:
            s, x = p["scalar"], args[0]
            if self.name == "div" and p["reversed"]:
                return f"{s!r} / ({x}.abs() + 1)"
            return f"{s!r} {op} {x}" if p["reversed"] else f"{x} {op} {s!r}"
        x, y = args
        if self.name == "div":
            return f"{x} / ({y}.abs() + 1)"
        if "alpha" in p:
            return f"torch.{self.name}({x}, {y}, alpha={p['alpha']})"
        return f"torch.maximum({x}, {y})" if self.name == "maximum" else f"{x} {op} {y}"


def _den(y):
    return (y.to(torch.int32) if y.dtype == torch.bool else y).abs() + 1


def _reversed(name, s, x):
    return {"add": lambda: s + x, "sub": lambda: s - x, "mul": lambda: s * x}[name]()


def _broadcasts(a, b):
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


# ---- compute-bound ops ------------------------------------------------------------------------

def rowsum_max(w, dims):
    return float(d64(w).abs().sum(dims).max()) if w.numel() else 0.0


class Linear(Op):
    name, category = "linear", "approx"

    def draw(self, b, v):
        k = v.shape[-1]
        n = b.choice([8, 4, 16, 2, 1, 3, 5])  # first: what shrinking tends to
        t = {"w": b.const((n, k), v.dtype, scale=1 / math.sqrt(k))}
        if b.flag():
            t["b"] = b.const((n,), v.dtype)
        return [v.name], {}, t

    def forward(self, xs, p, t):
        return F.linear(xs[0], t["w"], t.get("b"))

    def prop(self, xs, es, out, p, t):
        return es[0] * rowsum_max(t["w"], 1)

    def disc(self, xs, out, p, t):
        x, w = xs[0], t["w"]
        s = F.linear(d64(x).abs(), d64(w).abs(), d64(t["b"]).abs() if "b" in t else None)
        return (x.shape[-1] * acc_unit(out.dtype) + unit(out.dtype)) * mag(s)

    def code(self, args, p, t):
        return f"F.linear({args[0]}, w{list(t['w'].shape)}{', b' if 'b' in t else ''})"


class Addmm(Op):
    name, category = "addmm", "approx"

    def applies(self, v):
        return v.dtype in FLOATS and v.rank == 2

    def draw(self, b, v):
        m, k = v.shape
        n = b.choice([8, 4, 2, 1])
        bias_shape = b.choice([(n,), (m, n), (1, n)])
        t = {"w": b.const((k, n), v.dtype, scale=1 / math.sqrt(k)), "b": b.const(bias_shape, v.dtype)}
        return [v.name], dict(beta=b.choice([1.0, 0.5, 0.0]), alpha=b.choice([1.0, 2.0])), t

    def forward(self, xs, p, t):
        return torch.addmm(t["b"], xs[0], t["w"], beta=p["beta"], alpha=p["alpha"])

    def prop(self, xs, es, out, p, t):
        return p["alpha"] * es[0] * rowsum_max(t["w"], 0)

    def disc(self, xs, out, p, t):
        s = p["alpha"] * mag(d64(xs[0]).abs() @ d64(t["w"]).abs()) + p["beta"] * mag(t["b"])
        return (xs[0].shape[1] * acc_unit(out.dtype) + 2 * unit(out.dtype)) * s

    def code(self, args, p, t):
        return f"torch.addmm(b{list(t['b'].shape)}, {args[0]}, w{list(t['w'].shape)}, beta={p['beta']}, alpha={p['alpha']})"


class Matmul(Op):
    """matmul/bmm/mm of x with a constant, x's own transpose, or a new input (batch dims broadcast)."""
    name, category = "matmul", "approx"

    def draw(self, b, v):
        r, k = v.rank, v.shape[-1]
        fn = "matmul"
        if r == 3 and b.flag():
            fn = "bmm"
        elif r == 2 and b.flag():
            fn = "mm"
        mode = b.choice(["const", "self_t", "input", "vector"] if fn == "matmul" else ["const", "self_t", "input"])
        n = b.choice([8, 4, 2, 1, 5])
        batch = list(v.shape[:-2])
        if fn == "matmul" and batch and b.flag():
            batch = [1 if b.flag() else s for s in batch]  # broadcast batch dims
        shape = tuple(batch) + (k, n)
        if mode == "vector":  # matrix-vector: PyTorch's vector semantics, left to PyTorch
            shape = (k,)
        if mode == "self_t":
            if r < 2:
                return None
            return [v.name, v.name], dict(fn=fn, self_t=True), {}
        if mode == "input":
            return [v.name, b.new_input(shape, v.dtype)], dict(fn=fn), {}
        return [v.name], dict(fn=fn), {"w": b.const(shape, v.dtype, scale=1 / math.sqrt(k))}

    def applies(self, v):
        return v.dtype in FLOATS and v.rank >= 2

    def _operands(self, xs, p, t):
        x = xs[0]
        y = xs[1].transpose(-1, -2) if p.get("self_t") else (xs[1] if len(xs) > 1 else t["w"])
        return x, y

    def forward(self, xs, p, t):
        x, y = self._operands(xs, p, t)
        return getattr(torch, p["fn"])(x, y)

    def prop(self, xs, es, out, p, t):
        x, y = self._operands(xs, p, t)
        ex, ey = es[0], (es[1] if len(es) > 1 else 0.0)
        k = x.shape[-1]
        return ex * rowsum_max(y, -2 if y.dim() > 1 else 0) + rowsum_max(x, -1) * ey + k * ex * ey

    def disc(self, xs, out, p, t):
        x, y = self._operands(xs, p, t)
        s = torch.matmul(d64(x).abs(), d64(y).abs())
        return (x.shape[-1] * acc_unit(out.dtype) + unit(out.dtype)) * mag(s)

    def code(self, args, p, t):
        y = f"{args[1]}.transpose(-1, -2)" if p.get("self_t") else (args[1] if len(args) > 1 else f"w{list(t['w'].shape)}")
        return f"torch.{p['fn']}({args[0]}, {y})"


class Attention(Op):
    """scaled_dot_product_attention of x [B, H, L, D] as the query: keys and values x itself, new
    inputs or constants; no mask, a boolean one (True attends) or a float one; a given scale or the
    default. Rows left with no key (a boolean mask of only False) are NaN or 0 depending on the
    kernel: such examples have non-finite outputs and are not drawn."""
    name, category = "sdpa", "approx"

    def applies(self, v):
        return v.dtype in FLOATS and v.rank == 4

    def draw(self, b, v):
        bs, h, l, d = v.shape
        mode = b.choice(["input", "self", "const"])
        s_len, e = b.choice([l, 4, 1, 7]), b.choice([d, 8, 3])
        kb, kh = (bs if b.draw(st.integers(0, 3)) else 1), (h if b.draw(st.integers(0, 3)) else 1)  # broadcast heads: PyTorch's
        args, t = [v.name], {}
        if mode == "input":
            args += [b.new_input((kb, kh, s_len, d), v.dtype), b.new_input((kb, kh, s_len, e), v.dtype)]
        elif mode == "const":
            t["k"], t["v"] = b.const((kb, kh, s_len, d), v.dtype), b.const((kb, kh, s_len, e), v.dtype)
        else:
            s_len = l
        mask = b.choice(["none", "bool", "float"])
        if mask != "none":
            shape = b.choice([(l, s_len), (1, 1, l, s_len), (bs, 1, l, s_len), (bs, h, l, s_len), (1, h, l, s_len)])
            t["mask"] = b.const(shape, torch.bool if mask == "bool" else v.dtype)
        return args, dict(scale=b.choice([None, None, 0.5, 0.125])), t

    def _operands(self, xs, t):
        q = xs[0]
        if len(xs) == 3:
            return q, xs[1], xs[2]
        return (q, t["k"], t["v"]) if "k" in t else (q, q, q)

    def forward(self, xs, p, t):
        q, k, v = self._operands(xs, t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=t.get("mask"), scale=p["scale"])

    def _scale(self, q, p):
        return p["scale"] if p["scale"] is not None else 1 / math.sqrt(q.shape[-1])

    def prop(self, xs, es, out, p, t):
        # A difference of the scores by up to ds moves each softmax weight by a factor in
        # [exp(-2 ds), exp(2 ds)]: the output by up to (exp(2 ds) - 1) max|V|, plus V's own difference.
        q, k, v = self._operands(xs, t)
        eq = es[0]
        ek, ev = (es[1], es[2]) if len(es) == 3 else ((0.0, 0.0) if "k" in t else (eq, eq))
        ds = self._scale(q, p) * (eq * rowsum_max(k, -1) + ek * rowsum_max(q, -1))
        return math.expm1(min(2 * ds, 50.0)) * mag(v) + ev

    def disc(self, xs, out, p, t):
        # The scores' matmul (and a bf16 kernel's rounding of the scores and weights), the softmax's
        # sum of S exponentials, the second matmul, as in Matmul and softmax.
        q, k, v = self._operands(xs, t)
        dt = out.dtype
        scores = torch.matmul(d64(q).abs(), d64(k).abs().transpose(-1, -2)) * self._scale(q, p)
        mask = t.get("mask")
        shifted = mag(scores) + (mag(mask) if mask is not None and mask.dtype != torch.bool else 0.0)
        ds = (q.shape[-1] * acc_unit(dt) + unit(dt)) * mag(scores) + 2 * unit(dt) * shifted
        s_len = k.shape[-2]
        return (math.expm1(min(2 * ds, 50.0)) + (s_len + 8) * acc_unit(dt) + 2 * unit(dt)) * mag(v) + unit(dt) * mag(out)

    def code(self, args, p, t):
        kv = f"{args[1]}, {args[2]}" if len(args) == 3 else ("k, v" if "k" in t else f"{args[0]}, {args[0]}")
        m = "" if "mask" not in t else f", attn_mask=mask({t['mask'].dtype}, {list(t['mask'].shape)})"
        return f"F.scaled_dot_product_attention({args[0]}, {kv}{m}, scale={p['scale']})"


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


class Conv(Op):
    name, category = "conv", "approx"

    def applies(self, v):
        return v.dtype in FLOATS and v.rank in (3, 4)

    def draw(self, b, v):
        sp = v.rank - 2
        c = v.shape[1]
        groups = b.choice(divisors(c))
        out = groups * b.int(1, 3)
        k = tuple(b.int(1, 3) for _ in range(sp))
        stride = tuple(b.int(1, 2) for _ in range(sp))
        pad = tuple(b.int(0, 2) for _ in range(sp))
        dil = tuple(b.int(1, 2) for _ in range(sp))
        for i in range(sp):
            if v.shape[2 + i] + 2 * pad[i] - dil[i] * (k[i] - 1) < 1:
                return None
        w_out = (v.shape[-1] + 2 * pad[-1] - dil[-1] * (k[-1] - 1) - 1) // stride[-1] + 1
        if v.dtype == BF16 and sp == 2 and w_out == 1 and stride[-1] > 1:
            return None  # eager PyTorch 2.14's bf16 conv2d returns garbage here (uninitialized memory)
        if any(k[i] == 1 and dil[i] > 1 for i in range(sp)):
            # eager PyTorch 2.14 segfaults on some (oneDNN 3.12's brgemm conv, the fault quirk
            # dilated_unit_kernel keeps from torch_llga's groups): bf16 [2, 4, 7, 1] channels-last,
            # w [4, 2, 3, 1], stride (1, 2), padding (1, 1), dilation (1, 2), groups 2. It crashed
            # a long fuzz run while drawing a program, before torch_llga ran it. On Zen 4 fp32 too
            # (oneDNN picks brg_conv_fwd:avx2 there; a null kernel in perform_outwork): [1, 4, 4, 1]
            # channels-last, w [6, 2, 3, 1], stride (1, 2), padding (1, 1), dilation (2, 2), groups 2.
            return None
        fan_in = c // groups * math.prod(k)
        t = {"w": b.const((out, c // groups) + k, v.dtype, scale=1 / math.sqrt(fan_in))}
        if b.flag():
            t["b"] = b.const((out,), v.dtype)
        return [v.name], dict(stride=stride, padding=pad, dilation=dil, groups=groups), t

    def forward(self, xs, p, t):
        conv = F.conv2d if xs[0].dim() == 4 else F.conv1d
        return conv(xs[0], t["w"], t.get("b"), **p)

    def prop(self, xs, es, out, p, t):
        return es[0] * rowsum_max(t["w"].flatten(1), 1)

    def disc(self, xs, out, p, t):
        conv = F.conv2d if xs[0].dim() == 4 else F.conv1d
        s = conv(d64(xs[0]).abs(), d64(t["w"]).abs(), d64(t["b"]).abs() if "b" in t else None, **p)
        k = t["w"][0].numel()
        return (k * acc_unit(out.dtype) + unit(out.dtype)) * mag(s)

    def code(self, args, p, t):
        f = "conv2d" if len(t["w"].shape) == 4 else "conv1d"
        return f"F.{f}({args[0]}, w{list(t['w'].shape)}, {'b' if 'b' in t else None}, **{p})"


class BatchNorm(Op):
    name, category = "batch_norm", "approx"

    def applies(self, v):
        return v.dtype in FLOATS and v.rank >= 2

    def draw(self, b, v):
        c = v.shape[1]
        dt = b.param_dtype(v.dtype)
        t = {"mean": b.const((c,), dt, scale=0.5), "var": b.const((c,), dt, low=0.5, high=2.0)}
        if b.draw(st.integers(0, 3)) > 0:
            t["w"] = b.const((c,), dt, low=-1.5, high=1.5)
            t["b"] = b.const((c,), dt, scale=0.5)
        return [v.name], dict(eps=b.choice([1e-5, 1e-3, 0.1])), t

    def forward(self, xs, p, t):
        return F.batch_norm(xs[0], t["mean"], t["var"], t.get("w"), t.get("b"), False, 0.1, p["eps"])

    def _scale_shift(self, p, t):
        s = (d64(t["w"]) if "w" in t else 1.0) / torch.sqrt(d64(t["var"]) + p["eps"])
        return s, (d64(t["b"]) if "b" in t else 0.0) - d64(t["mean"]) * s

    def prop(self, xs, es, out, p, t):
        s, _ = self._scale_shift(p, t)
        return es[0] * mag(s)

    def disc(self, xs, out, p, t):
        s, shift = self._scale_shift(p, t)
        return 4 * acc_unit(out.dtype) * (mag(xs[0]) * mag(s) + mag(shift) + mag(out))

    def code(self, args, p, t):
        return f"F.batch_norm({args[0]}, mean, var, {'w, b' if 'w' in t else 'None, None'}, False, 0.1, {p['eps']})"


class LayerNorm(Op):
    name, category = "layer_norm", "approx"

    def draw(self, b, v):
        n = 2 if v.rank >= 2 and b.draw(st.integers(0, 3)) == 0 else 1  # over 2 dims: not mapped
        shape = tuple(v.shape[-n:])
        t = {}
        if b.draw(st.integers(0, 3)) > 0:
            t = {"w": b.const(shape, v.dtype, low=0.5, high=1.5), "b": b.const(shape, v.dtype, scale=0.5)}
        return [v.name], dict(normalized_shape=shape, eps=b.choice([1e-5, 1e-3])), t

    def forward(self, xs, p, t):
        return F.layer_norm(xs[0], p["normalized_shape"], t.get("w"), t.get("b"), p["eps"])

    def _sigma_min(self, x, p):
        rows = d64(x).reshape(-1, math.prod(p["normalized_shape"]))
        return float(torch.sqrt(rows.var(1, unbiased=False) + p["eps"]).min())

    def prop(self, xs, es, out, p, t):
        g = mag(t["w"]) if "w" in t else 1.0
        return 3 * g * es[0] / self._sigma_min(xs[0], p)

    def disc(self, xs, out, p, t):
        # mean and variance over k values; x - mean cancels, then is divided by sigma
        g = mag(t["w"]) if "w" in t else 1.0
        k = math.prod(p["normalized_shape"])
        return (k + 8) * acc_unit(out.dtype) * (g * mag(xs[0]) / self._sigma_min(xs[0], p) + mag(out))

    def code(self, args, p, t):
        return f"F.layer_norm({args[0]}, {p['normalized_shape']}, {'w, b' if t else 'None, None'}, {p['eps']})"


# ---- pooling and reductions -------------------------------------------------------------------

def _pool_params(b, v, dilation):
    k = (b.int(1, 3), b.int(1, 3))
    stride = None if b.flag() else (b.int(1, 3), b.int(1, 3))
    pad = tuple(b.int(0, ki // 2) for ki in k)
    p = dict(kernel_size=k, stride=stride, padding=pad, ceil_mode=b.draw(st.integers(0, 2)) == 0)
    if dilation:
        p["dilation"] = (b.int(1, 2), b.int(1, 2))
    return p


class MaxPool(Op):
    name, category = "max_pool2d", "exact"

    def applies(self, v):
        return v.dtype in FLOATS and v.rank in (3, 4)

    def draw(self, b, v):
        return [v.name], _pool_params(b, v, True), {}

    def forward(self, xs, p, t):
        return F.max_pool2d(xs[0], **p)

    def code(self, args, p, t):
        return f"F.max_pool2d({args[0]}, **{p})"


class AvgPool(Op):
    name, category = "avg_pool2d", "approx"

    def applies(self, v):
        return v.dtype in FLOATS and v.rank in (3, 4)

    def draw(self, b, v):
        p = _pool_params(b, v, False)
        p["count_include_pad"] = b.flag()
        p["divisor_override"] = b.choice([None, None, None, 1, 3])
        return [v.name], p, {}

    def forward(self, xs, p, t):
        return F.avg_pool2d(xs[0], **p)

    def _gain(self, p):
        k = math.prod(p["kernel_size"])
        return k / p["divisor_override"] if p["divisor_override"] else 1.0

    def prop(self, xs, es, out, p, t):
        return es[0] * self._gain(p)

    def disc(self, xs, out, p, t):
        k = math.prod(p["kernel_size"])
        return k * acc_unit(out.dtype) * mag(xs[0]) * self._gain(p)

    def code(self, args, p, t):
        return f"F.avg_pool2d({args[0]}, **{p})"


class Reduce(Op):
    """adaptive_avg_pool2d (to 1x1: mapped), mean and sum (not mapped; PyTorch's reduction order
    depends on the strides the fused producer handed it)."""
    category = "approx"

    def __init__(self, name):
        self.name = name

    def applies(self, v):
        if self.name == "adaptive_avg_pool2d":
            return v.dtype in FLOATS and v.rank in (3, 4)
        return v.dtype in (FLOATS if self.name == "mean" else FLOATS + INTS) and v.rank >= 1

    def draw(self, b, v):
        if self.name == "adaptive_avg_pool2d":
            return [v.name], dict(output_size=b.choice([1, (1, 1), 2, (1, 2)])), {}
        if self.name == "sum" and b.draw(st.integers(0, 5)) == 0:
            return [v.name], dict(dim=None), {}  # a 0-dim result
        dims = sorted({b.int(0, v.rank - 1) for _ in range(b.int(1, 2))})
        keepdim = b.flag() or v.rank == len(dims)
        return [v.name], dict(dim=tuple(dims), keepdim=keepdim), {}

    def forward(self, xs, p, t):
        x = xs[0]
        if self.name == "adaptive_avg_pool2d":
            return F.adaptive_avg_pool2d(x, p["output_size"])
        if p["dim"] is None:
            return x.sum()
        return getattr(x, self.name)(p["dim"], keepdim=p["keepdim"])

    def _count(self, x, out):
        return max(1, x.numel() // max(1, out.numel()))

    def prop(self, xs, es, out, p, t):
        return es[0] * (self._count(xs[0], out) if self.name == "sum" else 1)

    def disc(self, xs, out, p, t):
        k = self._count(xs[0], out)
        s = mag(xs[0]) * (k if self.name == "sum" else 1)
        return k * acc_unit(out.dtype) * s

    def code(self, args, p, t):
        if self.name == "adaptive_avg_pool2d":
            return f"F.adaptive_avg_pool2d({args[0]}, {p['output_size']})"
        if p["dim"] is None:
            return f"{args[0]}.sum()"
        return f"{args[0]}.{self.name}({p['dim']}, keepdim={p['keepdim']})"


# ---- data movement and casts (exact) -----------------------------------------------------------

class Cat(Op):
    name, category = "cat", "exact"

    def applies(self, v):
        return v.rank >= 1

    def draw(self, b, v):
        d = b.int(0, v.rank - 1)
        parts = [v.name]
        for _ in range(b.int(1, 2)):
            mode = b.choice(["self", "input", "value"])
            if mode == "self":
                parts.append(v.name)
            elif mode == "value":
                same = [o.name for o in b.values if o.rank == v.rank and o.name != v.name and
                        all(o.shape[i] == v.shape[i] for i in range(v.rank) if i != d)]
                if same:
                    parts.append(b.choice(same))
            else:
                shape = list(v.shape)
                shape[d] = b.int(1, 4)
                parts.append(b.new_input(tuple(shape), other_dtype(b, v.dtype)))
        if len(parts) < 2:
            return None
        order = b.draw(st.permutations(parts))
        return list(order), dict(dim=d - v.rank if b.flag() else d), {}

    def forward(self, xs, p, t):
        return torch.cat(xs, p["dim"])

    def prop(self, xs, es, out, p, t):
        return max(es)

    def code(self, args, p, t):
        return f"torch.cat([{', '.join(args)}], {p['dim']})"


def _split_shape(b, shape):
    """A new shape with the same number of elements: dims merged, split, or flattened."""
    shape = list(shape)
    kind = b.choice(["merge", "split", "flat", "minus1"])
    if kind == "merge" and len(shape) >= 2:
        i = b.int(0, len(shape) - 2)
        return shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:]
    if kind == "split":
        i = b.int(0, len(shape) - 1)
        f = b.choice(divisors(shape[i]))
        return shape[:i] + [f, shape[i] // f] + shape[i + 1:]
    if kind == "minus1":
        return [shape[0], -1] if len(shape) >= 2 else [-1]
    return [math.prod(shape)]


class Movement(Op):
    category = "exact"
    allocates = False

    def __init__(self, name):
        self.name = name

    def applies(self, v):
        return v.rank >= (2 if self.name in ("transpose", "t") else 1) and (self.name != "t" or v.rank == 2)

    def draw(self, b, v):
        r = v.rank
        if self.name == "permute":
            return [v.name], dict(dims=tuple(b.draw(st.permutations(range(r))))), {}
        if self.name == "transpose":
            return [v.name], dict(dim0=b.int(-r, r - 1), dim1=b.int(-r, r - 1)), {}
        if self.name in ("reshape", "view"):
            return [v.name], dict(shape=tuple(_split_shape(b, v.shape))), {}
        if self.name == "flatten":
            s = b.int(0, r - 1)
            return [v.name], dict(start_dim=s, end_dim=b.int(s, r - 1)), {}
        if self.name == "unsqueeze":
            return [v.name], dict(dim=b.int(-r - 1, r)), {}
        return [v.name], {}, {}

    def forward(self, xs, p, t):
        x = xs[0]
        if self.name == "view":  # view needs a viewable input whatever the inputs' strides
            return x.contiguous().view(p["shape"])
        if self.name == "t":
            return x.t()
        return getattr(x, self.name)(*p.values())

    def prop(self, xs, es, out, p, t):
        return es[0]

    def code(self, args, p, t):
        if self.name == "view":
            return f"{args[0]}.contiguous().view({p['shape']})"
        return f"{args[0]}.{self.name}({', '.join(map(repr, p.values()))})"


class Cast(Op):
    name, category = "to", "exact"
    allocates = False  # to its own dtype: the input itself

    def applies(self, v):
        return v.rank >= 1

    def draw(self, b, v):
        targets = [F32, BF16, F64, v.dtype]
        if v.exact and (v.dtype not in FLOATS or v.max_abs < 1e4):  # truncation is discontinuous
            targets += [torch.int32, torch.int64, torch.bool]
        return [v.name], dict(dtype=b.choice(targets)), {}

    def forward(self, xs, p, t):
        return xs[0].to(p["dtype"])

    def prop(self, xs, es, out, p, t):
        return es[0]

    def code(self, args, p, t):
        return f"{args[0]}.to({p['dtype']})"


# ---- in-place forms (remove_mutation makes the mapped ones functional) --------------------------

INPLACE_UNARY = {
    "relu": lambda x, p: x.relu_(),
    "sigmoid": lambda x, p: x.sigmoid_(),
    "tanh": lambda x, p: x.tanh_(),
    "clamp": lambda x, p: x.clamp_(**p),
    "hardtanh": lambda x, p: F.hardtanh(x, inplace=True, **p),
    "leaky_relu": lambda x, p: F.leaky_relu(x, inplace=True, **p),
    "elu": lambda x, p: F.elu(x, inplace=True, **p),
    "silu": lambda x, p: F.silu(x, inplace=True),
    "hardswish": lambda x, p: F.hardswish(x, inplace=True),
    "hardsigmoid": lambda x, p: F.hardsigmoid(x, inplace=True),
}


class InPlace(Op):
    """x.op_(...) on a freshly computed x nothing else has read: its twin's draw and bounds."""
    mutates = True
    allocates = False

    def __init__(self, twin):
        self.twin, self.name, self.category, self.c = twin, twin.name + "_", twin.category, twin.c

    def applies(self, v):
        return v.fresh and v.dtype in FLOATS and self.twin.applies(v)

    def draw(self, b, v):
        drawn = self.twin.draw(b, v)
        if drawn is None or drawn[0][0] != v.name or drawn[1].get("reversed"):
            return None  # x must be the one written
        return drawn

    def forward(self, xs, p, t):
        if self.twin.name in INPLACE_UNARY:
            return INPLACE_UNARY[self.twin.name](xs[0], p)
        x = xs[0]
        y = p["scalar"] if "scalar" in p else (_den(xs[1]) if self.twin.name == "div" else xs[1])
        method = getattr(x, self.twin.name + "_")
        return method(y, alpha=p["alpha"]) if "alpha" in p else method(y)

    def identical(self, p):
        return self.twin.identical(p)

    def prop(self, xs, es, out, p, t):
        return self.twin.prop(xs, es, out, p, t)

    def disc(self, xs, out, p, t):
        return self.twin.disc(xs, out, p, t)

    def code(self, args, p, t):
        if self.twin.name in INPLACE_UNARY:
            return f"{args[0]}.{self.name}({', '.join(f'{k}={v!r}' for k, v in p.items())})"
        y = repr(p["scalar"]) if "scalar" in p else (f"({args[1]}.abs() + 1)" if self.twin.name == "div" else args[1])
        return f"{args[0]}.{self.name}({y}{', alpha=' + repr(p['alpha']) if 'alpha' in p else ''})"


# Families drawn first (with these weights), then an op of the family that applies to the operand:
# so compute-bound ops, which form groups alone, are drawn as often as the many elementwise ones.
FAMILIES = {
    "compute": [Linear(), Addmm(), Matmul(), Conv(), BatchNorm(), LayerNorm(), Attention()],
    "elementwise": UNARY,
    "binary": [Binary(n) for n in ("add", "sub", "mul", "div", "maximum")],
    "inplace": ([InPlace(op) for op in UNARY if op.name in INPLACE_UNARY]
                + [InPlace(Binary(n)) for n in ("add", "sub", "mul", "div")]),
    "pool": [MaxPool(), AvgPool(), Reduce("adaptive_avg_pool2d"), Reduce("mean"), Reduce("sum")],
    "movement": [Cat(), Cast()] + [Movement(n) for n in ("permute", "transpose", "reshape", "view", "flatten", "unsqueeze", "t")],
}
FAMILY_WEIGHTS = ["compute"] * 3 + ["elementwise"] * 3 + ["binary"] * 2 + ["pool"] * 2 + ["movement", "inplace"]
OPS = [op for ops in FAMILIES.values() for op in ops]
