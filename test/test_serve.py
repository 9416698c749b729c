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


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    torch.manual_seed(0)
    model = TinyClassifier().eval()
    path = str(tmp_path_factory.mktemp("serve") / "tiny.pt")
    with torch.no_grad():
        torch.jit.save(torch.jit.freeze(torch.jit.trace(model, torch.rand(1, 3, 224, 224))), path)
    return model, path


@pytest.fixture(scope="module")
def server(model_file):
    """The example's application serving the small classifier (2 replicas of 1 thread) at /tiny/."""
    _, path = model_file
    # Ray counts 4 CPUs (2 here): room for a third replica (a deployment that fails) beside the two.
    url = run.start(fuse=True, port=PORT, replicas=2, threads=1, models=("tiny",), paths={"tiny": path},
                    kinds={"tiny": "image"}, cpus=4)
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


def test_responses_equal_eager_and_replicas_report_their_stats(server, model_file):
    model, _ = model_file
    for rows in (1, 3, 8):
        x = np.random.rand(rows, 3, 224, 224).astype(np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        torch.testing.assert_close(classify(server, x), expected, **FP32)
    stats = requests.get(f"{server}/tiny/stats", timeout=30).json()
    assert stats["fuse"] and stats["threads"] == 1
    assert stats["executions"] > 0 and stats["guard_failures"] == 0  # every padded batch size warmed up


@pytest.mark.parametrize("body,says", [
    (npy(np.zeros((2, 3, 224, 224), np.float64)), "float64[2, 3, 224, 224]"),
    (npy(np.zeros((3, 224, 224), np.float32)), "float32[3, 224, 224]"),
    (npy(np.zeros((2, 3, 32, 32), np.float32)), "float32[2, 3, 32, 32]"),
    (npy(np.zeros((9, 3, 224, 224), np.float32)), "1 <= B <= 8"),
    (b"not an array", "not a .npy array"),
    (pickled_npy(), "not a .npy array"),  # pickled objects are refused
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
    # killed mid-traffic, Ray starts another. Every request gets its right answer.
    from load_test import post

    model, _ = model_file
    x = np.random.rand(2, 3, 224, 224).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    answers, stop = [], threading.Event()

    def client():
        session = requests.Session()
        while not stop.is_set():
            response, _ = post(session, f"{server}/tiny/", npy(x), retries=20)
            answers.append(response)

    clients = [threading.Thread(target=client) for _ in range(3)]
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
    for response in answers:
        assert response is not None and response.status_code == 200, getattr(response, "text", response)
        torch.testing.assert_close(np.load(io.BytesIO(response.content), allow_pickle=False), expected, **FP32)
