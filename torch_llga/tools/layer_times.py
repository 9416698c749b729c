"""Where a model's time goes, layer by layer: torch_llga's oneDNN primitives, optionally beside
OpenVINO's nodes (benchmark-only dependency), for a model of the bench.

    python -m torch_llga.tools.layer_times --model mobilenet_v2 [--calls 300] [--threads 2] [--openvino]

torch_llga's side runs in child processes with ONEDNN_VERBOSE=profile_exec: oneDNN prints every
partition and primitive execution with its time, into a file whose offsets before and after the
timed calls the child reports. Each timed call must run the same sequence; each position in it is
averaged over the calls (by kind instead where threads print in turn, as inside oneDNN's SDPA).
The partitions come from a run that prints only them (filter=graph), the primitives from a second
one. Printing slows the calls, so the wall time here is above the bench's; the primitive times are
not (oneDNN times the primitive alone). "outside oneDNN" is the wall time minus the partitions':
the interpreter, the ops left to PyTorch, our guards and dispatch, and the printing. Primitives that
one partition runs on several threads at once (oneDNN's SDPA) add up to more than its wall time.
Partition time minus primitive time is no measure of oneDNN's graph layer: on MobileNetV2 at one
thread it came to 11 us a partition, where a C++ loop without verbose measured 0.5-0.9 us
(measured 2026-11-25 on a Zen 4; BENCHMARKS.md in git history). Count per-group cost with perf or callgrind instead.
OpenVINO's side is its own per-node profile (PERF_COUNT), in this process.
"""
import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

import torch

VERBOSE_PREFIX = "onednn_verbose,v1,"


def check_model(name):
    """Exits with one sentence if `name` is not a bench model or its package is not installed."""
    from torch_llga import _optional
    from torch_llga.tools.bench_models import MODELS, PACKAGE

    if name not in MODELS:
        sys.exit(f"unknown model '{name}'; the bench's models are: {', '.join(MODELS)}")
    if name in PACKAGE and not _optional.installed(PACKAGE[name]):
        sys.exit(_optional.missing(name, PACKAGE[name]))


def model_and_inputs(name):
    from torch_llga.tools.bench_models import MODELS

    check_model(name)
    model, inputs = MODELS[name](1)
    return model.eval(), inputs


def run_child(args):
    """The timed loop; oneDNN's verbose lines go to stdout, a file: its offsets around the timed calls
    and the wall ms/call go to stderr."""
    import ctypes

    import torch_llga

    def stdout_offset():
        ctypes.CDLL(None).fflush(None)  # oneDNN prints with C stdio
        return os.fstat(1).st_size

    torch.set_num_threads(args.threads)
    model, inputs = model_and_inputs(args.model)
    torch_llga.enable()
    with torch.no_grad():
        m = torch.jit.freeze(torch.jit.trace(model, inputs))
        for _ in range(20):
            m(*inputs)
        begin = stdout_offset()
        start = time.perf_counter()
        for _ in range(args.calls):
            m(*inputs)
        wall_ms = (time.perf_counter() - start) / args.calls * 1e3
        end = stdout_offset()
    print(f"timed {begin} {end} {wall_ms}", file=sys.stderr)


def executions(stdout, kind):
    """(name, implementation, shape, ms) of each 'primitive' or 'graph' execution, in order."""
    rows = []
    for line in stdout.splitlines():
        if not line.startswith(VERBOSE_PREFIX + kind + ",exec,"):
            continue
        f = line.split(",")
        if kind == "primitive":  # ...,exec,cpu,kind,impl,prop,mds,attrs,aux,shape,ms
            rows.append((f[5], f[6], f[-2], float(f[-1])))
        else:  # ...,exec,cpu,id,name,ops,...,ms
            rows.append((f[6], f[7], "", float(f[-1])))
    return rows


