"""Sweep for oneDNN reference kernels: fused patterns (matmul, linear and conv with eltwise and
binary post-ops, every broadcast pattern of the operand; layer norm, softmax, pooling, cat; where
after a matmul; attention) run traced and frozen with torch_llga, each in a child process with
ONEDNN_VERBOSE=1, looking for a primitive whose implementation starts with "ref".

oneDNN 3.12 runs some fused patterns with its reference kernels, 7-3700x slower than PyTorch runs
the same ops. onednn_quirks.cpp keeps the known ones out of partitions, and the kernel's speed check
(run_checking_speed) sends a partition over 5x (plus a margin) slower than its unfused ops to
PyTorch after its 3rd execution (stats()["slow_partitions"]). This finds the reference kernels
left: those the speed check caught, and those it did not (costlier than its margin: a miss; cheaper:
a quirk's to keep out), and checks values against eager on the way. Not part of `make test`
(about 15 s with --quick, 1 minute without, on 2 quiet cores):

    python test/sweep_ref_kernels.py [--quick | --big] [--dtype bf16] [-k NAME_SUBSTRING ...]

--big sweeps other cases instead: few rows against large K and N (a batch-1 classifier, one token
through a transformer's linears, attention decoding one query), 1x1-spatial convs with many
channels, layer norm and softmax over 8192, where oneDNN's crashes showed (one_row_matmul_sum_post_op:
a heap corruption from K >= 1088 at N >= 512, that small shapes never reach). Each case runs in
a child of its own, so a corrupted heap is blamed on the case that corrupted it (190 cases, about
4 minutes).

Prints the reference-kernel cases, wrong values, crashes and counts per family; exits 1 if any value
is wrong, a case crashed or a reference kernel ran that the speed check did not catch.
"""
import argparse
import collections
import copy
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

CASE_TIMEOUT = 180  # seconds; a reference conv3d is the slowest legitimate case (a few seconds)
CHUNK = 400  # cases per child: PyTorch keeps every traced module's code and constants until exit
rn = torch.randn


class Model(nn.Module):
    """forward(*xs) = fn(self, *xs); tensors in parts become buffers (constants once frozen)."""

    def __init__(self, fn, parts):
        super().__init__()
        self.fn = fn
        for k, v in parts.items():
            if isinstance(v, torch.Tensor):
                self.register_buffer(k, v)
            else:
                setattr(self, k, v)

    def forward(self, *xs):
        return self.fn(self, *xs)


def patterns(out, lower=True, scalar=True):
    """Every broadcast pattern of a post-op operand (each output dim kept or 1); with lower, also
    each without its leading 1s (a lower-rank operand); with scalar, a 0-d one."""
    res = []
    for keep in itertools.product([1, 0], repeat=len(out)):
        s = tuple(d if k else 1 for d, k in zip(out, keep))
        lead = next((i for i, d in enumerate(s) if d != 1), len(s) - 1)
        res += [s, s[lead:]] if lower else [s]
    return list(dict.fromkeys(res + ([()] if scalar else [])))


ELTWISE = {"relu": torch.relu, "gelu": F.gelu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
           "clamp": lambda t: t.clamp(-0.5, 0.5)}
BINARY = {"add": torch.add, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
          "where": lambda p, m, y: torch.where(m, p, y)}


def operands(op, pat):
    if op == "where":
        return [torch.rand(pat) > 0.5, rn(pat)]
    return [torch.rand(pat) + 0.5] if op == "div" else [rn(pat)]


def apply_chain(p, chain, xs):
    """chain: "plain" (a scale, so something fuses), or ops like "relu>add"; xs: the binary's operands."""
    if chain == "plain":
        return p * 1.5
    for step in chain.split(">"):
        p = ELTWISE[step](p) if step in ELTWISE else BINARY[step](p, *xs)
    return p


def chains(out, quick, ops=("mul", "div", "max", "where"), lower=True, combos=True):
    """(chain, operand pattern) pairs swept after a main op whose output has sizes out."""
    yield "plain", None
    yield from ((e, None) for e in (["relu"] if quick else ELTWISE))
    yield from (("add", p) for p in patterns(out, lower=lower and not quick))
    for pat in patterns(out, lower=False, scalar=False):
        yield from ((op, pat) for op in ops if not quick or op in ("mul", "where"))
        if not quick and combos:
            yield from (("relu>add", pat), ("add>gelu", pat))


