"""Soak: one process serving three models from 8 threads for a long time, with changing input shapes,
the models loaded from their files and released on the way. Every result is checked against eager.
At the end: wrong results, errors, fused executions, and the resident memory's slope after warm-up
(least squares over the samples of the last two thirds of the run), in MB a minute, and the same for
the heap's allocated bytes (glibc's mallinfo2): growth there is memory held, the rest fragmentation.

    python test/soak.py --minutes 60          # the documented hour
    python test/soak.py --minutes 3           # test_soak.py's run in make test
    python test/soak.py --minutes 60 --plain  # the same on plain TorchScript

Exit status 1 if a result was wrong, a call failed, the slope is over --max-slope (1 MB/min), over
1% of calls fell back at a guard, or torch_llga.stats()'s counters disagree. --plain runs the same
traffic on plain TorchScript: the memory baseline.
"""
import argparse
import ctypes
import gc
import json
import os
import random
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_llga  # noqa: E402


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.fc = nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, 10)

    def forward(self, x):
        y = F.relu(self.bn(self.c1(x)))
        y = F.relu(self.c2(y) + y)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Encoder(nn.Module):
    """A transformer encoder layer written out (nn.TransformerEncoderLayer traces, without
    gradients, to one fast-path op that nothing fuses)."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.ln1, self.ln2, self.head = nn.LayerNorm(d), nn.LayerNorm(d), nn.Linear(d, 8)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, -1) @ v
        x = self.ln1(x + self.o(attention.transpose(1, 2).reshape(b, s, d)))
        return self.head(self.ln2(x + self.fc2(F.gelu(self.fc1(x)))))


def mlp():
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))


# name -> (the eager model, a random input for it): 16 shapes each, as many as a group keeps
# compiled by default (torch_llga.cache_capacity()); more shapes than that recompile in turn (right,
# slower, and the heap fragments while it settles: docs/usage.md).
MODELS = {
    "convnet": (ConvNet, lambda rng: torch.randn(rng.randint(1, 4), 3, rng.choice((16, 20, 24, 32)), 24)),
    "encoder": (Encoder, lambda rng: torch.randn(rng.randint(1, 4), rng.choice((8, 16, 32, 48)), 64)),
    "mlp": (mlp, lambda rng: torch.randn(rng.randint(1, 16), 32)),
}


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use_mb():
    """glibc's allocated bytes (mallinfo2): what is held, apart from freed memory its heaps keep
    resident (fragmentation); None where glibc has no mallinfo2."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        m = libc.mallinfo2()
    except (OSError, AttributeError):
        return None
    return (m.uordblks + m.hblkhd) / 2**20


