"""Checks for labs/05_triton_ensemble_lab.ipynb (lesson 05: a Triton config by hand, served and tuned)."""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from utils.checks import LabCheckFailed, call, expect, expect_target, figure, no_reference, passed
from utils.core import bench, env, models, onnx_io, tritonserver, verdict
from utils.core.data import labeled_sentences
from utils.serving import loadgen, repository

SEQ_LEN = 16  # the lesson's padding length: the longest sentence of utils/core/data/sentences.csv, rounded up to 8
TENSORS_IN = ("input_ids", "attention_mask", "token_type_ids")
# tuned throughput over the baseline's at CONCURRENCY, per interleaved round: the whole interval must clear it, and
# the tuned p95 must not be slower than the baseline's (utils.core.verdict), in smoke mode as in full mode
TARGET_GAIN = 1.2
CONCURRENCY = 8
ROUNDS = {True: (3, 2.0), False: (5, 5.0)}  # smoke -> (interleaved rounds, seconds of load per model and round)
# the course's config builder: a config written through it is the lesson's answer, not the learner's text
_REFERENCE_CONFIG = (repository.model_config, repository.encoder_config, repository.to_pbtxt, repository.tensor)


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


def _config_text(pbtxt_fn, *args, what: str, **kwargs):
    with no_reference(*_REFERENCE_CONFIG, what="your encoder_pbtxt"):
        return call(pbtxt_fn, *args, what=what, **kwargs)


def check_config_text(pbtxt_fn) -> None:
    """The learner's config.pbtxt text parses through Triton's schema and says exactly what each case asks; it is
    written by the learner, not by the course's config builder."""
    for case in CASES:
        text = _config_text(pbtxt_fn, **case, what=f"encoder_pbtxt(**{case})")
        cfg = _parse(text, f"encoder_pbtxt(**{case})")
        _semantics(cfg, **case, what=f"encoder_pbtxt(**{case})")
    passed("config text", f"{len(CASES)} configs parse through the ModelConfig schema and match")


def check_mean_batch(mean_batch_fn) -> None:
    """Mean batch size from two statistics snapshots (the shape utils.core.tritonserver.model_statistics returns)."""
    before = {"inference_count": 10, "execution_count": 10, "batches": {1: 10}}
    after = {"inference_count": 10 + 6 + 16 + 24, "execution_count": 10 + 6 + 2 + 3, "batches": {1: 16, 8: 5}}
    got = call(mean_batch_fn, before, after, what="mean_batch(before, after)")
    want = (6 + 16 + 24) / (6 + 2 + 3)
    lifetime = after["inference_count"] / after["execution_count"]
    expect(isinstance(got, int | float) and abs(got - want) < 1e-9,
           f"mean_batch(before, after) should be {want:.4f} for these snapshots, got {got!r}"
           + (": that is the mean batch since the server started, not between the two snapshots"
              if isinstance(got, int | float) and abs(got - lifetime) < 1e-9 else ""))
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


def _load_rounds(url: str, requests, expected, rounds: int, seconds: float) -> dict[str, list[dict]]:
    """Load the baseline and the tuned encoder in interleaved rounds, every response checked. A round runs baseline,
    tuned, tuned, baseline (half of `seconds` each), so a drift of the machine within the round hits both alike; a
    round's figures per model pool its two halves: {"throughput": correct responses per second, "p95": ms}."""
    out: dict[str, list[dict]] = {"baseline": [], "tuned": []}
    for _ in range(rounds):
        halves: dict[str, list] = {"baseline": [], "tuned": []}
        for model in ("baseline", "tuned", "tuned", "baseline"):
            res = loadgen.run_load(url, model, requests, expected=expected, concurrency=CONCURRENCY,
                                   max_requests=1_000_000, max_seconds=seconds / 2, warmup=CONCURRENCY, atol=1e-3,
                                   rtol=1e-3, label=model)
            expect(res.failed == 0 and res.wrong == 0,
                   f"{model}: {res.failed} failed and {res.wrong} wrong responses; first errors: {res.errors[:2]}")
            halves[model].append(res)
        for model, (a, b) in halves.items():
            out[model].append({"throughput": (a.ok + b.ok) / (a.seconds + b.seconds),
                               "p95": loadgen.percentile(a.latencies_ms + b.latencies_ms, 95)})
    return out


