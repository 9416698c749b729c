"""A Ray Serve application serving frozen TorchScript models with torch_llga.

One Ray Serve application per model, at /<name>/ on the HTTP proxy:

    POST /resnet50/        body: a .npy float32 array [B, 3, 224, 224]      -> .npy logits [B, 1000]
    POST /bert/            body: a .npy int64 array of token ids [B, S]     -> .npy embeddings [B, 768]
    GET  /<name>/stats     this replica's torch_llga.stats(), its pid, threads and whether it fuses

What Ray does, Ray does: replicas, routing, restarts, dynamic batching (@serve.batch). The replica
applies the rules of docs/usage.md ("C++ and serving"): intra-op threads sized so that replicas x
threads <= cores; every shape it will run warmed up (four calls each: profiling, compiling, and two
speed-checked runs) before it takes traffic.
Requests are batched and cut into chunks of at most 8 rows, padded to 1, 2, 4 or 8 rows (and BERT's
sequences to 32, 64 or 128 tokens, masked), so a replica only ever runs the shapes it warmed up.
A bad request (not a .npy array, wrong dtype, rank or size) is a 400 naming the problem; the replica
stays healthy. A model file that does not load fails that application's deployment with the reason;
the other applications keep serving.
"""
import io
import os
import types

import numpy as np
import torch
from fastapi import FastAPI, HTTPException, Request, Response
from ray import serve

BATCH_BUCKETS = (1, 2, 4, 8)
SEQ_BUCKETS = (32, 64, 128)
MAX_ROWS = 8  # a request's rows

# What each model takes: its input checks, and how its rows are padded and run.
KINDS = {"resnet50": "image", "bert": "tokens"}


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def bucket(n, buckets):
    return next(b for b in buckets if b >= n)


def check_image(x):
    if x.dtype != np.float32 or x.ndim != 4 or x.shape[1:] != (3, 224, 224) or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"the model takes float32 images [B, 3, 224, 224] with 1 <= B <= {MAX_ROWS}, "
                         f"not {x.dtype}{list(x.shape)}")


def check_tokens(x):
    if x.dtype not in (np.int64, np.int32) or x.ndim != 2 or not 1 <= x.shape[0] <= MAX_ROWS \
            or not 1 <= x.shape[1] <= SEQ_BUCKETS[-1]:
        raise ValueError(f"the model takes int64 token ids [B, S] with 1 <= B <= {MAX_ROWS} and 1 <= S <= "
                         f"{SEQ_BUCKETS[-1]}, not {x.dtype}{list(x.shape)}")


def check_token_values(x, vocab=30522):
    if x.size and (x.min() < 0 or x.max() >= vocab):
        raise ValueError(f"token ids are in [0, {vocab}): this request has {x.min()}..{x.max()}")


def read_npy(body, check):
    """The array in a .npy body, its header checked first (`check` sees its dtype and shape): a
    header asking for gigabytes is refused before anything is allocated."""
    stream = io.BytesIO(body)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
    except Exception as e:  # noqa: BLE001 - what is no .npy file
        raise TypeError(f"it starts with {body[:16]!r} ({str(e)[:100]})") from None
    check(types.SimpleNamespace(dtype=dtype, shape=shape, ndim=len(shape)))
    try:
        return np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - a truncated body, pickled objects
        raise TypeError(str(e)[:200]) from None


api = FastAPI()


