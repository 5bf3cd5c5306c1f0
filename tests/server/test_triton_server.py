"""The generated Python models on the real bundled tritonserver (lesson 05): tokenization, classification, errors,
load generation with checked responses, statistics, metrics, loopback binding and a clean stop.

The encoder (ONNX Runtime) is left to the lesson notebook; these models load in a few seconds.
"""

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from utils import load, triton, triton_repo
from utils.core import env, models

pytestmark = pytest.mark.skipif(not env.has("tritonserver"), reason="needs the tritonserver binary (nvidia-pytriton)")

SEQ = 16
CLASSES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    repo = root / "repo"
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(triton_repo.HIDDEN_SIZE, len(CLASSES))).astype(np.float32)
    bias = rng.normal(size=len(CLASSES)).astype(np.float32)
    clf = triton_repo.write_classifier(root / "clf.npz", weight, bias, CLASSES)
    batching = {"max_queue_delay_microseconds": 0}
    cfg = triton_repo.preprocess_config("preprocess", seq_len=SEQ, max_batch_size=8, dynamic_batching=batching,
                                        max_text_bytes=64)
    triton_repo.write_model(repo, cfg, {1: {"model.py": triton_repo.PREPROCESS_PY,
                                            "tokenizer.json": models.minilm_path() / "tokenizer.json"}})
    cfg = triton_repo.postprocess_config("postprocess", num_classes=len(CLASSES), max_batch_size=8,
                                         dynamic_batching=batching)
    triton_repo.write_model(repo, cfg, {1: {"model.py": triton_repo.POSTPROCESS_PY, "classifier.npz": clf}})
    server = triton.TritonServer(repo, name="test_triton_server", extra_args=["--disable-auto-complete-config"])
    server.start()
    pids = [p.pid for p in server.processes()]
    try:
        yield server, weight, bias, pids
    finally:
        server.stop()


def _reference(hidden, mask, weight, bias):
    m = mask[:, :, None].astype(np.float32)
    pooled = (hidden * m).sum(1) / m.sum(1)
    emb = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    return emb @ weight + bias


def _text(sentences):
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("TEXT", [len(sentences), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=object))
    return inp


def test_loopback_only_and_stubs_started(served):
    server, _, _, pids = served
    addresses = server.listening_addresses()
    assert len(addresses) == 3 and all(triton.is_loopback(ip) for ip, _ in addresses)
    assert len(pids) >= 3  # the server and one stub per model


def test_cpu_seconds_names_each_model_and_grows_with_work(served):
    import tritonclient.grpc as grpcclient

    server = served[0]
    before = server.cpu_seconds()
    assert set(before) == {"tritonserver", "preprocess", "postprocess"}
    assert all(v >= 0 for v in before.values())
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for _ in range(200):
            client.infer("preprocess", [_text(["The striker scored twice."])])
    after = server.cpu_seconds()
    assert after["preprocess"] > before["preprocess"]  # the stub that tokenized did the work
    assert after["tritonserver"] > before["tritonserver"]


def test_preprocess_matches_the_hugging_face_tokenizer(served):
    import tritonclient.grpc as grpcclient

    server = served[0]
    sentences = ["The striker scored twice.", "Restart the router if the connection keeps dropping."]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        res = client.infer("preprocess", [_text(sentences)])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(models.minilm_path()))
    want = tokenizer(sentences, padding="max_length", truncation=True, max_length=SEQ, return_tensors="np")
    np.testing.assert_array_equal(res.as_numpy("input_ids"), want["input_ids"])
    np.testing.assert_array_equal(res.as_numpy("attention_mask"), want["attention_mask"])
    assert not res.as_numpy("token_type_ids").any()


def test_postprocess_classifies_like_numpy(served):
    import tritonclient.grpc as grpcclient

    server, weight, bias = served[:3]
    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(5, SEQ, triton_repo.HIDDEN_SIZE)).astype(np.float32)
    mask = (np.arange(SEQ)[None, :] < rng.integers(2, SEQ, size=(5, 1))).astype(np.int64)
    inputs = [grpcclient.InferInput("last_hidden_state", list(hidden.shape), "FP32"),
              grpcclient.InferInput("attention_mask", list(mask.shape), "INT64")]
    inputs[0].set_data_from_numpy(hidden)
    inputs[1].set_data_from_numpy(mask)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        res = client.infer("postprocess", inputs)
    want = _reference(hidden, mask, weight, bias)
    np.testing.assert_allclose(res.as_numpy("LOGITS"), want, atol=1e-4, rtol=1e-4)
    assert [x.decode() for x in res.as_numpy("LABEL")[:, 0]] == [CLASSES[k] for k in want.argmax(1)]


def test_oversized_text_is_a_400_and_the_server_stays_ready(served):
    server = served[0]
    body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["x" * 100]}]}
    req = urllib.request.Request(f"http://{server.http_url}/v2/models/preprocess/infer",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 400
    assert "at most 64" in info.value.read().decode()
    assert server.is_ready()


def test_load_counts_checks_and_bounds(served):
    server, weight, bias = served[:3]
    rng = np.random.default_rng(2)
    requests, expected = [], []
    for _ in range(6):
        hidden = rng.normal(size=(1, SEQ, triton_repo.HIDDEN_SIZE)).astype(np.float32)
        mask = np.ones((1, SEQ), dtype=np.int64)
        requests.append({"last_hidden_state": hidden, "attention_mask": mask})
        expected.append({"LOGITS": _reference(hidden, mask, weight, bias).astype(np.float32)})
    before = triton.model_statistics(server.grpc_url, "postprocess")
    metrics_before = triton.scrape_metrics(server.metrics_url)
    r = load.run_load(server.grpc_url, "postprocess", requests, expected=expected, concurrency=4, max_requests=40,
                      warmup=4)
    assert (r.requests, r.failed, r.wrong) == (40, 0, 0)
    assert r.throughput > 0 and r.p50 <= r.p95 <= r.p99
    after = triton.model_statistics(server.grpc_url, "postprocess")
    assert after["inference_count"] - before["inference_count"] == 44  # warm-up included
    hist = triton.batch_histogram(before, after)
    assert sum(size * n for size, n in hist.items()) == 44
    per = triton.per_request_ms(metrics_before, triton.scrape_metrics(server.metrics_url), "postprocess")
    assert per["requests"] == 44 and per["compute_ms"] > 0
    # wrong expectations are counted as wrong, not as failures
    bad = [{"LOGITS": e["LOGITS"] + 1.0} for e in expected]
    r = load.run_load(server.grpc_url, "postprocess", requests, expected=bad, concurrency=2, max_requests=6)
    assert (r.failed, r.wrong) == (0, 6) and r.errors
    # the time bound ends a run long before its request bound
    t0 = time.perf_counter()
    r = load.run_load(server.grpc_url, "postprocess", requests, concurrency=2, max_requests=10**9, max_seconds=1.0)
    assert time.perf_counter() - t0 < 10 and 0 < r.requests < 10**9
    # an unknown model fails every request, with the server's message
    r = load.run_load(server.grpc_url, "nope", requests, concurrency=1, max_requests=3)
    assert r.failed == 3 and "unknown model" in r.errors[0].lower()


def test_stop_leaves_no_process(served):
    import psutil

    server, _, _, pids = served
    server.stop()
    server.stop()  # idempotent
    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive
    assert not server.is_ready()
