"""Practice mode: pick a set of cards (by topic, by lesson, or a default 30-minute set), see each question with its
answer hidden, answer aloud, reveal, then run the card's proof (lesson 08).

    from utils.interview import practice
    today = practice.pick()                      # the default set: about 30 minutes, seeded
    practice.pick(topic="quantization")          # a topic set (practice.TOPICS lists them)
    practice.pick(lesson="02")                   # a lesson set
    today.reveal(0)                              # plain text: card 0's answer strategy
    practice.prove("warm-up")                    # run one card's proof and print what it showed
    practice.prove_all()                         # every proof in the bank, one line per card

A set is a quiz (utils.interview.quiz.Quiz): the same seeded draw, the same hidden-answer display (ipywidgets
buttons with an HTML <details> fallback, which the static site shows), the same reveal().
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from utils.core import env
from utils.interview.bank import Question, get, load_bank
from utils.interview.proofs import ProofResult, recorded, run_proof, session_results
from utils.interview.quiz import Quiz, _prove_and_print, match_lessons, quiz

__all__ = ["TOPICS", "MINUTES_PER_CARD", "DEFAULT_MINUTES", "PracticeSet", "pick", "topics", "prove", "prove_all"]

# Answer aloud (about a minute), read the answer strategy (about a minute), run and read the proof (about a minute).
MINUTES_PER_CARD = 3
DEFAULT_MINUTES = 30

# Topics cut across lessons: a card can sit in several. Every card of the bank is in at least one (a test checks it).
TOPICS: dict[str, tuple[str, ...]] = {
    "measurement": ("memory-or-compute-bound", "median-and-iqr", "warm-up", "batch-vs-single", "profile-a-training-loop",
                    "amp-predict-from-hardware", "is-the-kernel-good", "triton-latency-methodology", "quoted-speedups"),
    "pytorch-inference": ("no-grad-vs-requires-grad", "why-eval", "two-ways-to-save", "weights-only-load",
                          "inference-mode-vs-no-grad", "warm-up", "device-mismatch", "out-of-memory",
                          "keras-call-vs-predict"),
    "graphs-and-compilers": ("trace-vs-script", "graphs-pytorch-vs-tensorflow", "what-is-torchscript",
                             "debug-torchscript", "freeze-folds-batchnorm", "export-cond", "graph-breaks",
                             "xla-compile-vs-execute", "tf-retracing", "cuda-graphs-overhead", "compile-recompilation"),
    "training-speed": ("profile-a-training-loop", "amp-loss-scaling", "amp-predict-from-hardware", "channels-last",
                       "dataloader-workers"),
    "conversion": ("what-is-onnx", "onnx-custom-autograd-function", "custom-graph-pass", "conversion-gate-ci",
                   "preprocessing-in-graph", "tensorrt-missing-fusions", "constant-folding", "parity-not-bitwise"),
    "quantization": ("dynamic-quantization-cnn", "int8-calibration", "affine-quantization", "integer-matmul-requantize",
                     "calibration-methods", "ptq-vs-qat", "weight-only-int4", "smoothquant", "int8-kv-cache"),
    "compression": ("unstructured-vs-structured-pruning", "knowledge-distillation", "affine-quantization", "ptq-vs-qat",
                    "weight-only-int4"),
    "serving": ("batch-vs-single", "triton-latency-methodology", "dynamic-batching", "triton-ensemble",
                "serving-hardening", "replicas-littles-law", "continuous-vs-dynamic-batching"),
    "gpu-and-kernels": ("online-softmax", "custom-op-registration", "is-the-kernel-good", "tiling-memory-hierarchy",
                        "memory-coalescing", "warps-and-divergence", "occupancy", "tensor-cores-vs-systolic",
                        "cuda-graphs-overhead", "flash-attention-io"),
    "numerics": ("kahan-summation", "batch-invariance", "parity-not-bitwise", "amp-loss-scaling", "online-softmax"),
    "llm-inference": ("decode-memory-bound", "kv-cache-cost", "flash-attention", "continuous-vs-dynamic-batching",
                      "static-vs-continuous-batching", "flash-attention-io", "kv-cache-budget", "decode-latency-bound"),
    "llm-serving": ("paged-kv-cache", "prefix-caching", "chunked-prefill", "speculative-decoding",
                    "speculative-sampling", "grouped-query-attention", "int8-kv-cache"),
    "sizing-arithmetic": ("memory-or-compute-bound", "kv-cache-budget", "decode-latency-bound", "replicas-littles-law"),
}


def _match_topics(topic: str) -> list[str]:
    """The topics a name stands for: an exact name, else every topic containing it ("llm": both LLM topics)."""
    key = str(topic).strip().lower().replace(" ", "-").replace("_", "-")
    if key in TOPICS:
        return [key]
    found = [name for name in TOPICS if key and key in name]
    if not found:
        raise ValueError(f"no topic matches {topic!r}; topics are {sorted(TOPICS)}")
    return found


@dataclass
class PracticeSet(Quiz):
    """A set of cards to practise (lesson 08): a Quiz whose answers point at ``practice.prove(id)``.

    ``show()`` displays the questions with their answers hidden; ``reveal(k or id)`` prints one answer strategy;
    ``prove(k or id)`` runs that card's proof.
    """

    title: str = "Practice"
    smoke: bool | None = None

    def _ask_hint(self) -> str:
        return "Answer each aloud, then call .reveal(k) on this set for card k's answer, and practice.prove(id) for its proof."

    def _proof_call(self, q: Question) -> str:
        return f"practice.prove({q.id!r})"

    def _heading(self) -> str:
        n = len(self.questions)
        return (f"<b>{self.title}</b>: {n} card{'s' * (n != 1)}, about {n * MINUTES_PER_CARD} minutes. Answer each "
                "aloud first, then open its answer; <code>practice.prove(id)</code> runs its proof.")

    @property
    def ids(self) -> list[str]:
        return [q.id for q in self.questions]

    def _index(self, k: int | str) -> int:
        if isinstance(k, str):
            if k not in self.ids:
                raise KeyError(f"card {k!r} is not in this set; its cards are {self.ids}")
            return self.ids.index(k)
        return k

    def reveal(self, k: int | str) -> None:
        super().reveal(self._index(k))

    def prove(self, k: int | str) -> ProofResult | None:
        index = self._index(k)
        if not 0 <= index < len(self.questions):
            raise IndexError(f"card number must be 0..{len(self.questions) - 1}, got {k}")
        return prove(self.questions[index].id, smoke=self.smoke)


def pick(topic: str | None = None, lesson=None, *, ids=None, minutes: int = DEFAULT_MINUTES, n: int | None = None,
         seed: int = 0, smoke: bool | None = None, show: bool = True, mode: str = "auto", bank=None) -> PracticeSet:
    """A practice set (lesson 08): the cards of a topic and/or a lesson, named cards, or a default set drawn from the
    whole bank.

    The set holds ``n`` cards (default: as many as fit in ``minutes`` at MINUTES_PER_CARD each). The default set is
    quiz()'s seeded draw, so the TorchScript and Keras cards keep their LEGACY_WEIGHT; a topic or lesson set takes all
    its cards in bank order, or, when they do not fit, a seeded plain sample of them (kept in bank order). The same
    arguments and seed always give the same set. ``ids`` names the cards (in that order): a set to share.
    """
    bank = bank if bank is not None else load_bank()
    if ids is not None:
        if topic is not None or lesson is not None:
            raise ValueError("give ids, or a topic and/or a lesson, not both")
        ids = [ids] if isinstance(ids, str) else list(ids)
        if not ids:
            raise ValueError("ids is empty: name at least one card")
        result = PracticeSet([_resolve(qid, bank) for qid in ids], seed, title="Practice set: named cards", smoke=smoke)
        if show:
            result.show(mode)
        return result
    if n is None:
        if not isinstance(minutes, int) or isinstance(minutes, bool) or minutes < MINUTES_PER_CARD:
            raise ValueError(f"minutes must be an integer of at least {MINUTES_PER_CARD} (one card), got {minutes!r}")
        n = minutes // MINUTES_PER_CARD
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if topic is None and lesson is None:
        drawn = quiz(min(n, len(bank)), seed, show=False, bank=bank).questions
        title = f"Practice set (seed {seed})"
    else:
        names = []
        pool = list(bank)
        if topic is not None:
            wanted_topics = _match_topics(topic)
            ids = {qid for name in wanted_topics for qid in TOPICS[name]}
            pool = [q for q in pool if q.id in ids]
            names.append("topic " + " + ".join(wanted_topics))
        if lesson is not None:
            stems = match_lessons(lesson)
            pool = [q for q in pool if q.lesson in stems]
            names.append("lesson " + " + ".join(sorted(stems)))
        if not pool:
            raise ValueError(f"no card is in {' and '.join(names)}")
        if len(pool) > n:
            chosen = {q.id for q in quiz(n, seed, show=False, bank=pool, legacy_weight=1.0).questions}
            pool = [q for q in pool if q.id in chosen]
            names.append(f"seed {seed}")
        drawn = pool
        title = "Practice set: " + ", ".join(names)
    result = PracticeSet(list(drawn), seed, title=title, smoke=smoke)
    if show:
        result.show(mode)
    return result


def topics(bank=None) -> dict[str, int]:
    """Print each topic with its number of cards and minutes; return {topic: cards} (lesson 08)."""
    ids = {q.id for q in (bank if bank is not None else load_bank())}
    counts = {name: sum(qid in ids for qid in members) for name, members in TOPICS.items()}
    for name, count in counts.items():
        print(f"  {name:22s} {count:2d} cards, about {count * MINUTES_PER_CARD} minutes")
    return counts


def _resolve(qid: str, bank=None) -> Question:
    try:
        return get(qid, bank)
    except KeyError as exc:
        raise KeyError(f"{exc.args[0]}; `python -m utils.interview list` lists every card id") from None


def _smoke(smoke: bool | None) -> bool:
    return bool(smoke) if smoke is not None else env.smoke_default()


def prove(qid: str, *, smoke: bool | None = None, show_code: bool = True, bank=None) -> ProofResult | None:
    """Run one card's proof and print its code, its output and how long it took (lesson 08).

    A card proved by a lesson's metrics prints the values that lesson recorded (or that it has not run yet) and
    returns None. A failing proof prints its error and raises AssertionError; an unknown id raises KeyError naming
    close ids. ``smoke`` defaults from WORKBOOK_SMOKE, like a notebook's parameters cell.
    """
    q = _resolve(qid, bank)
    print(f"Proof of [{q.id}] (lesson {q.lesson[:2]}, {q.notebook})")
    result = _prove_and_print(q, run=True, smoke=_smoke(smoke), show_code=show_code)
    if result is None:
        print("  (no code proof: the lesson's recorded metrics above are the evidence)")
    return result


def _row(q: Question, result: ProofResult | None) -> str:
    """One line of prove_all's table: id, lesson, proof state, seconds, and a note where there is one."""
    note = ""
    if result is None:
        values = recorded(q)
        seen = sum(not str(v).startswith(("not run", "not recorded")) for v in values.values())
        state, seconds = "metrics", "-"
        note = f"{seen} of {len(values)} recorded by {q.lesson}"
    elif result.skipped:
        state, seconds, note = "skipped", "-", result.skipped
    else:
        state, seconds = ("passed" if result.ok else "FAILED"), f"{result.seconds:.1f}"
    return f"{q.id:34s} {q.lesson:20s} {state:8s} {seconds:>7s}" + (f"  {note}" if note else "")


