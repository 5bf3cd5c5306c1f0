"""utils.interview and its bank (lesson 08): the bank validates, every proof runs, the quiz is seeded."""

import html
import importlib
import importlib.util
import json
import random
import re
import warnings

import nbformat
import pytest

from tests.lesson_contract import REQUIRED_METRICS
from utils import interview
from utils.core import env
from utils.interview import __main__ as cli
from utils.interview import practice, proofs

BANK = interview.load_bank()
CODE_PROOFS = [q for q in BANK if q.code]
PROOF_BUDGET_S = 20  # per proof, after the one-time framework imports (see the fixture)

# the questions of the source material the bank must answer (interview questions and the seven self-checks)
SOURCE_QUESTIONS = {
    "no-grad-vs-requires-grad", "triton-latency-methodology", "xla-compile-vs-execute", "trace-vs-script",
    "onnx-custom-autograd-function", "tensorrt-missing-fusions",
    "graphs-pytorch-vs-tensorflow", "why-eval", "two-ways-to-save", "what-is-torchscript", "what-is-onnx", "warm-up",
    "batch-vs-single",
}


# issue 28: the topics interviews for inference roles open with, each with a card whose proof runs on a CPU
ISSUE_28_CARDS = {
    "LLM serving": {"paged-kv-cache", "prefix-caching", "chunked-prefill", "speculative-decoding", "speculative-sampling",
                    "grouped-query-attention", "int8-kv-cache", "flash-attention-io", "static-vs-continuous-batching"},
    "sizing arithmetic": {"kv-cache-budget", "decode-latency-bound", "replicas-littles-law"},
    "quantization": {"affine-quantization", "integer-matmul-requantize", "calibration-methods", "ptq-vs-qat",
                     "weight-only-int4", "smoothquant"},
    "numerics": {"kahan-summation", "batch-invariance"},
    "GPU architecture": {"tiling-memory-hierarchy", "warps-and-divergence", "occupancy", "memory-coalescing",
                         "tensor-cores-vs-systolic"},
    "torch.compile": {"compile-recompilation"},
}


def test_bank_is_large_and_covers_every_lesson():
    assert len(BANK) >= 30
    lessons = {q.lesson for q in BANK}
    assert {stem for stem in interview.LESSON_TITLES if stem != "08_interview_prep"} <= lessons


def test_every_source_question_is_in_the_bank():
    ids = {q.id: q for q in BANK}
    missing = SOURCE_QUESTIONS - set(ids)
    assert not missing, f"source questions missing from the bank: {sorted(missing)}"
    for qid in SOURCE_QUESTIONS:
        assert ids[qid].origin == "source" and ids[qid].source_ref, qid
    assert sum(q.origin == "source" for q in BANK) == len(SOURCE_QUESTIONS)


def test_issue_28_topics_have_cards_with_code_proofs():
    ids = {q.id: q for q in BANK}
    wanted = set().union(*ISSUE_28_CARDS.values())
    assert len(wanted) >= 20
    missing = sorted(wanted - set(ids))
    assert not missing, f"issue 28's cards missing from the bank: {missing}"
    assert all(ids[qid].code for qid in wanted), "each of issue 28's cards proves its answer with code"
    assert {"04_quantization", "07_llm_serving"} <= {ids[qid].lesson for qid in wanted}


def test_every_question_has_an_answer_a_lesson_and_a_proof():
    for q in BANK:
        assert q.question.endswith("?"), f"{q.id}: the question should be a question"
        assert len(q.strategy.split()) >= 30, f"{q.id}: the answer strategy is too thin"
        assert q.lesson in interview.LESSON_TITLES
        assert q.code or q.metrics, f"{q.id}: no proof"


def test_metric_pointers_name_metrics_the_lessons_must_record():
    for q in BANK:
        if q.metrics:
            assert q.lesson in REQUIRED_METRICS, f"{q.id}: lesson {q.lesson} records no contracted metrics"
            unknown = sorted(set(q.metrics) - set(REQUIRED_METRICS[q.lesson]))
            assert not unknown, f"{q.id}: {unknown} are not in REQUIRED_METRICS[{q.lesson!r}]"


def test_metric_pointers_resolve_to_a_section_where_the_lesson_exists():
    root = env.repo_root()
    for q in BANK:
        if q.metrics and (root / q.notebook).is_file():
            code = "\n".join(c.source for c in nbformat.read(str(root / q.notebook), as_version=4).cells)
            if any(m in code for m in q.metrics):
                assert interview.locate(q), f"{q.id}: its metrics are in {q.notebook} but no heading precedes them"


