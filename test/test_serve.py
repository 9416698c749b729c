"""torch_llga behind Ray Serve (examples/serve/): right answers, per-replica stats, and the faults a
service meets: bad requests, a model file that does not load, a replica killed mid-traffic.

A small image classifier stands in for ResNet-50 (the example's load test runs the real models):
these tests check the serving path, not the models. Ray is a test extra; without it they skip.
"""
import io
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from conftest import FP32

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
requests = pytest.importorskip("requests")

SERVE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "serve")
sys.path.insert(0, SERVE)
import run  # noqa: E402

PORT = 8123
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


class TinyClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


class TinyEmbedder(nn.Module):
    """Token ids and a mask in, the masked mean of their projected embeddings out (BERT's interface)."""

    def __init__(self):
        super().__init__()
        self.embedding, self.proj = nn.Embedding(30522, 16), nn.Linear(16, 8)

    def forward(self, ids, mask):
        hidden = torch.relu(self.proj(self.embedding(ids)))
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1)


def saved(model, example, path):
    with torch.no_grad():
        torch.jit.save(torch.jit.freeze(torch.jit.trace(model, example)), path)
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    torch.manual_seed(0)
    model = TinyClassifier().eval()
    return model, saved(model, torch.rand(1, 3, 224, 224), str(tmp_path_factory.mktemp("serve") / "tiny.pt"))


@pytest.fixture(scope="module")
def embedder_file(tmp_path_factory):
    torch.manual_seed(0)
    model = TinyEmbedder().eval()
    ids = torch.randint(0, 30522, (1, 16))
    return model, saved(model, (ids, torch.ones_like(ids)), str(tmp_path_factory.mktemp("serve") / "embedder.pt"))


@pytest.fixture(scope="module")
def server(model_file, embedder_file):
    """The example's application serving the small classifier at /tiny/ and the embedder at
    /embedder/, 2 replicas of 1 thread each."""
    # Ray counts 6 CPUs (2 here): room for a fifth replica (a deployment that fails) beside the four.
    url = run.start(fuse=True, port=PORT, replicas=2, threads=1, models=("tiny", "embedder"),
                    paths={"tiny": model_file[1], "embedder": embedder_file[1]},
                    kinds={"tiny": "image", "embedder": "tokens"}, cpus=6)
    yield url
    run.stop()


def npy(array):
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def pickled_npy():
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def classify(url, x):
    response = requests.post(f"{url}/tiny/", data=npy(x), timeout=60)
    assert response.status_code == 200, response.text
    return np.load(io.BytesIO(response.content), allow_pickle=False)


def test_concurrent_requests_each_get_their_own_rows(server, model_file, embedder_file):
    # Requests of several sizes at once: Ray gathers them (@serve.batch), the replica pads and runs
    # them together and cuts the outputs back. Token rows of several lengths share a padded, masked
    # batch. Each answer is checked against eager on that request alone.
    rng = np.random.default_rng(0)
    requests_ = [("tiny", rng.random((rows, 3, 224, 224), dtype=np.float32)) for rows in (1, 3, 5, 2, 8)] + \
                [("embedder", rng.integers(0, 30522, (rows, length))) for rows, length in
                 ((1, 5), (3, 20), (2, 20), (1, 40), (4, 64), (2, 128))]
    answers = [None] * len(requests_)

    def send(i):
        name, x = requests_[i]
        response = requests.post(f"{server}/{name}/", data=npy(x), timeout=120)
        answers[i] = response

    for _ in range(2):
        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests_))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for (name, x), response in zip(requests_, answers):
            assert response.status_code == 200, response.text
            with torch.no_grad():
                if name == "tiny":
                    expected = model_file[0](torch.from_numpy(x))
                else:
                    ids = torch.from_numpy(x)
                    expected = embedder_file[0](ids, torch.ones_like(ids))
            torch.testing.assert_close(torch.from_numpy(np.load(io.BytesIO(response.content))), expected, **FP32)


def test_replicas_report_their_stats(server):
    stats = requests.get(f"{server}/tiny/stats", timeout=30).json()
    assert stats["fuse"] and stats["threads"] == 1
    assert stats["executions"] > 0 and stats["guard_failures"] == 0  # every padded batch size warmed up


@pytest.mark.parametrize("body,says", [
    (npy(np.zeros((2, 3, 224, 224), np.float64)), "float64[2, 3, 224, 224]"),
    (npy(np.zeros((3, 224, 224), np.float32)), "float32[3, 224, 224]"),
    (npy(np.zeros((2, 3, 32, 32), np.float32)), "float32[2, 3, 32, 32]"),
    (npy(np.zeros((9, 3, 224, 224), np.float32)), "1 <= B <= 8"),
    (b"not an array", "not a .npy array"),
    (pickled_npy(), "not object[1]"),  # pickled objects are refused (by the header, before loading)
], ids=["dtype", "rank", "size", "rows", "not-npy", "pickle"])
def test_a_bad_request_is_a_400_naming_the_problem(server, body, says):
    response = requests.post(f"{server}/tiny/", data=body, timeout=60)
    assert response.status_code == 400 and says in response.json()["detail"], response.text
    classify(server, np.zeros((1, 3, 224, 224), np.float32))  # the replica still serves


def test_a_model_file_that_does_not_load_fails_its_deployment_only(server, tmp_path):
    from app import application

    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 this is not a TorchScript archive")
    with pytest.raises(RuntimeError, match="Deploying application corrupt failed"):
        serve.run(application("corrupt", str(corrupt), kind="image"), name="corrupt", route_prefix="/corrupt")
    # `serve status` (and the replica's log) says why, in the replica's one sentence.
    status = serve.status().applications["corrupt"].deployments["corrupt"]
    assert f"corrupt: {corrupt} is not a TorchScript model file" in status.message, status.message
    serve.delete("corrupt")
    classify(server, np.zeros((1, 3, 224, 224), np.float32))  # the server and its other application: up


def test_a_killed_replica_loses_no_retried_request(server, model_file):
    # Clients send requests and retry a failed one (examples/serve/load_test.py's post); a replica is
    # killed mid-traffic, Ray starts another. Every request gets its right answer (each client its
    # own input and row count).
    from load_test import post

    model, _ = model_file
    inputs = [np.random.rand(rows, 3, 224, 224).astype(np.float32) for rows in (1, 2, 3)]
    with torch.no_grad():
        expected = [model(torch.from_numpy(x)).numpy() for x in inputs]
    answers, stop = [], threading.Event()

    def client(k):
        session = requests.Session()
        while not stop.is_set():
            response, _ = post(session, f"{server}/tiny/", npy(inputs[k]), retries=20)
            answers.append((k, response))

    clients = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for c in clients:
        c.start()
    time.sleep(2)
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in a["name"]]
    ray.kill(ray.get_actor(replicas[0]["name"], namespace=replicas[0]["namespace"]), no_restart=True)
    time.sleep(8)
    stop.set()
    for c in clients:
        c.join()
    assert len(answers) > 10
    for k, response in answers:
        assert response is not None and response.status_code == 200, getattr(response, "text", response)
        torch.testing.assert_close(np.load(io.BytesIO(response.content), allow_pickle=False), expected[k], **FP32)
