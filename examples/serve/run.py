"""Serves the example's models with Ray Serve on this machine, fused by torch_llga:

    python examples/serve/run.py                  # http://127.0.0.1:8000/resnet50/ and /bert/
    python examples/serve/run.py --no-fuse        # the same application, plain TorchScript

The models are built into examples/serve/models/ on first use (random weights). Ctrl-C stops it.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("resnet50", "bert")


def cores():
    return len(os.sched_getaffinity(0))


def start(fuse=True, port=8000, replicas=1, threads=None, models=MODELS, directory=os.path.join(HERE, "models"),
          paths=None, kinds=None, cpus=None):
    """Starts Ray (a local cluster of `cpus` logical CPUs, default the cores) and one Serve
    application per model at /<model>/; returns the base URL. Threads per replica: the cores shared
    out, replicas x threads <= cores."""
    import ray
    from ray import serve

    sys.path.insert(0, HERE)
    from app import application
    from models import saved

    threads = threads or max(1, cores() // (replicas * len(models)))
    if not ray.is_initialized():
        # The replicas import app.py (and torch_llga, installed or built in place) from here.
        pythonpath = os.pathsep.join([HERE, os.path.dirname(os.path.dirname(HERE))] + sys.path[1:])
        ray.init(num_cpus=cpus or cores(), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for name in models:
        path = (paths or {}).get(name) or saved(name, directory)
        serve.run(application(name, path, replicas, threads, fuse, (kinds or {}).get(name)), name=name,
                  route_prefix=f"/{name}")
    return f"http://127.0.0.1:{port}"


def stop():
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-fuse", action="store_true", help="serve plain TorchScript (no torch_llga)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--replicas", type=int, default=1, help="replicas per model")
    parser.add_argument("--threads", type=int, help="intra-op threads per replica (default: cores shared out)")
    args = parser.parse_args()
    url = start(not args.no_fuse, args.port, args.replicas, args.threads)
    print(f"serving {', '.join(f'{url}/{m}/' for m in MODELS)} (stats: {url}/<model>/stats); Ctrl-C stops",
          flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop()


if __name__ == "__main__":
    main()
