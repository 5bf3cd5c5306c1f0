"""Lab 01's serving task (section 5): the check passes a serve that batches the queue and reports its gain over one
predict call per request; it fails the typical wrong answers with a message that names the symptom, and refuses an
answer that calls the course's own predict."""

import re

import pytest
import torch

from utils import checks, inference
from utils.checks import LabCheckFailed, lab01
from utils.core import verdict


def a_predict(model, x, max_batch=16, *, eval_mode=True, no_grad=True):
    """The lab's predict (section 1), with switches that turn it into wrong ones."""
    device = next(model.parameters()).device
    if eval_mode:
        model.eval()
    outputs = []
    with torch.inference_mode(no_grad):
        for chunk in x.split(max_batch):
            outputs.append(model(chunk.to(device)).cpu())
    return torch.cat(outputs)


def a_serve(model, requests, max_batch=32, **kw):
    sizes = [len(r) for r in requests]
    return list(a_predict(model, torch.cat(requests), max_batch=max_batch, **kw).split(sizes))


def one_call(model, requests, max_batch=32):
    return a_serve(model, requests, max_batch=10**6)  # the whole queue in one model call


def equal_parts(model, requests, max_batch=32):
    return list(a_predict(model, torch.cat(requests), max_batch=max_batch).chunk(len(requests)))


def per_request(model, requests, max_batch=32):
    return [a_predict(model, r, max_batch=max_batch) for r in requests]


def kept_per_sizes():
    kept = {}

    def serve(model, requests, max_batch=32):
        key = tuple(len(r) for r in requests)
        if key not in kept:
            kept[key] = a_serve(model, requests, max_batch)
        return kept[key]

    return serve


def one_output_buffer():
    buffer = {}  # every call writes into the same output tensor, so a caller's earlier results change

    def serve(model, requests, max_batch=32):
        out = a_predict(model, torch.cat(requests), max_batch=max_batch)
        if buffer.get("t") is None or buffer["t"].shape[1:] != out.shape[1:] or len(buffer["t"]) < len(out):
            buffer["t"] = torch.empty(max(len(out), 64), *out.shape[1:])
        buffer["t"][: len(out)].copy_(out)
        return list(buffer["t"][: len(out)].split([len(r) for r in requests]))

    return serve


def via_the_course(model, requests, max_batch=32):
    sizes = [len(r) for r in requests]
    return list(inference.predict(model, torch.cat(requests), max_batch=max_batch).split(sizes))


@pytest.fixture(autouse=True)
def _record_speed(monkeypatch):
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")  # a missed gain is printed here, not a test failure


def test_a_batching_serve_passes_and_reports_its_gain(capsys):
    result = lab01.check_serve(a_serve)
    out = capsys.readouterr().out
    assert "PASSED serve a queue" in out
    assert "your serve vs one predict per request" in out
    assert "SMOKE MODE: the gain is reported, not judged" in out  # the suite runs with WORKBOOK_SMOKE=1
    assert re.search(r"^FIGURE serve_speedup_over_per_request: \S+ x \(higher is better\)$", out, re.MULTILINE)
    assert len(result["calls"]) == -(-result["images"] // lab01.SERVE_MAX_BATCH)


def test_full_mode_judges_the_gain_against_the_line(capsys):
    result = lab01.check_serve(a_serve, smoke=False, requests=12, image_size=32)
    out = capsys.readouterr().out
    assert "SMOKE MODE" not in out
    assert re.search(rf"line {lab01.SERVE_LINE:.2f}0?x", out)
    faster = verdict.speed(result["speedup"], lab01.SERVE_LINE) == verdict.FASTER
    # under WORKBOOK_SPEED_TARGETS=record a miss is printed with its numbers instead of failing the suite
    assert faster or "SPEED TARGET NOT ENFORCED" in out


def test_one_call_per_request_is_correct_and_shows_its_call_count(capsys):
    result = lab01.check_serve(per_request)  # correct, only slow: smoke mode reports, full mode judges the line
    out = capsys.readouterr().out
    assert f"your serve {len(result['calls'])} times" in out and len(result["calls"]) == 12


@pytest.mark.parametrize("wrong, symptom", [
    (one_call, "a batch larger than max_batch=8 reached it"),
    (lambda m, r, mb=32: a_serve(m, r, mb, eval_mode=False), "the model ran in train mode"),
    (lambda m, r, mb=32: a_serve(m, r, mb, no_grad=False), "the model ran with autograd recording"),
    (equal_parts, "the output for request 0 (3 images) has shape (5, 10), expected (3, 10)"),
    (kept_per_sizes(), "a second queue of the same sizes, new images never called the model, so its outputs cannot"),
    (via_the_course, "calls utils.inference.predict, the course's reference implementation"),
    (one_output_buffer(), "the outputs serve returned for the first queue changed after later queues were served"),
])
def test_typical_wrong_answers_fail_with_their_symptom(wrong, symptom):
    with pytest.raises(LabCheckFailed, match=re.escape(symptom)):
        lab01.check_serve(wrong)


def test_a_stub_fails_with_the_todo_message():
    def stub(model, requests, max_batch=32):
        raise NotImplementedError("TODO: serve the queue")

    with pytest.raises(LabCheckFailed, match="is not written yet"):
        lab01.check_serve(stub)


def test_every_timed_call_gets_new_images_and_the_last_ones_are_checked():
    seen = []  # every queue serve was handed, kept alive so that no id can be reused

    def serve(model, requests, max_batch=32):
        seen.append(requests)
        return a_serve(model, requests, max_batch)

    lab01.check_serve(serve)
    timed = seen[5:]  # after the four correctness queues and the timed queue's own check
    assert len(timed) >= 3
    assert len({float(q[0].sum()) for q in timed}) == len(timed), "a timed call saw images an earlier call saw"
    assert [len(r) for r in timed[0]] == [len(r) for r in timed[-1]]  # the same work every call


def test_an_answer_that_stops_working_after_the_check_is_caught():
    calls = {"n": 0}

    def serve(model, requests, max_batch=32):  # right on the checked queues, stale once the timing has begun
        calls["n"] += 1
        if calls["n"] <= 6:
            serve.kept = a_serve(model, requests, max_batch)
        return serve.kept

    with pytest.raises(LabCheckFailed, match="last timed queue"):
        lab01.check_serve(serve)
