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
import io
import operator
import threading
import warnings

import torch
import torch.fx
from torch.utils import _pytree as pytree

from . import _C, _pt2e

_warned = set()
traced_scripts = 0  # scripts traced and frozen here, all graphs (torch_llga.stats()["compile_scripts"])


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


# A symbolic number's Python type once its value is known.
_NUMBER_TYPE = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def _symbol(value):
    """The sympy expression behind a SymInt, SymFloat or SymBool (None for anything else)."""
    return value.node.expr if type(value) in _NUMBER_TYPE else None


_INT_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
                   operator.neg, operator.pow, operator.getitem, operator.eq, operator.ne, operator.lt, operator.le,
                   operator.gt, operator.ge}


def _example(node):
    return node.meta.get("example_value", node.meta.get("val"))


def _is_symbolic(value):
    if isinstance(value, (list, tuple)):
        return any(_is_symbolic(v) for v in value)
    return _symbol(value) is not None


_VALUE_READS = {"item", "tolist"}


def _follow_sizes(graph, roles):
    """Rewrites `graph` so that the TorchScript tracer follows its symbolic sizes: aten.sym_size
    becomes Tensor.size (which the tracer records as aten::size), and an aten op overload taking a
    size becomes the Tensor method or torch function of that name (an overload called directly
    receives a plain int: the trace would bake the size in, silently). Returns (stray, read): the
    first node computing with a size in a way the tracer does not follow (None if none: then one
    script serves every size), and the inputs whose value the graph reads (`.item()` of a number
    Dynamo passes as a 0-dim tensor: baked in, one script per value)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    dynamic = {n for n, r in zip(placeholders, roles) if r[0] == "size"}  # ints that vary, read in the script
    baked = {n for n, r in zip(placeholders, roles) if r[0] == "value"}  # ints that are constants of a script
    read, stray = set(), None
    # Numbers nothing uses, or only other such numbers (Dynamo keeps some: a cache's numel(), a
    # `not (batch == 1)`): whatever they compute reaches no output.
    unused = set()
    for node in reversed(graph.nodes):
        if node.op in ("call_function", "call_method") and not isinstance(_example(node), torch.Tensor) \
                and all(user in unused for user in node.users):
            unused.add(node)
    for node in list(graph.nodes):
        if node in unused:
            continue
        if node.op == "call_function" and node.target is torch.ops.aten.sym_size.int:
            with graph.inserting_before(node):
                size = graph.call_method("size", node.args)
            size.meta = node.meta
            node.replace_all_uses_with(size)
            graph.erase_node(node)
            dynamic.add(size)
            continue
        if node.op == "placeholder":
            continue
        inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
        value = _example(node)
        if not any(a in dynamic for a in inputs):
            if not _is_symbolic(value):
                continue
            first = node.args[0] if node.args else None
            if node.op == "call_method" and node.target == "size":
                dynamic.add(node)
            elif node.op == "call_method" and node.target in _VALUE_READS and first in placeholders \
                    and roles[placeholders.index(first)][0] == "tensor":
                read.add(placeholders.index(first))
                baked.add(node)
            elif inputs and all(a in baked or not _is_symbolic(_example(a)) for a in inputs) and any(a in baked for a in inputs):
                baked.add(node)
            else:  # a size from elsewhere (a stride, an element count, an intermediate tensor's value)
                stray = stray or node
            continue
        if not isinstance(value, torch.Tensor):
            dynamic.add(node)  # an int computed from sizes (a tensor made with one is not)
        if node.op == "call_method" or node.op == "output":
            stray = stray or (node if node.op == "output" else None)  # a traced script returns tensors only
        elif isinstance(node.target, torch._ops.OpOverload):
            name = node.target._schema.name.split("::")[1]
            first = node.args[0] if node.args else None
            if isinstance(first, torch.fx.Node) and isinstance(_example(first), torch.Tensor) and hasattr(torch.Tensor, name):
                node.op, node.target = "call_method", name
            elif hasattr(torch, name):
                node.target = getattr(torch, name)
            else:
                stray = stray or node
        elif node.target not in _INT_ARITHMETIC and not (
                getattr(node.target, "__module__", "").startswith("torch") and not node.target.__name__.startswith("sym_")):
            stray = stray or node  # Python code (math.*, int(), torch.sym_max) computes with the traced size's value
    return stray, read


def _numbers_out(graph):
    """A Dynamo graph may return numbers beside its tensors (a size its caller keeps, say, a cache's
    length); a traced script returns tensors only. Rewrites the graph to return its tensors and
    returns how to rebuild the outputs: ("tensor", k) the script's k-th, ("constant", value), or
    ("number", (int/float/bool, sympy expression of the inputs' sizes and ints)). None if the graph
    returns only tensors, or a number no input determines (then it is left to the tracer's error)."""
    output = next(n for n in graph.nodes if n.op == "output")
    leaves = output.args[0]
    if not isinstance(leaves, (tuple, list)):
        return None
    recipe, tensors = [], []
    for leaf in leaves:
        value = _example(leaf) if isinstance(leaf, torch.fx.Node) else leaf
        if isinstance(leaf, torch.fx.Node) and isinstance(value, torch.Tensor):
            recipe.append(("tensor", len(tensors)))
            tensors.append(leaf)
        elif _symbol(value) is not None:
            recipe.append(("number", (_NUMBER_TYPE[type(value)], _symbol(value))))
        elif value is None or isinstance(value, (int, float, bool)):
            recipe.append(("constant", value))
        else:
            return None
    if len(tensors) == len(leaves):
        return None
    output.args = (tuple(tensors),)
    return recipe


class _FxScripts:
    """One FX graph whose inputs play roles: "state" (a parameter or buffer: baked in as a constant,
    checked on every call: one replaced, written in place or given other memory compiles again),
    "tensor" (an input of the script), "size" (an int that is dimension `dim` of input `of`: read
    from it inside the script), "value" (any other scalar: baked in, one script per value) and
    "scalar" (a 0-dim tensor input whose value the graph reads: baked in, one script per value)."""

    def __init__(self, gm, roles, output_spec=None):
        self.gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # the caller keeps its graph
        self.numbers_out = _numbers_out(self.gm.graph) if output_spec is None else None
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        state = {n for n, r in zip(placeholders, roles) if r[0] == "state"}
        _pt2e.lower(self.gm.graph, lambda n: n in state or getattr(n, "op", None) == "get_attr")
        written = _written_in_place(self.gm.graph)
        self.writes_inputs = any(n in written for n, r in zip(placeholders, roles) if r[0] == "tensor")
        stray, read = _follow_sizes(self.gm.graph, roles)
        roles = [("scalar",) if i in read else r for i, r in enumerate(roles)]
        self.roles, self.output_spec = roles, output_spec
        self.state = [i for i, r in enumerate(roles) if r[0] == "state"]
        self.tensors = [i for i, r in enumerate(roles) if r[0] == "tensor"]
        self.values = [i for i, r in enumerate(roles) if r[0] == "value"]
        self.scalars = [i for i, r in enumerate(roles) if r[0] == "scalar"]
        self.generic = stray is None  # one script for every size
        if stray is not None:
            _warn_once(f"torch_llga: a graph computes with a size through {stray.format_node()}, which the "
                       "TorchScript trace cannot follow: it is traced once per input size (the last "
                       "cache_capacity() kept), fused at each; a size read with x.shape / x.size() avoids this")
        self.gm.recompile()
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.symbols = [(i, d, _symbol(size)) for i in self.tensors if isinstance(_example(placeholders[i]), torch.Tensor)
                        for d, size in enumerate(_example(placeholders[i]).shape) if getattr(_symbol(size), "is_Symbol", False)]
        self.int_symbols = [(i, _symbol(_example(n))) for i, n in enumerate(placeholders)
                            if roles[i][0] in ("size", "value") and getattr(_symbol(_example(n)), "is_Symbol", False)]
        known = {symbol for *_, symbol in self.symbols} | {symbol for _, symbol in self.int_symbols}
        if any(kind == "number" and not what[1].free_symbols <= known for kind, what in self.numbers_out or ()):
            raise TraceError("the graph returns a number no input size determines")
        outputs = next(n for n in self.gm.graph.nodes if n.op == "output").args[0]
        self.output_shapes = [tuple(_symbol(s) if _symbol(s) is not None else s for s in _example(n).shape)
                              if isinstance(n, torch.fx.Node) and isinstance(_example(n), torch.Tensor) else None
                              for n in pytree.tree_leaves(outputs)]
        self.checked = set()  # input sizes the one script ran right at (_first_call_at)
        self.scripts = collections.OrderedDict()  # key -> frozen script, least recently used first
        self.baked = None  # _C.StateSnapshot of the state the scripts hold
        self.last_door = None  # (key, the _C.ScriptDoor door() last built)
        self.lock = threading.Lock()

    def _key(self, args):
        if self.generic and not self.values and not self.scalars:
            return ()  # one script for every call (a model's usual case: no Python step each call)
        key = tuple(args[i] for i in self.values) + tuple(args[i].item() for i in self.scalars)
        if not self.generic:  # traced per input size (and layout)
            key += tuple((args[i].shape, args[i].stride()) for i in self.tensors)
        return key

    def door(self, args, positions, num_args):
        """A _C.ScriptDoor, after a call with `args` ran: calls of num_args positional arguments
        whose script inputs are at `positions` run the one script in one C++ call (at the sizes of
        this call, where they are symbolic: others go to _first_call_at). None where calls need
        this Python path (a script per size or value, numbers returned beside the tensors)."""
        with self.lock:
            if not (self.generic and not self.values and not self.scalars and self.numbers_out is None
                    and self.baked is not None and len(self.scripts) == 1):
                return None
            sizes = [list(args[i].shape) for i in self.tensors] if self.symbols else []
            if sizes and tuple(args[i].shape for i in self.tensors) not in self.checked:
                return None
            script = next(iter(self.scripts.values()))
            # The same door again where nothing changed (calls the door leaves to this path, one
            # after another, need not build one each).
            key = (id(script), id(self.baked), tuple(positions), num_args, tuple(map(tuple, sizes)))
            if self.last_door is None or self.last_door[0] != key:
                self.last_door = (key, _C.ScriptDoor(script, self.baked, list(positions), num_args, sizes, _MISS))
            return self.last_door[1]

    def _state_baked(self, args):
        """Is the state in args what the scripts hold: the same tensors, none written or given other
        memory since?"""
        return self.baked is not None and self.baked.holds(args)

    def script(self, args):
        """The frozen script for these arguments (traced now if none fits)."""
        key = self._key(args)
        script = self.scripts.get(key)
        if script is not None and self._state_baked(args):
            return script
        with self.lock:
            if not self._state_baked(args):
                self.scripts.clear()  # a weight was replaced or written in place: every script holds it
                self.baked = _C.StateSnapshot(args, self.state)
            key = self._key(args)
            if key not in self.scripts:
                self.scripts[key] = self._trace(args)
                while len(self.scripts) > _C._cache_capacity():
                    self.scripts.popitem(last=False)
            self.scripts.move_to_end(key)
            return self.scripts[key]

    def _values(self, args):
        """Each symbol of the graph's inputs (a symbolic size, a symbolic int argument): its value in this call."""
        values = {symbol: args[i].shape[d] for i, d, symbol in self.symbols}
        values.update({symbol: args[i] for i, symbol in self.int_symbols})
        return values

    def _sizes_followed(self, args, outputs):
        """Are the outputs the sizes the graph says they are at these input sizes?"""
        values = self._values(args)
        for out, expected in zip(pytree.tree_leaves(outputs), self.output_shapes):
            if expected is None or not isinstance(out, torch.Tensor):
                continue
            want = [int(e.xreplace(values)) if hasattr(e, "xreplace") and e.free_symbols <= values.keys() else e
                    for e in expected]
            if len(want) != out.dim() or any(isinstance(w, int) and w != o for w, o in zip(want, out.shape)):
                return False
        return True

    def _first_call_at(self, script, args, inputs):
        """A call of the one script at input sizes it has not run before. A size the trace baked in
        anyway (a path _follow_sizes does not know) shows here: an error or outputs of other sizes
        than the graph's. If a script traced at these sizes then runs, the graph is traced per input
        size from now on (with a warning); if it fails too, the inputs are wrong: its error is raised."""
        sizes = tuple(args[i].shape for i in self.tensors)
        try:
            outputs = script(*inputs)
            followed = self._sizes_followed(args, outputs)
        except RuntimeError:
            followed = False
        if followed:
            if len(self.checked) > 4096:
                self.checked.clear()
            self.checked.add(sizes)
            return outputs
        if self.writes_inputs:  # the call may have written them already: running it again would write twice
            raise RuntimeError("torch_llga: a graph that writes its inputs in place did not follow its input sizes "
                               "in the traced script (an op read one in a way the trace does not record); compile "
                               "it with torch.compile(..., dynamic=False) to trace it per size")
        traced = self._trace(args)
        outputs = traced(*inputs)  # raises for inputs the graph does not take
        with self.lock:
            if self.generic:
                self.generic = False
                self.scripts.clear()
                _warn_once("torch_llga: a graph's traced script did not follow its input sizes (an op read "
                           "one in a way the trace does not record): it is traced per input size from now on")
            self.scripts[self._key(args)] = traced
        return outputs

    def _bake_sizes(self, graph, args):
        """For a script of these input sizes only: every int the graph computes from sizes becomes
        its value at them (Python code the tracer cannot follow then computes with plain ints)."""
        values = self._values(args)
        for node in list(graph.nodes):
            symbol = _symbol(_example(node))
            if node.op != "placeholder" and symbol is not None and symbol.free_symbols <= values.keys():
                _replace_with_constant(node, _NUMBER_TYPE[type(_example(node))](symbol.xreplace(values)))
                graph.erase_node(node)

    def _trace(self, args):
        global traced_scripts
        gm = torch.fx.GraphModule(self.gm, copy.deepcopy(self.gm.graph))
        graph = gm.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        if not self.generic:
            self._bake_sizes(graph, args)
        with graph.inserting_after(placeholders[-1] if placeholders else None):
            for i, (node, role) in enumerate(zip(placeholders, self.roles)):
                if role[0] in ("state", "scalar"):  # an attribute, so that freezing makes it a constant
                    name = f"_llga_constant_{i}"
                    gm.register_buffer(name, args[i].detach().clone() if role[0] == "scalar" else args[i].detach())
                    node.replace_all_uses_with(graph.get_attr(name))
                elif role[0] == "size" and self.generic:
                    node.replace_all_uses_with(graph.call_method("size", (placeholders[role[1]], role[2])))
                elif role[0] in ("value", "size"):
                    _replace_with_constant(node, args[i])
        for node, role in zip(placeholders, self.roles):
            if role[0] != "tensor":
                graph.erase_node(node)
        graph.lint()
        gm.recompile()
        module = gm if self.output_spec is None else _Unflattened(gm, self.output_spec)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notes, the tracer's on sizes read
            # Tracing and the profiling run execute the graph: on copies, so that a graph writing
            # its inputs (a cache position, a KV cache) writes them once, in the caller's call.
            try:
                copies = tuple(args[i].clone() for i in self.tensors)
                script = torch.jit.freeze(_in_own_unit(torch.jit.trace(module.eval(), copies, check_trace=False, strict=False)))
            except Exception as e:  # noqa: BLE001 - what TorchScript cannot trace, said in one line
                raise TraceError(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from e
            was_on = _C._set_enabled_in_thread(True)
            try:
                script(*(args[i].clone() for i in self.tensors))  # the profiling run: the caller's first call runs fused
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
                script = self.script(args)
                if self.generic and self.symbols and tuple(args[i].shape for i in self.tensors) not in self.checked:
                    outputs = self._first_call_at(script, args, inputs)
                else:
                    outputs = script(*inputs)
        finally:
            _C._set_enabled_in_thread(was_on)
        return outputs if self.numbers_out is None else self._with_numbers(args, outputs)

    def _with_numbers(self, args, tensors):
        """The graph's outputs: the script's tensors, and the numbers it returned beside them."""
        values = self._values(args)
        out = []
        for kind, what in self.numbers_out:
            if kind == "tensor":
                out.append(tensors[what])
            elif kind == "constant":
                out.append(what)
            else:
                number_type, expr = what
                out.append(number_type(expr.xreplace(values)))
        return tuple(out)


def _in_own_unit(traced):
    """The traced module, reloaded into a compilation unit of its own: PyTorch keeps a traced
    module's code in its global unit until exit, and freezing it there would keep its weights and
    compiled partitions too, the module deleted or not. A loaded module's unit goes with it.
    Saved without its weights (each an empty tensor of its dtype meanwhile; a quantized one saved
    as it is), which the loaded module then takes back: no copy kept. BERT-base's round trip takes
    ~125 ms (2.3 s with its 418 MB saved). What the archive cannot hold (an autograd.Function's
    PythonOp) leaves the traced module where it is, as before."""
    held = []
    for owner_name, owner in traced.named_modules():
        for name, tensor in list(owner.named_buffers(recurse=False)) + list(owner.named_parameters(recurse=False)):
            held.append((owner_name, name, tensor))
    buffer = io.BytesIO()
    try:
        for owner_name, name, tensor in held:
            if not tensor.is_quantized:  # (an empty quantized tensor needs its quantizer)
                setattr(_submodule(traced, owner_name), name, tensor.new_empty(0))
        torch.jit.save(traced, buffer)
    except Exception:  # noqa: BLE001 - not serializable: the global unit, as a trace alone has it
        return traced
    finally:
        for owner_name, name, tensor in held:
            setattr(_submodule(traced, owner_name), name, tensor)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    for owner_name, name, tensor in held:
        setattr(_submodule(loaded, owner_name), name, tensor)
    return loaded


def _submodule(module, path):
    for name in path.split(".") if path else ():
        module = getattr(module, name)
    return module


def _replace_with_constant(node, value):
    for user in list(node.users):
        user.args = torch.fx.node.map_arg(user.args, lambda a: value if a is node else a)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a: value if a is node else a)


class TraceError(RuntimeError):
    """A graph TorchScript's tracer could not trace (an op or output type it does not know)."""


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


# Ops whose output may share memory with their first input: a write into it writes the input.
_VIEWS = {"view", "reshape", "transpose", "permute", "select", "narrow", "expand", "unsqueeze", "squeeze", "flatten",
          "unflatten", "t", "as_strided", "split", "chunk", "unbind", "diagonal", "contiguous", "detach", "to", "view_as",
          "expand_as", "reshape_as", "movedim", "swapaxes", "slice", "alias", "__getitem__", "getitem"}


def _written_in_place(graph):
    """The placeholders an op of the graph writes (in place, directly or through a view)."""
    aliases = {n: n for n in graph.nodes if n.op == "placeholder"}  # node -> the placeholder it may view
    written = set()
    for node in graph.nodes:
        first = node.args[0] if node.args else None
        if first not in aliases or node.op not in ("call_method", "call_function"):
            continue
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        if isinstance(node.target, torch._ops.OpOverload):
            name = node.target._schema.name.split("::")[1]
            if node.target._schema.is_mutable:
                written.add(aliases[first])
        if (name.endswith("_") and not name.startswith("__")) or name in ("setitem", "__setitem__", "copy_") \
                or node.kwargs.get("inplace") is True or (node.kwargs.get("out") is not None):
            written.add(aliases[first])
        elif name in _VIEWS:
            aliases[node] = aliases[first]
    return written


_MISS = object()  # a _C.ScriptDoor's answer to a call it leaves to the Python path


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
        # A state the graph writes in place (a cache, a counter) stays an input: frozen, the write
        # would land in a copy.
        written = _written_in_place(gm.graph)

        def is_state(i):
            x = example_inputs[i]
            return placeholders[i] not in written and (
                isinstance(x, torch.nn.Parameter) or (isinstance(x, torch.Tensor) and "_buffers_" in placeholders[i].name))
        self.untraceable = False
        self.door = None  # _C.ScriptDoor, once a call ran the one script
        try:
            self.scripts = _FxScripts(gm, _roles(fakes, is_state))
        except TraceError as e:
            self._give_up(e)

    def __call__(self, *args):
        door = self.door
        if door is not None:  # the usual call, in C++
            out = door(args, args)
            if out is not _MISS:
                return out
        # Parameters count: outside no_grad an eager call would record them for backward.
        if _needs_gradients(args):
            _warn_once("torch_llga runs inference only: a call that needs gradients runs eager "
                       "(call the model under torch.no_grad() or torch.inference_mode() to fuse)")
            return self.gm(*args)
        if not self.untraceable:
            try:
                out = self.scripts(args)
            except TraceError as e:
                self._give_up(e)
            else:
                self.door = self.scripts.door(args, self.scripts.tensors, len(args))
                return out
        return self.gm(*args)

    def _give_up(self, error):
        self.untraceable, self.door = True, None
        _warn_once(f"torch_llga could not trace a graph to TorchScript ({error}): that graph runs eager, "
                   "unfused. TORCH_LOGS=graph_code shows it; a graph break "
                   "(torch._dynamo.graph_break()) before the op named keeps the rest fused")


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
        signature = program.graph_signature
        # A functionalized program returns the new values of what it writes (run_decompositions does
        # that); the graph as exported writes in place, which the script keeps.
        written = {**signature.buffers_to_mutate, **getattr(signature, "user_inputs_to_mutate", {})}
        if written:
            raise NotImplementedError(
                f"torch_llga.compile: this program returns new values for {', '.join(sorted(set(written.values())))} "
                "(a functionalized graph), which it does not run yet: compile the program torch.export.export "
                "returned, before run_decompositions, or use torch.compile(model, backend=\"torch_llga\")")
        specs = program.graph_signature.input_specs
        values = {**program.state_dict, **program.constants}
        self.state = [values[s.target] if s.kind != InputKind.USER_INPUT else None for s in specs]
        self.user_positions = [i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT]
        gm = program.graph_module
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        fakes = [n.meta.get("val") for n in placeholders]
        written = _written_in_place(gm.graph)  # a buffer written in place is passed, not frozen: the write lands in it
        is_state = lambda i: specs[i].kind != InputKind.USER_INPUT and placeholders[i] not in written  # noqa: E731
        self.scripts = _FxScripts(gm, _roles(fakes, is_state),
                                  program.call_spec.out_spec)
        self.in_spec = program.call_spec.in_spec
        # Tensors alone, positional: the inputs as they come (pytree's walk cost ~15 us a call)
        self.positional_tensors = self.in_spec == pytree.tree_flatten((tuple(range(len(self.user_positions))), {}))[1]
        self.door = None  # _C.ScriptDoor, once a call ran the one script

    def _args(self, args, kwargs):
        if self.positional_tensors and not kwargs and len(args) == len(self.user_positions) \
                and all(type(a) is torch.Tensor for a in args):
            flat = args
        else:
            flat, spec = pytree.tree_flatten((args, kwargs))
            if spec != self.in_spec:
                raise TypeError(f"the exported program takes inputs structured as {self.in_spec}, not {spec}")
        full = self.state.copy()  # the state in place, the user's inputs at their positions
        for position, value in zip(self.user_positions, flat):
            full[position] = value
        return full

    def __call__(self, *args, **kwargs):
        door = self.door
        if door is not None and not kwargs:  # the usual call, in C++
            out = door(self.state, args)
            if out is not _MISS:
                return out
        full = self._args(args, kwargs)
        if _needs_gradients(full):
            _warn_once("torch_llga runs inference only: a call that needs gradients runs eager "
                       "(call the program under torch.no_grad() or torch.inference_mode() to fuse)")
            return self.program.module()(*args, **kwargs)
        out = self.scripts(full)
        # The door takes the user's tensors as they come: only where they are the script's inputs.
        if self.positional_tensors and self.scripts.tensors == self.user_positions:
            self.door = self.scripts.door(full, range(len(self.user_positions)), len(self.user_positions))
        return out

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
