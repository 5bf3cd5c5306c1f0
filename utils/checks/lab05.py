"""Checks for labs/05_triton_ensemble_lab.ipynb (lesson 05: a Triton config by hand, served and tuned)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from utils.checks import LabCheckFailed, call, expect, passed
from utils.core import env, models, onnx_io, tritonserver
from utils.core.data import labeled_sentences
from utils.serving import loadgen, repository

SEQ_LEN = 16  # the lesson's padding length: the longest sentence of utils/core/data/sentences.csv, rounded up to 8
TENSORS_IN = ("input_ids", "attention_mask", "token_type_ids")
TARGET_GAIN = 1.2  # tuned throughput over the baseline's, at CONCURRENCY, with p95 no higher than the baseline's
CONCURRENCY = 8


def work_dir() -> Path:
    path = env.build_dir() / "triton" / "lab05"
    path.mkdir(parents=True, exist_ok=True)
    return path


def minilm_onnx() -> Path:
    """The MiniLM ONNX file: the lesson's export when it exists, otherwise exported now (about 10 s)."""
    for candidate in (env.build_dir() / "triton" / "05" / "minilm.onnx", work_dir() / "minilm.onnx"):
        if candidate.is_file():
            return candidate
    return onnx_io.export_minilm(work_dir() / "minilm.onnx", dynamo=False)


def _parse(text, what: str):
    expect(isinstance(text, str), f"{what} should return the config.pbtxt text as a str, got {type(text).__name__}")
    try:
        return repository.parse_pbtxt(text)
    except ValueError as exc:
        raise LabCheckFailed(f"{what}: Triton's schema rejects this text: {exc}\n--- text ---\n{text}") from None


def _semantics(cfg, *, name, max_batch_size, batching, preferred=(), delay_us=0, instances=1, threads=1, spin=True,
               what="the config") -> None:
    """Compare a parsed ModelConfig with what the encoder needs; raise LabCheckFailed naming the first difference."""
    from tritonclient.grpc import model_config_pb2 as mc

    expect(cfg.name == name, f"{what}: name should be {name!r}, got {cfg.name!r}")
    expect(cfg.backend == "python" and not cfg.platform,
           f"{what}: the encoder runs in the Python backend: backend: \"python\" (got backend {cfg.backend!r}, "
           f"platform {cfg.platform!r})")
    expect(cfg.max_batch_size == max_batch_size,
           f"{what}: max_batch_size should be {max_batch_size}, got {cfg.max_batch_size}")
    ins = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input}
    want_in = {n: ("TYPE_INT64", [-1]) for n in TENSORS_IN}
    expect(ins == want_in, f"{what}: inputs should be {want_in} (dims exclude the batch dimension), got {ins}")
    outs = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output}
    want_out = {"last_hidden_state": ("TYPE_FP32", [-1, 384])}
    expect(outs == want_out, f"{what}: outputs should be {want_out}, got {outs}")
    has_db = cfg.HasField("dynamic_batching")
    expect(has_db == batching, f"{what}: dynamic_batching should be {'present' if batching else 'absent'}, it is "
                               f"{'present' if has_db else 'absent'}")
    if batching:
        got_pref = list(cfg.dynamic_batching.preferred_batch_size)
        expect(got_pref == list(preferred), f"{what}: preferred_batch_size should be {list(preferred)}, got {got_pref}")
        expect(cfg.dynamic_batching.max_queue_delay_microseconds == delay_us,
               f"{what}: max_queue_delay_microseconds should be {delay_us}, got "
               f"{cfg.dynamic_batching.max_queue_delay_microseconds}")
    groups = [(g.count, mc.ModelInstanceGroup.Kind.Name(g.kind)) for g in cfg.instance_group]
    expect(groups == [(instances, "KIND_CPU")],
           f"{what}: instance_group should be one group with count {instances} and kind KIND_CPU, got {groups}")
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    want_params = {"intra_op_threads": str(threads)}
    if not spin:
        want_params["allow_spinning"] = "0"
    expect(params == want_params, f"{what}: parameters should be {want_params} (string values), got {params}")


CASES = [
    dict(name="encoder", max_batch_size=16, batching=False),
    dict(name="enc_b", max_batch_size=32, batching=True, preferred=(8, 16), delay_us=500, instances=2, threads=1),
    dict(name="enc_c", max_batch_size=8, batching=True, threads=2, spin=False),
]


def check_config_text(pbtxt_fn) -> None:
    """The learner's config.pbtxt text parses through Triton's schema and says exactly what each case asks."""
    for case in CASES:
        text = call(pbtxt_fn, **case, what=f"encoder_pbtxt(**{case})")
        cfg = _parse(text, f"encoder_pbtxt(**{case})")
        _semantics(cfg, **case, what=f"encoder_pbtxt(**{case})")
    passed("config text", f"{len(CASES)} configs parse through the ModelConfig schema and match")


def check_mean_batch(mean_batch_fn) -> None:
    """Mean batch size from two statistics snapshots (the shape utils.core.tritonserver.model_statistics returns)."""
    before = {"inference_count": 10, "execution_count": 10, "batches": {1: 10}}
    after = {"inference_count": 10 + 6 + 16 + 24, "execution_count": 10 + 6 + 2 + 3, "batches": {1: 16, 8: 5}}
    got = call(mean_batch_fn, before, after, what="mean_batch(before, after)")
    want = (6 + 16 + 24) / (6 + 2 + 3)
    expect(isinstance(got, int | float) and abs(got - want) < 1e-9,
           f"mean_batch should be (requests run) / (executions) between the snapshots = {want:.4f}, got {got!r}. "
           "Use the differences of inference_count and execution_count, not the totals.")
    idle = call(mean_batch_fn, after, after, what="mean_batch(after, after)")
    expect(idle == 0, f"with no executions between the snapshots mean_batch should return 0, got {idle!r}")
    passed("mean batch size", f"{want:.3f} from the snapshots")


