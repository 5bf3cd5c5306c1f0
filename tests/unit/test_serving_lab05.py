"""Lab 05's checks (utils.checks.lab05) on the solution and on realistic wrong answers: the parts that need no server.
The served part (check_tuned's load rounds) is graded for real in tests/server/test_grade.py."""

import pytest

pytest.importorskip("tritonclient", reason="tritonclient is optional: lab 05's config checks parse with its schema")

from utils.checks import LabCheckFailed, lab05  # noqa: E402
from utils.serving import repository  # noqa: E402


def encoder_pbtxt(name, max_batch_size, *, batching, preferred=(), delay_us=0, instances=1, threads=1, spin=True,
                  batch_in_dims=False):
    """The lab's solution: the config written as text (batch_in_dims: a typical mistake)."""
    dims = "[ -1, -1 ]" if batch_in_dims else "[ -1 ]"
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch_size}"]
    for tensor in ("input_ids", "attention_mask", "token_type_ids"):
        lines.append(f'input {{ name: "{tensor}" data_type: TYPE_INT64 dims: {dims} }}')
    lines.append('output { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] }')
    if batching:
        sizes = "".join(f" preferred_batch_size: {p}" for p in preferred)
        lines.append(f"dynamic_batching {{{sizes} max_queue_delay_microseconds: {delay_us} }}")
    lines.append(f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]")
    lines.append(f'parameters {{ key: "intra_op_threads" value {{ string_value: "{threads}" }} }}')
    if not spin:
        lines.append('parameters { key: "allow_spinning" value { string_value: "0" } }')
    return "\n".join(lines) + "\n"


def with_the_course_builder(name, max_batch_size, *, batching, preferred=(), delay_us=0, instances=1, threads=1,
                            spin=True):
    """A wrong answer: the course's config builder writes the text."""
    db = {"preferred_batch_size": list(preferred), "max_queue_delay_microseconds": delay_us} if batching else None
    return repository.to_pbtxt(repository.encoder_config(name, max_batch_size=max_batch_size, dynamic_batching=db,
                                                         instance_count=instances, intra_op_threads=threads,
                                                         allow_spinning=spin))


def test_config_text_check_passes_the_solution(capsys):
    lab05.check_config_text(encoder_pbtxt)
    assert "PASSED config text" in capsys.readouterr().out


def test_config_text_check_fails_an_answer_written_by_the_course_builder():
    from utils.serving.repository import model_config  # however it is imported

    def via_model_config(name, max_batch_size, *, batching, preferred=(), delay_us=0, instances=1, threads=1,
                         spin=True):
        params = {"intra_op_threads": threads, **({} if spin else {"allow_spinning": 0})}
        cfg = model_config(name, max_batch_size=max_batch_size, instance_count=instances, parameters=params,
                           dynamic_batching={"preferred_batch_size": list(preferred),
                                             "max_queue_delay_microseconds": delay_us} if batching else None,
                           inputs=[(n, "INT64", [-1]) for n in lab05.TENSORS_IN],
                           outputs=[("last_hidden_state", "FP32", [-1, 384])])
        return str(cfg)  # protobuf's text format, without to_pbtxt

    with pytest.raises(LabCheckFailed, match=r"calls utils\.serving\.repository\.encoder_config, the course's"):
        lab05.check_config_text(with_the_course_builder)
    with pytest.raises(LabCheckFailed, match=r"calls utils\.serving\.repository\.model_config"):
        lab05.check_config_text(via_model_config)
    # the served check builds the tuned config through the same function: caught there too, before any server starts
    with pytest.raises(LabCheckFailed, match="course's reference implementation"):
        lab05.check_tuned(lambda: dict(max_batch_size=16, batching=True), with_the_course_builder)


def test_config_text_check_names_what_is_wrong():
    with pytest.raises(LabCheckFailed, match=r"inputs should be .* got .*\[-1, -1\]"):
        lab05.check_config_text(lambda *a, **k: encoder_pbtxt(*a, **k, batch_in_dims=True))

    def ignores_spin(name, max_batch_size, **kw):
        kw.pop("spin", None)
        return encoder_pbtxt(name, max_batch_size, **kw)

    with pytest.raises(LabCheckFailed, match="enc_c.*parameters should be .*allow_spinning"):
        lab05.check_config_text(ignores_spin)

    def int_parameter(*a, **k):
        return encoder_pbtxt(*a, **k).replace('string_value: "1"', "string_value: 1")

    with pytest.raises(LabCheckFailed, match="Triton's schema rejects this text"):
        lab05.check_config_text(int_parameter)


def test_mean_batch_check():
    def between(before, after):
        runs = after["execution_count"] - before["execution_count"]
        return (after["inference_count"] - before["inference_count"]) / runs if runs else 0

    lab05.check_mean_batch(between)
    with pytest.raises(LabCheckFailed, match="since the server started, not between the two snapshots") as caught:
        lab05.check_mean_batch(lambda before, after: after["inference_count"] / after["execution_count"])
    assert "inference_count" not in str(caught.value), "the message names the symptom, not the fix"


def test_tuned_check_rejects_a_malformed_tuning_before_serving():
    with pytest.raises(LabCheckFailed, match="my_tuning\\(\\) should return a dict"):
        lab05.check_tuned(lambda: dict(batching=True, workers=4), encoder_pbtxt)
