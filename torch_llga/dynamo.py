"""torch_llga as a torch.compile backend, and torch.export programs through the same fuser:

    model = torch.compile(model, backend="torch_llga")   # the name comes with pip's entry point
    program = torch_llga.compile(torch.export.export(model, (x,)))
    with torch.no_grad():
        model(x); model(x); model(x)                      # compile, profiling run, fused

Each FX graph (one per region between Dynamo's graph breaks, or an ExportedProgram's) is traced to
TorchScript, frozen with the module's parameters and buffers as constants and run under the fuser:
the same passes, partitions, kernel, guards and weight cache as the TorchScript path.

Sizes: a graph with symbolic sizes (torch.compile marks a dimension dynamic once a call changes it;
torch.export's Dim) is traced once, each symbolic size read from its input tensor in the traced
graph (aten::size), so one script serves every size and the kernel compiles a partition per new
size, as for a TorchScript module. A symbolic int that is no input's size (an int argument) is
baked in: one script per value, the last cache_capacity() kept.

Threads: the fuser is on for these scripts through the calling thread's own switch, for the call's
length; the process-wide one (torch_llga.enable) is neither read nor changed, so other threads'
TorchScript modules fuse or not as they chose.

Inference only: a call that needs gradients runs the graph as it came (eager), with a one-time warning.
"""
import collections
import copy
import operator
import threading
import warnings

import torch
import torch.fx
from torch.utils import _pytree as pytree

from . import _C

_warned = set()
traced_scripts = 0  # scripts traced and frozen here, all graphs (torch_llga.stats()["compile_scripts"])


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


def _symbol(value):
    """The sympy expression behind a SymInt (None for anything else)."""
    return value.node.expr if isinstance(value, torch.SymInt) else None


_INT_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
                   operator.neg, operator.pow, operator.getitem}


def _example(node):
    return node.meta.get("example_value", node.meta.get("val"))