def test_the_notebook_practises_and_runs_every_proof():
    nb = nbformat.read(str(env.repo_root() / "notebooks" / "08_interview_prep.ipynb"), as_version=4)
    assert len(nb.cells) <= 50, f"lesson 08 has {len(nb.cells)} cells: one sitting is about 50 at most"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "practice.prove_all(" in code, "lesson 08 must run every proof in the bank (code_proofs_run, _passed)"
    for call in ("practice.pick(minutes=", "practice.pick(topic=", "practice.pick(lesson=", "report.show()"):
        assert call in code, f"lesson 08 no longer calls {call}"
    named = re.findall(r'practice\.prove\("([a-z0-9-]+)"', code)
    assert 3 <= len(named) <= 5 and set(named) <= {q.id for q in BANK}, f"the worked example proves {named}"


@pytest.fixture(scope="module")
def frameworks_imported():
    """Pay the one-time imports outside the per-proof budget (triton before tensorflow: see interview)."""
    import torch  # noqa: F401

    needs = {m for q in CODE_PROOFS for m in q.needs if importlib.util.find_spec(m) is not None}
    proofs.import_order_guard(tuple(needs))
    for module in sorted(needs):
        __import__(module)


@pytest.mark.parametrize("q", CODE_PROOFS, ids=[q.id for q in CODE_PROOFS])
def test_code_proof_runs(q, frameworks_imported, monkeypatch, tmp_path):
    for module in q.needs:  # e.g. tensorflow: optional in your own environment
        pytest.importorskip(module, reason=f"proof {q.id} needs {module}, which is not installed")
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))  # proofs that read results see an empty build
    result = interview.run_proof(q)
    assert result.ok, f"proof of {q.id} failed:\n{result.output}\n{result.error}"
    assert not result.skipped, result.skipped
    assert result.output.strip(), f"{q.id}: a proof must print what it shows"
    if result.seconds > PROOF_BUDGET_S:  # a time budget is a benchmark, not a pass/fail test: say it, do not fail
        warnings.warn(f"{q.id}: proof took {result.seconds:.1f} s (budget {PROOF_BUDGET_S} s)", stacklevel=1)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda e: e.pop("strategy"), "missing or empty"),
        (lambda e: e.update(id="Bad Id"), "lowercase slug"),
        (lambda e: e.update(lesson="09_nothing"), "is not one of"),
        (lambda e: e.update(origin="source"), "needs source_ref"),
        (lambda e: e.update(proof={}), "missing or empty"),
        (lambda e: e.update(proof={"code": "def broken(:\n"}), "does not compile"),
        (lambda e: e.update(proof={"metrics": ["not an identifier"]}), "list of identifiers"),
        (lambda e: e.update(proof={"cod": "x = 1"}), "unknown proof field"),
        (lambda e: e.update(strategy="Too short."), "too short"),
        (lambda e: e.update(extra="x"), "unknown field"),
    ],
)
def test_bad_entries_are_rejected_with_the_reason(mutate, message):
    entry = {"id": "ok-entry", "lesson": "01_inference_modes", "origin": "course", "question": "Why?",
             "strategy": " ".join(["word"] * 20), "proof": {"code": "x = 1\n"}}
    interview.validate([dict(entry)])
    bad = json.loads(json.dumps(entry))
    mutate(bad)
    with pytest.raises(interview.BankError, match=message):
        interview.validate([bad])


def test_duplicate_ids_and_empty_banks_are_rejected(tmp_path):
    entry = {"id": "dup", "lesson": "01_inference_modes", "origin": "course", "question": "Why?",
             "strategy": " ".join(["word"] * 20), "proof": {"metrics": ["first_call_over_steady"]}}
    with pytest.raises(interview.BankError, match="duplicate id 'dup'"):
        interview.validate([entry, dict(entry)])
    with pytest.raises(interview.BankError, match="non-empty list"):
        interview.validate([])
    bad = tmp_path / "bank.yaml"
    bad.write_text("- id: [unclosed\n")
    with pytest.raises(interview.BankError, match="not valid YAML"):
        interview.load_bank(bad)
    with pytest.raises(FileNotFoundError):
        interview.load_bank(tmp_path / "missing.yaml")