def slope(samples):
    """Least-squares slope of (minutes, MB) samples, MB a minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mm = sum(m for _, m in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return sum((t - mt) * (m - mm) for t, m in samples) / var if var else 0.0


class Soak:
    def __init__(self, directory, seed=0):
        torch.manual_seed(seed)
        self.eager, self.paths, self.scripts = {}, {}, {}
        for name, (make, example) in MODELS.items():
            model = make().eval()
            self.eager[name] = model
            self.paths[name] = os.path.join(directory, f"{name}.pt")
            with torch.no_grad():
                torch.jit.save(torch.jit.freeze(torch.jit.trace(model, example(random.Random(0)))), self.paths[name])
            self.scripts[name] = torch.jit.load(self.paths[name])
        self.lock = threading.Lock()
        self.calls = self.wrong = self.reloads = 0
        self.errors = []

    def reload(self, name):
        """A new copy of the model from its file; the old one is dropped once no call holds it
        (not torch_llga.release()d: calls of it may still be running; its reordered weights go
        with oneDNN's constant cache's next flush, docs/usage.md)."""
        script = torch.jit.load(self.paths[name])
        with self.lock:
            self.scripts[name] = script
            self.reloads += 1

    def worker(self, seed, deadline):
        rng = random.Random(seed)
        with torch.no_grad():
            while time.time() < deadline:
                name = rng.choice(list(MODELS))
                x = MODELS[name][1](rng)
                with self.lock:
                    script = self.scripts[name]
                try:
                    out = script(x)
                    expected = self.eager[name](x)
                    # fp32; 1e-4: the encoder's softmax and layer norm sum in another order fused
                    ok = torch.allclose(out, expected, rtol=1e-4, atol=1e-4)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    with self.lock:
                        self.errors.append(f"{name} {list(x.shape)}: {type(e).__name__}: {e}"[:300])
                    continue
                with self.lock:
                    self.calls += 1
                    self.wrong += not ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--reload-seconds", type=float, default=20, help="a model reloaded from its file this often")
    parser.add_argument("--max-slope", type=float, default=1.0, help="MB a minute allowed after warm-up")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--plain", action="store_true", help="plain TorchScript (torch_llga not enabled): the baseline")
    parser.add_argument("--trace", action="store_true",
                        help="a line a minute on stderr: resident and heap MB, the kept buffers, choice records, cached partitions")
    args = parser.parse_args(argv)

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    if not args.plain:
        torch_llga.enable()
    with tempfile.TemporaryDirectory() as directory:
        soak = Soak(directory)
        start = time.time()
        deadline = start + 60 * args.minutes
        workers = [threading.Thread(target=soak.worker, args=(seed, deadline)) for seed in range(args.threads)]
        for w in workers:
            w.start()
        samples, heap_samples, names, next_reload = [], [], list(MODELS), start + args.reload_seconds
        while any(w.is_alive() for w in workers):
            time.sleep(min(5.0, max(0.1, deadline - time.time())))
            now = time.time()
            samples.append(((now - start) / 60, rss_mb()))
            heap = heap_in_use_mb()
            if heap is not None:
                heap_samples.append(((now - start) / 60, heap))
            if args.trace and len(samples) % 12 == 0:
                st = torch_llga.stats()
                print(f"{samples[-1][0]:6.1f} min  rss {samples[-1][1]:7.1f}  heap {heap or 0:7.1f}  kept buffers "
                      f"{st['kept_buffer_bytes'] / 2**20:6.1f}  records {len(torch_llga.choices()):6d}  cached partitions "
                      f"{st['cached_partitions']:4d}  compilations {st['compilations']:6d}  reloads {soak.reloads}", file=sys.stderr, flush=True)
            if now >= next_reload and now < deadline:
                soak.reload(names[int(now) % len(names)])
                next_reload = now + args.reload_seconds
        stats = torch_llga.stats()
        # Every model released (the scripts, and the reloaded ones before them): their compiled
        # partitions must go with them.
        soak.scripts.clear()
        gc.collect()
        left = torch_llga.stats()["cached_partitions"]
    # Warm-up: the first third of the run, and at least 90 s (a short run on a loaded machine is
    # still compiling its models' sizes in its second minute).
    warm_up = max(args.minutes / 3, 1.5)
    after_warm_up = [s for s in samples if s[0] >= warm_up]
    result = {"backend": "torchscript" if args.plain else "torch_llga", "minutes": args.minutes, "threads": args.threads, "calls": soak.calls, "wrong": soak.wrong,
              "errors": len(soak.errors), "reloads": soak.reloads, "rss_mb_start": round(samples[0][1], 1),
              "rss_mb_end": round(samples[-1][1], 1), "slope_mb_per_min": round(slope(after_warm_up), 3),
              # the same for the heap's allocated bytes: a slope here is memory held, not fragmentation
              "heap_slope_mb_per_min": round(slope([s for s in heap_samples if s[0] >= warm_up]), 3),
              "executions": stats["executions"], "compilations": stats["compilations"],
              "evictions": stats["evictions"], "guard_failures": stats["guard_failures"],
              "plan_misses": stats["plan_misses"],
              "kernel_fallbacks": stats["kernel_fallbacks"], "cached_partitions": stats["cached_partitions"],
              "slow_partitions": stats["slow_partitions"], "unfused_by_choice": stats["unfused_by_choice"],
              "groups_chosen_unfused": sorted({(c["subject"], c["key"]) for c in torch_llga.choices()
                                               if c["site"] == "fusion_group" and c["chosen"] == "pytorch"}),
              "constant_cache_flushes": stats["constant_cache_flushes"]}
    # The counters agree with each other (nothing negative, no more cached than compiled and not
    # evicted) and with what is alive: nothing cached once every model is gone.
    result["partitions_left_after_release"] = left
    result["stats_consistent"] = all(v >= 0 for v in stats.values() if isinstance(v, int)) and \
        stats["cached_partitions"] <= stats["compilations"] - stats["evictions"] and left == 0
    for line in soak.errors[:10]:
        print(line, file=sys.stderr)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    fused = args.plain or (stats["executions"] > 0 and result["guard_failures"] <= 0.01 * soak.calls)
    bad = not fused or soak.wrong or soak.errors or result["slope_mb_per_min"] > args.max_slope or not result["stats_consistent"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