def _is_symbolic(value):
    if isinstance(value, (list, tuple)):
        return any(_is_symbolic(v) for v in value)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _follow_sizes(graph, roles):
    """Rewrites `graph` so that the TorchScript tracer follows its symbolic sizes: aten.sym_size
    becomes Tensor.size (which the tracer records as aten::size), and an aten op overload taking a
    size becomes the Tensor method or torch function of that name (an overload called directly
    receives a plain int: the trace would bake the size in, silently). Returns whether every use of
    a size is one the tracer follows; if not, the graph is traced per input size instead."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    symbolic = {n for n, r in zip(placeholders, roles) if r[0] == "size"}
    follows = True
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.sym_size.int:
            with graph.inserting_before(node):
                size = graph.call_method("size", node.args)
            size.meta = node.meta
            node.replace_all_uses_with(size)
            graph.erase_node(node)
            symbolic.add(size)
            continue
        if node.op == "placeholder" or not _is_symbolic(_example(node)) and not any(
                a in symbolic for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)):
            continue
        uses_size = any(a in symbolic for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node))
        if not uses_size:
            if node.op == "call_method" and node.target == "size":
                symbolic.add(node)
            else:  # a size from elsewhere (a stride, an element count, a tensor's value)
                follows = False
            continue
        if not isinstance(_example(node), torch.Tensor):
            symbolic.add(node)  # an int computed from sizes (a tensor made with one is not)
        if node.op == "call_method" or node.op == "output":
            follows = follows and node.op == "call_method"  # a traced script returns tensors only
        elif isinstance(node.target, torch._ops.OpOverload):
            name = node.target._schema.name.split("::")[1]
            first = node.args[0] if node.args else None
            if isinstance(first, torch.fx.Node) and isinstance(_example(first), torch.Tensor) and hasattr(torch.Tensor, name):
                node.op, node.target = "call_method", name
            elif hasattr(torch, name):
                node.target = getattr(torch, name)
            else:
                follows = False
        elif node.target not in _INT_ARITHMETIC and not (
                getattr(node.target, "__module__", "").startswith("torch") and not node.target.__name__.startswith("sym_")):
            follows = False  # Python code (math.*, int(), torch.sym_max) computes with the traced size's value
    return follows


class _FxScripts:
    """One FX graph whose inputs play roles: "state" (a parameter or buffer: baked in as a constant,
    checked on every call: one replaced or written in place compiles again), "tensor" (an input of the
    script), "size" (an int that is dimension `dim` of input `of`: read from it inside the script) and
    "value" (any other scalar: baked in, one script per value)."""

    def __init__(self, gm, roles, output_spec=None):
        self.gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the caller keeps its graph
        self.roles, self.output_spec = roles, output_spec
        self.state = [i for i, r in enumerate(roles) if r[0] == "state"]
        self.tensors = [i for i, r in enumerate(roles) if r[0] == "tensor"]
        self.values = [i for i, r in enumerate(roles) if r[0] == "value"]
        self.generic = _follow_sizes(self.gm.graph, roles)  # one script for every size
        self.gm.recompile()
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.symbols = [(i, d, _symbol(size)) for i in self.tensors if isinstance(_example(placeholders[i]), torch.Tensor)
                        for d, size in enumerate(_example(placeholders[i]).shape) if _symbol(size) is not None]
        outputs = next(n for n in self.gm.graph.nodes if n.op == "output").args[0]
        self.output_shapes = [tuple(_symbol(s) if _symbol(s) is not None else s for s in _example(n).shape)
                              if isinstance(n, torch.fx.Node) and isinstance(_example(n), torch.Tensor) else None
                              for n in pytree.tree_leaves(outputs)]
        self.checked = set()  # input sizes whose output sizes were checked against the graph's
        self.scripts = collections.OrderedDict()  # key -> frozen script, least recently used first
        self.baked = None  # [(tensor, version)] of the state the scripts hold
        self.lock = threading.Lock()

    def _key(self, args):
        key = tuple(args[i] for i in self.values)
        if not self.generic:  # traced per input size (and layout)
            key += tuple((args[i].shape, args[i].stride()) for i in self.tensors)
        return key

    def script(self, args):
        """The frozen script for these arguments (traced now if none fits)."""
        key = self._key(args)
        script = self.scripts.get(key)
        if script is not None and all(args[i] is t and t._version == v for i, (t, v) in zip(self.state, self.baked)):
            return script
        with self.lock:
            if self.baked is None or any(args[i] is not t or t._version != v for i, (t, v) in zip(self.state, self.baked)):
                self.scripts.clear()  # a weight was replaced or written in place: every script holds it
                self.baked = [(args[i], args[i]._version) for i in self.state]
            key = self._key(args)
            if key not in self.scripts:
                self.scripts[key] = self._trace(args)
                while len(self.scripts) > _C._cache_capacity():
                    self.scripts.popitem(last=False)
            self.scripts.move_to_end(key)
            return self.scripts[key]

    def _check_output_sizes(self, args, outputs):
        """At input sizes not seen before: are the outputs the sizes the graph says? A size the trace
        baked in anyway (a path _follow_sizes did not know) shows here; the graph is then traced per
        input size from now on, and this call's result traced again."""
        sizes = tuple(args[i].shape for i in self.tensors)
        if sizes in self.checked:
            return True
        values = {symbol: args[i].shape[d] for i, d, symbol in self.symbols}
        for out, expected in zip(pytree.tree_leaves(outputs), self.output_shapes):
            if expected is None or not isinstance(out, torch.Tensor):
                continue
            want = [int(e.xreplace(values)) if hasattr(e, "xreplace") and e.free_symbols <= values.keys() else e
                    for e in expected]
            if any(isinstance(w, int) and w != o for w, o in zip(want, out.shape)) or len(want) != out.dim():
                with self.lock:
                    if self.generic:
                        self.generic = False
                        self.scripts.clear()
                        _warn_once("torch_llga: a graph's traced script did not follow its sizes (an op "
                                   "outside those it knows read one); it is traced per input size from now on")
                return False
        if len(self.checked) > 4096:
            self.checked.clear()
        self.checked.add(sizes)
        return True

    def _trace(self, args):
        global traced_scripts
        gm = torch.fx.GraphModule(self.gm, copy.deepcopy(self.gm.graph))
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        with graph.inserting_after(placeholders[-1] if placeholders else None):
            for i, (node, role) in enumerate(zip(placeholders, self.roles)):
                if role[0] == "state":  # an attribute, so that freezing makes it a constant
                    name = f"_llga_constant_{i}"
                    gm.register_buffer(name, args[i].detach())
                    node.replace_all_uses_with(graph.get_attr(name))
                elif role[0] == "size":
                    node.replace_all_uses_with(graph.call_method("size", (placeholders[role[1]], role[2])))
                elif role[0] == "value":
                    for user in list(node.users):
                        user.args = torch.fx.node.map_arg(user.args, lambda a: args[i] if a is node else a)
                        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: args[i] if a is node else a)
        for node, role in zip(placeholders, self.roles):
            if role[0] != "tensor":
                graph.erase_node(node)
        graph.lint()
        gm.recompile()
        module = gm if self.output_spec is None else _Unflattened(gm, self.output_spec)
        inputs = tuple(args[i] for i in self.tensors)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notes, the tracer's on sizes read
            script = torch.jit.freeze(torch.jit.trace(module.eval(), inputs, check_trace=False, strict=False))
            was_on = _C._set_enabled_in_thread(True)
            try:
                script(*inputs)  # the profiling run, here: the caller's first call already runs fused
            finally:
                _C._set_enabled_in_thread(was_on)
        traced_scripts += 1
        return script

    def __call__(self, args):
        inputs = [args[i] for i in self.tensors]
        # The executor reads the switch when it optimizes (the second call, or a guard's fallback
        # later), in the calling thread: this thread's switch, on for this call.
        was_on = _C._set_enabled_in_thread(True)
        try:
            with torch.no_grad():
                outputs = self.script(args)(*inputs)
                if self.generic and self.symbols and not self._check_output_sizes(args, outputs):
                    outputs = self.script(args)(*inputs)
                return outputs
        finally:
            _C._set_enabled_in_thread(was_on)


