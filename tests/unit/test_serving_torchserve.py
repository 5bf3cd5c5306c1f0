"""utils.serving.torchserve and its handler (lesson 05's optional TorchServe section), without starting a server:
the config it writes, the capability's reasons, the HTTP load loop, the loopback guard, and the handler class run
in this process on a tiny BERT. tests/server/test_serving_torchserve.py starts the real server."""

import importlib.util
import json
import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pytest

from utils.core import env, models
from utils.serving import repository, torchserve

PORTS = dict(zip(torchserve.PORTS, (18080, 18081, 18082, 17070, 17071), strict=True))


def _props(text):
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_config_binds_every_endpoint_to_loopback_and_registers_both_models():
    text = torchserve.config_properties(PORTS, {"m": {"mar": "m.mar"},
                                                "m_b8": {"mar": "m.mar", "batch_size": 8, "max_batch_delay_ms": 5}})
    props = _props(text)
    assert props["inference_address"] == "http://127.0.0.1:18080"
    assert props["management_address"] == "http://127.0.0.1:18081"
    assert props["metrics_address"] == "http://127.0.0.1:18082"
    assert props["grpc_inference_address"] == props["grpc_management_address"] == "127.0.0.1"
    assert (props["grpc_inference_port"], props["grpc_management_port"]) == ("17070", "17071")
    assert props["install_py_dep_per_model"] == "false"
    assert props["load_models"] == "m=m.mar,m_b8=m.mar"
    registered = json.loads(props["models"])
    assert registered["m"]["1.0"]["batchSize"] == 1 and registered["m"]["1.0"]["maxBatchDelay"] == 0
    assert registered["m_b8"]["1.0"] == {"marName": "m.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": 8,
                                         "maxBatchDelay": 5, "defaultVersion": True}
    assert "0.0.0.0" not in text


@pytest.mark.parametrize("ports, models, message", [
    ({k: v for k, v in PORTS.items() if k != "metrics"}, {"m": {"mar": "m.mar"}}, "ports must name"),
    (PORTS, {}, "at least one model"),
    (PORTS, {"m": {"file": "m.mar"}}, "expected keys"),
    (PORTS, {"m": {"mar": "m.mar", "batch_size": 0}}, "batch_size and workers"),
    (PORTS, {"m": {"mar": "m.mar", "max_batch_delay_ms": -1}}, "max_batch_delay_ms"),
    (PORTS, {"bad name": {"mar": "m.mar"}}, "letters, digits"),
])
def test_config_rejects_bad_input(ports, models, message):
    with pytest.raises(ValueError, match=message):
        torchserve.config_properties(ports, models)


def test_server_refuses_to_start_without_the_capability(monkeypatch, tmp_path):
    monkeypatch.setitem(env.capabilities(), "torchserve", env.Capability("torchserve", False, "no java (test)"))
    with pytest.raises(torchserve.TorchServeError, match="no java \\(test\\)"):
        torchserve.TorchServe(tmp_path, {"m": {"mar": "m.mar"}})


def test_server_checks_the_model_store(monkeypatch, tmp_path):
    monkeypatch.setitem(env.capabilities(), "torchserve", env.Capability("torchserve", True, "fake"))
    with pytest.raises(FileNotFoundError, match="not a folder"):
        torchserve.TorchServe(tmp_path / "missing", {"m": {"mar": "m.mar"}})
    with pytest.raises(FileNotFoundError, match="torch-model-archiver"):
        torchserve.TorchServe(tmp_path, {"m": {"mar": "m.mar"}})


@pytest.mark.parametrize("packages, java, version_text, available, says", [
    (True, "/usr/bin/java", 'openjdk version "17.0.15" 2025-04-15', True, "Java 17.0.15"),
    (True, "/usr/bin/java", 'java version "1.8.0_292"', False, "Java 8; TorchServe needs 11+"),
    (True, None, "", False, "no java on PATH; install a Java 11+ runtime (Debian/Ubuntu: apt install openjdk-17"),
    (False, "/usr/bin/java", 'openjdk version "21" 2023-09-19', False, "pip install torchserve torch-model-archiver"),
    (False, None, "", False, "torchserve and torch-model-archiver not installed"),
])
def test_capability_says_what_is_missing(monkeypatch, packages, java, version_text, available, says):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(env, "distribution_version",
                        lambda m: ({"ts": ("torchserve", "0.12.0"), "model_archiver": ("torch-model-archiver", "0.12.0")}
                                   .get(m) if packages else None))
    monkeypatch.setattr(env.shutil, "which", lambda name: java if name == "java" else None)
    monkeypatch.setattr(env.Path, "is_file", lambda self: str(self) == java)
    monkeypatch.setattr(env.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], 0, stdout="", stderr=version_text))
    cap = env._torchserve()
    assert cap.available is available
    assert says in cap.reason, cap.reason


