"""The interview bank: one YAML file beside this module, read and validated into Question objects (lesson 08).

Each entry names its lesson, its origin (a question of the source material, or the course's own), the question, an
answer strategy and a proof (runnable code and/or the metrics the lesson records). Validation errors name the entry
and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BANK_PATH", "LESSON_TITLES", "BankError", "Question", "validate", "load_bank", "get", "by_lesson"]

BANK_PATH = Path(__file__).resolve().parent / "bank.yaml"

LESSON_TITLES = {
    "00_environment": "Your machine, measured",
    "01_inference_modes": "Inference modes",
    "01_serving_basics": "Warm-up, batching, Keras and model files",
    "02_graphs": "Graphs: trace, script, export",
    "02_jit_compilers": "Compiling graphs: torch.compile, freezing, XLA",
    "03_profiling_amp": "Profiling a training loop and fixing it",
    "03_training_bound": "Mixed precision and the compute bound",
    "04_onnx_tensorrt": "ONNX, ONNX Runtime and graph optimization",
    "04_porting": "Porting a model: int8, TensorFlow, custom ops, a CI gate, TensorRT",
    "04_quantization": "Quantization from the arithmetic up",
    "04_sparsity_distillation": "Pruning and distillation",
    "05_triton_ensemble": "A Triton ensemble",
    "05_triton_under_load": "Triton under load",
    "05_triton_vs_torchserve": "Hardening Triton, and TorchServe",
    "06_fused_softmax": "A fused softmax kernel",
    "06_gpu_kernels_triton": "GPU kernels in the Triton language",
    "06_numerics": "Numerics: long sums and batch invariance",
    "07_llm_inference": "Inside LLM inference",
    "07_llm_scheduling": "Many sequences, one engine: batching, paged KV, int8",
    "07_llm_serving": "Serving techniques for LLMs",
    "07_llm_tuning": "Latency under load: chunked prefill, int8 KV cache",
    "08_interview_prep": "Interview prep",
}

_ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED = ("id", "lesson", "origin", "question", "strategy", "proof")
_ORIGINS = ("source", "course")


class BankError(ValueError):
    """The question bank file is malformed; the message names the entry and the field (lesson 08)."""


@dataclass(frozen=True)
class Question:
    """One entry of the interview bank (lesson 08)."""

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
    """Read and validate the bank (default: utils/interview/bank.yaml). Lesson 08."""
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
    """The question with this id (lesson 08); KeyError listing close ids otherwise."""
    bank = bank if bank is not None else load_bank()
    for q in bank:
        if q.id == qid:
            return q
    close = [q.id for q in bank if qid.split("-")[0] in q.id][:5]
    raise KeyError(f"no question {qid!r} in the bank" + (f"; did you mean {close}?" if close else ""))


def by_lesson(bank: list[Question] | None = None) -> dict[str, list[Question]]:
    """Questions grouped by lesson, in lesson order (lesson 08)."""
    bank = bank if bank is not None else load_bank()
    out: dict[str, list[Question]] = {stem: [] for stem in LESSON_TITLES}
    for q in bank:
        out[q.lesson].append(q)
    return {k: v for k, v in out.items() if v}
