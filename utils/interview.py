"""The interview question bank and its quiz (lesson 07).

The bank is one data file, ``utils/data/interview_bank.yaml``: a list of entries ::

    - id: trace-vs-script            # unique slug
      lesson: 02_graphs              # the lesson that teaches it
      origin: source                 # "source" (a question of the commissioned material) or "course"
      source_ref: ...                # for origin "source": which question of which document
      question: ...
      strategy: ...                  # how to answer, in a few sentences
      proof:
        code: |                      # small CPU code (seconds) that demonstrates the answer; it asserts the facts
          ...
        metrics: [name, ...]         # and/or: the metrics the lesson records while proving it (see tests)
        needs: [tensorflow]          # optional python modules the code imports

``load_bank()`` reads and validates it (clear errors naming the entry and the field). ``run_proof(entry)`` executes
a code proof in a fresh namespace (``tmpdir`` is a scratch folder, ``SMOKE`` the notebook's mode) and returns a
``ProofResult``. ``card(id)`` shows one question with its strategy and runs its proof; ``quiz(n, seed)`` shows a
seeded random subset with the answers hidden until asked for: ipywidgets buttons where available, an HTML
``<details>`` fallback that also works in the static site, and ``Quiz.reveal(k)`` in a plain terminal.

    python -m utils.interview validate | list | quiz [--n 5 --seed 0] | prove [ID ...]
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import io
import json
import random
import re
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from utils import env

__all__ = [
    "BANK_PATH",
    "LESSON_TITLES",
    "BankError",
    "Question",
    "ProofResult",
    "load_bank",
    "validate",
    "get",
    "by_lesson",
    "run_proof",
    "recorded",
    "card",
    "quiz",
    "Quiz",
    "session_results",
]

BANK_PATH = Path(__file__).resolve().parent / "data" / "interview_bank.yaml"

LESSON_TITLES = {
    "00_environment": "Your machine, measured",
    "01_inference_modes": "Inference modes",
    "02_graphs": "Graphs: trace, script, export, compile",
    "03_profiling_amp": "Profiling and mixed precision",
    "04_onnx_tensorrt": "ONNX and TensorRT",
    "05_triton_ensemble": "A Triton ensemble",
    "06_fused_softmax": "A fused softmax kernel",
    "07_interview_prep": "Interview prep",
    "08_llm_inference": "Inside LLM inference",
}

_ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED = ("id", "lesson", "origin", "question", "strategy", "proof")
_ORIGINS = ("source", "course")


class BankError(ValueError):
    """The question bank file is malformed; the message names the entry and the field (lesson 07)."""


@dataclass(frozen=True)
class Question:
    """One entry of the interview bank (lesson 07)."""

    id: str
    lesson: str
    origin: str
    question: str
    strategy: str
    code: str = ""
    metrics: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    source_ref: str = ""

    @property
    def notebook(self) -> str:
        return f"notebooks/{self.lesson}.ipynb"

    @property
    def title(self) -> str:
        return LESSON_TITLES.get(self.lesson, self.lesson)


@dataclass
class ProofResult:
    """What running a code proof gave: ok, seconds, the printed output and the error text if it failed (lesson 07)."""

    id: str
    ok: bool
    seconds: float
    output: str = ""
    error: str = ""
    skipped: str = ""  # reason when a needed module is missing
    extra: dict = field(default_factory=dict)

    def __str__(self) -> str:
        state = "skipped: " + self.skipped if self.skipped else ("proved" if self.ok else "FAILED")
        return f"[{self.id}] {state} in {self.seconds:.1f} s"


# proofs run by card() in this process, by id (the notebook's "Measured on this machine" table reads it)
session_results: dict[str, ProofResult] = {}

# ---------------------------------------------------------------------------------------------------------------------
# loading and validation
# ---------------------------------------------------------------------------------------------------------------------


def _entry(raw, index: int) -> Question:
    where = f"entry {index}"
    if not isinstance(raw, dict):
        raise BankError(f"{where}: expected a mapping with fields {list(_REQUIRED)}, got {type(raw).__name__}")
    where = f"entry {index} ({raw.get('id', 'no id')!r})"
    missing = [k for k in _REQUIRED if k not in raw or raw[k] in (None, "", {}, [])]
    if missing:
        raise BankError(f"{where}: missing or empty field(s) {missing}")
    unknown = sorted(set(raw) - set(_REQUIRED) - {"source_ref"})
    if unknown:
        raise BankError(f"{where}: unknown field(s) {unknown}; allowed: {list(_REQUIRED) + ['source_ref']}")
    for key in ("id", "lesson", "origin", "question", "strategy"):
        if not isinstance(raw[key], str):
            raise BankError(f"{where}: field {key!r} must be text, got {type(raw[key]).__name__}")
    if not _ID_RE.match(raw["id"]):
        raise BankError(f"{where}: id must be a lowercase slug like 'trace-vs-script', got {raw['id']!r}")
    if raw["lesson"] not in LESSON_TITLES:
        raise BankError(f"{where}: lesson {raw['lesson']!r} is not one of {sorted(LESSON_TITLES)}")
    if raw["origin"] not in _ORIGINS:
        raise BankError(f"{where}: origin must be one of {_ORIGINS}, got {raw['origin']!r}")
    if raw["origin"] == "source" and not raw.get("source_ref"):
        raise BankError(f"{where}: a question from the source material needs source_ref (which document, which question)")
    proof = raw["proof"]
    if not isinstance(proof, dict):
        raise BankError(f"{where}: proof must be a mapping with 'code' and/or 'metrics', got {type(proof).__name__}")
    extra = sorted(set(proof) - {"code", "metrics", "needs"})
    if extra:
        raise BankError(f"{where}: unknown proof field(s) {extra}; allowed: code, metrics, needs")
    code = proof.get("code") or ""
    metrics = proof.get("metrics") or []
    needs = proof.get("needs") or []
    if not code and not metrics:
        raise BankError(f"{where}: the proof needs runnable 'code' or the lesson 'metrics' that prove it")
    if not isinstance(code, str):
        raise BankError(f"{where}: proof.code must be text, got {type(code).__name__}")
    for name, value in (("metrics", metrics), ("needs", needs)):
        if not isinstance(value, list) or not all(isinstance(v, str) and v.isidentifier() for v in value):
            raise BankError(f"{where}: proof.{name} must be a list of identifiers, got {value!r}")
    if code:
        try:
            compile(code, f"<proof {raw['id']}>", "exec")
        except SyntaxError as exc:
            raise BankError(f"{where}: proof.code does not compile: {exc}") from None
    if len(raw["strategy"].split()) < 12:
        raise BankError(f"{where}: the answer strategy is too short to be useful ({len(raw['strategy'].split())} words)")
    return Question(
        id=raw["id"], lesson=raw["lesson"], origin=raw["origin"], question=raw["question"].strip(),
        strategy=raw["strategy"].strip(), code=code.rstrip() + ("\n" if code else ""), metrics=tuple(metrics),
        needs=tuple(needs), source_ref=str(raw.get("source_ref") or ""),
    )


def validate(raw_entries) -> list[Question]:
    """Validate parsed bank data (a list of mappings) and return the questions; BankError on the first problem."""
    if not isinstance(raw_entries, list) or not raw_entries:
        raise BankError(f"the bank must be a non-empty list of questions, got {type(raw_entries).__name__}")
    questions = [_entry(raw, i) for i, raw in enumerate(raw_entries)]
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            raise BankError(f"duplicate id {q.id!r}")
        seen.add(q.id)
    return questions


def load_bank(path: str | Path | None = None) -> list[Question]:
    """Read and validate the bank (default: utils/data/interview_bank.yaml). Lesson 07."""
    import yaml

    path = Path(path) if path is not None else BANK_PATH
    if not path.is_file():
        raise FileNotFoundError(f"question bank not found at {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BankError(f"{path} is not valid YAML: {exc}") from None
    return validate(data)


def get(qid: str, bank: list[Question] | None = None) -> Question:
    """The question with this id (lesson 07); KeyError listing close ids otherwise."""
    bank = bank if bank is not None else load_bank()
    for q in bank:
        if q.id == qid:
            return q
    close = [q.id for q in bank if qid.split("-")[0] in q.id][:5]
    raise KeyError(f"no question {qid!r} in the bank" + (f"; did you mean {close}?" if close else ""))


def by_lesson(bank: list[Question] | None = None) -> dict[str, list[Question]]:
    """Questions grouped by lesson, in lesson order (lesson 07)."""
    bank = bank if bank is not None else load_bank()
    out: dict[str, list[Question]] = {stem: [] for stem in LESSON_TITLES}
    for q in bank:
        out[q.lesson].append(q)
    return {k: v for k, v in out.items() if v}


# ---------------------------------------------------------------------------------------------------------------------
# proofs
# ---------------------------------------------------------------------------------------------------------------------


def _import_order_guard(needs) -> None:
    """Import OpenAI Triton before TensorFlow: the other order segfaults torch.compile/torch.export in one process.

    Measured with torch 2.14 / triton (torch's compiler) and tensorflow 2.21: ``import tensorflow`` then the first
    ``torch.compile`` or ``torch.export`` (which imports triton) crashes the interpreter; the reverse order works.
    """
    if "tensorflow" in needs and "tensorflow" not in sys.modules and importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401


def run_proof(q: Question | str, *, smoke: bool = True, capture: bool = True, echo: bool = False) -> ProofResult:
    """Execute a question's code proof in a fresh namespace and report what happened (lesson 07).

    The namespace holds ``tmpdir`` (a Path removed afterwards) and ``SMOKE``. Warnings are silenced so the output
    shows what the proof prints. With ``capture`` the output is collected (and printed too when ``echo``).
    A proof whose needed module is missing is skipped with the reason, never failed.
    """
    q = get(q) if isinstance(q, str) else q
    if not q.code:
        return ProofResult(q.id, True, 0.0, output="", skipped="no code proof: proved by the lesson's metrics")
    missing = [m for m in q.needs if importlib.util.find_spec(m) is None]
    if missing:
        return ProofResult(q.id, True, 0.0, skipped=f"needs python module(s) {missing}, not installed here")
    _import_order_guard(q.needs)
    buf = io.StringIO()
    t0 = time.perf_counter()
    ok, error = True, ""
    with tempfile.TemporaryDirectory(prefix=f"proof-{q.id}-") as tmp:
        # a real source file: torch.jit.script and tf.function's autograph read the source of what they compile
        source = Path(tmp) / f"proof_{q.id.replace('-', '_')}.py"
        source.write_text(q.code)
        namespace = {"__name__": source.stem, "__file__": str(source), "tmpdir": Path(tmp), "SMOKE": smoke}
        redirect = contextlib.redirect_stdout(buf) if capture else contextlib.nullcontext()
        try:
            with redirect, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(q.code, str(source), "exec"), namespace)  # the bank is part of the course
        except Exception:
            ok = False
            error = traceback.format_exc(limit=-3)
    result = ProofResult(q.id, ok, time.perf_counter() - t0, output=buf.getvalue(), error=error)
    if echo and capture:
        print(result.output, end="")
    return result


def recorded(q: Question, results_dir: Path | None = None) -> dict[str, object]:
    """The values the lesson recorded for this question's metrics in build/results (missing: 'not run yet')."""
    path = (results_dir or env.build_dir() / "results") / f"{q.lesson}.json"
    data = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            data = {}
    metrics = data.get("metrics", {})
    units = data.get("units", {})
    out: dict[str, object] = {}
    for m in q.metrics:
        if m in metrics:
            v = metrics[m]
            shown = f"{v:.3g}" if isinstance(v, float) else str(v)
            out[m] = f"{shown} {units.get(m, '')}".strip() + (f" ({data.get('mode')} run)" if data.get("mode") else "")
        elif not data:
            out[m] = f"not run yet (run {q.notebook})"
        else:
            out[m] = "not recorded in the last run"
    return out


def locate(q: Question, root: Path | None = None) -> str:
    """Where in the lesson notebook the question's metrics are recorded: the nearest heading above (lesson 07)."""
    root = root or env.repo_root()
    path = root / q.notebook
    if not q.metrics or not path.is_file():
        return ""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    heading = ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    heading = line.lstrip("#").strip()
        elif any(f'"{m}"' in cell.source or f"'{m}'" in cell.source for m in q.metrics):
            return heading
    return ""


# ---------------------------------------------------------------------------------------------------------------------
# display
# ---------------------------------------------------------------------------------------------------------------------


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and hasattr(shell, "kernel")


def _pointer_text(q: Question) -> str:
    if not q.metrics:
        return ""
    where = locate(q)
    values = recorded(q)
    lines = [f"Proved in lesson {q.lesson[:2]} ({q.notebook}" + (f', section "{where}"' if where else "") + "):"]
    lines += [f"  {m} = {v}" for m, v in values.items()]
    return "\n".join(lines)


def card(qid: str, *, run: bool = True, smoke: bool = True, show_code: bool = True) -> None:
    """Show one question: the question, the answer strategy, the proof code, then run it (lesson 07).

    The ProofResult goes to ``session_results[qid]``. A failing proof prints its error and raises, so a notebook run
    stops at a claim that no longer holds.
    """
    q = get(qid)
    origin = f" (from {q.source_ref})" if q.source_ref else ""
    print(f"Q [{q.id}]{origin}: {q.question}\n")
    print("Answer strategy:")
    for para in q.strategy.split("\n\n"):
        print("  " + "\n  ".join(_wrap(para)))
    pointer = _pointer_text(q)
    if pointer:
        print("\n" + pointer)
    if not q.code:
        return
    if show_code:
        print("\nProof (code from the bank):")
        print("  " + q.code.rstrip().replace("\n", "\n  "))
    if not run:
        return
    print("\nOutput:")
    result = run_proof(q, smoke=smoke, capture=True)
    session_results[q.id] = result
    if result.skipped:
        print(f"  skipped: {result.skipped}")
        return
    print("  " + result.output.rstrip().replace("\n", "\n  "))
    if not result.ok:
        print(result.error, file=sys.stderr)
        raise AssertionError(f"the proof of {q.id!r} failed: {result.error.strip().splitlines()[-1]}")
    print(f"  -> proof ran in {result.seconds:.1f} s")


def _wrap(text: str, width: int = 110) -> list[str]:
    import textwrap

    return textwrap.wrap(" ".join(text.split()), width) or [""]


@dataclass
class Quiz:
    """A seeded random subset of the bank (lesson 07). ``reveal(k)`` prints question k's answer strategy."""

    questions: list[Question]
    seed: int

    def ask(self) -> None:
        for k, q in enumerate(self.questions):
            print(f"{k}. [{q.lesson[:2]}] {q.question}")
        print("\nThink about each one, then call quiz.reveal(k) (or quiz.reveal_all()).")

    def reveal(self, k: int) -> None:
        if not 0 <= k < len(self.questions):
            raise IndexError(f"question number must be 0..{len(self.questions) - 1}, got {k}")
        q = self.questions[k]
        print(f"{k}. {q.question}\n")
        print("  " + "\n  ".join(_wrap(q.strategy)))
        print(f"\n  Proof: card({q.id!r}) runs it" + (f"; lesson {q.lesson[:2]} records {', '.join(q.metrics)}" if q.metrics else ""))

    def reveal_all(self) -> None:
        for k in range(len(self.questions)):
            self.reveal(k)
            print()

    def html(self) -> str:
        """Questions with answers folded in <details>: reveal on click, in Jupyter and in the static site."""
        parts = [f"<div class='quiz'><p><b>Quiz</b> (seed {self.seed}, {len(self.questions)} questions): "
                 "answer aloud, then open the answer.</p><ol start='0'>"]
        for q in self.questions:
            parts.append(
                f"<li><p>{html.escape(q.question)} <i>(lesson {q.lesson[:2]})</i></p>"
                f"<details><summary>Show the answer strategy</summary><p>{html.escape(q.strategy)}</p>"
                f"<p>Proof: <code>card({q.id!r})</code></p></details></li>"
            )
        parts.append("</ol></div>")
        return "".join(parts)

    def widget(self):
        """The ipywidgets version: a button per question that shows or hides its answer."""
        import ipywidgets as w

        rows = []
        for k, q in enumerate(self.questions):
            answer = w.HTML(f"<p>{html.escape(q.strategy)}</p><p>Proof: <code>card({q.id!r})</code></p>")
            answer.layout.display = "none"
            button = w.Button(description="Show answer", layout=w.Layout(width="140px"))

            def toggle(_b, answer=answer, button=button):
                hidden = answer.layout.display == "none"
                answer.layout.display = None if hidden else "none"
                button.description = "Hide answer" if hidden else "Show answer"

            button.on_click(toggle)
            rows.append(w.VBox([w.HTML(f"<b>{k}.</b> {html.escape(q.question)} <i>(lesson {q.lesson[:2]})</i>"),
                                button, answer]))
        return w.VBox(rows)

    def show(self, mode: str = "auto") -> None:
        """Display the quiz: 'widgets', 'html' or 'plain'; 'auto' picks widgets in a kernel where ipywidgets exists.

        The widget output carries the <details> version as its HTML fallback, so the executed notebook rendered to
        static HTML still lets a reader reveal answers one at a time.
        """
        if mode not in {"auto", "widgets", "html", "plain"}:
            raise ValueError(f"mode must be 'auto', 'widgets', 'html' or 'plain', got {mode!r}")
        has_widgets = importlib.util.find_spec("ipywidgets") is not None
        if mode == "auto":
            mode = "widgets" if (_in_kernel() and has_widgets) else ("html" if _in_kernel() else "plain")
        if mode == "plain":
            self.ask()
            return
        from IPython.display import display

        if mode == "widgets":
            if not has_widgets:
                raise RuntimeError("ipywidgets is not installed: use mode='html' or mode='plain'")
            bundle = self.widget()._repr_mimebundle_()
            data = bundle[0] if isinstance(bundle, tuple) else bundle
            data = dict(data)
            data["text/html"] = self.html()
            data["text/plain"] = "Quiz: " + "; ".join(q.id for q in self.questions)
            display(data, raw=True)
        else:
            from IPython.display import HTML

            display(HTML(self.html()))


def quiz(n: int = 5, seed: int = 0, lessons=None, *, show: bool = True, mode: str = "auto", bank=None) -> Quiz:
    """A seeded random subset of `n` questions, optionally from some lessons only (lesson 07).

    The same seed gives the same questions in the same order, so a class can share a quiz by its seed.
    """
    bank = bank if bank is not None else load_bank()
    if lessons is not None:
        lessons = [lessons] if isinstance(lessons, str) else list(lessons)
        wanted = {stem for stem in LESSON_TITLES if any(stem.startswith(str(x)) for x in lessons)}
        if not wanted:
            raise ValueError(f"no lesson matches {lessons}; lessons are {sorted(LESSON_TITLES)}")
        bank = [q for q in bank if q.lesson in wanted]
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if n > len(bank):
        raise ValueError(f"asked for {n} questions but only {len(bank)} match")
    picked = random.Random(seed).sample(bank, n)
    result = Quiz(picked, seed)
    if show:
        result.show(mode)
    return result


# ---------------------------------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.interview", description="The lesson 07 question bank.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("validate", help="check the bank file")
    sub.add_parser("list", help="list the questions by lesson")
    qp = sub.add_parser("quiz", help="a seeded random quiz; press Enter to reveal each answer")
    qp.add_argument("--n", type=int, default=5)
    qp.add_argument("--seed", type=int, default=0)
    qp.add_argument("--lesson", action="append", default=None, help="e.g. 02 (repeatable)")
    pp = sub.add_parser("prove", help="run code proofs (all, or the ids given)")
    pp.add_argument("ids", nargs="*")
    args = parser.parse_args(argv)

    bank = load_bank()
    if args.cmd == "validate":
        print(f"{BANK_PATH.name}: {len(bank)} questions, {len(by_lesson(bank))} lessons, "
              f"{sum(bool(q.code) for q in bank)} code proofs, {sum(bool(q.metrics) for q in bank)} lesson pointers")
        return 0
    if args.cmd == "list":
        for stem, qs in by_lesson(bank).items():
            print(f"{stem}:")
            for q in qs:
                print(f"  {q.id:34s} {q.question[:80]}")
        return 0
    if args.cmd == "quiz":
        qz = quiz(args.n, args.seed, args.lesson, show=False, bank=bank)
        interactive = sys.stdin.isatty()
        for k, q in enumerate(qz.questions):
            print(f"\n{k}. {q.question}")
            if interactive:
                input("   (Enter to reveal) ")
            print("   " + "\n   ".join(_wrap(q.strategy, 100)))
        return 0
    ids = args.ids or [q.id for q in bank if q.code]
    failed = 0
    for qid in ids:
        res = run_proof(get(qid, bank))
        print(res)
        if not res.ok:
            failed += 1
            print(res.output + res.error)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