def test_failing_and_skipped_proofs_are_reported_not_hidden():
    failing = interview.Question("f", "01_inference_modes", "course", "Q?", "S", code="print('before')\nassert 1 == 2\n")
    result = interview.run_proof(failing)
    assert not result.ok and "AssertionError" in result.error and result.output == "before\n"
    missing = interview.Question("m", "01_inference_modes", "course", "Q?", "S", code="import x\n", needs=("no_such_mod_xyz",))
    result = interview.run_proof(missing)
    assert result.ok and "no_such_mod_xyz" in result.skipped


def test_get_names_close_matches():
    with pytest.raises(KeyError, match="did you mean"):
        interview.get("trace-vs-scrip")


def test_quiz_is_seeded_and_filtered():
    a = interview.quiz(5, seed=3, show=False)
    b = interview.quiz(5, seed=3, show=False)
    assert [q.id for q in a.questions] == [q.id for q in b.questions]
    assert len({q.id for q in a.questions}) == 5
    others = [interview.quiz(5, seed=s, show=False).questions for s in range(4, 8)]
    assert any([q.id for q in o] != [q.id for q in a.questions] for o in others)
    only02 = interview.quiz(3, seed=1, lessons=["02"], show=False)
    assert {q.lesson for q in only02.questions} <= {"02_graphs", "02_jit_compilers"}  # lesson 02's two parts
    with pytest.raises(ValueError, match="only"):
        interview.quiz(len(BANK) + 1, show=False)
    with pytest.raises(ValueError, match="no lesson matches"):
        interview.quiz(1, lessons=["42"], show=False)
    with pytest.raises(ValueError, match="positive integer"):
        interview.quiz(0, show=False)


def test_default_quiz_draws_fewer_torchscript_and_keras_cards():
    legacy = importlib.import_module("utils.interview.quiz").LEGACY_IDS  # the package's `quiz` is the function
    assert legacy <= {q.id for q in BANK}, "LEGACY_IDS names a card the bank does not have"

    def legacy_share(**kw):  # share of legacy cards over many seeded quizzes (deterministic: fixed seeds)
        drawn = [q.id for s in range(300) for q in interview.quiz(8, seed=s, show=False, bank=BANK, **kw).questions]
        return sum(qid in legacy for qid in drawn) / len(drawn)

    in_bank = len(legacy) / len(BANK)
    assert legacy_share() < 0.5 * in_bank < legacy_share(legacy_weight=1.0)
    lesson02 = [q for q in BANK if q.lesson in ("02_graphs", "02_jit_compilers")]  # a quiz on a lesson weighs its cards
    # alike (both parts): a plain sample
    for s in range(5):
        picked = interview.quiz(4, seed=s, lessons=["02"], show=False, bank=BANK).questions
        assert [q.id for q in picked] == [q.id for q in random.Random(s).sample(lesson02, 4)]
    with pytest.raises(ValueError, match="legacy_weight"):
        interview.quiz(3, legacy_weight=0, show=False)


def test_quiz_hides_answers_until_asked(capsys):
    quiz = interview.quiz(3, seed=0, show=False)
    page = quiz.html()
    assert page.count("<details>") == 3 and "<summary>" in page
    quiz.show("plain")
    asked = capsys.readouterr().out
    assert all(q.question in asked for q in quiz.questions)
    flat = lambda text: " ".join(text.split())  # noqa: E731
    assert not any(flat(q.strategy)[:60] in flat(asked) for q in quiz.questions)
    quiz.reveal(1)
    assert flat(quiz.questions[1].strategy)[:60] in flat(capsys.readouterr().out)
    with pytest.raises(IndexError):
        quiz.reveal(3)
    with pytest.raises(ValueError, match="mode"):
        quiz.show("loud")


def test_quiz_widget_reveals_on_click():
    pytest.importorskip("ipywidgets")
    quiz = interview.quiz(2, seed=0, show=False)
    box = quiz.widget()
    row = box.children[0]
    _, button, answer = row.children
    assert answer.layout.display == "none"
    button.click()
    assert answer.layout.display is None and button.description == "Hide answer"
    button.click()
    assert answer.layout.display == "none"


