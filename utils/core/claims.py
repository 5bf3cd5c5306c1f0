"""The source claims, checked against this machine's measurements (course report; lesson 08).

The source material repeats a few numbers ("TorchScript is 10-30% faster", "quantization: 4x smaller, 2-4x
faster", ...). Each ``Claim`` names the metrics the lessons record (``build/results/<lesson>.json``) that test it and
the range it states. ``evaluate()`` returns one ``ClaimResult`` per claim with the measured value and a verdict:

- ``holds``: the measurement falls inside the claimed range;
- ``holds (beyond the claimed range)``: better than claimed (e.g. a 1.9x speedup against "10-30% faster");
- ``does not hold``: below the range;
- ``undecided``: the measurement's interval (from its interleaved rounds) straddles an edge of the range (the same
  rule as utils.core.verdict.prediction, which the lessons print);
- ``not measurable here``: the lesson ran but skipped the section that measures it (the reason is given);
- ``not run``: the lesson that measures it has no results yet.

A metric whose lesson note says it is "not like for like" (the lesson's ``Ratio.caveat``, e.g. eager's page faults
against ONNX Runtime's arena) is judged only when no later metric of the claim is recorded like for like; when it is
judged, the row carries the caveat: the verdict reads e.g. "holds (not like for like)" and the reason quotes it.

The results come in as a dict (``report.load_all()``): this module reads no files, so the results store can show a
lesson's verdicts (``report.show()``) without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["VERDICTS", "Claim", "ClaimResult", "CLAIMS", "evaluate", "markdown", "for_lesson", "format_value", "cell"]

HOLDS, BEYOND, FAILS, UNDECIDED, NOT_HERE, NOT_RUN = (
    "holds", "holds (beyond the claimed range)", "does not hold", "undecided", "not measurable here", "not run",
)
VERDICTS = (HOLDS, BEYOND, FAILS, UNDECIDED, NOT_HERE, NOT_RUN)


@dataclass(frozen=True)
class Claim:
    """One claim of the source material and how the course measures it (course report).

    ``metrics`` are (lesson stem, metric name) pairs tried in order: the first one recorded like for like is the
    measurement (one whose lesson note says "not like for like" yields to a later clean one; with none, the first
    recorded is judged and the row carries its caveat).
    ``low``/``high`` bound the claimed range in the metric's unit (``high`` None: "at least low").
    ``section`` is the OPTIONAL_SECTIONS id whose skip makes the claim not measurable here.
    ``kind`` "ratio" values are normalised to >= 1 (a size ratio recorded either way round reads the same).
    """

    id: str
    claim: str
    source: str
    metrics: tuple[tuple[str, str], ...]
    low: float
    high: float | None
    unit: str = "x"
    section: str = ""
    kind: str = "plain"
    also: tuple[tuple[str, str], ...] = ()  # shown next to the value for context
    explain: str = ""
    # (lesson, metric) of what the lesson predicted from this machine's hardware before measuring, and of whether it
    # held: the reason then says whether the verdict was expected here
    prediction: tuple[tuple[str, str], tuple[str, str]] | None = None
    # why the course does not (yet) measure this claim: it then reads "not measurable here" with this reason until a
    # lesson records one of its metrics
    untested: str = ""


@dataclass
class ClaimResult:
    """The verdict for one claim on this machine (course report)."""

    id: str
    claim: str
    source: str
    measured: str
    verdict: str
    reason: str
    value: float | None = None
    metric: str = ""
    lesson: str = ""
    mode: str = ""
    anchor: str = ""
    context: list[str] = field(default_factory=list)
    caveat: str = ""  # what differs when the judged metric is not like for like (the lesson's note)


_004 = "framework fundamentals lesson (004)"
_000 = "practice projects (000)"

CLAIMS: tuple[Claim, ...] = (
    Claim(
        "torchscript-speedup", "TorchScript: 10-30% faster inference", _004,
        (("02_jit_compilers", "script_speedup_resnet50"), ("02_jit_compilers", "freeze_speedup_resnet50")), 1.10, 1.30,
        also=(("02_jit_compilers", "freeze_speedup_resnet50"), ("02_jit_compilers", "compile_speedup_resnet50")),
        explain="ResNet-50 scripted (and frozen + optimize_for_inference) vs eager, measured side by side",
    ),
    Claim(
        "quantization-size", "Quantization: 4x smaller model", _004,
        (("04_porting", "int8_size_ratio"),), 3.5, 4.5, kind="ratio",
        also=(("01_serving_basics", "resnet50_int8_dynamic_size_ratio"),),
        explain="ONNX Runtime static int8 vs fp32 files; lesson 01's dynamic quantization of ResNet-50 shown beside it",
    ),
    Claim(
        "quantization-dynamic-size", "Quantization: 4x smaller (PyTorch dynamic int8)", _004,
        (("01_serving_basics", "minilm_int8_dynamic_size_ratio"),
         ("01_serving_basics", "resnet50_int8_dynamic_size_ratio")), 3.5, 4.5, kind="ratio",
        also=(("01_serving_basics", "resnet50_int8_dynamic_size_ratio"),),
        explain="quantize_dynamic converts nn.Linear layers only: MiniLM's word-embedding table (about half of its "
        "parameters) stays fp32, so only its Linear half shrinks 4x; ResNet-50's convolutions stay fp32",
    ),
    Claim(
        "quantization-speed", "Quantization: 2-4x faster", _004,
        (("04_porting", "int8_speedup"),), 2.0, 4.0,
        also=(("04_porting", "digits_int8_accuracy_drop"),
              ("04_porting", "ort_dynamic_int8_bert_min_cosine"), ("07_llm_scheduling", "int8_decode_speedup"), ("07_llm_scheduling", "int8_fp32_activations_over_bf16")),
        explain="the verdict is for static W8A8 int8 in ONNX Runtime vs fp32 (same batch, same session options) only; "
        "weight-only int8 is a different method: lesson 07 times it on an LLM decode step against bf16 "
        "(int8_decode_speedup), and with fp32 activations, which ATen's x86 int8 kernel runs in a scalar loop. "
        "Accuracy is not part of this verdict: the timed vision model has random weights (its agreement with fp32 "
        "is not accuracy); the accuracy evidence is the same static recipe on a trained digits model "
        "(digits_int8_accuracy_drop, pp) and MiniLM dynamic int8's worst embedding cosine "
        "(ort_dynamic_int8_bert_min_cosine), which lesson 04 judges against a 0.99 acceptance line",
    ),
    Claim(
        "batch-speedup", "Batch inference: 3-10x faster than single inference", _004,
        (("01_serving_basics", "resnet18_bs32_vs_bs1_throughput"),), 3.0, 10.0,
        explain="ResNet-18 throughput at batch 32 over batch 1",
    ),
    Claim(
        "first-inference", "First inference: 10-100x slower than steady state", _004,
        (("01_serving_basics", "first_call_over_steady"),), 10.0, 100.0,
        explain="first call in a fresh model vs the median of warmed-up calls; the verdict is on lesson 01's "
        "ResNet-18: a sub-millisecond model can show 100x and more (lesson 08's warm-up proof, on a toy model)",
    ),
    Claim(
        "gpu-speedup", "GPU inference: 10-100x faster (large models)", _004,
        (("01_serving_basics", "gpu_vs_cpu_speedup"), ("01_serving_basics", "gpu_speedup")), 10.0, 100.0,
        section="01.gpu-speedup", explain="the same model and batch on the GPU vs this CPU",
    ),
    Claim(
        "transfer-latency", "Moving data between CPU and GPU adds 1-10 ms", _004,
        (("01_inference_modes", "h2d_copy_ms"), ("01_inference_modes", "pageable_copy_ms"),
         ("01_inference_modes", "transfer_ms")), 1.0, 10.0, unit="ms",
        section="01.pinned-memory", explain="host-to-device copy of one input batch (pageable memory)",
    ),
    Claim(
        "state-dict-size", "Saving the state dict: about 50% smaller than saving the whole model", _004,
        (("01_inference_modes", "state_dict_over_whole_model_size"),), 1.6, 2.4, kind="ratio",
        explain="file size of torch.save(model) over torch.save(model.state_dict()), same model",
    ),
    Claim(
        "keras-call-vs-predict", "Keras: model(x) is faster than model.predict(x) for small batches", _004,
        (("01_serving_basics", "keras_call_vs_predict_speedup"),), 1.0, None,
        explain="direct call vs predict() on one small batch",
    ),
    Claim(
        "onnx-runtime-faster", "ONNX Runtime: often faster than the native framework", _004,
        (("04_onnx_tensorrt", "ort_speedup_vs_eager_bs8"), ("04_onnx_tensorrt", "ort_speedup_vs_eager_bs1")),
        1.0, None,
        also=(("04_onnx_tensorrt", "ort_speedup_vs_eager_bs8"), ("04_onnx_tensorrt", "ort_speedup_vs_eager_bs1")),
        explain="ONNX Runtime (all optimisations) vs the best eager PyTorch layout, same model, inputs and threads, "
        "batch 8; where eager's page faults at batch 8 make that comparison not like for like (a share of the gap "
        "would be glibc's allocator, not ONNX Runtime), batch 1, where eager takes none",
    ),
    Claim(
        "iteration-level-scheduling", "Iteration-level (continuous) scheduling serves more than request-level batching",
        "Orca (OSDI 2022)",
        (("07_llm_scheduling", "continuous_vs_static_throughput"),), 1.05, None,
        also=(("07_llm_scheduling", "static_padding_waste_fraction"),),
        explain="iteration-level vs request-level (static) scheduling: the same engine, contiguous KV slots and "
        "arrival trace; no paging is involved",
    ),
    Claim(
        "paged-kv-serving", "Continuous batching with a paged KV cache: 2-4x the serving throughput",
        "vLLM PagedAttention paper (SOSP 2023)",
        (), 2.0, 4.0,
        also=(("07_llm_serving", "paged_serving_throughput_gain"), ("07_llm_serving", "paged_serving_capacity_gain"),
              ("07_llm_scheduling", "paged_capacity_gain")),
        untested="the paper's 2-4x is against Orca at equal latency, on a GPU with an in-place paged-attention "
        "kernel; lesson 07 part 3 has none of the three (a gather instead of the kernel, a CPU, no equal-latency "
        "operating point). What it does measure is shown beside this row: paged over contiguous KV slots, both "
        "iteration-level, the same KV bytes and arrival trace (throughput and the batch the same bytes hold)",
    ),
    Claim(
        "amp-training-speedup", "Automatic mixed precision makes a training step faster", _000,
        (("03_training_bound", "amp_speedup"),), 1.10, None,  # 1.10: utils.training.precision.FASTER
        also=(("03_training_bound", "amp_speedup_128px"), ("03_training_bound", "amp_layer_probe_ratio")),
        explain="ResNet-50 training step with autocast (bf16 on a CPU, fp16 + GradScaler on a GPU) vs fp32, side by "
        "side; it pays only where the hardware has fast 16-bit units",
        prediction=(("03_training_bound", "amp_prediction"), ("03_training_bound", "amp_prediction_held")),
    ),
)


def format_value(value, unit: str = "") -> str:
    """A recorded value as the course prints it (report.show(), the course report, the claims table): yes/no for
    booleans, 3 significant digits below 1000, thousands separators above, then the unit."""
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int | float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def _range(c: Claim) -> str:
    if c.high is None:
        return f">= {c.low:g} {c.unit}".strip()
    return f"{c.low:g}-{c.high:g} {c.unit}".strip()


def _prediction_note(c: Claim, results: dict[str, dict]) -> str:
    (p_lesson, p_metric), (h_lesson, h_metric) = c.prediction
    predicted = results.get(p_lesson, {}).get("metrics", {}).get(p_metric)
    held = results.get(h_lesson, {}).get("metrics", {}).get(h_metric)
    if isinstance(held, bool):  # older results files stored True/False
        held = "held" if held else "did not hold"
    if predicted is None or held not in ("held", "did not hold", "undecided"):
        return ""
    outcome = {"held": "held: the verdict is what this hardware should give", "did not hold": "did not hold",
               "undecided": "is undecided: the measurement's interval straddles the predicted band"}[held]
    lesson, metric = c.metrics[0]
    measured = results.get(lesson, {}).get("metrics", {}).get(metric)
    side = {"slower": lambda v: v <= 1 / c.low, "faster": lambda v: v >= c.low}.get(predicted)  # past the claim's line
    if held == "did not hold" and side and isinstance(measured, int | float) and side(measured):  # missed the band
        outcome = (f"did not hold in size: measured {format_value(measured, c.unit)}, {predicted} as predicted but "
                   "outside the predicted band")
    return f"; predicted from this machine's hardware before measuring: {predicted}, and the prediction {outcome}"


LIKE_FOR_LIKE = "not like for like"  # how a lesson's note (verdict.speed_line, report.record) marks a caveat


def caveat_of(data: dict, metric: str) -> str:
    """What the lesson's note for `metric` says differs between the two sides ("" when it is like for like)."""
    note = data.get("notes", {}).get(metric, "")
    if LIKE_FOR_LIKE not in note:
        return ""
    return note.split(LIKE_FOR_LIKE, 1)[1].lstrip(": ").strip() or "the lesson's note says so"


