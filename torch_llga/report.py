"""What torch_llga did to a graph: its fusion groups and the ops left to PyTorch."""
import collections


def _speed_forms():
    """Each speed choice's chosen form (passes/speed_choices.cpp), by its id: 0 the fused group, 1 the
    rule's form; a choice being measured (or at several sizes) counts as the rule's, its default."""
    from . import _C

    chosen = {}
    for c in _C._choices():
        if c["site"] == "speed_rule":
            chosen[c["group_id"]] = 0 if c["chosen"] == "onednn" and chosen.get(c["group_id"], 0) == 0 else 1
    return chosen


def _running_form(node, forms):
    """The block that runs of a speed choice's If (its chosen form), or None for any other node."""
    cond = next(node.inputs()).node() if node.kind() == "prim::If" else None
    if cond is None or cond.kind() != "llga::SpeedChoice":
        return None
    return list(node.blocks())[forms.get(cond.i("choice_id"), 1)]


def running_nodes(block, kind, forms=None):
    """The nodes of `kind` in block and its blocks that run: of a speed choice's two forms, the chosen one."""
    forms = _speed_forms() if forms is None else forms
    found = []
    for n in block.nodes():
        form = _running_form(n, forms)
        for b in [form] if form is not None else n.blocks():
            found += running_nodes(b, kind, forms)
        if n.kind() == kind:
            found.append(n)
    return found


def fusion_groups(graph):
    """The aten op kinds inside each llga::FusionGroup of an optimized graph that runs, in order."""
    groups = []
    for node in running_nodes(graph.block(), "llga::FusionGroup"):
        kinds = [n.kind() for n in node.g("Subgraph").nodes()
                 if n.kind() not in ("prim::Constant", "prim::ListConstruct")]
        groups.append([k.replace("aten::", "") for k in kinds])
    return groups


def small_plans(graph):
    """The aten op kinds inside each llga::SmallPlan (a whole graph of tiny tensors run as one step)."""
    return [[n.kind().replace("aten::", "") for n in node.g("Subgraph").nodes()
             if n.kind() not in ("prim::Constant", "prim::ListConstruct")]
            for node in running_nodes(graph.block(), "llga::SmallPlan")]


def _own_kernel_ops():
    """Ops torch_llga runs with a kernel of its own (its own-kernel table): what each is for."""
    from . import _C

    return {row["kernel"]: row["takes"] for row in _C._own_kernel_table() if row["kernel"].startswith("llga::")}


OWN_KERNELS = _own_kernel_ops()


def own_kernels(graph):
    """The ops of the graph (blocks included) run by torch_llga's own kernels."""
    return [n.kind() for kind in OWN_KERNELS for n in running_nodes(graph.block(), kind)]


def unfused_ops(graph):
    """aten ops the top-level graph runs in PyTorch (with those of a speed choice's running form)."""
    forms = _speed_forms()

    def top(block):
        for n in block.nodes():
            form = _running_form(n, forms)
            if form is not None:
                yield from top(form)
            elif n.kind().startswith("aten::"):
                yield n.kind().replace("aten::", "")
    return list(top(graph.block()))


def format_groups(groups, unfused):
    lines = [f"{len(groups)} fusion groups, {sum(map(len, groups))} ops fused, {len(unfused)} left to PyTorch"]
    for i, ops in enumerate(groups):
        counts = collections.Counter(ops)
        summary = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
        lines.append(f"  group {i:2d}: {len(ops):3d} ops  [{summary}]")
    if unfused:
        lines.append("  in PyTorch: " + ", ".join(f"{op} x{n}" if n > 1 else op
                                                for op, n in collections.Counter(unfused).items()))
    return "\n".join(lines)


def _type_text(value):
    t = value.type()
    try:
        sizes, dtype = t.sizes(), t.dtype()
    except RuntimeError:
        return str(t)
    return f"{str(dtype).replace('torch.', '')}{list(sizes) if sizes is not None else ''}"


def _choice_text(c):
    times = ", ".join(f"{name} {us:.0f} us" for name, us in c["best_us"].items())
    return f"{c['how']}: {times}" if times else c["how"]


