"""Load test of the Ray Serve example over localhost: the application with torch_llga, then the same
application without it (plain TorchScript), in one run; every response checked against the model
run eagerly here (the same file, TorchScript without fusion, unpadded, unbatched).

    python examples/serve/load_test.py [--requests 120] [--seconds 300] [--clients 4]

Each client sends requests of mixed sizes (ResNet-50: 1-4 images; BERT: 1-4 sequences of 8-128
tokens), one at a time, to both models in turn; a request that fails to connect or gets a 5xx is
sent again (up to 5 times: a replica being restarted). Stops after --requests requests per mode or
--seconds, whichever comes first. Prints one markdown table: p50 / p99 latency and throughput per
model and mode, wrong responses, errors.
"""
import argparse
import io
import os
import random
import sys
import threading
import time

import numpy as np
import requests
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402
from models import VOCAB, saved  # noqa: E402

# fp32, 1e-4: the server pads rows and tokens and batches requests together, and torch_llga's
# kernels block the sums differently: the same math, summed in another order.
RTOL = ATOL = 1e-4


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def input_pool(seed=0, size=12):
    """Requests of mixed sizes per model, with the eager outputs they must get back."""
    rng = np.random.default_rng(seed)
    pool = {"resnet50": [], "bert": []}
    directory = os.path.join(HERE, "models")
    models = {name: torch.jit.load(saved(name, directory)) for name in pool}
    with torch.no_grad():
        for _ in range(size):
            images = rng.random((int(rng.integers(1, 5)), 3, 224, 224), dtype=np.float32)
            pool["resnet50"].append((images, models["resnet50"](torch.from_numpy(images)).numpy()))
            ids = rng.integers(0, VOCAB, (int(rng.integers(1, 5)), int(rng.integers(8, 129))))
            ids_t = torch.from_numpy(ids)
            pool["bert"].append((ids, models["bert"](ids_t, torch.ones_like(ids_t)).numpy()))
    return pool


def post(session, url, body, retries=5):
    """One request; sent again after a connection error or a 5xx. Returns (response, tries)."""
    response = None
    for attempt in range(retries):
        try:
            response = session.post(url, data=body, timeout=120)
            if response.status_code < 500:
                return response, attempt + 1
        except requests.ConnectionError:
            pass
        time.sleep(0.5 * (attempt + 1))
    return response, retries


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency = {"resnet50": [], "bert": []}
        self.rows = {"resnet50": 0, "bert": 0}
        self.wrong, self.errors, self.retried, self.sent = [], [], 0, 0


def client(url, pool, results, deadline, budget, seed):
    rng = random.Random(seed)
    session = requests.Session()
    while time.time() < deadline:
        with results.lock:
            if results.sent >= budget:
                return
            results.sent += 1
        name = rng.choice(("resnet50", "bert"))
        x, expected = rng.choice(pool[name])
        start = time.perf_counter()
        response, tries = post(session, f"{url}/{name}/", npy(x))
        elapsed = time.perf_counter() - start
        with results.lock:
            results.retried += tries > 1
            if response is None or response.status_code != 200:
                results.errors.append(f"{name}: {getattr(response, 'status_code', 'no response')} "
                                      f"{getattr(response, 'text', '')[:200]}")
                continue
            out = np.load(io.BytesIO(response.content), allow_pickle=False)
            if out.shape != expected.shape or not np.allclose(out, expected, rtol=RTOL, atol=ATOL):
                diff = np.abs(out - expected).max() if out.shape == expected.shape else f"shape {out.shape}"
                results.wrong.append(f"{name} {list(x.shape)}: max diff {diff}")
            results.latency[name].append(elapsed)
            results.rows[name] += x.shape[0]


def load(url, pool, clients, budget, seconds):
    results = Results()
    deadline = time.time() + seconds
    threads = [threading.Thread(target=client, args=(url, pool, results, deadline, budget, seed)) for seed in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.seconds = time.perf_counter() - start
    return results


def stats(url):
    return {name: requests.get(f"{url}/{name}/stats", timeout=30).json() for name in ("resnet50", "bert")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=120, help="requests per mode (both models)")
    parser.add_argument("--seconds", type=float, default=300, help="time limit per mode")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()

    torch.set_num_threads(run.cores())
    pool = input_pool()
    rows, failed = [], False
    for mode, fuse in (("torch_llga", True), ("TorchScript", False)):
        url = run.start(fuse=fuse, port=args.port)
        try:
            before = stats(url)
            results = load(url, pool, args.clients, args.requests, args.seconds)
            after = stats(url)
        finally:
            run.stop()
        for name in ("resnet50", "bert"):
            latency = sorted(results.latency[name])
            p = (lambda q: 1000 * latency[min(len(latency) - 1, int(q * len(latency)))]) if latency else (lambda q: float("nan"))
            extra = ""
            if fuse:
                fused = after[name]["executions"] - before[name]["executions"]
                guards = after[name]["guard_failures"] - before[name]["guard_failures"]
                extra = f"{fused} fused runs, {guards} guard fallbacks"
            rows.append((mode, name, len(latency), p(0.5), p(0.99), results.rows[name] / results.seconds, extra))
        failed |= bool(results.wrong or results.errors)
        for line in results.wrong[:10] + results.errors[:10]:
            print(f"{mode}: {line}", file=sys.stderr)
        print(f"{mode}: {len(results.wrong)} wrong, {len(results.errors)} errors, {results.retried} retried, "
              f"{results.seconds:.0f} s", file=sys.stderr)

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"\n{args.clients} clients, {args.requests} requests per mode, {run.cores()} cores ({cpu}), "
          f"1 replica per model, torch {torch.__version__}\n")
    print("| mode | model | requests | p50 ms | p99 ms | rows/s | torch_llga |\n|---|---|---|---|---|---|---|")
    for mode, name, n, p50, p99, throughput, extra in rows:
        print(f"| {mode} | {name} | {n} | {p50:.0f} | {p99:.0f} | {throughput:.2f} | {extra} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
