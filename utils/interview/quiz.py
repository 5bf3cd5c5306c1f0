"""Showing the bank: a question card that runs its proof, and a seeded quiz (widgets, HTML <details>, plain text).

Lesson 08.
"""

from __future__ import annotations

import html
import importlib.util
import random
import sys
from dataclasses import dataclass

from utils.interview.bank import LESSON_TITLES, Question, get, load_bank
from utils.interview.proofs import locate, recorded, run_proof, session_results

__all__ = ["card", "Quiz", "quiz", "match_lessons", "LEGACY_IDS", "LEGACY_WEIGHT"]

# Cards on TorchScript (deprecated: torch.export and torch.compile succeed it) and on Keras specifics, which inference
# interviews now ask far less often than LLM serving or quantization (issue 28). They stay in the bank, in card() and in
# a quiz filtered by lesson; the default whole-bank quiz draws each of them with LEGACY_WEIGHT of a normal card's weight.
LEGACY_IDS = frozenset({"trace-vs-script", "what-is-torchscript", "debug-torchscript", "freeze-folds-batchnorm",
                        "keras-call-vs-predict"})
LEGACY_WEIGHT = 0.25


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
    """Show one question: the question, the answer strategy, the proof code, then run it (lesson 08).

    The ProofResult goes to ``session_results[qid]``. A failing proof prints its error and raises, so a notebook run
    stops at a claim that no longer holds.
    """
    q = get(qid)
    origin = f" (from {q.source_ref})" if q.source_ref else ""
    print(f"Q [{q.id}]{origin}: {q.question}\n")
    print("Answer strategy:")
    for para in q.strategy.split("\n\n"):
        print("  " + "\n  ".join(_wrap(para)))
    _prove_and_print(q, run=run, smoke=smoke, show_code=show_code)


def _prove_and_print(q: Question, *, run: bool = True, smoke: bool = True, show_code: bool = True):
    """The proof half of a card: where the lesson records it, the code, its output (card() and practice.prove())."""
    pointer = _pointer_text(q)
    if pointer:
        print("\n" + pointer)
    if not q.code:
        return None
    if show_code:
        print("\nProof (code from the bank):")
        print("  " + q.code.rstrip().replace("\n", "\n  "))
    if not run:
        return None
    print("\nOutput:")
    result = run_proof(q, smoke=smoke, capture=True)
    session_results[q.id] = result
    if result.skipped:
        print(f"  skipped: {result.skipped}")
        return result
    print("  " + result.output.rstrip().replace("\n", "\n  "))
    if not result.ok:
        print(result.error, file=sys.stderr)
        raise AssertionError(f"the proof of {q.id!r} failed: {result.error.strip().splitlines()[-1]}")
    print(f"  -> proof ran in {result.seconds:.1f} s")
    return result


def _wrap(text: str, width: int = 110) -> list[str]:
    import textwrap

    return textwrap.wrap(" ".join(text.split()), width) or [""]


