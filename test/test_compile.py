"""torch.compile(model, backend="torch_llga"): each graph Dynamo hands over runs through the same
fuser as the TorchScript path (torch_llga/dynamo.py)."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_llga
import torch_llga.dynamo

from conftest import AVX2, CPU, FP32, ConvNet, requires_bf16_kernels, run_in_threads


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch_llga.dynamo._warned.clear()  # its warnings come once a process
    yield
    torch._dynamo.reset()


def groups_of(graph):
    """The ops of each fusion group in a TorchScript graph (inside guards' branches too)."""
    return [[n.kind().split("::")[1] for n in g.g("Subgraph").nodes() if n.kind() != "prim::Constant"]
            for g in graph.findAllNodes("llga::FusionGroup", True)]


def run_three_times(compiled, *inputs):
    """Compile, profiling run, fused run; returns the last output and the fused run's stats delta."""
    with torch.no_grad():
        compiled(*inputs)
        compiled(*inputs)
        before = torch_llga.stats()
        out = compiled(*inputs)
    after = torch_llga.stats()
    return out, {k: after[k] - before[k] for k in before}


def test_backend_by_name_fuses_and_matches_eager():
    model, x = ConvNet().eval(), torch.randn(1, 3, 16, 16)
    out, delta = run_three_times(torch.compile(model, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert groups_of(torch.jit.last_executed_optimized_graph()) == [
        ["_convolution", "relu"], ["_convolution", "add", "relu"], ["linear"]]
    assert delta["executions"] == 3 and delta["guard_failures"] == 0 and delta["kernel_fallbacks"] == 0
    # The weights are constants of the frozen graph (each reordered once), not graph inputs.
    assert len(list(torch.jit.last_executed_optimized_graph().inputs())) == 2  # self, x


class TwoHalves(nn.Module):
    """A graph break between two fusable halves: Dynamo hands over two graphs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        y = F.relu(self.a(x))
        torch._dynamo.graph_break()
        return F.relu(self.b(y))


def test_graph_break():
    model, x = TwoHalves().eval(), torch.randn(4, 16)
    out, delta = run_three_times(torch.compile(model, backend="torch_llga"), x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert delta["executions"] == 2  # [linear, relu] in each graph


def test_second_batch_size_recompiles():
    model = ConvNet().eval()
    compiled = torch.compile(model, backend="torch_llga", dynamic=False)
    for batch in (1, 3, 1):
        x = torch.randn(batch, 3, 16, 16)
        out, delta = run_three_times(compiled, x)
        with torch.no_grad():
            torch.testing.assert_close(out, model(x), **FP32)
        assert delta["executions"] == 3


def fused_calls(compiled, model, *inputs):
    """Calls compiled(*inputs) once; returns its fused partition runs (oneDNN partitions and small-graph
    plans) after checking the output against eager."""
    before = torch_llga.stats()
    with torch.no_grad():
        out, expected = compiled(*inputs), model(*inputs)
    after = torch_llga.stats()
    first = (lambda o: o if isinstance(o, torch.Tensor) else o[0])
    torch.testing.assert_close(first(out), first(expected), **FP32)
    return after["executions"] - before["executions"] + after["plan_runs"] - before["plan_runs"]


class TinyEncoder(nn.Module):
    """Embedding, self-attention and a feed-forward block: a transformer encoder in miniature."""

    def __init__(self, vocab=100, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, tokens):
        x = self.embed(tokens)
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = self.norm1(x + self.out(attention))
        return self.norm2(x + self.ff(x))


def tokens(batch, seq=12):
    return torch.randint(0, 100, (batch, seq))


# The sequence: batch 2 three times, then batch 3 four times (torch.compile marks the batch
# dimension dynamic at the change), then sizes of the dynamic graph's own.
@pytest.mark.parametrize("model,make", [(ConvNet, lambda b: torch.randn(b, 3, 16, 16)),
                                        (TinyEncoder, tokens), (TwoHalves, lambda b: torch.randn(b, 16))],
                         ids=["cnn", "encoder", "graph_break"])
def test_default_settings_fuse_every_batch_size(model, make):
    model = model().eval()
    compiled = torch.compile(model, backend="torch_llga")
    before = torch_llga.stats()["compile_scripts"]
    for batch in (2, 2, 2, 3, 3, 3, 3):
        assert fused_calls(compiled, model, make(batch)) > 0, f"batch {batch} ran unfused"
    scripts = torch_llga.stats()["compile_scripts"]
    graphs = (scripts - before) // 2  # each graph traced at batch 2, then with a dynamic batch
    for batch in (5, 1, 7, 5):  # new sizes compile partitions, not scripts
        with torch.no_grad():
            compiled(make(batch))  # a small-graph plan's script profiles a new size once
        assert fused_calls(compiled, model, make(batch)) > 0, f"batch {batch} ran unfused"
    # One script more a graph at most: Dynamo gives size 1 graphs of its own (it specializes sizes 0 and 1).
    assert torch_llga.stats()["compile_scripts"] <= scripts + graphs


def test_dynamic_true_and_mark_dynamic_fuse_every_sequence_length():
    model = TinyEncoder().eval()
    compiled = torch.compile(model, backend="torch_llga", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seq in (5, 9, 16, 9):
            assert fused_calls(compiled, model, tokens(2, seq)) > 0
    # One script for every length: nothing traced per size (Dynamo passes the embedding's float
    # norm_type as a 0-dim tensor read with .item(): a value baked in, not a size).
    assert not [w for w in caught if "torch_llga" in str(w.message)]
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torch_llga")
    x = tokens(2, 7)
    torch._dynamo.mark_dynamic(x, 1)
    assert fused_calls(compiled, model, x) > 0
    for seq in (3, 20):
        assert fused_calls(compiled, model, tokens(2, seq)) > 0
    assert torch_llga.stats()["compile_scripts"] >= 1


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x, repeats: int):
        return F.relu(self.linear(x)).repeat(1, repeats)


def test_an_int_argument_that_is_no_size_gets_a_script_per_value():
    model, x = Scaled().eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="torch_llga")
    before = torch_llga.stats()["compile_scripts"]
    for repeats in (2, 3, 4, 3):  # from the second value on, Dynamo passes it as a symbolic int
        assert fused_calls(compiled, model, x, repeats) > 0
    assert torch_llga.stats()["compile_scripts"] - before == 3  # 2 (a static graph), then 3 and 4 baked in


def write_in_place(weight):
    weight.mul_(2)


def give_other_memory(weight):
    weight.data = weight.data * 2  # the version stays: the storage tells


def convnet_through(door, x):
    """(the eager model, the compiled one, its classifier's weight as the compiled one reads it)
    for a ConvNet through the torch.compile or the export door."""
    model = ConvNet().eval()
    if door == "compile":
        return model, torch.compile(model, backend="torch_llga"), model.fc.weight
    program = torch.export.export(model, (x,))
    return program.module(), torch_llga.compile(program), program.state_dict["fc.weight"]


@pytest.mark.parametrize("change", [write_in_place, give_other_memory])
@pytest.mark.parametrize("door", ["compile", "export"])
def test_a_changed_weight_compiles_again(door, change):
    x = torch.randn(1, 3, 16, 16)
    reference, compiled, weight = convnet_through(door, x)
    first, _ = run_three_times(compiled, x)
    with torch.no_grad():
        change(weight)  # the frozen graph's constant is stale now
    out, delta = run_three_times(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(out, reference(x), **FP32)
    assert not torch.allclose(out, first) and delta["executions"] == 3


def test_the_state_check_sees_another_tensor_swapped_into_a_weight():
    # torch.utils.swap_tensors keeps the Python object and puts another tensor in it (a model's
    # weights reached through Dynamo or export carry weakrefs, which it refuses: the check itself).
    weight, other = torch.randn(4, 4), torch.randn(4, 4, dtype=torch.float64)
    snapshot = torch_llga._C.StateSnapshot([weight], [0])
    assert snapshot.holds([weight])
    torch.utils.swap_tensors(weight, other)
    assert not snapshot.holds([weight])
    del other  # the recorded tensor freed: never read
    assert not snapshot.holds([weight])


@pytest.fixture
def python_path(monkeypatch):
    """The calls that took the doors' Python path (_FxScripts.__call__), not _C.ScriptDoor."""
    calls = []
    original = torch_llga.dynamo._FxScripts.__call__
    monkeypatch.setattr(torch_llga.dynamo._FxScripts, "__call__", lambda self, args: calls.append(1) or original(self, args))
    return calls


@pytest.mark.parametrize("door", ["compile", "export"])
def test_the_usual_call_skips_the_python_path(door, python_path):
    # Once a call ran the one script, calls go through _C.ScriptDoor; a changed weight sends one
    # call back to the Python path, which traces again, and the door runs the new script.
    x = torch.randn(1, 3, 16, 16)
    reference, compiled, weight = convnet_through(door, x)
    run_three_times(compiled, x)
    for change in (None, write_in_place):
        if change:
            with torch.no_grad():
                change(weight)
        before = len(python_path)
        out, delta = run_three_times(compiled, x)
        with torch.no_grad():
            torch.testing.assert_close(out, reference(x), **FP32)
        assert delta["executions"] == 3 and len(python_path) - before == (1 if change else 0)
    if door == "export":  # (torch.compile recompiles for either: Dynamo guards on them)
        before = len(python_path)
        with torch.no_grad():  # a tensor subclass: its Python methods run on the Python path
            compiled(x.as_subclass(MarkedTensor))
        assert len(python_path) == before + 1
        reference.requires_grad_(False)  # grad mode on, nothing needing gradients: fused, by the door
        compiled(x)
        before = len(python_path)
        out = compiled(x)
        assert len(python_path) == before and not out.requires_grad
        torch.testing.assert_close(out, reference(x), **FP32)


class MarkedTensor(torch.Tensor):
    pass


def test_a_dynamic_program_takes_the_door_at_each_checked_size(python_path):
    model, batch = ConvNet().eval(), torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(model, (torch.randn(2, 3, 16, 16),), dynamic_shapes=({0: batch},))
    compiled = torch_llga.compile(program)
    for n in (2, 3, 2):
        x = torch.randn(n, 3, 16, 16)
        with torch.no_grad():
            compiled(x)  # a new size: the Python path checks the script at it
            before = len(python_path)
            out = compiled(x)
            torch.testing.assert_close(out, model(x), **FP32)
        assert len(python_path) == before


def test_gradients_run_eager_with_a_warning():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    x = torch.randn(2, 8, requires_grad=True)
    compiled = torch.compile(model, backend="torch_llga")
    with pytest.warns(UserWarning, match="inference only"):
        out = compiled(x)
    out.sum().backward()
    assert x.grad is not None and torch.equal(out, model(x))


def test_grad_mode_with_trainable_weights_runs_eager():
    # Outside no_grad, a module's own parameters need gradients: the output must carry them.
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()), torch.randn(2, 8)
    compiled = torch.compile(model, backend="torch_llga")
    with pytest.warns(UserWarning, match="inference only"):
        out = compiled(x)
    assert out.requires_grad


BF16 = dict(rtol=3e-2, atol=3e-2)  # as test_bf16.py: bf16 rounds at other points than eager


@requires_bf16_kernels
def test_bf16_model_and_autocast():
    x = torch.randn(1, 3, 16, 16)
    model = ConvNet().eval()
    expected_groups = [["_convolution", "relu"], ["_convolution", "add", "relu"], ["linear"]]
    out, delta = run_three_times(torch.compile(model.bfloat16(), backend="torch_llga"), x.bfloat16())
    with torch.no_grad():
        torch.testing.assert_close(out, model(x.bfloat16()), **BF16)
    assert groups_of(torch.jit.last_executed_optimized_graph()) == expected_groups and delta["executions"] == 3

    torch._dynamo.reset()
    model = ConvNet().eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, delta = run_three_times(torch.compile(model, backend="torch_llga"), x)
        with torch.no_grad():
            expected = model(x)
    assert out.dtype == torch.bfloat16 and delta["executions"] == 3
    torch.testing.assert_close(out, expected, **BF16)


class LinearPlusBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.register_buffer("offset", torch.randn(16))

    def forward(self, x):
        return F.relu(self.linear(x) + self.offset)


def test_buffers_are_constants_and_a_written_one_compiles_again():
    # Dynamo passes buffers as inputs too: baked in, the add joins the linear as a post-op.
    model, x = LinearPlusBuffer().eval(), torch.randn(4, 16)
    compiled = torch.compile(model, backend="torch_llga")
    out, delta = run_three_times(compiled, x)
    assert groups_of(torch.jit.last_executed_optimized_graph()) == [["linear", "add", "relu"]]
    model.offset.add_(1.0)
    out, delta = run_three_times(compiled, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), **FP32)
    assert delta["executions"] == 1


def fused_per_call(compiled, model, x):
    """Fused partition runs of one warm call (and its output checked against eager)."""
    with torch.no_grad():
        compiled(x), compiled(x)
    return fused_calls(compiled, model, x)


def test_compiled_graphs_fuse_in_every_thread_and_leave_plain_modules_alone():
    # 8 threads, each calling two compiled models and a TorchScript module traced with the fuser off,
    # 500 times: the compiled calls all fuse (their switch is the calling thread's, for the call's
    # length), the TorchScript module never does (the process-wide switch stays off throughout).
    cnn, encoder, linear = ConvNet().eval(), TinyEncoder().eval(), nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    x_cnn, x_encoder, x_linear = torch.randn(2, 3, 16, 16), tokens(2), torch.randn(4, 16)
    compiled_cnn, compiled_encoder = torch.compile(cnn, backend="torch_llga"), torch.compile(encoder, backend="torch_llga")
    with torch_llga.enabled(False), torch.no_grad():
        plain = torch.jit.freeze(torch.jit.trace(linear, x_linear))
        per_call = fused_per_call(compiled_cnn, cnn, x_cnn) + fused_per_call(compiled_encoder, encoder, x_encoder)
        expected = [cnn(x_cnn), encoder(x_encoder), linear(x_linear)]
        before = torch_llga.stats()

        def worker(_):
            for _ in range(500):
                with torch.no_grad():  # grad mode is per thread
                    outputs = [compiled_cnn(x_cnn), compiled_encoder(x_encoder), plain(x_linear)]
                for out, exp in zip(outputs, expected):
                    torch.testing.assert_close(out, exp, **FP32)

        run_in_threads(worker, 8)
        after = torch_llga.stats()
    assert not torch_llga.is_enabled()
    fused = after["executions"] - before["executions"] + after["plan_runs"] - before["plan_runs"]
    assert per_call > 0 and fused == 8 * 500 * per_call
    graphs = [plan.graph for plan in plain.get_debug_state().execution_plans.values()]
    assert graphs and not any(g.findAllNodes(kind, True) for g in graphs for kind in ("llga::FusionGroup", "llga::Guard"))


# torch.export: an ExportedProgram through the same fuser, and saved for libtorch programs.
def exported(model, example, dims):
    return torch.export.export(model, (example,), dynamic_shapes=(dims,))


BATCH = torch.export.Dim("batch", min=1, max=64)


@pytest.mark.parametrize("model,make,dims,groups", [
    (ConvNet, lambda b: torch.randn(b, 3, 16, 16), {0: BATCH},
     [["_convolution", "relu"], ["_convolution", "add", "relu"], ["linear"]]),
    (TinyEncoder, tokens, {0: BATCH, 1: torch.export.Dim("seq", min=2, max=128)}, None),
], ids=["cnn", "encoder"])
def test_exported_program_fuses_at_every_size_and_saves(tmp_path, model, make, dims, groups):
    model = model().eval()
    compiled = torch_llga.compile(exported(model, make(2), dims))
    for batch in (2, 5, 3):
        assert fused_per_call(compiled, model, make(batch)) > 0
    if groups:
        assert groups_of(torch.jit.last_executed_optimized_graph()) == groups
    # Saved, it is a frozen TorchScript file: loaded with the fuser on, it fuses at every size too.
    compiled.save(str(tmp_path / "model.pt"))
    loaded = torch.jit.load(str(tmp_path / "model.pt"))
    with torch_llga.enabled():
        for batch in (4, 6):
            assert fused_per_call(loaded, model, make(batch)) > 0


def test_compile_takes_exported_programs_only():
    with pytest.raises(TypeError, match="torch.export.ExportedProgram.*backend=\"torch_llga\""):
        torch_llga.compile(ConvNet())


def test_a_size_computed_in_python_is_traced_per_size_with_a_warning():
    class Halves(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 16)

        def forward(self, x):  # Dynamo: torch.sym_max, a Python max on a trace
            return F.relu(self.linear(x.view(max(x.shape[0] // 2, 1), -1)))

    model = Halves().eval()
    compiled = torch.compile(model, backend="torch_llga", dynamic=True)
    before = torch_llga.stats()["compile_scripts"]
    with pytest.warns(UserWarning, match="traced once per input size"):
        for batch in (4, 6, 8, 6):
            assert fused_calls(compiled, model, torch.randn(batch, 8)) > 0
    assert torch_llga.stats()["compile_scripts"] - before == 3


@pytest.fixture
def views_left_as_overloads(monkeypatch):
    """As if a path _follow_sizes does not know: each view keeps (or gets) its aten overload, which
    the tracer records with the example's sizes."""
    follow = torch_llga.dynamo._follow_sizes

    def follow_but_keep_views(graph, roles):
        result = follow(graph, roles)
        for node in graph.nodes:
            if node.op == "call_method" and node.target == "view":
                node.op, node.target = "call_function", torch.ops.aten.view.default
                if len(node.args) != 2 or not isinstance(node.args[1], (list, tuple)):
                    node.args = (node.args[0], list(node.args[1:]))  # x.view(n, -1) -> view.default(x, [n, -1])
        return result

    monkeypatch.setattr(torch_llga.dynamo, "_follow_sizes", follow_but_keep_views)


@pytest.mark.usefixtures("views_left_as_overloads")
def test_a_size_the_trace_baked_anyway_is_caught_and_traced_per_size():
    # At batch 5 the exported encoder's one script fails (or would give other sizes); a script
    # traced at 5 runs, and from then on each size gets its own.
    model = TinyEncoder().eval()
    compiled = torch_llga.compile(exported(model, tokens(2), {0: BATCH}))
    fused_calls(compiled, model, tokens(2))
    with pytest.warns(UserWarning, match="did not follow its input sizes"):
        assert fused_calls(compiled, model, tokens(5)) > 0
    assert fused_per_call(compiled, model, tokens(3)) > 0
    with pytest.raises(RuntimeError), torch.no_grad():
        compiled(torch.randint(0, 100, (2, 12, 3)))  # a wrong input still fails, as in eager


class Cache(nn.Module):
    """A buffer written in place every call (a KV cache's shape): its writes must land in it."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.register_buffer("cache", torch.zeros(4, 8))

    def forward(self, x, position):
        self.cache.index_copy_(0, position, F.relu(self.linear(x)))
        return self.linear(self.cache).sum(0)


def test_a_buffer_written_in_place_keeps_its_writes():
    model, reference = Cache().eval(), Cache().eval()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="torch_llga")
    for step in range(4):
        x, position = torch.randn(1, 8), torch.tensor([step])
        with torch.no_grad():  # (no fusion here yet: the fuser keeps ops on a tensor written in place out of groups)
            out, expected = compiled(x, position), reference(x, position)
        torch.testing.assert_close(out, expected, **FP32)
        torch.testing.assert_close(model.cache, reference.cache, **FP32)
    assert model.cache.abs().sum(1).gt(0).all()  # every row written, in the module's own buffer


def test_an_exported_program_keeps_its_buffer_writes():
    model, reference = Cache().eval(), Cache().eval()
    reference.load_state_dict(model.state_dict())
    program = torch.export.export(model, (torch.randn(1, 8), torch.tensor([0])))
    compiled = torch_llga.compile(program)
    for step in range(4):
        x, position = torch.randn(1, 8), torch.tensor([step])
        with torch.no_grad():
            out, expected = compiled(x, position), reference(x, position)
        torch.testing.assert_close(out, expected, **FP32)
    torch.testing.assert_close(program.state_dict["cache"], reference.cache, **FP32)


class Counter(nn.Module):
    def forward(self, x, count):
        count.add_(1)  # an input written in place: once a call, not again by tracing or profiling
        return F.relu(x) * count


def test_a_graph_writing_its_input_writes_it_once_a_call():
    compiled, count = torch.compile(Counter(), backend="torch_llga"), torch.zeros(())
    with torch.no_grad():
        for call in range(1, 4):
            out = compiled(torch.ones(2, 4), count)
            assert count.item() == call and torch.equal(out, torch.full((2, 4), float(call)))


LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=500, max_position_embeddings=128)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_with_a_kv_cache_gives_eager_tokens(cache):
    # Hugging Face generate() with forward compiled: the cache is written in place every step (the
    # static cache's tensors are created in the first step's graph and returned for Dynamo to keep).
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    compiled = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    compiled.load_state_dict(model.state_dict())
    compiled.forward = torch.compile(compiled.forward, backend="torch_llga")
    settings = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False,
                    **({"cache_implementation": "static"} if cache == "static" else {}))
    for batch, prompt in ((1, 8), (1, 11), (4, 8)):
        ids = torch.randint(0, LLAMA["vocab_size"], (batch, prompt))
        before = torch_llga.stats()["executions"]
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
            tokens = compiled.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        assert torch.equal(tokens, expected), f"batch {batch}, prompt {prompt}"
        assert torch_llga.stats()["executions"] - before >= 12  # every step ran fused partitions
    # A decoding step's groups (batch 4): each RMSNorm one oneDNN RMSNorm (2 a layer and the final
    # one); the q, k and v projections one matmul (merge_parallel_linears.cpp), as are the MLP's gate
    # and up projections, the LM head a third; the output projection with its residual add; the
    # SwiGLU product with the down projection and its residual add.
    groups = groups_of(torch.jit.last_executed_optimized_graph())
    layers = LLAMA["num_hidden_layers"]
    assert groups.count(["rms_norm"]) == 2 * layers + 1
    assert groups.count(["linear"]) == 2 * layers + 1
    assert groups.count(["linear", "add"]) == layers
    assert groups.count(["mul", "mul", "linear", "add"]) == layers
    assert len(groups) == 6 * layers + 2


@pytest.mark.skipif(not AVX2, reason="torch_llga's row linear kernel needs AVX2 and FMA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decoding_steps_stream_their_weights_through_the_row_kernel(dtype):
    # Weights of 64K+ values (hidden 256): a decoding step's linears are llga::row_linear (the
    # output and down projections, the LM head: it reads a slice of the last norm) or, after the
    # RMSNorm that alone feeds them, llga::rms_norm_row_linear (q/k/v, gate/up); the attention over
    # the cache is llga::decode_attention, reading the cache's 2 KV heads for the 4 query heads (no
    # repeat_kv copies); the tokens stay eager's (static cache; fp32 batch 1 and 4, bf16 batch 4:
    # its weights and cache read as bf16, its logits within a bf16 rounding of eager's).
    from transformers import LlamaConfig, LlamaForCausalLM

    config = dict(LLAMA, hidden_size=256, intermediate_size=512)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval().to(dtype)
    compiled = LlamaForCausalLM(LlamaConfig(**config)).eval().to(dtype)
    compiled.load_state_dict(model.state_dict())
    compiled.forward = torch.compile(compiled.forward, backend="torch_llga")
    settings = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, cache_implementation="static",
                    output_logits=True, return_dict_in_generate=True)
    layers = config["num_hidden_layers"]
    for batch in (1, 4) if dtype == torch.float32 else (4,):
        ids = torch.randint(0, config["vocab_size"], (batch, 9))
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
            tokens = compiled.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        assert torch.equal(tokens.sequences, expected.sequences), f"batch {batch}"
        if dtype == torch.bfloat16:  # logits of about 1: bf16's step there is 2^-7
            for step, (ours, theirs) in enumerate(zip(tokens.logits, expected.logits)):
                torch.testing.assert_close(ours.float(), theirs.float(), rtol=0, atol=2**-6, msg=f"step {step}")
        step = str(torch.jit.last_executed_optimized_graph())
        assert step.count("llga::rms_norm_row_linear(") == 2 * layers, step
        assert step.count("llga::row_linear(") == 2 * layers + 1, step
        attention = [n for n in torch.jit.last_executed_optimized_graph().nodes() if n.kind() == "llga::decode_attention"]
        assert len(attention) == layers and all(n.inputsAt(1).node().kind() != "aten::reshape" for n in attention)


@pytest.mark.usefixtures("views_left_as_overloads")
def test_a_baked_size_in_a_graph_writing_its_inputs_is_an_error_not_a_second_write():
    # As test_a_size_the_trace_baked_anyway_is_caught_and_traced_per_size, in a graph that writes an
    # input: tracing again and rerunning would write it twice, so the call fails, saying what to do.
    class CountedView(nn.Module):
        def forward(self, x, count):
            count.add_(1)
            return x.view(x.shape[0], -1).relu()

    compiled, count = torch.compile(CountedView(), backend="torch_llga", dynamic=True), torch.zeros(())
    with torch.no_grad():
        compiled(torch.randn(2, 3, 4), count)
        with pytest.raises(RuntimeError, match="writes its inputs.*dynamic=False"):
            compiled(torch.randn(5, 3, 4), count)
