"""The lesson's Python-backend programs (utils/triton_models) on the real bundled tritonserver (lesson 05):
tokenization, encoding with batching, classification, errors, warm-up, the response cache, load generation with
checked responses, statistics, metrics, loopback binding and a clean stop.

The encoder runs a tiny ONNX graph with MiniLM's tensor names (an embedding lookup masked by attention_mask) instead
of MiniLM itself, so every model loads in a few seconds; the lesson notebook serves the real one.
"""

import json
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from utils.core import env, models, tritonserver
from utils.serving import loadgen, repository

pytestmark = pytest.mark.skipif(not env.has("tritonserver"), reason="needs the tritonserver binary (nvidia-pytriton)")

SEQ = 16
CLASSES = ["a", "b", "c"]
VOCAB = 32
AT_START = {}  # the encoder's statistics when the server reported ready, before any test sent a request


def _tiny_encoder(path):
    """last_hidden_state[b, s] = TABLE[input_ids[b, s]] * attention_mask[b, s]; token_type_ids is an unused input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.arange(VOCAB * repository.HIDDEN_SIZE, dtype=np.float32).reshape(VOCAB, -1) / 1000
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "S"]) for n in repository.ENCODER_INPUTS]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["B", "S", repository.HIDDEN_SIZE])
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["emb"]),
             helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"]),
             helper.make_node("Mul", ["emb", "mask3"], ["last_hidden_state"])]
    graph = helper.make_graph(nodes, "tiny_encoder", ins, [out], initializer=[
        numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([-1], np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9  # ONNX Runtime reads up to 13 (onnx writes newer by default)
    onnx.save(model, path)
    return path, table


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    repo = root / "repo"
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(repository.HIDDEN_SIZE, len(CLASSES))).astype(np.float32)
    bias = rng.normal(size=len(CLASSES)).astype(np.float32)
    clf = repository.write_classifier(root / "clf.npz", weight, bias, CLASSES)
    batching = {"max_queue_delay_microseconds": 0}
    cfg = repository.preprocess_config("preprocess", seq_len=SEQ, max_batch_size=8, dynamic_batching=batching,
                                        max_text_bytes=64)
    files = {1: {"model.py": repository.model_source("preprocess"),
                 "tokenizer.json": models.minilm_path() / "tokenizer.json"}}
    repository.write_model(repo, cfg, files)
    cfg.name = "preprocess_cached"  # the same model behind the server's response cache
    cfg.response_cache.enable = True
    repository.write_model(repo, cfg, files)
    cfg = repository.postprocess_config("postprocess", num_classes=len(CLASSES), max_batch_size=8,
                                         dynamic_batching=batching)
    repository.write_model(repo, cfg, {1: {"model.py": repository.model_source("postprocess"), "classifier.npz": clf}})
    onnx_path, table = _tiny_encoder(root / "tiny_encoder.onnx")
    cfg = repository.encoder_config("encoder", max_batch_size=8, intra_op_threads=1, allow_spinning=False,
                                     dynamic_batching={"preferred_batch_size": [4], "max_queue_delay_microseconds": 200_000},
                                     warmup_batch_sizes=(1, 4), seq_len=SEQ)
    repository.write_encoder(repo, cfg, onnx_path)
    server = tritonserver.TritonServer(repo, name="test_triton_server", extra_args=["--disable-auto-complete-config"],
                                 response_cache_bytes=1 << 20)
    server.start()
    AT_START["encoder"] = tritonserver.model_statistics(server.grpc_url, "encoder")
    pids = [p.pid for p in server.processes()]
    try:
        yield server, weight, bias, pids, table
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
    server, _, _, pids, _ = served
    addresses = server.listening_addresses()
    assert len(addresses) == 3 and all(tritonserver.is_loopback(ip) for ip, _ in addresses)
    assert len(pids) >= 3  # the server and one stub per model


def test_cpu_seconds_names_each_model_and_grows_with_work(served):
    import tritonclient.grpc as grpcclient

    server = served[0]
    before = server.cpu_seconds()
    assert set(before) == {"tritonserver", "preprocess", "preprocess_cached", "postprocess", "encoder"}
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


def _encoder_inputs(module, ids, mask):
    inputs = []
    for name, array in (("input_ids", ids), ("attention_mask", mask), ("token_type_ids", np.zeros_like(ids))):
        t = module.InferInput(name, list(array.shape), "INT64")
        t.set_data_from_numpy(array)
        inputs.append(t)
    return inputs


def test_encoder_batches_concurrent_requests_into_one_call(served):
    import asyncio

    import tritonclient.grpc.aio as grpcaio

    server, table = served[0], served[4]
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(4, SEQ)).astype(np.int64)
    mask = (np.arange(SEQ)[None, :] < rng.integers(2, SEQ, size=(4, 1))).astype(np.int64)
    before = tritonserver.model_statistics(server.grpc_url, "encoder")

    async def four_at_once():
        async with grpcaio.InferenceServerClient(server.grpc_url) as client:
            return await asyncio.gather(*(client.infer("encoder", _encoder_inputs(grpcaio, ids[i:i + 1], mask[i:i + 1]))
                                          for i in range(4)))

    results = asyncio.run(four_at_once())
    for i, res in enumerate(results):  # each request gets its own slice of the batch's output
        np.testing.assert_array_equal(res.as_numpy("last_hidden_state")[0], table[ids[i]] * mask[i][:, None])
    after = tritonserver.model_statistics(server.grpc_url, "encoder")
    # preferred size 4 with a long queue delay: the four requests ran as one execution of batch 4
    assert tritonserver.batch_histogram(before, after) == {4: 1}


def test_encoder_warmup_ran_before_ready(served):
    server = served[0]
    cfg = repository.read_config(server.model_repository / "encoder")
    assert [w.batch_size for w in cfg.model_warmup] == [1, 4]
    # before any client request, the server had already run one batch of each warm-up size through model.py
    assert AT_START["encoder"]["batches"] == {1: 1, 4: 1}


def test_response_cache_hit_returns_the_same_bytes(served):
    import tritonclient.grpc as grpcclient

    server = served[0]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        first = client.infer("preprocess_cached", [_text(["A sentence nobody sent before."])])
        second = client.infer("preprocess_cached", [_text(["A sentence nobody sent before."])])
    assert second.get_response().raw_output_contents == first.get_response().raw_output_contents
    stats = tritonserver.model_statistics(server.grpc_url, "preprocess_cached")
    assert (stats["cache_misses"], stats["cache_hits"]) == (1, 1)
    assert stats["execution_count"] == 1  # the hit never reached model.py


def test_postprocess_classifies_like_numpy(served):
    import tritonclient.grpc as grpcclient

    server, weight, bias = served[:3]
    rng = np.random.default_rng(1)
    hidden = rng.normal(size=(5, SEQ, repository.HIDDEN_SIZE)).astype(np.float32)
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
        hidden = rng.normal(size=(1, SEQ, repository.HIDDEN_SIZE)).astype(np.float32)
        mask = np.ones((1, SEQ), dtype=np.int64)
        requests.append({"last_hidden_state": hidden, "attention_mask": mask})
        expected.append({"LOGITS": _reference(hidden, mask, weight, bias).astype(np.float32)})
    before = tritonserver.model_statistics(server.grpc_url, "postprocess")
    metrics_before = tritonserver.scrape_metrics(server.metrics_url)
    r = loadgen.run_load(server.grpc_url, "postprocess", requests, expected=expected, concurrency=4, max_requests=40,
                      warmup=4, snapshot=lambda: tritonserver.model_statistics(server.grpc_url, "postprocess"))
    assert (r.requests, r.failed, r.wrong) == (40, 0, 0)
    window_before, window_after = r.snapshots  # taken around the measured window: the warm-up is outside it
    assert window_after["inference_count"] - window_before["inference_count"] == 40
    assert window_before["inference_count"] - before["inference_count"] == 4
    assert r.client_cpu_s > 0
    assert r.throughput > 0 and r.p50 <= r.p95 <= r.p99
    after = tritonserver.model_statistics(server.grpc_url, "postprocess")
    assert after["inference_count"] - before["inference_count"] == 44  # warm-up included
    hist = tritonserver.batch_histogram(before, after)
    assert sum(size * n for size, n in hist.items()) == 44
    per = tritonserver.per_request_ms(metrics_before, tritonserver.scrape_metrics(server.metrics_url), "postprocess")
    assert per["requests"] == 44 and per["compute_ms"] > 0
    # wrong expectations are counted as wrong, not as failures
    bad = [{"LOGITS": e["LOGITS"] + 1.0} for e in expected]
    r = loadgen.run_load(server.grpc_url, "postprocess", requests, expected=bad, concurrency=2, max_requests=6)
    assert (r.failed, r.wrong) == (0, 6) and r.errors
    # the time bound ends a run long before its request bound
    t0 = time.perf_counter()
    r = loadgen.run_load(server.grpc_url, "postprocess", requests, concurrency=2, max_requests=10**9, max_seconds=1.0)
    assert time.perf_counter() - t0 < 10 and 0 < r.requests < 10**9
    # an unknown model fails every request, with the server's message
    r = loadgen.run_load(server.grpc_url, "nope", requests, concurrency=1, max_requests=3)
    assert r.failed == 3 and "unknown model" in r.errors[0].lower()


def test_stop_leaves_no_process(served):
    import psutil

    server, _, _, pids, _ = served
    server.stop()
    server.stop()  # idempotent
    time.sleep(0.5)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive
    assert not server.is_ready()