@dataclass
class Quiz:
    """A seeded random subset of the bank (lesson 08). ``reveal(k)`` prints question k's answer strategy."""

    questions: list[Question]
    seed: int

    # the hint after the questions, the heading and the call that runs a card's proof (practice.PracticeSet changes them)
    def _ask_hint(self) -> str:
        return "Think about each one, then call quiz.reveal(k) (or quiz.reveal_all())."

    def _proof_call(self, q: Question) -> str:
        return f"card({q.id!r})"

    def _heading(self) -> str:
        return (f"<b>Quiz</b> (seed {self.seed}, {len(self.questions)} questions): "
                "answer aloud, then open the answer.")

    def ask(self) -> None:
        for k, q in enumerate(self.questions):
            print(f"{k}. [{q.lesson[:2]}] {q.question}")
        print("\n" + self._ask_hint())

    def reveal(self, k: int) -> None:
        if not 0 <= k < len(self.questions):
            raise IndexError(f"question number must be 0..{len(self.questions) - 1}, got {k}")
        q = self.questions[k]
        print(f"{k}. {q.question}\n")
        print("  " + "\n  ".join(_wrap(q.strategy)))
        print(f"\n  Proof: {self._proof_call(q)} runs it" + (f"; lesson {q.lesson[:2]} records {', '.join(q.metrics)}" if q.metrics else ""))

    def reveal_all(self) -> None:
        for k in range(len(self.questions)):
            self.reveal(k)
            print()

    def html(self) -> str:
        """Questions with answers folded in <details>: reveal on click, in Jupyter and in the static site."""
        parts = [f"<div class='quiz'><p>{self._heading()}</p><ol start='0'>"]
        for q in self.questions:
            parts.append(
                f"<li><p>{html.escape(q.question)} <i>(lesson {q.lesson[:2]})</i></p>"
                f"<details><summary>Show the answer strategy</summary><p>{html.escape(q.strategy)}</p>"
                f"<p>Proof: <code>{html.escape(self._proof_call(q))}</code></p></details></li>"
            )
        parts.append("</ol></div>")
        return "".join(parts)

    def widget(self):
        """The ipywidgets version: a button per question that shows or hides its answer."""
        import ipywidgets as w

        rows = []
        for k, q in enumerate(self.questions):
            answer = w.HTML(f"<p>{html.escape(q.strategy)}</p>"
                            f"<p>Proof: <code>{html.escape(self._proof_call(q))}</code></p>")
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
            data["text/plain"] = f"{type(self).__name__}: " + "; ".join(q.id for q in self.questions)
            display(data, raw=True)
        else:
            from IPython.display import HTML

            display(HTML(self.html()))


def match_lessons(lessons) -> set[str]:
    """The lesson stems that one or more names or prefixes ("02", "04_quantization", ["06", "07"]) stand for."""
    lessons = [lessons] if isinstance(lessons, str) else list(lessons)
    wanted = {stem for stem in LESSON_TITLES if any(stem.startswith(str(x)) for x in lessons)}
    if not wanted:
        raise ValueError(f"no lesson matches {lessons}; lessons are {sorted(LESSON_TITLES)}")
    return wanted


def quiz(n: int = 5, seed: int = 0, lessons=None, *, show: bool = True, mode: str = "auto", bank=None,
         legacy_weight: float = LEGACY_WEIGHT) -> Quiz:
    """A seeded random subset of `n` questions, optionally from some lessons only (lesson 08).

    The same seed gives the same questions in the same order, so a class can share a quiz by its seed. Without
    `lessons`, the cards in LEGACY_IDS (TorchScript, Keras) are drawn with `legacy_weight` (1: like any other card);
    a quiz on named lessons weighs every card alike.
    """
    bank = bank if bank is not None else load_bank()
    if lessons is not None:
        wanted = match_lessons(lessons)
        bank = [q for q in bank if q.lesson in wanted]
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if n > len(bank):
        raise ValueError(f"asked for {n} questions but only {len(bank)} match")
    if not (isinstance(legacy_weight, int | float) and not isinstance(legacy_weight, bool) and 0 < legacy_weight <= 1):
        raise ValueError(f"legacy_weight must be a number in (0, 1], got {legacy_weight!r}")
    rng = random.Random(seed)
    weights = [legacy_weight if lessons is None and q.id in LEGACY_IDS else 1.0 for q in bank]
    if all(w == 1.0 for w in weights):
        picked = rng.sample(bank, n)
    else:  # weighted sampling without replacement (Efraimidis-Spirakis): the n largest keys u ** (1 / weight)
        keys = [rng.random() ** (1 / w) for w in weights]
        picked = [bank[i] for i in sorted(range(len(bank)), key=keys.__getitem__, reverse=True)[:n]]
    result = Quiz(picked, seed)
    if show:
        result.show(mode)
    return result
