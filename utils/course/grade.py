"""Grade a folder of submitted lab notebooks (instructor kit; docs/INSTRUCTOR.md "Grading").

    python -m utils.course.grade SUBMISSIONS [--out grades.csv] [--timeout 300] [--full] [--lab 00_environment_lab]
    make grade SUBMISSIONS=path/to/folder

A submission is a lab notebook named after its lab: ``SUBMISSIONS/<learner>/00_environment_lab.ipynb`` or
``SUBMISSIONS/<learner>_00_environment_lab.ipynb`` (with ``--lab``, any ``SUBMISSIONS/<learner>.ipynb``). Each one is
copied into its own scratch folder, its ``# CHECK`` cells are replaced by the reference ones from solutions/ (so an
edited check cannot pass itself), and it is executed there with a per-submission timeout. The CSV has one row per
learner and check: ``learner, lab, check, status, detail, seconds`` with status ``passed``, ``failed`` (the check
raised LabCheckFailed), ``error`` (anything else: a crash, a missing function, a dead kernel), ``timeout`` or
``not_run``.

Beside it, ``leaderboard.csv`` and ``leaderboard.html`` (a page an instructor can project): one row per learner and lab
with the checks passed and each performance figure the lab's checks printed (``utils.checks.figure``: a fraction of a
roof, a speedup, all measured on the grading machine in the same run as the baseline), sorted by checks passed, then
by the lab's first figure.

Isolation: every submission runs in the sandbox of utils.course.sandbox (its docstring says what is and is not
enforced); without one, grading refuses unless ``--unsafe-no-sandbox`` is given.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from utils.core import env
from utils.course.sandbox import Sandbox, sandbox, stage

__all__ = [
    "COLUMNS",
    "STATUSES",
    "Submission",
    "find_submissions",
    "reference_checks",
    "grade_one",
    "grade",
    "leaderboard",
    "main",
]

COLUMNS = ("learner", "lab", "check", "status", "detail", "seconds")
STATUSES = ("passed", "failed", "error", "timeout", "not_run")
CHECK = "# CHECK"
_CHECK_CALL = re.compile(r"\b(lab\w*)\.(check_\w+)\s*\(")
_DETAIL_MAX = 300
_FIGURE = re.compile(r"^FIGURE (\S+): (\S+) (\S+) \((higher|lower) is better\)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Submission:
    """One learner's notebook for one lab."""

    learner: str
    lab: str  # stem of solutions/<lab>.ipynb, e.g. "00_environment_lab"
    path: Path


# ---------------------------------------------------------------------------------------------------------------------
# finding submissions and checks
# ---------------------------------------------------------------------------------------------------------------------


def known_labs(root: Path | None = None) -> list[str]:
    """The lab stems that can be graded (one per solutions/*.ipynb)."""
    root = root or env.repo_root()
    return sorted(p.stem for p in (root / "solutions").glob("*.ipynb"))


def _learner_from(name: str, lab: str) -> str:
    rest = name.replace(lab, " ")
    return re.sub(r"^[\s_.-]+|[\s_.-]+$", "", rest) or ""