def sname(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


def catalog(quick):
    """[(name, build)]; build() -> (Model, inputs), called after torch.manual_seed(0)."""
    cases = []

    def reg(name, fn, inputs, parts=dict):
        cases.append((name, lambda: (Model(fn, parts()), inputs())))

    def reg_chains(prefix, head, n_in, inputs, out, parts=dict, **kw):
        for chain, pat in chains(out, quick, **kw):
            op = chain.split(">")[-1 if chain.startswith(tuple(ELTWISE)) else 0]
            reg(f"{prefix}.{chain}" + ("" if pat is None else f".{sname(pat)}"),
                lambda s, *xs, chain=chain: apply_chain(head(s, *xs[:n_in]), chain, xs[n_in:]),
                lambda pat=pat, op=op: inputs() + ([] if pat is None else operands(op, pat)), parts)

    # matmul: batch dims broadcast either way, transposed operands, the attention head split
    B, H, M, K, N = 2, 6, 64, 48, 80

    def mm(tx=False, ty=False):  # x @ y, y an input or the constant s.w, either transposed
        def f(s, x, y=None):
            y = s.w if y is None else y
            return torch.matmul(x.transpose(-1, -2) if tx else x, y.transpose(-1, -2) if ty else y)
        return f
    matmuls = {  # name: (input shapes, constant weight's shape or None, f)
        "2d_c": ([(M, K)], (K, N), mm()), "2d_in": ([(M, K), (K, N)], None, mm()),
        "2d_tw": ([(M, K)], (N, K), mm(ty=True)), "3d_in": ([(H, M, K), (H, K, N)], None, mm()),
        "3d_c2": ([(H, M, K)], (K, N), mm()),
        "3d_lb": ([(M, K), (H, K, N)], None, mm()), "3d_tr": ([(H, M, K), (H, N, K)], None, mm(ty=True)),
        "4d_in": ([(B, H, M, K), (B, H, K, N)], None, mm()), "4d_c2": ([(B, H, M, K)], (K, N), mm()),
        "4d_wb1": ([(B, H, M, K), (1, H, K, N)], None, mm()),
        "4d_xb1": ([(1, H, M, K), (B, H, K, N)], None, mm()), "4d_x1w1": ([(B, 1, M, K), (1, H, K, N)], None, mm()),
        "4d_tr": ([(B, H, M, K), (B, H, N, K)], None, mm(ty=True)),
        "4d_trx": ([(B, H, K, M), (B, H, K, N)], None, mm(tx=True)),
        "4d_heads": ([(B, M, H, K), (B, N, H, K)], None,
                     lambda s, x, y: torch.matmul(x.transpose(1, 2), y.transpose(1, 2).transpose(-1, -2))),
    }
    for name, (shapes, w, f) in matmuls.items():
        if quick and name not in ("2d_c", "3d_in", "3d_c2", "4d_in", "4d_c2", "4d_x1w1", "4d_heads"):
            continue
        out = tuple(f(Model(None, {"w": torch.empty(w or 0, device="meta")}),
                      *[torch.empty(s, device="meta") for s in shapes]).shape)
        reg_chains(f"matmul.{name}", f, len(shapes), lambda shapes=shapes: [rn(s) for s in shapes], out,
                   lambda w=w: {"w": rn(w)} if w else {})

    # linear on 2-D to 4-D inputs, with and without bias, on a transposed input
    for rank, bias, tin in itertools.product((2, 3, 4), (True, False), (False, True)):
        if (tin and rank == 2) or (quick and (tin or not bias and rank > 2)):
            continue
        xs = (B, H, M, K)[4 - rank:]
        reg_chains(f"linear.{rank}d{'.tin' if tin else ''}.{'b' if bias else 'nb'}",
                   lambda s, x, tin=tin: s.lin(x.transpose(-1, -2) if tin else x), 1,
                   lambda xs=xs, tin=tin: [rn(xs[:-2] + xs[:-3:-1]) if tin else rn(xs)], xs[:-1] + (N,),
                   lambda bias=bias: {"lin": nn.Linear(K, N, bias=bias)},
                   **({} if bias and not tin else {"ops": ("mul",), "combos": False}))

    # convolutions (+ batch norm), channels-last too; the first few get every post-op
    convs = {  # name: (input shape, Conv kwargs)
        "c2_k3": ((2, 32, 28, 28), dict(out_channels=64, kernel_size=3, padding=1)),
        "c2_dw": ((2, 64, 28, 28), dict(out_channels=64, kernel_size=3, padding=1, groups=64)),
        "c1_k3": ((2, 32, 100), dict(out_channels=64, kernel_size=3, padding=1)),
        "c3_k3": ((2, 16, 8, 16, 16), dict(out_channels=32, kernel_size=3, padding=1)),
        "c2_k1": ((2, 32, 28, 28), dict(out_channels=64, kernel_size=1)),
        "c2_s2": ((2, 32, 28, 28), dict(out_channels=64, kernel_size=3, stride=2, padding=1)),
        "c2_s3p2": ((2, 32, 29, 31), dict(out_channels=48, kernel_size=3, stride=3, padding=2)),
        "c2_d2": ((2, 32, 28, 28), dict(out_channels=64, kernel_size=3, dilation=2, padding=2)),
        "c2_k5x3": ((2, 32, 28, 28), dict(out_channels=32, kernel_size=(5, 3), stride=(2, 1), padding=(2, 0))),
        "c2_dw_s2": ((2, 64, 28, 28), dict(out_channels=64, kernel_size=3, padding=1, stride=2, groups=64)),
        "c2_dw_mult": ((2, 32, 28, 28), dict(out_channels=64, kernel_size=3, padding=1, groups=32)),
        "c2_g4": ((2, 32, 28, 28), dict(out_channels=64, kernel_size=3, padding=1, groups=4)),
        "c2_k7s2_c3": ((2, 3, 64, 64), dict(out_channels=32, kernel_size=7, stride=2, padding=3)),
        "c2_patch8": ((2, 3, 64, 64), dict(out_channels=64, kernel_size=8, stride=8, bias=False)),
        "c1_dw_s2": ((2, 64, 101), dict(out_channels=64, kernel_size=7, stride=2, padding=3, groups=64)),
        "c3_dw": ((2, 32, 8, 16, 16), dict(out_channels=32, kernel_size=3, padding=1, groups=32)),
    }
    for i, (name, (xs, kw)) in enumerate(convs.items()):
        d = len(xs) - 2
        conv_cls = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[d - 1]
        bn_cls = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)[d - 1]
        out = tuple(conv_cls(xs[1], **kw, device="meta")(torch.empty(xs, device="meta")).shape)
        fmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(d)
        for bn, cl in itertools.product((False, True), (False, True)):
            if (cl and not fmt) or (quick and (i >= 4 or cl and i)) or (cl and not bn):
                continue

            def parts(xs=xs, kw=kw, bn=bn, conv_cls=conv_cls, bn_cls=bn_cls):
                p = {"conv": conv_cls(xs[1], **kw)}
                if bn:  # running statistics far from 0 and 1, so folding them in matters
                    p["bn"] = bn_cls(kw["out_channels"]).eval()
                    p["bn"].running_mean.uniform_(-0.5, 0.5), p["bn"].running_var.uniform_(0.5, 2)
                    p["bn"].weight.data.uniform_(0.5, 1.5), p["bn"].bias.data.uniform_(-0.5, 0.5)
                return p
            reg_chains(f"conv.{name}{'.bn' if bn else ''}{'.cl' if cl else ''}",
                       lambda s, x, bn=bn: s.bn(s.conv(x)) if bn else s.conv(x), 1,
                       lambda xs=xs, cl=cl, fmt=fmt: [rn(xs).contiguous(memory_format=fmt) if cl else rn(xs)],
                       out, parts, ops=() if cl or bn else ("mul", "div", "max", "where")[:4 if i < 4 else 1],
                       lower=i < 4, combos=i < 4 and not (cl or bn))

    # layer norm with post-ops, softmax over each dim, pooling, cat
    for xs in ((64, 96), (2, 64, 96), (2, 6, 32, 96)):
        for affine, post in itertools.product((True, False), ("none", "add", "add_row", "mul_col", "gelu")):
            if quick and not affine:
                continue
            operand = {"add": xs, "add_row": xs[-1:], "mul_col": xs[:-1] + (1,)}.get(post)
            reg(f"misc.layer_norm.{sname(xs)}.{'aff' if affine else 'noaff'}.{post}",
                lambda s, x, *y, xs=xs, affine=affine, post=post: apply_chain(
                    F.layer_norm(x, xs[-1:], s.w if affine else None, s.b if affine else None),
                    {"none": "plain", "add_row": "add", "mul_col": "mul"}.get(post, post), y),
                lambda xs=xs, operand=operand: [rn(xs)] + ([rn(operand)] if operand else []),
                lambda xs=xs: {"w": torch.rand(xs[-1]) + 0.5, "b": rn(xs[-1])})
    for xs in ((64, 96), (2, 64, 96), (2, 6, 64, 80), (2, 8, 1, 64)):
        for dim, fname, pre in itertools.product(range(len(xs)), ("softmax", "log_softmax"), ("scale", "addmask")):
            if quick and (len(xs) != 4 or fname != "softmax"):
                continue
            mask = tuple(n if k == dim else 1 for k, n in enumerate(xs))
            reg(f"misc.{fname}.{sname(xs)}.d{dim}.{pre}",
                lambda s, x, *m, dim=dim, fname=fname: getattr(torch, fname)(x + m[0] if m else x * 0.125, dim),
                lambda xs=xs, pre=pre, mask=mask: [rn(xs)] + ([rn(mask)] if pre == "addmask" else []))
    for xs, (k, st, pad, ceil), kind, cl in itertools.product(
            ((2, 32, 28, 28), (2, 32, 27, 29)),
            ((2, 2, 0, False), (3, 2, 1, False), (3, 2, 0, True), (3, 1, 1, False)),
            ("max", "avg"), (False, True)):
        if quick and (xs[2] == 27 or k == 3 and pad == 0):
            continue
        pool = F.max_pool2d if kind == "max" else F.avg_pool2d
        reg(f"misc.{kind}_pool.{sname(xs)}.k{k}s{st}p{pad}{'.ceil' if ceil else ''}{'.cl' if cl else ''}",
            lambda s, x, pool=pool, a=(k, st, pad), ceil=ceil: torch.relu(pool(x, *a, ceil_mode=ceil)),
            lambda xs=xs, cl=cl: [rn(xs).contiguous(memory_format=torch.channels_last) if cl else rn(xs)])
    for size in (1, 7, (4, 6)):
        reg(f"misc.adaptive_avg_pool.o{sname(size) if isinstance(size, tuple) else size}",
            lambda s, x, size=size: torch.relu(F.adaptive_avg_pool2d(x, size)), lambda: [rn(2, 64, 14, 14)])
    for xs in ((2, 32, 28, 28), (2, 64, 96)):
        for dim, three in itertools.product(range(len(xs)), (False, True)):
            if quick and dim != 1:
                continue
            ys = xs[:dim] + (xs[dim] // 2 + 1,) + xs[dim + 1:]  # another size along the cat dim
            reg(f"misc.cat.{sname(xs)}.d{dim}{'.three' if three else ''}",
                lambda s, x, y, z, dim=dim, three=three: torch.relu(torch.cat([x, y, z], dim)) if three else
                torch.cat([torch.relu(x), torch.sigmoid(y)], dim), lambda xs=xs, ys=ys: [rn(xs), rn(ys), rn(xs)])

    # where(mask, scores, y) after a matmul (an attention mask), mask and y broadcast differently
    out = (B, H, M, N)
    for pat in patterns(out, lower=not quick, scalar=False):
        for form in ("same", "mask_full", "y_full", "y_scalar", "masked_fill")[:3 if quick else 5]:
            mshape, yshape = {"mask_full": (out, pat), "y_full": (pat, out)}.get(form, (pat, pat))
            reg(f"where.{form}.{sname(pat)}",
                lambda s, q, k, m, y, form=form: torch.matmul(q, k.transpose(-1, -2)).masked_fill(m, -1e4)
                if form == "masked_fill" else
                torch.where(m, torch.matmul(q, k.transpose(-1, -2)), -1e4 if form == "y_scalar" else y),
                lambda m=mshape, y=yshape: [rn(B, H, M, K), rn(B, H, N, K), torch.rand(m) > 0.3, rn(y)])

    # attention: SDPA and the hand-written form, masks of every kind
    for (lq, lk, dh), form, mask, causal in itertools.product(
            ((128, 128, 64), (197, 197, 64), (1, 128, 64), (100, 37, 80)), ("sdpa", "manual"),
            ("none", "b11k", "b1qk", "1hqk", "qk", "bhqk", "b11k_bool", "bhqk_bool"), (False, True)):
        if quick and (lq in (197, 100) or "b1qk" in mask or mask == "qk"):
            continue
        if causal and (form == "manual" or mask != "none" or lq != lk):
            continue
        mshape = {"b11k": (B, 1, 1, lk), "b1qk": (B, 1, lq, lk), "1hqk": (1, H, lq, lk), "qk": (lq, lk),
                  "bhqk": (B, H, lq, lk)}.get(mask.split("_")[0])

        def attn(s, q, k, v, *m, form=form, causal=causal, dh=dh):
            if form == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m[0] if m else None, is_causal=causal)
            w = torch.matmul(q, k.transpose(-1, -2)) * dh ** -0.5
            if m:
                w = w.masked_fill(~m[0], float("-inf")) if m[0].dtype == torch.bool else w + m[0]
            return torch.matmul(torch.softmax(w, -1), v)

        def inputs(lq=lq, lk=lk, dh=dh, mask=mask, mshape=mshape):
            m = [] if mshape is None else [torch.rand(mshape) > 0.3 if "bool" in mask else rn(mshape)]
            if m and m[0].dtype == torch.bool:
                m[0][..., 0] = True  # no row fully masked (NaN in both, compared as equal anyway)
            return [rn(B, H, lq, dh), rn(B, H, lk, dh), rn(B, H, lk, dh)] + m
        reg(f"sdpa.{form}.q{lq}k{lk}d{dh}.{mask}{'.causal' if causal else ''}", attn, inputs)

    # model-sized instances of the traps found so far: the quirks' and the speed check's own test
    T, C = 256, 768
    lin = lambda: {"lin": nn.Linear(C, C)}  # noqa: E731
    conv = lambda cin, cout, k, g=1: lambda: {"conv": nn.Conv2d(cin, cout, k, padding=k // 2, groups=g)}  # noqa: E731
    add_conv = lambda s, x, t: s.conv(x) + t  # noqa: E731
    for name, fn, inputs, parts in (
            ("linear_row_scale", lambda s, x, r: s.lin(x) * r, lambda: [rn(T, C), torch.rand(T, 1)], lin),
            ("matmul_row_add", lambda s, x, r: torch.matmul(x, s.w) + r, lambda: [rn(T, C), rn(T, 1)],
             lambda: {"w": rn(C, C)}),
            ("matmul_head_bias", lambda s, x, b: torch.matmul(x, s.w) + b,
             lambda: [rn(1, 12, 128, 768), rn(1, 12, 1, 64)], lambda: {"w": rn(1, 12, 768, 64)}),
            ("attn_where_mask", lambda s, q, k, m, y: torch.where(m, torch.matmul(q, k.transpose(-1, -2)), y),
             lambda: [rn(2, 12, 197, 64), rn(2, 12, 197, 64), torch.rand(2, 1, 1, 197) > 0.2,
                      torch.full((1, 1, 1, 1), -1e4)], dict),
            ("conv_per_sample", add_conv, lambda: [rn(2, 64, 56, 56), rn(2, 1, 1, 1)], conv(64, 64, 3)),
            ("dwconv_time_emb", add_conv, lambda: [rn(2, 64, 56, 56), rn(2, 64, 1, 1)], conv(64, 64, 3, 64)),
            ("conv_pos_emb_1chw", add_conv, lambda: [rn(2, 64, 56, 56), rn(1, 64, 56, 56)], conv(64, 64, 3)),
            ("conv_row_nch1", add_conv, lambda: [rn(2, 64, 56, 56), rn(2, 64, 56, 1)], conv(64, 64, 3)),
            ("layer_norm_4d_col", lambda s, x, t: F.layer_norm(x, (768,)) * t,
             lambda: [rn(2, 12, 197, 768), rn(2, 12, 197, 1)], dict)):
        reg(f"large.{name}", fn, inputs, parts)
    return cases


def big_catalog():
    """Crash-prone large shapes, one child per case (--big)."""
    cases = []

    def reg(name, fn, inputs, parts=dict):
        cases.append((name, lambda: (Model(fn, parts()), inputs())))

    posts = {  # name: (fn(p, s, *ys), whether it takes an operand of the output's sizes)
        "add": (lambda p, s, y: p + y, True), "bias": (lambda p, s: p + s.c, False),
        "add>relu": (lambda p, s, y: torch.relu(p + y), True), "relu>add": (lambda p, s, y: torch.relu(p) + y, True),
        "mul": (lambda p, s, y: p * y, True), "sub": (lambda p, s, y: p - y, True)}
    for (K, N), (head, xs), M in itertools.product(
            ((1280, 768), (2048, 1000), (3072, 768), (4096, 3072)),
            (("linear", 2), ("linear_nb", 2), ("matmul", 2), ("addmm", 2), ("linear", 3)), (1, 2)):
        if M == 2 and (head != "linear" or xs != 2):
            continue
        f = {"linear": lambda s, x: s.lin(x), "linear_nb": lambda s, x: s.lin(x),
             "matmul": lambda s, x: torch.matmul(x, s.w), "addmm": lambda s, x: torch.addmm(s.b, x, s.w)}[head]
        x = (M, K) if xs == 2 else (1, M, K)
        for post, (g, same) in posts.items():
            reg(f"big.{head}.{xs}d.M{M}K{K}N{N}.{post}", lambda s, x, *y, f=f, g=g: g(f(s, x), s, *y),
                lambda x=x, same=same, N=N: [rn(x)] + ([rn(x[:-1] + (N,))] if same else []),
                lambda K=K, N=N, head=head: {"lin": nn.Linear(K, N, bias=head == "linear"), "w": rn(K, N) / K ** 0.5,
                                             "b": rn(N), "c": rn(N)})
    for D, H in ((768, 3072), (1024, 4096), (1280, 5120), (2048, 8192)):  # one token through an MLP block
        reg(f"big.mlp.1x1x{D}.h{H}", lambda s, x: s.l2(F.gelu(s.l1(x))) + x, lambda D=D: [rn(1, 1, D)],
            lambda D=D, H=H: {"l1": nn.Linear(D, H), "l2": nn.Linear(H, D)})
    for B, K, N in ((12, 64, 2048), (1, 2048, 1000), (12, 768, 2304)):  # batched, one row
        for post in ("add", "mul"):
            reg(f"big.bmm.{B}x1x{K}.n{N}.{post}", lambda s, a, b, y, g=posts[post][0]: g(torch.matmul(a, b), s, y),
                lambda B=B, K=K, N=N: [rn(B, 1, K), rn(B, K, N) / K ** 0.5, rn(B, 1, N)])
    for S, mask in itertools.product((512, 2048), ("none", "b11s", "bh1s")):  # attention decoding one query
        mshape = {"b11s": (1, 1, 1, S), "bh1s": (1, 12, 1, S)}.get(mask)

        def attn(s, q, k, v, *m):
            w = torch.matmul(q, k.transpose(-1, -2)) * 0.125
            return torch.matmul(torch.softmax(w + m[0] if m else w, -1), v)
        reg(f"big.attn_decode.s{S}.{mask}", attn, lambda S=S, mshape=mshape: [rn(1, 12, 1, 64), rn(1, 12, S, 64),
            rn(1, 12, S, 64)] + ([rn(mshape)] if mshape else []))
    for sp, (cin, cout), post in itertools.product((1, 2, 7), ((512, 2048), (2048, 512)), ("add", "add>relu", "bias")):
        g, same = posts[post]
        reg(f"big.conv1x1.1x{cin}x{sp}x{sp}.o{cout}.{post}", lambda s, x, *y, g=g: g(s.conv(x), s, *y),
            lambda cin=cin, cout=cout, sp=sp, same=same: [rn(1, cin, sp, sp)] + ([rn(1, cout, sp, sp)] if same else []),
            lambda cin=cin, cout=cout: {"conv": nn.Conv2d(cin, cout, 1), "c": rn(cout, 1, 1)})
    for D, op, post in itertools.product((4096, 8192), ("layer_norm", "softmax"), ("add", "bias", "mul")):
        g, same = posts[post]
        reg(f"big.{op}.1x{D}.{post}",
            lambda s, x, *y, g=g, op=op, D=D: g(F.layer_norm(x, (D,), s.w, s.b) if op == "layer_norm" else
                                               torch.softmax(x, -1), s, *y),
            lambda D=D, same=same: [rn(1, D)] + ([rn(1, D)] if same else []),
            lambda D=D: {"w": torch.rand(D) + 0.5, "b": rn(D), "c": rn(D)})
    return cases


def mismatch(got, expected, tol):
    """The largest |got - expected| over tol * (1 + |expected|), or 0; NaN against NaN agrees."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return float("inf")
    g, e = got.double(), expected.double()
    d = torch.where((g == e) | (g.isnan() & e.isnan()), 0.0, (g - e).abs().nan_to_num(nan=float("inf")))
    over = d[d > tol * (1 + e.abs())]
    return over.max().item() if over.numel() else 0.0


def child(args, cases):
    """Runs cases[first:last]; "@@" lines bracket each phase for the parent reading oneDNN's log."""
    import torch_llga
    warnings.filterwarnings("ignore")  # the speed check's warning, tracer warnings
    torch.set_num_threads(2)
    torch_llga.enable()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    # bf16 keeps 8 mantissa bits (2^-8 relative rounding), and a fused chain keeps fp32 between its ops
    # where eager rounds each to bf16: a few bf16 ulps apart is right, a wrong broadcast is off by ~1.
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for i in range(args.first, args.last):
        print(f"@@ start {i}", flush=True)
        try:
            torch.manual_seed(0)
            model, inputs = cases[i][1]()
            model = model.eval().to(dtype)
            inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
            with torch.no_grad():
                expected = model(*inputs)
                # bf16 references besides eager, a result near any of them being right: the frozen
                # model run by PyTorch (freezing folds a batch norm into the conv's bf16 weights,
                # rounding them: conv.c2_k1.bn is 2-3% off eager without the fuser too), and the
                # same math in fp32 on the same bf16 values (a fused chain keeps fp32 between its
                # ops where eager rounds each to bf16: sdpa.manual.q100k37d80 was 0.017-0.019 from
                # fp64, eager 0.019-0.024).
                frozen = exact = None
                if dtype == torch.bfloat16:
                    exact = copy.deepcopy(model).float()(*(t.float() if t.is_floating_point() else t for t in inputs))
                    exact = exact.to(dtype) if isinstance(exact, torch.Tensor) else None
                    with torch_llga.enabled(False):
                        unfused = torch.jit.freeze(torch.jit.trace(model, inputs, check_trace=False))
                        frozen = [unfused(*inputs) for _ in range(3)][-1]
                traced = torch.jit.freeze(torch.jit.trace(model, inputs, check_trace=False))
                print("@@ profile", flush=True)  # call 1 profiles: PyTorch's own ops, its own kernels
                traced(*inputs)
                before = torch_llga.stats()
                print("@@ fused", flush=True)  # call 2 fuses; 3 and 4 time the speed check; 5 runs its verdict
                outs = [traced(*inputs) for _ in range(4)]
                print("@@ end", flush=True)
                after = torch_llga.stats()
            res = dict(fused=after["executions"] > before["executions"],
                       slow=after["slow_partitions"] - before["slow_partitions"],
                       err=max(min(mismatch(o, ref, tol) for ref in (expected, frozen, exact) if ref is not None) for o in outs))
        except Exception as e:  # noqa: BLE001 (a case that fails to trace or run is reported, not fatal)
            res = dict(error=f"{type(e).__name__}: {e}".replace("\n", " ")[:300])
        print("@@ result " + json.dumps(res), flush=True)


def run_children(args, cases):
    """Runs every case in child processes; restarts after a crash or a timeout. Returns records."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", TORCH_LLGA_SMALL_PLANS="0", OMP_NUM_THREADS="2")
    recs, first = [], 0
    while first < len(cases):
        last = min(len(cases), first + (1 if args.big else CHUNK))
        cmd = [sys.executable, __file__, "--dtype", args.dtype, "--child", str(first), str(last)]
        cmd += ["--quick"] * args.quick + ["--big"] * args.big + sum((["-k", k] for k in args.k), [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines = queue.Queue()  # a reader thread, so a silent child can be timed out
        threading.Thread(target=lambda: ([lines.put(ln) for ln in proc.stdout], lines.put(None)), daemon=True).start()
        rec, phase, tail, started = None, None, [], time.time()
        while True:
            try:
                line = lines.get(timeout=5)
            except queue.Empty:
                if rec and time.time() - started > CASE_TIMEOUT:
                    proc.kill()
                    rec["status"] = "timeout"
                    break
                continue
            if line is None:
                break
            if line.startswith("@@ start "):
                i = int(line.split()[2])
                rec = dict(index=i, name=cases[i][0], refs={}, eager_refs=set())
                phase, tail, started = None, [], time.time()
            elif line.startswith("@@ result "):
                rec.update(json.loads(line[10:]), status="done")
                recs.append(rec)
                rec = None
            elif line.startswith("@@ "):
                phase = line.split()[1]
            elif line.startswith("onednn_verbose,v1,primitive,exec,cpu,") and phase in ("profile", "fused"):
                f = line.strip().split(",")  # ...,exec,cpu,<kind>,<impl>,<prop>,<mds>,<attrs>,<aux>,<problem>,<ms>
                if f[6].startswith("ref"):
                    if phase == "profile":
                        rec["eager_refs"].add((f[5], f[6]))
                    else:
                        key = f"{f[5]}:{f[6]}"
                        ms = float(f[-1]) if f[-1].replace(".", "", 1).isdigit() else 0.0
                        rec["refs"][key] = max(rec["refs"].get(key, 0.0), ms)
            elif not line.startswith("onednn_verbose"):
                tail = (tail + [line.rstrip()])[-5:]
        proc.wait()
        if rec is not None:  # died or hung inside a case: record it, go on after it
            rec.setdefault("status", f"crash (exit {proc.returncode})")
            rec["error"] = " | ".join(tail)
            recs.append(rec)
            first = rec["index"] + 1
        elif proc.returncode and args.big and recs and recs[-1]["index"] == first:  # died at exit: a heap
            recs[-1].update(status=f"crash at exit (exit {proc.returncode})", error=" | ".join(tail))  # it corrupted
            first = last
        elif proc.returncode:  # failed between cases (to start, say): report what ran
            recs.append(dict(name=f"child.cases_{first}_to_{last}", status=f"child failed (exit {proc.returncode})",
                             error=" | ".join(tail), refs={}, eager_refs=set()))
            break
        else:
            first = last
        print(f"[{first}/{len(cases)} cases, {time.time() - args.t0:.0f} s]", file=sys.stderr, flush=True)
    for r in recs:  # a kernel PyTorch's own run (call 1) used too is not the fusion's doing
        r["refs"] = {k: ms for k, ms in r["refs"].items() if tuple(k.split(":", 1)) not in r["eager_refs"]}
    return recs


def report(recs):
    refs = [r for r in recs if r["refs"] and r["status"] == "done"]
    caught = [r for r in refs if r["slow"]]
    missed = sorted((r for r in refs if not r["slow"]), key=lambda r: -max(r["refs"].values()))  # costliest first
    wrong = [r for r in recs if r.get("err")]
    failed = [r for r in recs if r["status"] != "done" or "error" in r]

    def table(title, rows, cell):
        print(f"\n{title}: {len(rows)}")
        for r in rows:
            print(f"  {r['name']:<48} {cell(r)}")
    # each reference primitive with its longest execution, as oneDNN's log timed it
    ref_cell = lambda r: "  ".join(f"{k} {ms:.1f} ms" for k, ms in sorted(r["refs"].items()))  # noqa: E731
    table("Reference kernels no quirk kept out, caught by the speed check", caught, ref_cell)
    table("Reference kernels NOT caught by the speed check (slow_partitions unchanged)", missed, ref_cell)
    table("Wrong values (largest error over the tolerance)", wrong, lambda r: f"{r['err']:.3g}")
    table("Crashes, timeouts, errors", failed, lambda r: f"{r['status']}: {r.get('error', '')}"[:200])
    counts = collections.defaultdict(collections.Counter)
    for r in recs:
        c = counts[r["name"].split(".")[0]]
        c.update(cases=1, fused=bool(r.get("fused")), **{k: any(r is x for x in rows) for k, rows in
                                                          (("ref", refs), ("caught", caught), ("missed", missed),
                                                           ("wrong", wrong), ("failed", failed))})
    cols = ("cases", "fused", "ref", "caught", "missed", "wrong", "failed")
    print("\n" + f"{'family':<8}" + "".join(f"{c:>8}" for c in cols))
    for fam, c in counts.items():
        print(f"{fam:<8}" + "".join(f"{c[k]:>8}" for k in cols))
    return 1 if missed or wrong or failed else 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer shapes and post-ops (840 cases, about 15 s)")
    parser.add_argument("--big", action="store_true",
                        help="large shapes instead, each case in a child of its own (190 cases, about 4 minutes)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("-k", action="append", default=[], help="only cases whose name contains this")
    parser.add_argument("--child", nargs=2, type=int, metavar=("FIRST", "LAST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.big and args.quick:
        parser.error("--big and --quick are exclusive")
    cases = [c for c in (big_catalog() if args.big else catalog(args.quick)) if not args.k or any(k in c[0] for k in args.k)]
    if args.child:
        args.first, args.last = args.child
        return child(args, cases)
    args.t0 = time.time()
    recs = run_children(args, cases)
    status = report(recs)
    print(f"{len(recs)} of {len(cases)} cases run, {args.dtype}, {time.time() - args.t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