def _encoder_requests(n: int = 48):
    """n single-sentence encoder requests (token ids padded to SEQ_LEN) and the hidden states ONNX Runtime gives."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(models.minilm_path() / "tokenizer.json"))
    tok.enable_truncation(max_length=SEQ_LEN)
    tok.enable_padding(length=SEQ_LEN, pad_id=0, pad_token="[PAD]")
    texts = labeled_sentences()[0][:n]
    enc = tok.encode_batch(texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    hidden = onnx_io.ort_session(minilm_onnx(), threads=1).run(["last_hidden_state"], feeds)[0]
    requests = [{k: v[i:i + 1] for k, v in feeds.items()} for i in range(n)]
    expected = [{"last_hidden_state": hidden[i:i + 1]} for i in range(n)]
    return requests, expected


def check_tuned(tuning_fn, pbtxt_fn, *, smoke: bool = True) -> dict:
    """Serve the learner's tuned encoder next to a naive baseline and measure both at CONCURRENCY.

    Baseline: no dynamic batching, one instance, ONNX Runtime's default threads (spinning). Target: throughput at
    least TARGET_GAIN x the baseline's with p95 no higher than the baseline's, every response correct.
    """
    knobs = call(tuning_fn, what="my_tuning()")
    required = {"max_batch_size", "batching"}
    optional = {"preferred", "delay_us", "instances", "threads", "spin"}
    expect(isinstance(knobs, dict) and required <= set(knobs) <= required | optional,
           f"my_tuning() should return a dict with {sorted(required)} and optionally {sorted(optional)}; "
           f"got {knobs!r}")
    text = call(pbtxt_fn, "tuned", **knobs, what="encoder_pbtxt('tuned', **my_tuning())")
    cfg = _parse(text, "encoder_pbtxt('tuned', **my_tuning())")
    _semantics(cfg, name="tuned", **knobs, what="the tuned config")
    if not env.has("tritonserver"):
        raise LabCheckFailed(f"this check serves the model and needs tritonserver: "
                             f"{env.capabilities()['tritonserver'].reason}")
    onnx_path = minilm_onnx()
    repo = work_dir() / "repository"
    shutil.rmtree(repo, ignore_errors=True)
    repository.write_encoder(repo, cfg, onnx_path)
    baseline = repository.encoder_config("baseline", max_batch_size=max(cfg.max_batch_size, 1), intra_op_threads=0)
    repository.write_encoder(repo, baseline, onnx_path)
    requests, expected = _encoder_requests()
    n_req, rounds = (96, 2) if smoke else (400, 3)
    results = {"baseline": [], "tuned": []}
    args = ["--disable-auto-complete-config", "--backend-config=python,shm-default-byte-size=4194304"]
    t0 = time.perf_counter()
    with tritonserver.TritonServer(repo, name="lab05", extra_args=args) as server:
        for _ in range(rounds):
            for model in results:
                r = loadgen.run_load(server.grpc_url, model, requests, expected=expected, concurrency=CONCURRENCY,
                                  max_requests=n_req, max_seconds=20.0, warmup=CONCURRENCY, atol=1e-3, rtol=1e-3,
                                  label=model)
                expect(r.failed == 0 and r.wrong == 0,
                       f"{model}: {r.failed} failed and {r.wrong} wrong responses; first errors: {r.errors[:2]}")
                results[model].append(r)
        stats = tritonserver.model_statistics(server.grpc_url, "tuned")
    best = {m: max(rs, key=lambda r: r.throughput) for m, rs in results.items()}
    base, tuned = best["baseline"], best["tuned"]
    gain = tuned.throughput / base.throughput
    mean_batch = stats["inference_count"] / max(stats["execution_count"], 1)
    summary = (f"baseline {base.throughput:.1f} req/s p95 {base.p95:.1f} ms; tuned {tuned.throughput:.1f} req/s "
               f"p95 {tuned.p95:.1f} ms ({gain:.2f}x, mean batch {mean_batch:.1f}; {time.perf_counter() - t0:.0f} s)")
    met = gain >= TARGET_GAIN and tuned.p95 <= base.p95
    if smoke:
        # Smoke mode is what the test suite runs on shared, noisy machines: correctness is enforced above, the speed
        # target is reported, not enforced (timing thresholds belong in recorded results, not pass/fail tests).
        verdict = "met" if met else "NOT met"
        passed("tuned encoder (smoke: speed target reported, enforced in full mode)", f"{summary}; target {verdict}")
        return {"gain": gain, "baseline": base, "tuned": tuned, "mean_batch": mean_batch}
    expect(met,
           f"not yet: {summary}. The target is >= {TARGET_GAIN}x the baseline's throughput with p95 no higher. "
           "Try dynamic batching with a max_batch_size of at least the concurrency, and threads/instances that fit "
           "this machine's cores (is ONNX Runtime spinning on cores the other processes need?).")
    passed("tuned encoder", summary)
    return {"gain": gain, "baseline": base, "tuned": tuned, "mean_batch": mean_batch}
