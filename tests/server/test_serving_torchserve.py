"""The real TorchServe (lesson 05's optional section) serving the lesson's handler on a tiny BERT: archive, start on
loopback, REST answers equal to the handler's in-process answers, a 400 for a bad request, batching, a clean stop,
and no java left when the process that started the server is killed. Skipped, saying why, where the torchserve and
torch-model-archiver packages or a Java 11+ runtime are missing."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from utils.core import env, models, tritonserver
from utils.serving import repository, torchserve

pytestmark = pytest.mark.skipif(not env.has("torchserve"), reason=f"TorchServe cannot run here: "
                                f"{env.capabilities()['torchserve'].reason}")

TEXTS = ["the cat sat", "stocks fell sharply today", "rain after lunch", "a goal in the last minute"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import torch
    from transformers import BertConfig, BertModel

    root = tmp_path_factory.mktemp("torchserve")
    files = root / "files"
    files.mkdir()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).eval().save_pretrained(files)
    (files / "tokenizer.json").write_bytes((models.minilm_path() / "tokenizer.json").read_bytes())
    rng = np.random.default_rng(0)
    repository.write_classifier(files / "classifier.npz", rng.normal(size=(32, 3)), rng.normal(size=3), ["a", "b", "c"])
    (files / "handler.json").write_text(json.dumps({"seq_len": 16, "torch_threads": 1, "max_text_bytes": 40}))
    extra = ",".join(str(files / n) for n in ("config.json", "model.safetensors", "tokenizer.json", "classifier.npz",
                                              "handler.json"))
    (root / "store").mkdir()
    done = subprocess.run([*torchserve.ARCHIVER, "--model-name", "tiny", "--version", "1.0", "--handler",
                           str(torchserve.HANDLER), "--extra-files", extra, "--export-path", str(root / "store"),
                           "--archive-format", "zip-store"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return root / "store"


@pytest.fixture(scope="module")
def served(store):
    server = torchserve.TorchServe(store, {"tiny": {"mar": "tiny.mar"},
                                           "tiny_b4": {"mar": "tiny.mar", "batch_size": 4, "max_batch_delay_ms": 50}},
                                   name="test")
    with server:
        yield server


def _running(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _ask(server, model, text):
    status, body = torchserve.post(server.predictions_url(model), text)
    return status, json.loads(body)


def test_every_endpoint_on_loopback_and_workers_ready(served):
    addresses = served.listening_addresses()
    assert len(addresses) == 5 and all(tritonserver.is_loopback(ip) for ip, _ in addresses)
    assert {port for _, port in addresses} == set(served.ports.values())
    for model, batch in (("tiny", 1), ("tiny_b4", 4)):
        desc = served.model_status(model)
        assert desc["batchSize"] == batch and [w["status"] for w in desc["workers"]] == ["READY"]
    assert served.log_lines(r"WORKER_STARTED -> WORKER_MODEL_LOADED")


def test_rest_answers_match_and_batching_does_not_change_them(served):
    single = [_ask(served, "tiny", t) for t in TEXTS]
    assert all(status == 200 for status, _ in single)
    f0 = len(served.log_lines(r"W-\d+-tiny_b4_\S+ \S+ - Flushing req\.cmd PREDICT"))
    batched = {}

    def send(i):
        batched[i] = _ask(served, "tiny_b4", TEXTS[i])
        return batched[i][0] == 200

    run = torchserve.http_load(send, concurrency=4, max_requests=len(TEXTS), max_seconds=60)
    assert run.ok == len(TEXTS)
    flushed = len(served.log_lines(r"W-\d+-tiny_b4_\S+ \S+ - Flushing req\.cmd PREDICT")) - f0
    assert 1 <= flushed < len(TEXTS), "four requests in flight with a 50 ms delay should form at least one batch"
    for i, (_, answer) in enumerate(single):
        np.testing.assert_allclose(batched[i][1]["logits"], answer["logits"], atol=1e-5, rtol=1e-5)
        assert batched[i][1]["label"] == answer["label"]


def test_a_bad_request_is_a_400_and_the_server_stays_healthy(served):
    status, answer = _ask(served, "tiny", "x" * 41)
    assert status == 400 and "at most 40" in answer["error"]
    status, _ = torchserve.post(served.predictions_url("no_such_model"), "hi")
    assert status == 404
    assert served.is_healthy() and _ask(served, "tiny", "fine")[0] == 200


def test_stop_leaves_nothing(store):
    server = torchserve.TorchServe(store, {"tiny": {"mar": "tiny.mar"}}, name="test_stop").start()
    pids = [p.pid for p in server.processes()]
    assert any(p.name() == "java" for p in server.processes())
    server.stop()
    server.stop()  # twice is fine
    assert server.leftovers() == {"processes": [], "ports": []}
    assert not _running(pids)
    assert not server.tmp_dir.exists()


def test_java_dies_with_the_process_that_started_it(store, tmp_path):
    script = ("import sys, time; from utils.serving import torchserve; "
              f"s = torchserve.TorchServe({str(store)!r}, {{'tiny': {{'mar': 'tiny.mar'}}}}, name='test_orphan').start(); "
              "print(' '.join(str(p.pid) for p in s.processes()), flush=True); time.sleep(120)")
    kernel = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=env.repo_root(),
                              env=env.child_environ())
    pids = []
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) >= 3, "launcher, java and a worker"
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(timeout=10)
        deadline = time.monotonic() + 30
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = _running(pids)
            time.sleep(0.2)
        assert not alive, f"still running after the starting process was killed: {alive}"
    finally:
        if kernel.poll() is None:
            kernel.kill()
        for pid in _running(pids):  # only what this test started, if the check above failed
            psutil.Process(pid).kill()


def test_a_handler_that_fails_to_load_is_an_error_with_its_traceback(tmp_path):
    handler = tmp_path / "broken_handler.py"
    handler.write_text("class Broken:\n    def initialize(self, context):\n"
                       "        raise RuntimeError('classifier.npz is not in the archive (test)')\n\n"
                       "    def handle(self, data, context):\n        return data\n")
    (tmp_path / "store").mkdir()
    done = subprocess.run([*torchserve.ARCHIVER, "--model-name", "broken", "--version", "1.0", "--handler", str(handler),
                           "--export-path", str(tmp_path / "store"), "--archive-format", "zip-store"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    server = torchserve.TorchServe(tmp_path / "store", {"broken": {"mar": "broken.mar"}}, name="test_broken",
                                   startup_timeout=120)
    t0 = time.monotonic()
    with pytest.raises(torchserve.TorchServeError, match="classifier.npz is not in the archive") as info:
        server.start()
    assert time.monotonic() - t0 < 60, "the first failed load ends the wait (TorchServe itself retries forever)"
    assert "Traceback" in str(info.value) and "broken_handler.py" in str(info.value)
    assert server.leftovers() == {"processes": [], "ports": []}