def _pick(c: Claim, results: dict[str, dict]):
    """The (lesson, metric, data) a claim is judged on and the not-like-for-like ones passed over for it."""
    recorded = [(lesson, metric, results[lesson]) for lesson, metric in c.metrics
                if results.get(lesson) and metric in results[lesson].get("metrics", {})]
    for i, (lesson, metric, data) in enumerate(recorded):
        if not caveat_of(data, metric):
            return (lesson, metric, data), recorded[:i]
    return (recorded[0] if recorded else None), []


def _evaluate_one(c: Claim, results: dict[str, dict]) -> ClaimResult:
    lessons = sorted({lesson for lesson, _ in c.metrics})
    base = dict(id=c.id, claim=c.claim, source=c.source)
    found, passed_over = _pick(c, results)
    context = []
    shown_elsewhere = {m for _, m, _ in passed_over} | ({found[1]} if found else set())
    for lesson, metric in c.also:
        data = results.get(lesson, {})
        if metric in data.get("metrics", {}) and metric not in shown_elsewhere:
            raw = data["metrics"][metric]
            unit = data.get("units", {}).get(metric, "")
            if c.kind == "ratio" and isinstance(raw, int | float) and not isinstance(raw, bool) and 0 < raw < 1:
                # the same reading as the claim's own metric: a size ratio recorded either way round reads the same
                context.append(f"{metric} = {1 / raw:.3g} x (recorded as {raw:.3g}, read as its inverse)")
            else:
                context.append(f"{metric} = {format_value(raw, unit)}")
    if found is None and c.untested:
        return ClaimResult(**base, measured="-", verdict=NOT_HERE, context=context, reason=c.untested)
    if found is None:
        ran = [lesson for lesson in lessons if lesson in results]
        if not ran:
            return ClaimResult(**base, measured="-", verdict=NOT_RUN, context=context,
                               reason=f"{', '.join(lessons)} has no results yet: run it (make course)")
        for lesson in ran:
            skipped = results[lesson].get("skipped", {})
            if c.section and c.section in skipped:
                return ClaimResult(**base, measured="-", verdict=NOT_HERE, lesson=lesson, context=context,
                                   reason=f"section {c.section} skipped: {skipped[c.section]}")
        names = " or ".join(m for _, m in c.metrics)
        if c.section:
            return ClaimResult(**base, measured="-", verdict=NOT_HERE, lesson=ran[0], context=context,
                               reason=f"{ran[0]} ran without skipping {c.section} but recorded none of {names}")
        return ClaimResult(**base, measured="-", verdict=NOT_RUN, lesson=ran[0], context=context,
                           reason=f"{ran[0]} ran but did not record {names}")
    lesson, metric, data = found
    raw = data["metrics"][metric]
    mode = data.get("mode", "")
    anchor = data.get("anchors", {}).get(metric, "")
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return ClaimResult(**base, measured=str(raw), verdict=NOT_HERE, lesson=lesson, metric=metric, mode=mode,
                           reason=f"{metric} is not a number ({raw!r})", anchor=anchor, context=context)
    value = float(raw)
    lo, hi = data.get("intervals", {}).get(metric) or (value, value)
    note = ""
    if c.kind == "ratio" and 0 < value < 1:
        value, lo, hi, note = 1 / value, 1 / hi, 1 / lo, f" (recorded as {raw:.3g}, read as its inverse)"
    # one rule with the lessons' own verdicts (utils.core.verdict.prediction): the whole interval inside the claimed
    # range holds, wholly below fails, wholly above holds beyond the range, straddling an edge is undecided
    if hi < c.low:
        verdict = FAILS
    elif c.high is not None and lo > c.high:
        verdict = BEYOND
    elif lo >= c.low and (c.high is None or hi <= c.high):
        verdict = HOLDS
    else:
        verdict = UNDECIDED
    unit = c.unit if c.kind == "ratio" else (data.get("units", {}).get(metric, "") or c.unit)
    shown = f"{value:.3g} {c.unit}" + (f" [{lo:.3g}-{hi:.3g}]" if (lo, hi) != (value, value) else "")
    reason = f"measured {shown} against the claimed {_range(c)}{note}"
    if verdict == UNDECIDED:
        edge = c.low if lo < c.low else c.high
        reason += f": the interval crosses the claimed range's edge at {edge:.3g} {c.unit}"
    lesson_note = data.get("notes", {}).get(metric, "")
    if lesson_note.startswith("REJECTED"):  # the lesson measured it and refused it (accuracy): the row must say so
        reason += f"; lesson {lesson} rejected this result ({lesson_note[len('REJECTED'):].lstrip(': ')})"
    for p_lesson, p_metric, p_data in passed_over:  # not like for like: a clean metric later in the list is judged
        p_value = format_value(p_data["metrics"][p_metric], p_data.get("units", {}).get(p_metric, ""))
        p_lo_hi = p_data.get("intervals", {}).get(p_metric)
        p_value += f" [{p_lo_hi[0]:.3g}-{p_lo_hi[1]:.3g}]" if p_lo_hi else ""
        reason += (f"; judged on {metric}, not on {p_metric} = {p_value} ({p_lesson}), which is not like for like: "
                   f"{caveat_of(p_data, p_metric)}")
        p_anchor = p_data.get("anchors", {}).get(p_metric, "")
        anchor = anchor or (f"{p_metric}: {p_anchor}" if p_anchor else "")  # the anchor is the passed-over metric's
    caveat = caveat_of(data, metric)
    if caveat:  # no clean metric recorded: the verdict stands on a comparison the lesson itself flagged
        reason += f"; not like for like: {caveat}"
    if c.prediction:
        reason += _prediction_note(c, results)
    if mode == "smoke":
        reason += "; smoke run (small sizes): rerun with `make course` for the real number"
    measured = f"{value:.3g} {unit}".strip() + (f" [{lo:.3g}-{hi:.3g}]" if (lo, hi) != (value, value) else "")
    return ClaimResult(**base, measured=measured, verdict=verdict, reason=reason, value=value,
                       metric=metric, lesson=lesson, mode=mode, anchor=anchor, context=context, caveat=caveat)