def test_http_load_counts_right_wrong_and_failed_answers():
    def send(i):
        time.sleep(0.001)
        if i % 10 == 3:
            raise ConnectionError("refused")
        return i % 10 != 7

    r = torchserve.http_load(send, concurrency=4, max_requests=50, max_seconds=30, warmup=5, label="fake")
    assert (r.requests, r.failed, r.wrong, r.ok) == (50, 5, 5, 40)
    assert len(r.latencies_ms) == 50 and all(ms > 0.5 for ms in r.latencies_ms)
    assert r.errors and r.errors[0] == "ConnectionError: refused"
    assert r.throughput == pytest.approx(40 / r.seconds)


def test_http_load_stops_at_the_time_limit_and_rejects_bad_arguments():
    r = torchserve.http_load(lambda i: time.sleep(0.05) or True, concurrency=2, max_requests=10_000, max_seconds=0.3)
    assert 2 <= r.requests <= 20 and r.seconds < 2
    with pytest.raises(ValueError, match="concurrency"):
        torchserve.http_load(lambda i: True, concurrency=0, max_requests=1, max_seconds=1)


def test_post_sends_only_to_loopback():
    with pytest.raises(ValueError, match="loopback"):
        torchserve.post("http://192.0.2.1:8080/predictions/m", "text")


# -- the handler, in this process, on a tiny BERT with MiniLM's tokenizer ------------------------------------------------


@pytest.fixture(scope="module")
def handler_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    import torch
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("handler")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(folder)  # config.json + model.safetensors
    (folder / "tokenizer.json").write_bytes((models.minilm_path() / "tokenizer.json").read_bytes())
    rng = np.random.default_rng(0)
    repository.write_classifier(folder / "classifier.npz", rng.normal(size=(32, 3)), rng.normal(size=3), ["a", "b", "c"])
    (folder / "handler.json").write_text(json.dumps({"seq_len": 16, "torch_threads": 1, "max_text_bytes": 40}))
    return folder


def _handler(folder):
    spec = importlib.util.spec_from_file_location("ts_handler_under_test", torchserve.HANDLER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    handler = module.MiniLMClassifierHandler()
    handler.initialize(SimpleNamespace(system_properties={"model_dir": str(folder)}))
    return handler


class _Context:
    def __init__(self):
        self.status = {}

    def set_response_status(self, code=200, phrase="", idx=0):
        self.status[idx] = (code, phrase)


def test_handler_batches_and_matches_the_pipeline_it_replaces(handler_dir):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    handler = _handler(handler_dir)
    texts = ["the cat sat", "stocks fell sharply today", "rain after lunch"]
    ctx = _Context()
    out = handler.handle([{"body": texts[0].encode()}, {"data": texts[1]}, {"body": {"text": texts[2]}}], ctx)
    assert ctx.status == {} and [set(o) for o in out] == [{"label", "logits"}] * 3

    tok = Tokenizer.from_file(str(handler_dir / "tokenizer.json"))
    tok.enable_padding(length=16)
    tok.enable_truncation(max_length=16)
    enc = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    with torch.inference_mode():
        hidden = AutoModel.from_pretrained(handler_dir).eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    emb = torch.nn.functional.normalize(models.mean_pool(hidden, mask), dim=1).numpy()
    with np.load(handler_dir / "classifier.npz") as clf:
        want = emb @ clf["weight"] + clf["bias"]
    got = np.array([o["logits"] for o in out])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    assert [o["label"] for o in out] == [["a", "b", "c"][k] for k in want.argmax(1)]
    one = handler.handle([{"body": texts[1].encode()}], _Context())  # alone, not in a batch: the same answer
    np.testing.assert_allclose(one[0]["logits"], got[1], atol=1e-5, rtol=1e-5)


def test_handler_answers_a_bad_request_with_400_and_the_rest_normally(handler_dir):
    handler = _handler(handler_dir)
    ctx = _Context()
    out = handler.handle([{"body": b"x" * 41}, {"body": b"fine"}, {"body": b""}, {"body": b"\xff\xfe"}], ctx)
    assert sorted(ctx.status) == [0, 2, 3] and {code for code, _ in ctx.status.values()} == {400}
    assert "at most 40" in out[0]["error"] and "request body" in out[2]["error"]
    assert set(out[1]) == {"label", "logits"}
    only_bad = _Context()
    assert handler.handle([{"body": b"x" * 41}], only_bad) == [{"error": "the text is 41 bytes; this model accepts at most 40"}]
    assert only_bad.status == {0: (400, "the text is 41 bytes; this model accepts at most 40")}