def check_tuned(tuning_fn, pbtxt_fn, *, smoke: bool = True) -> dict:
    """Serve the learner's tuned encoder next to a naive baseline and measure both at CONCURRENCY.

    Baseline: no dynamic batching, one instance, ONNX Runtime's default threads (spinning). Both are loaded in
    interleaved rounds (ROUNDS: fewer and shorter in smoke mode). Target, enforced in both modes: the throughput gain
    (a bench.Ratio over the rounds) clears TARGET_GAIN with its whole interval, the tuned p95 is not slower than the
    baseline's (utils.core.verdict), and every response is correct.
    """
    knobs = call(tuning_fn, what="my_tuning()")
    required = {"max_batch_size", "batching"}
    optional = {"preferred", "delay_us", "instances", "threads", "spin"}
    expect(isinstance(knobs, dict) and required <= set(knobs) <= required | optional,
           f"my_tuning() should return a dict with {sorted(required)} and optionally {sorted(optional)}; "
           f"got {knobs!r}")
    text = _config_text(pbtxt_fn, "tuned", **knobs, what="encoder_pbtxt('tuned', **my_tuning())")
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
    rounds, seconds = ROUNDS[bool(smoke)]
    args = ["--disable-auto-complete-config", "--backend-config=python,shm-default-byte-size=4194304"]
    t0 = time.perf_counter()
    with tritonserver.TritonServer(repo, name="lab05", extra_args=args) as server:
        before = tritonserver.model_statistics(server.grpc_url, "tuned")
        results = _load_rounds(server.grpc_url, requests, expected, rounds, seconds)
        after = tritonserver.model_statistics(server.grpc_url, "tuned")
    runs = list(zip(results["baseline"], results["tuned"], strict=True))
    gain = bench.Ratio.from_samples([t["throughput"] / b["throughput"] for b, t in runs])
    p95 = bench.Ratio.from_samples([b["p95"] / t["p95"] for b, t in runs])  # above 1: the tuned p95 is lower
    executions = after["execution_count"] - before["execution_count"]
    mean_batch = (after["inference_count"] - before["inference_count"]) / max(executions, 1)
    base = {k: statistics.median(b[k] for b, _ in runs) for k in ("throughput", "p95")}
    tuned = {k: statistics.median(t[k] for _, t in runs) for k in ("throughput", "p95")}
    summary = (f"baseline {base['throughput']:.1f} req/s p95 {base['p95']:.1f} ms; tuned {tuned['throughput']:.1f} "
               f"req/s p95 {tuned['p95']:.1f} ms (medians of {rounds} interleaved rounds; mean batch "
               f"{mean_batch:.1f}; {time.perf_counter() - t0:.0f} s)")
    lines = (f"{verdict.speed_line('throughput', gain, 'baseline', TARGET_GAIN)}\n"
             f"{verdict.speed_line('p95 latency (baseline p95 / tuned p95)', p95, 'baseline')}")
    target = (f"The target: the tuned throughput above {TARGET_GAIN}x the baseline's in every round, and its p95 not "
              "slower.")
    latency_ok = verdict.speed(p95) != verdict.SLOWER
    met = latency_ok and verdict.speed(gain, TARGET_GAIN) == verdict.FASTER
    expect_target(met, latency_ok and gain.high >= TARGET_GAIN,
                  f"undecided: {summary}.\n{lines}\n{target} The rounds disagree, as they do when other programs keep "
                  "this machine's cores busy: run the check again.",
                  f"not yet: {summary}.\n{lines}\n{target} How many requests did the server merge per execution "
                  "(mean batch above), and how many cores does this machine have for the encoders, the stubs and the "
                  "load generator?")
    passed("tuned encoder" if met else "tuned encoder's correctness (speed target recorded above, not enforced)",
           f"{summary}\n{lines}")
    figure("throughput_gain", gain.value, "x")
    return {"gain": gain, "p95_gain": p95, "baseline": results["baseline"], "tuned": results["tuned"],
            "mean_batch": mean_batch}