def evaluate(results: dict[str, dict], claims: tuple[Claim, ...] = CLAIMS) -> list[ClaimResult]:
    """One ClaimResult per claim from `results` ({lesson stem: results file}, as report.load_all() returns them).

    Course report; lesson 08.
    """
    if not isinstance(results, dict):
        raise TypeError(f"evaluate() takes the results dict from report.load_all(), got {type(results).__name__}")
    return [_evaluate_one(c, results) for c in claims]


def for_lesson(stem: str, claims: tuple[Claim, ...] = CLAIMS) -> tuple[Claim, ...]:
    """The claims whose measurement (or context) one lesson records, e.g. "04_onnx_tensorrt" (report.show())."""
    return tuple(c for c in claims if any(lesson == stem for lesson, _ in (*c.metrics, *c.also)))


def cell(text) -> str:
    """Text made safe for one Markdown table cell (pipes escaped, newlines flattened)."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(results: dict[str, dict], claims: tuple[Claim, ...] = CLAIMS) -> str:
    """The claims table in Markdown (what report.md embeds, and report.show() for one lesson's claims)."""
    rows = evaluate(results, claims)
    by_id = {c.id: c for c in claims}
    lines = [
        "| claim (source) | claimed | measured here | verdict | why / how measured | published anchor |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = by_id.get(r.id)
        where = f"`{r.metric}` ({r.lesson}, {r.mode} run)" if r.metric else ""
        how = "; ".join(x for x in (r.reason, c.explain if c else "", where, "; ".join(r.context)) if x)
        lines.append(
            f"| {cell(r.claim)} ({cell(r.source)}) | {cell(_range(c)) if c else ''} | {cell(r.measured)} | "
            f"**{r.verdict}**{' (not like for like)' if r.caveat else ''} | {cell(how)} | {cell(r.anchor)} |"
        )
    return "\n".join(lines)

