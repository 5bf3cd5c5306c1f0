"""Running the bank's code proofs, and pointing at the lesson metrics that prove the rest (lesson 08)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from utils.core import claims, env, report
from utils.core.onnx_io import native_logs_silenced
from utils.interview.bank import Question, get

__all__ = ["ProofResult", "session_results", "run_proof", "recorded", "locate", "import_order_guard"]


@dataclass
class ProofResult:
    """What running a code proof gave: ok, seconds, the printed output and the error text if it failed (lesson 08)."""

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


def import_order_guard(needs) -> None:
    """Import OpenAI Triton before TensorFlow: the other order segfaults torch.compile/torch.export in one process.

    Measured with torch 2.14 / triton (torch's compiler) and tensorflow 2.21: ``import tensorflow`` then the first
    ``torch.compile`` or ``torch.export`` (which imports triton) crashes the interpreter; the reverse order works.
    """
    if "tensorflow" in needs and "tensorflow" not in sys.modules and importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401


def run_proof(q: Question | str, *, smoke: bool = True, capture: bool = True, echo: bool = False) -> ProofResult:
    """Execute a question's code proof in a fresh namespace and report what happened (lesson 08).

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
    import_order_guard(q.needs)
    # a proof that builds an extension imports torch.utils.cpp_extension, which logs a CUDA_HOME notice on a CPU machine
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
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
            # native_logs_silenced: C++ libraries' own log lines (TensorFlow's CUDA probe and oneDNN notice, Kineto)
            # are not the proof's output; Python's prints and exceptions are untouched
            with redirect, warnings.catch_warnings(), native_logs_silenced():
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
    """The values the lesson recorded for this question's metrics (build/results; missing: 'not run yet'). Lesson 08."""
    data = report.load_all(results_dir).get(q.lesson, {})
    metrics, units = data.get("metrics", {}), data.get("units", {})
    out: dict[str, object] = {}
    for m in q.metrics:
        if m in metrics:
            mode = f" ({data['mode']} run)" if data.get("mode") else ""
            out[m] = claims.format_value(metrics[m], units.get(m, "")) + mode
        elif not data:
            out[m] = f"not run yet (run {q.notebook})"
        else:
            out[m] = "not recorded in the last run"
    return out


def locate(q: Question, root: Path | None = None) -> str:
    """Where in the lesson notebook the question's metrics are recorded: the nearest heading above (lesson 08)."""
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
