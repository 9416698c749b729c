"""Model sweep: each model traced and frozen with random weights (nothing downloaded), fused by
torch_llga, and compared with eager.

    python -m torch_llga.check_models [--models resnet18,gpt2] [--size 224] [--compile]

With --compile each model runs as torch.compile(model, backend="torch_llga") instead (the groups
column then counts the fused partitions one call executed, over all of Dynamo's graphs).

Prints a table (model, groups, ops fused / total, max abs diff, pass, the op explain() most often
leaves to PyTorch and why) and exits 1 if a model fails.
"""
import argparse
import sys
import warnings

import torch

import torch_llga
import collections

from torch_llga.report import Explanation

TORCHVISION = ["resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "mobilenet_v2",
               "mobilenet_v3_large", "mobilenet_v3_small", "mnasnet1_0", "shufflenet_v2_x1_0", "squeezenet1_0",
               "efficientnet_b0", "regnet_y_400mf", "googlenet", "vgg11", "alexnet", "convnext_tiny", "vit_b_16",
               "swin_t"]
TRANSFORMERS = ["bert_base", "distilbert", "gpt2"]
# fp32 sums over many layers in another order drift ~1e-5 relative per layer. The absolute part
# scales with the output: random-init MobileNets output ~1e-9, where a fixed atol would pass anything.
RTOL = 1e-4


class FirstOutput(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        return self.model(*args)[0]


def make(name, size):
    torch.manual_seed(0)
    if name in TRANSFORMERS:
        import transformers as tf

        config = {"bert_base": (tf.BertConfig, tf.BertModel), "distilbert": (tf.DistilBertConfig, tf.DistilBertModel),
                  "gpt2": (tf.GPT2Config, tf.GPT2Model)}[name]
        model = FirstOutput(config[1](config[0](return_dict=False, torchscript=True)))
        return model.eval(), (torch.randint(0, 1000, (1, 128)),)
    import torchvision

    kwargs = {"aux_logits": False, "init_weights": True} if name == "googlenet" else {}
    if name == "vit_b_16":
        size = 224  # its position embedding fixes the input size
    return getattr(torchvision.models, name)(**kwargs).eval(), (torch.rand(1, 3, size, size),)


def informative(model):
    """Random init zeroes some heads (ViT's, for one), and then every output is 0 and any
    comparison passes. Give such weights small random values so the outputs mean something."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)
    return model


def check(name, size):
    model, inputs = make(name, size)
    model = informative(model)
    with torch.no_grad():
        expected = model(*inputs)
        with torch_llga.enabled():
            fused = torch.jit.freeze(torch.jit.trace(model, inputs))
            fused(*inputs)
            fused(*inputs)
            graph = torch.jit.last_executed_optimized_graph()
        before = torch_llga.stats()
        out = fused(*inputs)
        after = torch_llga.stats()
    report = Explanation(graph, after["guard_failures"] - before["guard_failures"],
                         after["nonfinite_fallbacks"] - before["nonfinite_fallbacks"])  # what explain() reports
    diff = (out - expected).abs().max().item()
    scale = expected.abs().max().item()
    n_fused = sum(len(g["ops"]) for g in report.groups)
    ok = (torch.allclose(out, expected, rtol=RTOL, atol=RTOL * scale) and report.guard_fallbacks == 0
          and after["kernel_fallbacks"] == before["kernel_fallbacks"])
    reasons = collections.Counter(f"{op}: {reason}" for op, reason in report.unfused).most_common(1)
    return len(report.groups), n_fused, n_fused + len(report.unfused), diff, scale, ok, reasons[0][0] if reasons else "-"


def check_compiled(name, size):
    model, inputs = make(name, size)
    model = informative(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torch_llga", dynamic=False)
    with torch.no_grad():
        expected = model(*inputs)
        compiled(*inputs)  # compilation
        compiled(*inputs)  # profiling run
        before = torch_llga.stats()
        out = compiled(*inputs)
        after = torch_llga.stats()
    delta = {k: after[k] - before[k] for k in before}
    diff = (out - expected).abs().max().item()
    scale = expected.abs().max().item()
    ok = (torch.allclose(out, expected, rtol=RTOL, atol=RTOL * scale) and delta["guard_failures"] == 0
          and delta["kernel_fallbacks"] == 0 and delta["executions"] > 0)
    return delta["executions"], "-", "-", diff, scale, ok, "-"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(TORCHVISION + TRANSFORMERS))
    parser.add_argument("--size", type=int, default=224, help="image size for the vision models")
    parser.add_argument("--compile", action="store_true", help='through torch.compile(backend="torch_llga")')
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")

    print("| model | groups | ops fused / total | max abs diff | max abs output | pass | most frequent op left to PyTorch (explain) |\n"
          "|---|---|---|---|---|---|---|")
    failed = []
    for name in [m for m in args.models.split(",") if m]:
        try:
            groups, n_fused, total, diff, scale, ok, left = (check_compiled if args.compile else check)(name, args.size)
            ok = ok and scale > 0
            print(f"| {name} | {groups} | {n_fused} / {total} | {diff:.1e} | {scale:.1e} | {'yes' if ok else 'NO'} | {left} |",
                  flush=True)
        except Exception as e:
            ok = False
            print(f"| {name} | - | - | {type(e).__name__}: {str(e).splitlines()[-1][:80]} | - | NO | - |", flush=True)
        if not ok:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
