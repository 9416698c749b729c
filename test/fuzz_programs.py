"""Random programs for test_fuzz.py: their inputs (sizes, dtypes, layouts), steps drawn from
fuzz_ops.py, and eager evaluation with error bounds."""
import dataclasses

import torch
from hypothesis import strategies as st

from fuzz_ops import BF16, F32, F64, FAMILIES, FAMILY_WEIGHTS, INTS, MAPPED, UNARY, mag, unit

MAX_ELEMENTS = 20000  # per value: keeps an example well under a second
MAX_MAGNITUDE = 1e6  # far from overflow


@dataclasses.dataclass
class Val:
    name: str
    ex: torch.Tensor  # its value on the traced inputs
    exact: bool  # fused and eager give bit-identical results
    fresh: bool = False  # a new tensor nothing has read yet: an in-place op may write it

    shape = property(lambda self: tuple(self.ex.shape))
    dtype = property(lambda self: self.ex.dtype)
    rank = property(lambda self: self.ex.dim())
    max_abs = property(lambda self: mag(self.ex))


def layouts_for(rank):
    if rank == 0:
        return ["contiguous"]
    return (["contiguous"] + (["channels_last"] if rank == 4 else []) + (["transposed"] if rank >= 2 else [])
            + ["sliced", "expanded"])


@dataclasses.dataclass
class Input:
    name: str
    shape: tuple
    dtype: torch.dtype
    layout: str
    dist: str  # normal (times scale) or halves (multiples of 0.5: ties for round, equal maxima)
    scale: float

    def make(self, seed, layout=None, shape=None):
        g = torch.Generator().manual_seed(seed)
        layout = layout or self.layout
        shape = shape or self.shape

        def values(s):
            if self.dtype == torch.bool:
                return torch.rand(s, generator=g) < 0.5
            if self.dtype in INTS:
                return torch.randint(-5, 6, s, generator=g, dtype=self.dtype)
            if self.dist == "halves":
                return (torch.randint(-8, 9, s, generator=g) / 2).to(self.dtype)
            return (torch.randn(s, generator=g) * self.scale).to(self.dtype)

        if layout == "channels_last":
            return values(shape).contiguous(memory_format=torch.channels_last)
        if layout == "transposed":
            return values(shape[::-1]).permute(*reversed(range(len(shape))))
        if layout == "sliced":
            return values(shape[:-1] + (2 * shape[-1],))[..., ::2]
        if layout == "expanded":  # stride 0 along the first dim
            return values((1,) + shape[1:]).expand(shape)
        return values(shape)

    def restrided(self):
        """Another layout for the same sizes, for the differently-strided call."""
        options = layouts_for(len(self.shape))
        return options[(options.index(self.layout) + 1) % len(options)]


@dataclasses.dataclass
class Step:
    op: object
    args: list
    p: dict
    t: dict
    out: str
    exact: bool


class Const:
    """A constant operand (module buffer: a frozen constant, or an attribute when not frozen)."""
    name, category = "const", "exact"
    allocates = mutates = False

    def forward(self, xs, p, t):
        return t["c"]

    def code(self, args, p, t):
        return f"const({t['c'].dtype}, {list(t['c'].shape)})"


@dataclasses.dataclass
class Program:
    seed: int
    inputs: list
    steps: list
    outputs: list

    def make_inputs(self, variant, restride=False, resize=False):
        """The traced inputs (variant 0) or fresh values; other strides; other sizes (every dim of
        the first input's batch size grows by one, so that broadcasting mostly still holds)."""
        grow = self.inputs[0].shape[0] if self.inputs[0].shape else None
        return tuple(i.make(self.seed * 1009 + k * 31 + variant, i.restrided() if restride else None,
                            tuple(d + 1 if d == grow else d for d in i.shape) if resize else None)
                     for k, i in enumerate(self.inputs))

    def __repr__(self):
        lines = [f"{i.name} = input({i.dtype}, {list(i.shape)}, {i.layout}, {i.dist} x{i.scale})" for i in self.inputs]
        lines += [f"{s.out} = {s.op.code(s.args, s.p, s.t)}{'  # exact' if s.exact else ''}" for s in self.steps]
        lines.append(f"return {', '.join(self.outputs)}")
        return "\n" + "\n".join(f"    {line}" for line in lines) + f"\n    # seed {self.seed}\n"

    def _repr_pretty_(self, printer, cycle):  # what hypothesis prints for a failing example
        printer.text(repr(self))