class Explanation:
    """What torch_llga did with a module: its partitions, every op left to PyTorch with the reason,
    guard fallbacks on the given inputs, and the share of ops that run fused."""

    def __init__(self, graph, guard_fallbacks, nonfinite_fallbacks, choices=()):
        self.groups = []      # [{"ops": [...], "inputs": ["float32[1, 3, 224, 224]", ...]}]
        self.unfused = []     # [(op, reason)]
        self.plans = small_plans(graph)  # [[op, ...]]: graphs run whole as one small-graph plan
        self.own_kernels = own_kernels(graph)  # ["llga::small_head_attention", ...]
        by_group = collections.defaultdict(list)
        for c in choices:
            by_group[c["group_id"]].append(c)
        for node in running_nodes(graph.block(), "llga::FusionGroup"):
            sub = node.g("Subgraph")
            ops = [n.kind().replace("aten::", "") for n in sub.nodes()
                   if n.kind() not in ("prim::Constant", "prim::ListConstruct")]
            gid = node.i("group_id") if node.hasAttribute("group_id") else -1
            self.groups.append({"ops": ops, "inputs": [_type_text(v) for v in sub.inputs()],
                                "choices": by_group.pop(gid, []) if gid >= 0 else []})
        # The choices made while explain ran the module: the groups' (above) and the own kernels'.
        self.choices = list(choices)
        self._collect_unfused(graph.block())
        self.guard_fallbacks = guard_fallbacks
        self.nonfinite_fallbacks = nonfinite_fallbacks
        fused = sum(len(g["ops"]) for g in self.groups) + sum(map(len, self.plans)) + len(self.own_kernels)
        counted = fused + len(self.unfused)
        self.fused_share = fused / counted if counted else 0.0

    def _collect_unfused(self, block, forms=None):
        forms = _speed_forms() if forms is None else forms
        for n in block.nodes():
            if n.kind() in ("llga::FusionGroup", "llga::SmallPlan", "llga::Guard", "llga::SpeedChoice", "llga::SpeedChoiceEnd"):
                continue
            form = _running_form(n, forms)
            if form is not None:  # a speed choice: the form that runs
                self._collect_unfused(form, forms)
                continue
            if n.kind() == "prim::If" and any(b.findNode("llga::FusionGroup") or b.findNode("llga::SmallPlan") for b in n.blocks()):
                continue  # a guard's branch: the group (or plan) and its fallback
            for b in n.blocks():
                self._collect_unfused(b, forms)
            # Tensor ops only: size(), Int() and the like are bookkeeping, not computation.
            if n.kind().startswith("aten::") and any(o.type().kind() == "TensorType" for o in n.outputs()):
                reason = n.s("llga_unfused") if n.hasAttribute("llga_unfused") else "not examined by the fuser"
                self.unfused.append((n.kind().replace("aten::", ""), reason))

    def __str__(self):
        fused = sum(len(g["ops"]) for g in self.groups) + sum(map(len, self.plans))
        own = f", {len(self.own_kernels)} run by torch_llga's own kernels" if self.own_kernels else ""
        lines = [f"{len(self.groups)} partitions, {fused} ops fused{own}, {len(self.unfused)} left to PyTorch; "
                 f"{self.fused_share:.0%} of the ops run fused"]
        for kind, n in collections.Counter(self.own_kernels).items():
            lines.append(f"  own kernel: {kind.replace('llga::', '')}{f' x{n}' if n > 1 else ''} ({OWN_KERNELS[kind]})")
        for ops in self.plans:
            counts = collections.Counter(ops)
            summary = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
            lines.append(f"  small-graph plan: {len(ops)} ops run as one native step [{summary}]")
        for i, g in enumerate(self.groups):
            counts = collections.Counter(g["ops"])
            summary = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())
            lines.append(f"  partition {i}: {len(g['ops'])} ops [{summary}]  inputs: {', '.join(g['inputs'])}")
            for c in g["choices"]:
                lines.append(f"    runs by {c['chosen']} ({_choice_text(c)})")
        for title, site_of in (("own kernels' choices:", lambda s: s not in ("fusion_group", "speed_rule")),
                               ("speed rules' choices (the op in PyTorch, or fused by oneDNN):", lambda s: s == "speed_rule")):
            chosen = [c for c in self.choices if site_of(c["site"])]
            if chosen:
                lines.append(title)
                for c in chosen:
                    lines.append(f"  {c['subject']} at {c['key']}: {c['chosen']} ({_choice_text(c)})")
        if self.unfused:
            lines.append("left to PyTorch:")
            for (op, reason), n in collections.Counter(self.unfused).items():
                lines.append(f"  {op}{f' x{n}' if n > 1 else ''}: {reason}")
        if self.guard_fallbacks:
            lines.append(f"guard fell back {self.guard_fallbacks} times on these inputs "
                         f"({self.nonfinite_fallbacks} for NaN/Inf; other sizes/dtypes than profiled): those groups ran unfused")
        return "\n".join(lines)

    __repr__ = __str__
