"""What torch_llga did to a graph: its fusion groups and the ops left to PyTorch."""
import collections


def fusion_groups(graph):
    """The aten op kinds inside each llga::FusionGroup of an optimized graph, in order."""
    groups = []
    for node in graph.findAllNodes("llga::FusionGroup", True):
        kinds = [n.kind() for n in node.g("Subgraph").nodes()
                 if n.kind() not in ("prim::Constant", "prim::ListConstruct")]
        groups.append([k.replace("aten::", "") for k in kinds])
    return groups


def unfused_ops(graph):
    """aten ops the top-level graph runs in PyTorch."""
    return [n.kind().replace("aten::", "") for n in graph.nodes() if n.kind().startswith("aten::")]


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