def run(prog, xs, tensor_of):
    env = dict(zip([i.name for i in prog.inputs], xs))
    for k, s in enumerate(prog.steps):
        env[s.out] = s.op.forward([env[a] for a in s.args], s.p, {n: tensor_of(k, n) for n in s.t})
    return tuple(env[o] for o in prog.outputs)


def evaluate(prog, xs):
    """Eager outputs and their error bounds, or None if a value is not finite (oneDNN's NaN
    handling is fixed separately; the fuzzer draws finite programs)."""
    env = dict(zip([i.name for i in prog.inputs], xs))
    err = {i.name: 0.0 for i in prog.inputs}
    with torch.no_grad():
        for s in prog.steps:
            ins = [env[a] for a in s.args]
            before = [x.clone() for x in ins] if s.op.mutates else ins  # an in-place op's bounds need its inputs
            out = s.op.forward(ins, s.p, s.t)
            if out.is_floating_point() and not torch.isfinite(out).all():
                return None
            e = 0.0
            if not s.exact:
                e = (s.op.prop(before, [err[a] for a in s.args], out, s.p, s.t) + s.op.disc(before, out, s.p, s.t)
                     + unit(out.dtype) * mag(out))
            env[s.out], err[s.out] = out, e
    return tuple(env[o] for o in prog.outputs), tuple(err[o] for o in prog.outputs)


def step_exact(op, p, ins, out_dtype):
    if not all(v.exact for v in ins):
        return False
    if op.category == "exact":
        return True
    dtypes = {v.dtype for v in ins} | {out_dtype}
    # IEEE arithmetic is identical in oneDNN and PyTorch in fp32; in bf16 a fused chain skips
    # eager's rounding after each op; other dtypes stay in PyTorch.
    return op.category == "ieee" and (dtypes == {F32} or not dtypes <= set(MAPPED)) and op.identical(p)