@serve.deployment(max_ongoing_requests=32, health_check_period_s=10)
@serve.ingress(api)
class ModelServer:
    def __init__(self, name, path, kind, threads, fuse=True):
        torch.set_num_threads(threads)
        self.name, self.kind, self.threads, self.fuse = name, kind, threads, fuse
        if fuse:
            import torch_llga

            torch_llga.enable()
        try:
            self.model = torch.jit.load(path)
        except Exception as e:  # noqa: BLE001 - the deployment fails with this sentence, the server stays up
            raise RuntimeError(f"{name}: {path} is not a TorchScript model file torch.jit.load can read "
                               f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200]})") from None
        self.warm_up()

    def warm_up(self):
        """Four calls of every shape this replica runs: the profiling run, the one compiling the
        partitions, two that time them against PyTorch; traffic then runs at full speed."""
        shapes = [(b,) for b in BATCH_BUCKETS] if self.kind == "image" else \
            [(b, s) for b in BATCH_BUCKETS for s in SEQ_BUCKETS]
        for shape in shapes:
            for _ in range(4 if self.fuse else 2):
                self.run_padded(self.example(*shape))

    def example(self, rows, seq=None):
        if self.kind == "image":
            return np.zeros((rows, 3, 224, 224), np.float32)
        return np.ones((rows, seq), np.int64)

    def run_padded(self, rows, lengths=None):
        """The model's outputs for these rows (at most 8; token rows of the given lengths, padded to
        one width), run at a warmed-up shape: padded rows, and for BERT padded tokens masked out."""
        n = rows.shape[0]
        with torch.no_grad():
            if self.kind == "image":
                x = torch.zeros((bucket(n, BATCH_BUCKETS), 3, 224, 224))
                x[:n] = torch.from_numpy(rows)
                return self.model(x)[:n].numpy()
            ids = torch.zeros((bucket(n, BATCH_BUCKETS), bucket(rows.shape[1], SEQ_BUCKETS)), dtype=torch.long)
            ids[:n, :rows.shape[1]] = torch.from_numpy(rows.astype(np.int64))
            mask = torch.zeros_like(ids)
            lengths = np.full(n, rows.shape[1]) if lengths is None else lengths
            for i, length in enumerate(lengths):
                mask[i, :length] = 1
            mask[n:, 0] = 1  # a padding row attends to one token: no 0/0 in its mean
            return self.model(ids, mask)[:n].numpy()

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.005)
    async def run_batch(self, requests):
        """Requests Ray gathered: those of one shape (images) or one sequence-length bucket (tokens,
        each row masked to its own length) run together, 8 rows a call."""
        groups = {}
        for i, x in enumerate(requests):
            key = "image" if self.kind == "image" else bucket(x.shape[1], SEQ_BUCKETS)
            groups.setdefault(key, []).append(i)
        results = [None] * len(requests)
        for members in groups.values():
            width = max(requests[i].shape[-1] for i in members)
            rows = np.concatenate([requests[i] if self.kind == "image" else
                                   np.pad(requests[i], ((0, 0), (0, width - requests[i].shape[1]))) for i in members])
            lengths = np.concatenate([np.full(requests[i].shape[0], requests[i].shape[-1]) for i in members])
            out = np.concatenate([self.run_padded(rows[k:k + MAX_ROWS], lengths[k:k + MAX_ROWS])
                                  for k in range(0, rows.shape[0], MAX_ROWS)])
            start = 0
            for i in members:
                results[i] = out[start:start + requests[i].shape[0]]
                start += requests[i].shape[0]
        return results

    @api.post("/")
    async def infer(self, request: Request):
        body = await request.body()
        try:
            x = read_npy(body, check_image if self.kind == "image" else check_tokens)
            if self.kind == "tokens":
                check_token_values(x)
        except TypeError as e:
            raise HTTPException(status_code=400, detail=f"{self.name}: the body is not a .npy array of numbers "
                                f"(numpy.save's format): {e}") from None
        except ValueError as e:
            raise HTTPException(status_code=400, detail=f"{self.name}: {e}") from None
        return Response(npy(await self.run_batch(x)), media_type="application/octet-stream")

    @api.get("/stats")
    def stats(self):
        stats = {}
        if self.fuse:
            import torch_llga

            stats = torch_llga.stats()
        return {"model": self.name, "pid": os.getpid(), "threads": torch.get_num_threads(), "fuse": self.fuse, **stats}


def application(name, path, replicas=1, threads=1, fuse=True, kind=None):
    """The Ray Serve application of one model: `replicas` replicas of `threads` intra-op threads each.
    kind: what the model takes, "image" or "tokens" (default: KINDS[name])."""
    return ModelServer.options(name=name, num_replicas=replicas, ray_actor_options={"num_cpus": threads}) \
        .bind(name, path, kind or KINDS[name], threads, fuse)