class _Unflattened(torch.nn.Module):
    """An exported graph's flat outputs in the structure the exported model returned (one tensor, a
    tuple, a dict), so the saved script returns what the model did."""

    def __init__(self, gm, spec):
        super().__init__()
        self.gm, self.spec = gm, spec

    def forward(self, *inputs):
        return pytree.tree_unflatten(list(self.gm(*inputs)), self.spec)


def _size_source(value, placeholders_values, roles_so_far):
    """("size", j, d) when `value` is the symbolic size `d` of tensor input j."""
    symbol = _symbol(value)
    if symbol is None:
        return None
    for j, fake in enumerate(placeholders_values):
        if isinstance(fake, torch.Tensor) and roles_so_far[j] == ("tensor",):
            for d, size in enumerate(fake.shape):
                if _symbol(size) == symbol:
                    return ("size", j, d)
    return None


def _roles(fakes, is_state):
    """The role of each input (see _FxScripts) from the graph's example values (fake tensors, SymInts)."""
    roles = [("state",) if is_state(i) else ("tensor",) if isinstance(f, torch.Tensor) else None
             for i, f in enumerate(fakes)]
    return [r or _size_source(fakes[i], fakes, roles) or ("value",) for i, r in enumerate(roles)]


def _needs_gradients(args):
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


class _Compiled:
    """One graph Dynamo handed over, as _FxScripts."""

    def __init__(self, gm, example_inputs):
        self.gm = gm
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        fakes = [n.meta.get("example_value", x) for n, x in zip(placeholders, example_inputs)]
        # The module's state among the inputs: its parameters, and its buffers, which Dynamo names
        # "..._buffers_..." (batch norm statistics, an FX-quantized model's scales and zero points).
        def is_state(i):
            x = example_inputs[i]
            return isinstance(x, torch.nn.Parameter) or (isinstance(x, torch.Tensor) and "_buffers_" in placeholders[i].name)
        self.scripts = _FxScripts(gm, _roles(fakes, is_state))

    def __call__(self, *args):
        # Parameters count: outside no_grad an eager call would record them for backward.
        if _needs_gradients(args):
            _warn_once("torch_llga runs inference only: a call that needs gradients runs eager "
                       "(call the model under torch.no_grad() or torch.inference_mode() to fuse)")
            return self.gm(*args)
        return self.scripts(args)


def torch_llga_backend(gm, example_inputs, **_options):
    """The Dynamo backend: a torch.fx.GraphModule and its example inputs in, a callable out."""
    return _Compiled(gm, example_inputs)


class CompiledProgram:
    """An ExportedProgram under the fuser (torch_llga.compile(program)): called with the program's
    inputs, it returns what the program returns; save(path) writes it as a frozen TorchScript file
    that torch.jit.load or a libtorch program loads (and fuses with TORCH_LLGA_ENABLE=1)."""

    def __init__(self, program):
        from torch.export.graph_signature import InputKind

        self.program = program
        specs = program.graph_signature.input_specs
        values = {**program.state_dict, **program.constants}
        self.state = [values[s.target] if s.kind != InputKind.USER_INPUT else None for s in specs]
        gm = program.graph_module
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        fakes = [n.meta.get("val") for n in placeholders]
        self.scripts = _FxScripts(gm, _roles(fakes, lambda i: specs[i].kind != InputKind.USER_INPUT),
                                  program.call_spec.out_spec)
        self.in_spec = program.call_spec.in_spec

    def _args(self, args, kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            raise TypeError(f"the exported program takes inputs structured as {self.in_spec}, not {spec}")
        flat = iter(flat)
        return [s if s is not None else next(flat) for s in self.state]

    def __call__(self, *args, **kwargs):
        full = self._args(args, kwargs)
        if _needs_gradients(full):
            _warn_once("torch_llga runs inference only: a call that needs gradients runs eager "
                       "(call the program under torch.no_grad() or torch.inference_mode() to fuse)")
            return self.program.module()(*args, **kwargs)
        return self.scripts(full)

    def save(self, path, *example_args, **example_kwargs):
        """Writes the program as a frozen TorchScript file taking the program's inputs flattened in
        order (tensors only), returning its outputs. Sizes stay symbolic where the program's are."""
        if not (example_args or example_kwargs):
            if self.program.example_inputs is None:
                raise ValueError("this program holds no example inputs: pass some, save(path, *args, **kwargs)")
            example_args, example_kwargs = self.program.example_inputs
        torch.jit.save(self.scripts.script(self._args(example_args, example_kwargs)), path)


def compile(program):
    """An ExportedProgram (torch.export.export) in, a callable running it under the fuser out."""
    if not isinstance(program, torch.export.ExportedProgram):
        raise TypeError(f"torch_llga.compile takes a torch.export.ExportedProgram, not {type(program).__name__}: "
                        'for an nn.Module use torch.compile(model, backend="torch_llga") or torch.jit.trace')
    return CompiledProgram(program)