def test_recorded_values_come_from_the_results_file(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    q = interview.get("batch-vs-single")
    assert "not run yet" in interview.recorded(q)["resnet18_bs32_vs_bs1_throughput"]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "01_serving_basics.json").write_text(json.dumps(
        {"notebook": "01_serving_basics", "mode": "full", "metrics": {"resnet18_bs32_vs_bs1_throughput": 4.25},
         "units": {"resnet18_bs32_vs_bs1_throughput": "x"}}))
    assert interview.recorded(q)["resnet18_bs32_vs_bs1_throughput"] == "4.25 x (full run)"


def test_command_line(capsys):
    assert cli.main(["validate"]) == 0
    assert f"{len(BANK)} questions" in capsys.readouterr().out
    assert cli.main(["prove", "median-and-iqr"]) == 0
    assert "proved" in capsys.readouterr().out


# practice mode (issue 25): sets by topic, lesson or a default draw; answers hidden; prove() on request


def test_every_card_has_a_topic_and_topics_name_real_cards():
    ids = {q.id for q in BANK}
    in_topics = set().union(*practice.TOPICS.values())
    assert not in_topics - ids, f"practice.TOPICS names cards the bank does not have: {sorted(in_topics - ids)}"
    assert not ids - in_topics, f"cards in no practice topic (add them to practice.TOPICS): {sorted(ids - in_topics)}"


def test_default_practice_set_fits_the_minutes_and_is_seeded():
    a = practice.pick(seed=3, show=False, bank=BANK)
    assert len(a.questions) == practice.DEFAULT_MINUTES // practice.MINUTES_PER_CARD
    assert len(set(a.ids)) == len(a.ids)
    assert a.ids == practice.pick(seed=3, show=False, bank=BANK).ids
    assert any(practice.pick(seed=s, show=False, bank=BANK).ids != a.ids for s in range(4, 8))
    assert len(practice.pick(minutes=9, show=False, bank=BANK).questions) == 3
    assert a.ids == [q.id for q in interview.quiz(len(a.ids), seed=3, show=False, bank=BANK).questions], (
        "the default set is quiz()'s draw (the legacy cards' quarter weight included)")
    legacy = importlib.import_module("utils.interview.quiz").LEGACY_IDS
    drawn = [qid for s in range(300) for qid in practice.pick(seed=s, show=False, bank=BANK).ids]
    assert sum(qid in legacy for qid in drawn) / len(drawn) < 0.5 * len(legacy) / len(BANK)
    with pytest.raises(ValueError, match="minutes"):
        practice.pick(minutes=1, show=False, bank=BANK)
    with pytest.raises(ValueError, match="positive integer"):
        practice.pick(n=0, show=False, bank=BANK)


def test_topic_and_lesson_sets():
    quant = practice.pick(topic="quantization", show=False, bank=BANK)
    assert set(quant.ids) == set(practice.TOPICS["quantization"])  # 9 cards fit in 30 minutes: all of them
    assert quant.ids == [q.id for q in BANK if q.id in quant.ids], "a topic set keeps lesson (bank) order"
    llm = practice.pick(topic="LLM", n=100, show=False, bank=BANK)  # a partial name: every topic containing it
    assert set(llm.ids) == set(practice.TOPICS["llm-inference"]) | set(practice.TOPICS["llm-serving"])
    big = practice.pick(topic="graphs-and-compilers", minutes=15, seed=2, show=False, bank=BANK)
    assert len(big.ids) == 5 and set(big.ids) <= set(practice.TOPICS["graphs-and-compilers"])
    assert big.ids == practice.pick(topic="graphs-and-compilers", minutes=15, seed=2, show=False, bank=BANK).ids
    lesson = practice.pick(lesson="06", n=100, show=False, bank=BANK)
    assert lesson.ids == [q.id for q in BANK if q.lesson.startswith("06")]
    both = practice.pick(topic="numerics", lesson="06", show=False, bank=BANK)
    assert both.ids and all(q.lesson.startswith("06") and q.id in practice.TOPICS["numerics"] for q in both.questions)
    named = practice.pick(ids=["warm-up", "kahan-summation"], show=False, bank=BANK)
    assert named.ids == ["warm-up", "kahan-summation"]
    with pytest.raises(ValueError, match="no topic matches"):
        practice.pick(topic="astrology", show=False, bank=BANK)
    with pytest.raises(ValueError, match="no lesson matches"):
        practice.pick(lesson="42", show=False, bank=BANK)
    with pytest.raises(ValueError, match="not both"):
        practice.pick(topic="numerics", ids=["warm-up"], show=False, bank=BANK)
    with pytest.raises(KeyError, match="did you mean"):
        practice.pick(ids=["warm-upp"], show=False, bank=BANK)