class Builder:
    """Draws a program step by step, running each step on the traced inputs as it goes."""

    def __init__(self, draw, seed):
        self.draw, self.seed = draw, seed
        self.gen = torch.Generator().manual_seed(seed)
        self.inputs, self.steps = [], []
        self.values = []  # what later steps may read (not values an in-place op has overwritten)
        self.by_name, self.env = {}, {}

    def int(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def choice(self, xs):
        return self.draw(st.sampled_from(xs))

    def flag(self):
        return self.draw(st.booleans())

    def dtype_of(self, name):
        return self.env[name].dtype

    def param_dtype(self, dtype):
        return F32 if dtype == BF16 and self.int(0, 3) == 0 else dtype  # bf16 data, fp32 weights

    def _add(self, name, ex, exact, fresh=False):
        self.env[name] = ex
        self.by_name[name] = Val(name, ex, exact, fresh)
        self.values.append(self.by_name[name])
        return name

    def new_input(self, shape, dtype):
        layout = self.choice(layouts_for(len(shape)))
        spec = Input(f"x{len(self.inputs)}", tuple(shape), dtype, layout, self.choice(["normal", "halves"]),
                     self.choice([1.0, 3.0]))
        self.inputs.append(spec)
        return self._add(spec.name, spec.make(self.seed * 1009 + (len(self.inputs) - 1) * 31), True)

    def const(self, shape, dtype, scale=1.0, low=None, high=None):
        if dtype == torch.bool:
            return torch.rand(shape, generator=self.gen) < 0.5
        if dtype in INTS:
            return torch.randint(-3, 4, shape, generator=self.gen, dtype=dtype)
        if low is not None:
            return (torch.rand(shape, generator=self.gen, dtype=F64) * (high - low) + low).to(dtype)
        return (torch.randn(shape, generator=self.gen, dtype=F64) * scale).to(dtype)

    def new_const(self, shape, dtype):
        t = {"c": self.const(shape, dtype)}
        self.steps.append(Step(Const(), [], {}, t, f"c{len(self.steps)}", True))
        return self._add(self.steps[-1].out, t["c"], True)

    def step(self, op, v):
        drawn = op.draw(self, v)
        if drawn is None:
            return
        args, p, t = drawn
        ins = [self.env[a] for a in args]
        if op.mutates:  # on copies, so that a failing call leaves the values intact
            copies = {}
            ins = [copies.setdefault(id(x), x.clone()) for x in ins]
        try:
            with torch.no_grad():
                out = op.forward(ins, p, t)
        except (RuntimeError, ValueError, TypeError, IndexError):
            return  # not a valid PyTorch call (dtype combination, window larger than input, ...)
        if out.numel() == 0 or out.numel() > MAX_ELEMENTS:
            return
        if out.is_floating_point() and not mag(out) <= MAX_MAGNITUDE:
            return  # far from overflow: generation must not hinge on the last bits of a value
        exact = step_exact(op, p, [self.by_name[a] for a in args], out.dtype)
        self.steps.append(Step(op, args, p, t, f"v{len(self.steps)}", exact))
        for a in args:
            self.by_name[a].fresh = False
        if op.mutates:  # the written value lives on under the new name only
            self.values.remove(self.by_name[args[0]])
        self._add(self.steps[-1].out, out, exact, fresh=op.allocates)


FIRST_DTYPES = [F32] * 8 + [BF16] * 4 + [F64, torch.int32, torch.int64, torch.bool]


def first_shape(draw):
    kind = draw(st.sampled_from(["image", "seq", "image", "matrix", "vector", "any"]))
    i = lambda lo, hi: draw(st.integers(lo, hi))  # noqa: E731
    if kind == "image":
        return (i(1, 2), i(1, 8), i(1, 10), i(1, 10))
    if kind == "seq":
        return (i(1, 3), i(1, 8), i(1, 16))
    if kind == "matrix":
        return (i(1, 16), i(1, 16))
    if kind == "vector":
        return (i(1, 16),)
    return tuple(i(1, 5) for _ in range(i(1, 5)))


# Programs a small-graph plan takes whole: only ops it has a step for (small_plan/compiler.cpp's
# table), fp32 or bf16. Drawn from every op, whole programs of tiny tensors are rarely plannable (51
# of 12,001 examples of a long run were planned), so the plan's own loops got little random testing.
PLAN_UNARY = {"relu", "abs", "neg", "relu6", "hardtanh", "clamp", "leaky_relu", "elu", "gelu", "sigmoid", "tanh",
              "exp", "hardswish", "hardsigmoid", "silu", "square", "log1", "sqrt1", "contiguous", "dropout"}
PLAN_FAMILIES = {
    "compute": [op for op in FAMILIES["compute"] if op.name in ("linear", "addmm", "matmul")],
    "elementwise": [op for op in UNARY if op.name in PLAN_UNARY],
    "binary": FAMILIES["binary"],
    "movement": [op for op in FAMILIES["movement"] if op.name != "to"],
}
PLAN_FAMILY_WEIGHTS = ["compute"] * 2 + ["elementwise"] * 3 + ["binary"] * 3 + ["movement"] * 2
PLAN_DTYPES = [F32, F32, BF16]


@st.composite
def programs(draw, max_steps=8, plannable=False):
    families, weights = (PLAN_FAMILIES, PLAN_FAMILY_WEIGHTS) if plannable else (FAMILIES, FAMILY_WEIGHTS)
    every_op = [op for ops in families.values() for op in ops]
    b = Builder(draw, draw(st.integers(0, 2 ** 31 - 1)))
    b.new_input(first_shape(draw), draw(st.sampled_from(PLAN_DTYPES if plannable else FIRST_DTYPES)))
    for _ in range(draw(st.integers(1, max_steps))):
        v = b.values[-1] if draw(st.booleans()) else draw(st.sampled_from(b.values))  # chains and branches
        family = families[draw(st.sampled_from(weights))]
        ops = [op for op in family if op.applies(v)] or [op for op in every_op if op.applies(v)]
        if ops:
            b.step(draw(st.sampled_from(ops)), v)
    names = [v.name for v in b.values]
    used = {a for s in b.steps for a in s.args}
    leaves = [s.out for s in b.steps if s.out not in used and s.args][-3:] or names[-1:]  # so that no step is dead
    outputs = leaves + draw(st.lists(st.sampled_from(names), max_size=2))  # several outputs, maybe repeated
    return Program(b.seed, b.inputs, b.steps, outputs)


# ---- the check --------------------------------------------------------------------------------

class ProgramModule(torch.nn.Module):
    def __init__(self, prog):
        super().__init__()
        self.prog = prog
        for k, s in enumerate(prog.steps):
            for n, t in s.t.items():
                self.register_buffer(f"t{k}_{n}", t)

    def forward(self, *xs):
        return run(self.prog, xs, lambda k, n: getattr(self, f"t{k}_{n}"))