def prove_all(*, smoke: bool | None = None, bank=None) -> dict[str, ProofResult]:
    """Run every code proof in the bank, printing one line per card (id, lesson, proof, seconds); lesson 08.

    Cards without code are listed with the lesson metrics that prove them. Every proof runs even when one fails; then
    an AssertionError names the failures (their errors go to stderr). Results also go to ``session_results``.
    """
    bank = bank if bank is not None else load_bank()
    smoke = _smoke(smoke)
    results: dict[str, ProofResult] = {}
    print(f"{'card':34s} {'lesson':20s} {'proof':8s} {'seconds':>7s}")
    for q in bank:
        result = run_proof(q, smoke=smoke, capture=True) if q.code else None
        if result is not None:
            results[q.id] = session_results[q.id] = result
        print(_row(q, result))
    failed = [r for r in results.values() if not r.ok]
    passed = sum(r.ok and not r.skipped for r in results.values())
    print(f"\n{passed} of {len(results)} code proofs passed, {sum(bool(r.skipped) for r in results.values())} skipped, "
          f"{len(failed)} failed; {len(bank) - len(results)} cards proved by lesson metrics; "
          f"{sum(r.seconds for r in results.values()):.0f} s in all")
    for r in failed:
        print(f"\n[{r.id}] output:\n{r.output}\n{r.error}", file=sys.stderr)
    if failed:
        raise AssertionError(f"{len(failed)} proof(s) failed: {[r.id for r in failed]}")
    return results