def test_practice_set_hides_answers_and_points_at_prove(capsys):
    chosen = practice.pick(topic="numerics", show=False, bank=BANK)
    page = chosen.html()
    n = len(chosen.questions)
    assert page.count("<details>") == n and page.count("<summary>") == n
    for q in chosen.questions:  # the question is outside the fold, the answer inside it
        head, _, fold = page.partition(html.escape(q.question))
        assert fold, q.id
        body = fold.split("</details>")[0]
        assert "<details>" in body and html.escape(q.strategy)[:80] in body
        assert html.escape(f"practice.prove({q.id!r})") in body
    assert chosen.title in page and f"about {n * practice.MINUTES_PER_CARD} minutes" in page
    chosen.show("plain")
    asked = capsys.readouterr().out
    assert all(q.question in asked for q in chosen.questions) and "reveal(k)" in asked
    flat = lambda text: " ".join(text.split())  # noqa: E731
    assert not any(flat(q.strategy)[:60] in flat(asked) for q in chosen.questions)
    chosen.reveal(chosen.ids[1])  # by id, as well as by number
    out = capsys.readouterr().out
    assert flat(chosen.questions[1].strategy)[:60] in flat(out) and "practice.prove(" in out
    with pytest.raises(KeyError, match="not in this set"):
        chosen.reveal("warm-up")


def test_practice_widget_reveals_on_click():
    pytest.importorskip("ipywidgets")
    box = practice.pick(ids=["median-and-iqr"], show=False, bank=BANK).widget()
    _, button, answer = box.children[0].children
    assert answer.layout.display == "none" and "practice.prove(" in answer.value
    button.click()
    assert answer.layout.display is None


def test_prove_runs_one_proof_and_fails_clearly(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    proofs.session_results.pop("median-and-iqr", None)
    result = practice.prove("median-and-iqr", smoke=True)
    out = capsys.readouterr().out
    assert result.ok and result.id == "median-and-iqr" and proofs.session_results["median-and-iqr"] is result
    assert "Proof of [median-and-iqr]" in out and "statistics.median" in out and "proof ran in" in out
    assert practice.prove("dynamic-batching", smoke=True) is None  # a metrics proof: the lesson's numbers
    assert "not run yet" in capsys.readouterr().out
    with pytest.raises(KeyError, match="no question 'warm-upp'.*did you mean.*utils.interview list"):
        practice.prove("warm-upp")
    failing = interview.Question("broken-card", "01_inference_modes", "course", "Q?", "S " * 12,
                                 code="print('before')\nassert 1 == 2, 'the claim no longer holds'\n")
    with pytest.raises(AssertionError, match="broken-card.*the claim no longer holds"):
        practice.prove("broken-card", bank=[failing])
    assert "before" in capsys.readouterr().out


def test_prove_all_prints_one_line_per_card_and_raises_after_the_table(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    fast = [interview.get("median-and-iqr"), interview.get("dynamic-batching")]
    results = practice.prove_all(smoke=True, bank=fast)
    lines = capsys.readouterr().out.splitlines()
    assert list(results) == ["median-and-iqr"] and results["median-and-iqr"].ok
    assert lines[0].split() == ["card", "lesson", "proof", "seconds"]
    assert lines[1].split()[:3] == ["median-and-iqr", "00_environment", "passed"]
    assert lines[2].split()[:4] == ["dynamic-batching", "05_triton_under_load", "metrics", "-"]
    assert "1 of 1 code proofs passed" in lines[-1]
    failing = interview.Question("broken-card", "01_inference_modes", "course", "Q?", "S", code="assert False\n")
    with pytest.raises(AssertionError, match=r"1 proof\(s\) failed: \['broken-card'\]"):
        practice.prove_all(smoke=True, bank=[failing, fast[0]])
    out = capsys.readouterr().out
    assert "broken-card" in out and "FAILED" in out and "median-and-iqr" in out  # the table is complete first


def test_command_line_practice(capsys):
    assert cli.main(["topics"]) == 0
    assert "quantization" in capsys.readouterr().out
    assert cli.main(["practice", "--topic", "numerics", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "kahan-summation" in out and "python -m utils.interview prove" in out
