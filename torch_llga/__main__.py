"""torch_llga's command line for saved TorchScript models.

    python -m torch_llga run model.pt --input 1x3x224x224 [--dtype bf16] [--threads N] [--runs 20]
    python -m torch_llga explain model.pt --input 1x3x224x224
"""
import argparse
import os
import statistics
import sys
import time
import warnings

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class CliError(Exception):
    """A one-line error for the user (no traceback)."""


def parse_shapes(text):
    """"1x3x224x224" or several inputs "1x128,1x128" -> [(1, 3, 224, 224)]."""
    try:
        shapes = [tuple(int(d) for d in part.split("x")) for part in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(not s or min(s) < 0 for s in shapes):
        raise CliError(f"bad --input {text!r}: give sizes like 1x3x224x224 (several inputs: 1x128,1x128)")
    return shapes


def load(args):
    import torch

    if not os.path.isfile(args.model):
        raise CliError(f"no such file: {args.model}")
    try:
        module = torch.jit.load(args.model).eval()
    except Exception as e:
        raise CliError(f"{args.model} is not a saved TorchScript model ({str(e).splitlines()[0]})")
    dtype = getattr(torch, DTYPES[args.dtype])
    torch.manual_seed(0)
    inputs = tuple(torch.rand(s).to(dtype) for s in parse_shapes(args.input))
    return module, inputs


def call(module, inputs):
    try:
        return module(*inputs)
    except Exception as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise CliError(f"the model does not accept input {tuple(tuple(i.shape) for i in inputs)}: {lines[-1] if lines else e}")


def first_tensor(output):
    while isinstance(output, (tuple, list)):
        output = output[0]
    return output


def prepared(path_args, fused):
    """A fresh copy of the model, warmed up (profiling run, optimization) with torch_llga on or off."""
    import torch
    import torch_llga

    module, inputs = load(path_args)
    with torch.no_grad(), torch_llga.enabled(fused):
        call(module, inputs)
        out = call(module, inputs)
        graph = torch.jit.last_executed_optimized_graph()
    return module, inputs, out, graph


def cmd_run(args):
    import torch
    import torch_llga

    plain, inputs, expected, _ = prepared(args, fused=False)
    fused, _, out, _ = prepared(args, fused=True)

    def median_ms(module, on):
        times = []
        with torch.no_grad(), torch_llga.enabled(on):
            for _ in range(args.runs):
                t = time.perf_counter()
                module(*inputs)
                times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    ts_ms, llga_ms = median_ms(plain, False), median_ms(fused, True)
    diff = (first_tensor(out).float() - first_tensor(expected).float()).abs().max().item()
    print(f"{args.model}: input {args.input} {args.dtype}, {torch.get_num_threads()} threads")
    print(f"TorchScript {ts_ms:.3f} ms, torch_llga {llga_ms:.3f} ms ({ts_ms / llga_ms:.2f}x); "
          f"max abs diff {diff:.3g}")


def cmd_explain(args):
    import torch_llga

    module, inputs = load(args)
    call(module, inputs)  # a one-line error if the model does not take these inputs
    torch_llga.explain(module, *inputs)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torch_llga", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in [("run", "time the model with and without fusion, and compare outputs"),
                           ("explain", "show the fusion groups the model forms and the ops left to PyTorch")]:
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument("model", help="a saved TorchScript file (torch.jit.save)")
        p.add_argument("--input", required=True, help="input sizes, e.g. 1x3x224x224; several inputs: 1x128,1x128")
        p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="input dtype (default fp32); the saved model must be in that dtype")
        p.add_argument("--threads", type=int, help="intra-op threads (default: torch's)")
        if name == "run":
            p.add_argument("--runs", type=int, default=20, help="timed calls (default 20)")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        {"run": cmd_run, "explain": cmd_explain}[args.command](args)
    except CliError as e:
        sys.exit(f"torch_llga: error: {e}")


if __name__ == "__main__":
    main()