def per_call(rows, calls):
    """(name, implementation, shape, ms per call, executions per call) of the calls' executions: by
    position when every call ran one sequence, else (threads printing in turn, as inside oneDNN's
    SDPA) by kind in order of first appearance. None if the calls ran different executions."""
    if not rows or len(rows) % calls:
        return None
    p = len(rows) // calls
    keys = [r[:3] for r in rows]
    if all(keys[k * p:(k + 1) * p] == keys[:p] for k in range(1, calls)):
        return [(*rows[i][:3], sum(rows[i + k * p][3] for k in range(calls)) / calls, 1) for i in range(p)]
    if any(collections.Counter(keys[k * p:(k + 1) * p]) != collections.Counter(keys[:p]) for k in range(1, calls)):
        return None
    total = {}
    for key, row in zip(keys, rows):
        ms, n = total.get(key, (0.0, 0))
        total[key] = (ms + row[3], n + 1)
    return [(*key, ms / calls, n // calls) for key, (ms, n) in total.items()]


def torch_llga_layers(args, verbose="profile_exec"):
    env = dict(os.environ, ONEDNN_VERBOSE=verbose)
    cmd = [sys.executable, "-m", "torch_llga.tools.layer_times", "--child", "--model", args.model,
           "--calls", str(args.calls), "--threads", str(args.threads)]
    with tempfile.TemporaryFile() as verbose:
        out = subprocess.run(cmd, env=env, stdout=verbose, stderr=subprocess.PIPE, text=True)
        timed = [line.split() for line in out.stderr.splitlines() if line.startswith("timed ")]
        if out.returncode != 0 or not timed:
            sys.exit(f"the profiled run failed:\n{out.stderr[-3000:]}")
        begin, end, wall = int(timed[0][1]), int(timed[0][2]), float(timed[0][3])
        verbose.seek(begin)
        text = verbose.read(end - begin).decode(errors="replace")
    prim_rows, part_rows = executions(text, "primitive"), executions(text, "graph")
    if not part_rows:
        sys.exit(f"no oneDNN partition ran in {args.model}'s calls: a small-graph plan runs it whole "
                 "(TORCH_LLGA_SMALL_PLANS=0 shows oneDNN's partitions instead)")
    prims = per_call(prim_rows, args.calls) if prim_rows else []  # none printed under filter=graph
    parts = per_call(part_rows, args.calls)
    if prims is None or parts is None:
        sys.exit("the timed calls did not all run the same oneDNN executions (shapes changing?): no per-layer times")
    return wall, prims, parts


def by_partition_kind(parts):
    """Partitions grouped by oneDNN kind and ops: (kind, ops, "", ms per call, executions per call), slowest first."""
    total = {}
    for kind, ops, _, ms, n in parts:
        t_ms, t_n = total.get((kind, ops), (0.0, 0))
        total[(kind, ops)] = (t_ms + ms, t_n + n)
    return sorted(((kind, ops, "", ms, n) for (kind, ops), (ms, n) in total.items()), key=lambda r: -r[3])


def openvino_layers(args):
    from torch_llga.tools.bench import bench_import, openvino_config

    ov = bench_import("openvino")
    model, inputs = model_and_inputs(args.model)
    config = dict(openvino_config("fp32", args.threads), PERF_COUNT="YES")  # the bench's settings, profiled
    arrays = [x.numpy() for x in inputs]
    with torch.no_grad():  # as the bench converts: nn.MultiheadAttention's inference path, traced once
        compiled = ov.Core().compile_model(ov.convert_model(model, example_input=tuple(arrays)), "CPU", config)
    request = compiled.create_infer_request()
    for _ in range(20):
        request.infer(arrays)
    total = collections.defaultdict(float)
    info = {}
    start = time.perf_counter()
    for _ in range(args.calls):
        request.infer(arrays)
        for p in request.get_profiling_info():
            total[p.node_name] += p.real_time.total_seconds() * 1e3
            info[p.node_name] = (p.node_type, p.exec_type)
    wall_ms = (time.perf_counter() - start) / args.calls * 1e3
    layers = [(info[n][0], info[n][1], n, ms / args.calls, 1) for n, ms in total.items() if ms > 0]
    return wall_ms, layers


def print_layers(title, layers, top):
    print(title)
    print(f"{'us/call':>9}  {'op':<16} {'implementation':<44} shape / node")
    for name, impl, shape, ms, n in (sorted(layers, key=lambda r: -r[3])[:top] if top else layers):
        times = f" (x{n})" if n > 1 else ""
        print(f"{ms * 1e3:9.1f}  {name:<16} {impl[:44]:<44} {shape[:60]}{times}")
    by_op = collections.defaultdict(lambda: [0.0, 0])
    for name, _, _, ms, n in layers:
        by_op[name][0] += ms
        by_op[name][1] += n
    print("  by op: " + ", ".join(f"{n} {ms * 1e3:.0f} us ({k})" for n, (ms, k) in sorted(by_op.items(), key=lambda x: -x[1][0])))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_llga.tools.layer_times", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mobilenet_v2")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--top", type=int, default=0, help="only the N slowest layers (0: all, in call order)")
    parser.add_argument("--openvino", action="store_true", help="OpenVINO's per-node times too (f32)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return run_child(args)

    from torch_llga.tools.bench import cpu_name

    check_model(args.model)  # before the children run
    if args.openvino:
        from torch_llga import _optional

        if not _optional.installed("openvino"):
            sys.exit(_optional.missing("--openvino", "openvino"))
    # Partitions first, with only their lines printed (filter=graph): a partition's wall time is then
    # not inflated by the printing of its primitives' lines (oneDNN's SDPA prints hundreds a call).
    wall, _, parts = torch_llga_layers(args, "profile_exec,filter=graph")
    _, prims, _ = torch_llga_layers(args)
    in_parts = sum(r[3] for r in parts)
    in_prims = sum(r[3] for r in prims)
    n_parts, n_prims = sum(r[4] for r in parts), sum(r[4] for r in prims)
    print(f"{cpu_name()}, {args.threads} threads, fp32, batch 1, {args.model}: mean of {args.calls} calls")
    print(f"torch_llga under ONEDNN_VERBOSE=profile_exec,filter=graph (its printing adds to the wall time): "
          f"wall {wall:.3f} ms/call; {n_parts} partition executions {in_parts:.3f} ms; outside oneDNN {wall - in_parts:.3f} ms")
    print_layers("torch_llga's partitions, by kind (wall time):", by_partition_kind(parts), args.top)
    print(f"\ntorch_llga's primitives (a second run, ONEDNN_VERBOSE=profile_exec): {n_prims} executions {in_prims:.3f} ms. "
          "Where a partition runs its primitives on several threads at once (oneDNN's SDPA: one head per thread), "
          "their times add up over the threads, CPU time rather than wall time: that partition's wall time is above.")
    print_layers("torch_llga's primitives:", prims, args.top)
    if args.openvino:
        ov_wall, ov_layers = openvino_layers(args)
        print(f"\nOpenVINO with PERF_COUNT: wall {ov_wall:.3f} ms/call (its profiling included); "
              f"{len(ov_layers)} nodes {sum(r[3] for r in ov_layers):.3f} ms")
        print_layers("OpenVINO's nodes:", ov_layers, args.top)


if __name__ == "__main__":
    main()