def find_submissions(folder: Path, lab: str | None = None, root: Path | None = None) -> list[Submission]:
    """The submissions in `folder` (see the module docstring for the accepted layouts), sorted by learner and lab."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"submissions folder {folder} does not exist")
    labs = known_labs(root)
    if lab is not None and lab not in labs:
        raise ValueError(f"unknown lab {lab!r}; expected one of {labs}")
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or any(part.startswith(".grade") for part in path.parts):
            continue
        rel = path.relative_to(folder)
        matches = [lab] if lab else [s for s in labs if s in path.stem]
        if len(rel.parts) > 1:  # <learner>/<anything>.ipynb
            learner = rel.parts[0]
        else:
            learner = _learner_from(path.stem, matches[0]) if matches else ""
            learner = learner or (path.stem if lab else "")
        if not matches:
            found.append(Submission(learner or path.stem, "", path))
            continue
        found.append(Submission(learner or path.stem, max(matches, key=len), path))
    if not found:
        raise FileNotFoundError(f"no .ipynb submissions under {folder}")
    return sorted(found, key=lambda s: (s.learner, s.lab, str(s.path)))


def _check_name(source: str, index: int) -> str:
    calls = [m.group(2) for m in _CHECK_CALL.finditer(source)]
    return "+".join(dict.fromkeys(calls)) or f"check {index + 1}"


def reference_checks(lab: str, root: Path | None = None) -> list[tuple[str, str]]:
    """(name, source) of every `# CHECK` cell of solutions/<lab>.ipynb, in order."""
    import nbformat

    root = root or env.repo_root()
    path = root / "solutions" / f"{lab}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no reference notebook {path}")
    nb = nbformat.read(str(path), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(CHECK)]
    if not cells:
        raise ValueError(f"{path} has no '{CHECK}' cells to grade with")
    return [(_check_name(src, i), src) for i, src in enumerate(cells)]


def _prepare(sub: Submission, checks: list[tuple[str, str]], scratch: Path) -> tuple[Path, list[int], str]:
    """Copy the submission into scratch with the reference check cells. Returns (path, check cell indices, problem)."""
    import nbformat

    try:
        nb = nbformat.read(str(sub.path), as_version=4)
    except Exception as exc:  # an unreadable file is the learner's problem, reported per check
        return scratch / "submission.ipynb", [], f"the notebook cannot be read ({type(exc).__name__}: {exc})"
    positions = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.lstrip().startswith(CHECK)]
    if len(positions) != len(checks):
        return (scratch / "submission.ipynb", [],
                f"the notebook has {len(positions)} '# CHECK' cells, the lab has {len(checks)}: "
                "restore the check cells from labs/ and resubmit")
    for i, (_, src) in zip(positions, checks, strict=True):
        nb.cells[i].source = src
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    path = scratch / "submission.ipynb"
    nbformat.write(nb, str(path))
    return path, positions, ""


# ---------------------------------------------------------------------------------------------------------------------
# running and classifying
# ---------------------------------------------------------------------------------------------------------------------


def _scratch_env(scratch: Path, smoke: bool) -> dict[str, str]:
    out = dict(os.environ)
    for key in list(out):
        if key.startswith(("JUPYTER_", "JPY_", "PYDEVD")):
            out.pop(key)
    dirs = {"HOME": "home", "TMPDIR": "tmp", "WORKBOOK_BUILD_DIR": "build", "IPYTHONDIR": "ipython",
            "MPLCONFIGDIR": "mpl", "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTER_DATA_DIR": "jupyter-data",
            "XDG_CACHE_HOME": "cache", "TORCH_EXTENSIONS_DIR": "torch_extensions", "TRITON_CACHE_DIR": "triton"}
    for key, sub in dirs.items():
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        out[key] = str(scratch / sub)
    out["WORKBOOK_SMOKE"] = "1" if smoke else "0"
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env.child_environ(out)


def _run(nb_in: Path, nb_out: Path, timeout: int) -> int:
    """Stage 2, inside the sandbox: execute the notebook cell by cell within `timeout` seconds in total (kernel
    start included), keep going after errors, and save the notebook after every cell so a kill keeps what ran."""
    import time

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    deadline = time.monotonic() + timeout
    nb = nbformat.read(str(nb_in), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(nb_in.parent)}})
    status = {"error": ""}

    def save():
        nb.metadata["grade_status"] = status
        nbformat.write(nb, str(nb_out))

    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    status["error"] = f"Timeout: the submission used its {timeout} s"
                    break
                client.timeout = max(1, int(remaining))
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    status["error"] = f"Timeout: cell {index} was still running when the {timeout} s ran out"
                    break
                except DeadKernelError as exc:
                    status["error"] = f"DeadKernelError: {exc}"[:200]
                    break
                save()
    except Exception as exc:  # a kernel that fails to start or dies between cells: graded as what ran
        status["error"] = status["error"] or f"{type(exc).__name__}: {str(exc).strip()[:160]}"
    save()
    return 0


def _cell_seconds(cell) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    try:
        from datetime import datetime

        start = datetime.fromisoformat(timing["iopub.status.busy"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(timing["iopub.status.idle"].replace("Z", "+00:00"))
        return round((end - start).total_seconds(), 2)
    except (KeyError, ValueError, TypeError):
        return 0.0


def _short(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(text).split()))
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 3] + "..."


def _classify(nb, positions: list[int], checks, sub: Submission, end_state: str) -> list[dict]:
    rows = []
    for (name, _), index in zip(checks, positions, strict=True):
        cell = nb.cells[index]
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        row = {"learner": sub.learner, "lab": sub.lab, "check": name, "seconds": _cell_seconds(cell), "figures": {}}
        if errors:
            err = errors[0]
            if err.get("ename") == "LabCheckFailed":
                row.update(status="failed", detail=_short(err.get("evalue", "")))
            else:
                row.update(status="error", detail=_short(f"{err.get('ename')}: {err.get('evalue', '')}"))
        elif cell.get("execution_count") is None:
            if end_state.startswith("timeout"):
                row.update(status="timeout", detail=_short(end_state))
            elif end_state:
                row.update(status="error", detail=_short(f"the kernel stopped before this check ran ({end_state})"))
            else:
                row.update(status="not_run", detail="the check cell did not run")
        elif "PASSED" in text:
            row.update(status="passed", detail=_short(next(ln for ln in text.splitlines() if "PASSED" in ln)),
                       figures={m[1]: (float(m[2]), m[3], m[4]) for m in _FIGURE.finditer(text)})
        else:
            row.update(status="error", detail=_short("the check ran but printed no PASSED line: " + text))
        rows.append(row)
    return rows


def grade_one(sub: Submission, scratch_root: Path, *, timeout: int = 300, smoke: bool = True,
              box: Sandbox | None = None, keep_scratch: bool = False, root: Path | None = None) -> list[dict]:
    """Grade one submission in its own scratch folder; returns its CSV rows (one per check)."""
    import nbformat

    if not sub.lab:
        return [{"learner": sub.learner, "lab": "", "check": "(submission)", "status": "error", "seconds": 0.0,
                 "detail": f"cannot tell which lab {sub.path.name} is: name it after one of {known_labs(root)}"}]
    checks = reference_checks(sub.lab, root)
    box = box if box is not None else sandbox()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{sub.learner}__{sub.lab}")
    scratch = Path(scratch_root).resolve() / safe
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        nb_in, positions, problem = _prepare(sub, checks, scratch)
        if problem:
            return [{"learner": sub.learner, "lab": sub.lab, "check": name, "status": "error", "detail": _short(problem),
                     "seconds": 0.0} for name, _ in checks]
        cache = env.build_dir() / "kernels"  # lesson 06's compiled extensions (make warmup): reuse, don't rebuild
        if cache.is_dir():
            shutil.copytree(cache, scratch / "build" / "kernels", dirs_exist_ok=True)
        nb_out = scratch / "executed.ipynb"
        runner = [sys.executable, "-m", "utils.course.grade", "_run", str(nb_in), str(nb_out), "--timeout", str(timeout)]
        command = [*box.prefix, *stage(scratch, runner)] if box.enforced else runner
        end_state = ""
        proc = subprocess.Popen(command, cwd=scratch, env=_scratch_env(scratch, smoke), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout + 30)  # the runner stops itself at `timeout`
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            end_state = f"timeout: the submission ran longer than {timeout} s and was stopped"
        (scratch / "grader.log").write_text(log or "")
        if not nb_out.is_file():
            state = end_state or f"the sandboxed run produced no notebook (exit code {proc.returncode}): " + _short(
                (log or "").strip().splitlines()[-1] if (log or "").strip() else "no output")
            status = "timeout" if end_state else "error"
            return [{"learner": sub.learner, "lab": sub.lab, "check": name, "status": status, "detail": _short(state),
                     "seconds": 0.0} for name, _ in checks]
        nb = nbformat.read(str(nb_out), as_version=4)
        run_error = nb.metadata.get("grade_status", {}).get("error", "")
        if run_error.startswith("Timeout"):
            end_state = f"timeout: {run_error.split(': ', 1)[1]}"
        elif run_error:
            end_state = run_error
        return _classify(nb, positions, checks, sub, end_state)
    finally:
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def grade(folder: Path, out: Path | None = None, *, timeout: int = 300, smoke: bool = True, lab: str | None = None,
          allow_unsandboxed: bool = False, keep_scratch: bool = False, root: Path | None = None) -> Path:
    """Grade every submission in `folder` and write the CSV (default: <folder>/grades.csv). Returns its path."""
    from tqdm.auto import tqdm

    subs = find_submissions(folder, lab, root)
    out = Path(out) if out is not None else Path(folder) / "grades.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch_root = out.parent / ".grade-scratch"
    scratch_root.mkdir(exist_ok=True)
    box = sandbox(scratch_root)
    print(f"sandbox: {box.description}")
    if not box.enforced and not allow_unsandboxed:
        raise RuntimeError("refusing to execute submissions without a sandbox (see above). Pass --unsafe-no-sandbox "
                           "only for notebooks you trust: they would run with your network and files.")
    rows = []
    for sub in tqdm(subs, desc="grading", unit="submission"):
        rows += grade_one(sub, scratch_root, timeout=timeout, smoke=smoke, box=box, keep_scratch=keep_scratch, root=root)
    if not keep_scratch:
        shutil.rmtree(scratch_root, ignore_errors=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    board = leaderboard(rows, out.parent)
    print(f"leaderboard: {board[0]} and {board[1]}")
    learners = sorted({r["learner"] for r in rows})
    for learner in learners:
        mine = [r for r in rows if r["learner"] == learner]
        print(f"  {learner:20s} {sum(r['status'] == 'passed' for r in mine)}/{len(mine)} checks passed")
    return out


def leaderboard(rows: list[dict], folder: Path) -> tuple[Path, Path]:
    """Write leaderboard.csv and leaderboard.html into `folder` from grade()'s rows: per lab, one row per learner with
    the checks passed and every figure their passing checks printed, sorted by checks passed, then by the lab's first
    figure (in its better direction). Returns the two paths."""
    import html

    table: dict[tuple[str, str], dict] = {}
    names: dict[str, dict[str, tuple[str, str]]] = {}  # lab -> figure -> (unit, better), in first-seen order
    for r in rows:
        entry = table.setdefault((r["lab"], r["learner"]), {"passed": 0, "checks": 0, "figures": {}})
        entry["checks"] += 1
        entry["passed"] += r["status"] == "passed"
        for name, (value, unit, better) in r.get("figures", {}).items():
            entry["figures"][name] = value
            names.setdefault(r["lab"], {}).setdefault(name, (unit, better))

    def rank(item):
        (lab, learner), entry = item
        first = next(iter(names.get(lab, {})), None)
        value = entry["figures"].get(first) if first else None
        sign = -1 if first and names[lab][first][1] == "higher" else 1
        return (lab, -entry["passed"], value is None, sign * value if value is not None else 0.0, learner)

    ordered = sorted(table.items(), key=rank)
    folder = Path(folder)
    csv_path, html_path = folder / "leaderboard.csv", folder / "leaderboard.html"
    all_figures = list(dict.fromkeys(f for lab in names.values() for f in lab))
    with csv_path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["lab", "rank", "learner", "checks_passed", "checks", *all_figures])
        for lab_rank, ((lab, learner), entry) in _ranked(ordered):
            writer.writerow([lab, lab_rank, learner, entry["passed"], entry["checks"],
                             *(f"{entry['figures'][f]:.4g}" if f in entry["figures"] else "" for f in all_figures)])
    parts = ["<!doctype html><meta charset='utf-8'><title>Lab leaderboard</title>",
             "<style>body{font:18px system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}"
             "td,th{border:1px solid #bbb;padding:.3em .8em;text-align:right}td:nth-child(2),th:nth-child(2)"
             "{text-align:left}caption{font-weight:bold;text-align:left;padding:.4em 0}</style>",
             "<h1>Lab leaderboard</h1><p>Figures were measured on the grading machine, each against its baseline or "
             "roof in the same run; a blank is a check that did not pass.</p>"]
    for lab in dict.fromkeys(lab for (lab, _), _ in ordered):
        figs = names.get(lab, {})
        head = "".join(f"<th>{html.escape(f)} ({html.escape(u)}, {b} is better)</th>" for f, (u, b) in figs.items())
        parts.append(f"<table><caption>{html.escape(lab or '(unrecognised)')}</caption><tr><th>#</th><th>learner</th>"
                     f"<th>checks passed</th>{head}</tr>")
        for lab_rank, ((row_lab, learner), entry) in _ranked(ordered):
            if row_lab != lab:
                continue
            cells = "".join(f"<td>{entry['figures'][f]:.3g}</td>" if f in entry["figures"] else "<td></td>"
                            for f in figs)
            parts.append(f"<tr><td>{lab_rank}</td><td>{html.escape(learner)}</td>"
                         f"<td>{entry['passed']}/{entry['checks']}</td>{cells}</tr>")
        parts.append("</table>")
    html_path.write_text("\n".join(parts) + "\n")
    return csv_path, html_path


def _ranked(ordered):
    """(rank within its lab, item) for leaderboard rows already sorted by lab."""
    lab, n = None, 0
    for item in ordered:
        n = n + 1 if item[0][0] == lab else 1
        lab = item[0][0]
        yield n, item


def main(argv=None) -> int:
    import argparse

    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "_run":  # the internal stage run inside the sandbox
        return _run(Path(argv[1]), Path(argv[2]), int(argv[argv.index("--timeout") + 1]))
    parser = argparse.ArgumentParser(prog="python -m utils.course.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", type=Path, help="folder of submitted lab notebooks")
    parser.add_argument("--out", type=Path, default=None, help="CSV path (default <submissions>/grades.csv)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per submission (default 300)")
    parser.add_argument("--full", action="store_true", help="run the labs in full mode (default smoke)")
    parser.add_argument("--lab", default=None, help="grade every notebook as this lab (e.g. 00_environment_lab)")
    parser.add_argument("--keep-scratch", action="store_true", help="keep each submission's scratch folder")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="run without isolation where the sandbox is unavailable (trusted notebooks only)")
    parser.add_argument("--check-sandbox", action="store_true", help="only probe and describe the sandbox")
    args = parser.parse_args(argv)
    if args.check_sandbox:
        box = sandbox()
        print(box.description)
        return 0 if box.enforced else 1
    try:
        out = grade(args.submissions, args.out, timeout=args.timeout, smoke=not args.full, lab=args.lab,
                    allow_unsandboxed=args.unsafe_no_sandbox, keep_scratch=args.keep_scratch)
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
