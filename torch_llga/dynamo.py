"""torch_llga as a torch.compile backend:

    model = torch.compile(model, backend="torch_llga")   # the name comes with pip's entry point
    with torch.no_grad():
        model(x); model(x); model(x)                      # compile, profiling run, fused

Each FX graph Dynamo hands over (one per region between graph breaks) is traced to TorchScript,
frozen with the module's parameters as constants and run with the fuser on: the same passes,
partitions, kernel, guards and weight cache as the TorchScript path. Dynamo's own guards (shapes,
dtypes) decide when a graph is compiled again. Inference only: a call that needs gradients runs the
graph as Dynamo gave it (eager), with a one-time warning.
"""
import copy
import warnings

import torch

from . import _C

_warned = set()


def _warn_once(message):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, stacklevel=3)


def _constants_baked_in(gm, example_inputs, params):
    """gm with the inputs at `params` (Dynamo lifts a module's parameters to graph inputs) made
    attributes, so that freezing turns them into constants: oneDNN then reorders each weight once."""
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))  # Dynamo keeps gm (its graph too)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in params:
        name = f"_llga_constant_{i}"
        gm.register_buffer(name, example_inputs[i].detach())
        with gm.graph.inserting_before(placeholders[i]):
            attr = gm.graph.get_attr(name)
        placeholders[i].replace_all_uses_with(attr)
        gm.graph.erase_node(placeholders[i])
    gm.graph.lint()
    gm.recompile()
    return gm


class _Compiled:
    """One FX graph as a frozen TorchScript module under the fuser. The parameters and buffers baked
    in are checked on every call (same tensors, not written since): a changed one compiles again."""

    def __init__(self, gm, example_inputs):
        self.gm = gm
        # The module's state among the inputs: its parameters, and its buffers, which Dynamo names
        # "..._buffers_..." (batch norm statistics, an FX-quantized model's scales and zero points).
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        self.params = [i for i, x in enumerate(example_inputs)
                       if isinstance(x, torch.nn.Parameter) or (isinstance(x, torch.Tensor) and "_buffers_" in names[i])]
        baked = set(self.params)
        self.inputs_at = [i for i in range(len(example_inputs)) if i not in baked]  # what the script takes
        self._build(example_inputs)

    def _build(self, args):
        self.baked = [(args[i], args[i]._version) for i in self.params]
        module = _constants_baked_in(self.gm, args, self.params) if self.params else self.gm
        inputs = tuple(args[i] for i in self.inputs_at)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit's deprecation notes
            self.script = torch.jit.freeze(torch.jit.trace(module.eval(), inputs, check_trace=False, strict=False))

    def __call__(self, *args):
        # Parameters count: outside no_grad an eager call would record them for backward.
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            _warn_once("torch_llga runs inference only: a call that needs gradients runs eager")
            return self.gm(*args)
        if any(args[i] is not t or t._version != v for i, (t, v) in zip(self.params, self.baked)):
            self._build(args)  # a weight was replaced or written in place
        inputs = [args[i] for i in self.inputs_at] if self.params else args
        # The fuser switch is read when the executor optimizes (the second call, or a guard's
        # fallback later): on for this call. Set directly: a context manager costs microseconds.
        was_enabled = _C._is_enabled()
        _C._set_enabled(True)
        try:
            if torch.is_grad_enabled():
                with torch.no_grad():
                    return self.script(*inputs)
            return self.script(*inputs)
        finally:
            _C._set_enabled(was_enabled)


def torch_llga_backend(gm, example_inputs):
    """The Dynamo backend: a torch.fx.GraphModule and its example inputs in, a callable out."""
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        # Symbolic sizes (dynamic=True): nothing TorchScript can trace; runs as Dynamo gave it.
        _warn_once("torch_llga compiles static shapes only: with dynamic=True the graph runs eager")
        return gm.forward
    return _Compiled(gm, example_inputs)
