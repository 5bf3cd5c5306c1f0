"""The headless course runner behind `make course` (README, "Running the course").

    python -m utils.course.run [--smoke | --full] [-p NAME VALUE ...] [notebook.ipynb ...]

Runs the lesson notebooks in order with papermill (default: every notebooks/NN_*.ipynb, full mode), writes the
executed copies to build/executed/, stores each notebook's run time with its results and renders build/report.md,
build/report.html and the static site build/site/ (utils.course.site).
It stops at the first failure and names the notebook, the cell and the error. A parameter a notebook does not declare
in its `parameters` cell is an error (papermill itself would only warn).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from pathlib import Path

from utils.core import env, report
from utils.course import render, site

__all__ = ["NotebookFailed", "declared_parameters", "run_notebook", "main"]


class NotebookFailed(RuntimeError):
    """A notebook stopped with an error; the message names the notebook, the cell and the error."""


def lesson_notebooks() -> list[Path]:
    return sorted((env.repo_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def declared_parameters(path: Path) -> list[str]:
    """The names assigned in the notebook's cell tagged `parameters`.

    Parsed with ast rather than papermill.inspect_notebook, which skips assignments whose value is an expression
    (such as ``SMOKE = env.smoke_default()``) and would then call SMOKE unknown.
    """
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise NotebookFailed(f"{path}: expected exactly one cell tagged 'parameters', found {len(cells)}")
    names = []
    for node in ast.parse(cells[0].source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    if "SMOKE" not in names:
        raise NotebookFailed(f"{path}: the parameters cell must declare SMOKE (found {names})")
    return names


def _parse_value(text: str):
    """-p values: Python literals (1, 0.5, True, 'x') where they parse, else the plain string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def run_notebook(path: Path, out_dir: Path, smoke: bool, parameters: dict | None = None, timeout: int = 1800) -> float:
    """Execute one notebook with papermill; return its wall time in seconds. Raises NotebookFailed on any error."""
    import logging

    import papermill
    from papermill.exceptions import PapermillExecutionError

    # papermill warns about parameters it cannot parse as literals (SMOKE = env.smoke_default()); we check them above
    logging.getLogger("papermill").setLevel(logging.ERROR)
    path = Path(path).resolve()
    if not path.is_file():
        raise NotebookFailed(f"{path}: no such notebook")
    declared = declared_parameters(path)
    parameters = {"SMOKE": smoke, **(parameters or {})}
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise NotebookFailed(
            f"{path.name}: unknown parameter(s) {unknown}; this notebook declares {sorted(declared)}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / path.name
    os.environ["WORKBOOK_SMOKE"] = "1" if smoke else "0"
    t0 = time.perf_counter()
    try:
        papermill.execute_notebook(
            str(path),
            str(output),
            parameters=parameters,
            cwd=str(path.parent),
            kernel_name="python3",
            progress_bar=False,
            execution_timeout=timeout,
        )
    except PapermillExecutionError as exc:
        index, first_line = _source_cell(output, exc.cell_index)
        raise NotebookFailed(
            f"{path.name} failed in cell {index} (counting from 0, first line: {first_line!r}): "
            f"{exc.ename}: {exc.evalue}\n  executed copy with the traceback: {output}"
        ) from None
    return time.perf_counter() - t0


def _source_cell(executed: Path, fallback: int) -> tuple[int, str]:
    """Index (in the source notebook) and first line of the cell that raised, read from the executed copy.

    Papermill adds cells to the copy (the injected parameters, an error banner at the top); they are not counted.
    """
    import nbformat

    nb = nbformat.read(str(executed), as_version=4)
    added = {"injected-parameters", "papermill-error-cell-tag"}
    cells = [c for c in nb.cells if not added & set(c.metadata.get("tags", []))]
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            lines = cell.source.strip().splitlines()
            return i, (lines[0] if lines else "")
    return fallback, ""


def runtimes_path() -> Path:
    """build/runtimes.json: every run's wall time per mode and notebook, oldest first (the workshop agenda)."""
    return env.build_dir() / "runtimes.json"


def record_run_time(stem: str, seconds: float, mode: str) -> list[float]:
    """Append one run's wall time to build/runtimes.json and return that notebook's times in this mode, oldest first.

    The first entry of a fresh clone is its cold run (empty compile caches, nothing built yet); later ones are warm.
    The agenda quotes both, since a class meets the first and an instructor's rehearsal the later.
    """
    if mode not in ("smoke", "full"):
        raise ValueError(f"mode must be 'smoke' or 'full', got {mode!r}")
    path = runtimes_path()
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        data = {}  # a torn file from a killed run: start the history again
    times = data.setdefault(mode, {}).setdefault(stem, [])
    times.append(round(float(seconds), 1))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.course.run", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="small sizes (what the tests run)")
    mode.add_argument("--full", action="store_true", help="full sizes (default)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[])
    parser.add_argument("--out", type=Path, default=None, help="folder for executed notebooks (build/executed)")
    parser.add_argument("--no-report", action="store_true", help="do not render the report and the site at the end")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)

    from tqdm.auto import tqdm

    smoke = bool(args.smoke)
    notebooks = args.notebooks or lesson_notebooks()
    params = {name: _parse_value(value) for name, value in args.parameter}
    out_dir = args.out or env.build_dir() / "executed"
    mode_name = "smoke" if smoke else "full"
    print(f"running {len(notebooks)} notebook(s) in {mode_name} mode -> {out_dir}")
    total = 0.0
    bar = tqdm(notebooks, unit="notebook")
    for nb in bar:
        bar.set_description(Path(nb).stem)
        try:
            seconds = run_notebook(nb, out_dir, smoke=smoke, parameters=params)
        except NotebookFailed as exc:
            bar.close()
            print(f"\nFAILED: {exc}", file=sys.stderr)
            return 1
        total += seconds
        report.set_runtime(Path(nb).stem, seconds, mode_name)
        record_run_time(Path(nb).stem, seconds, mode_name)
        tqdm.write(f"  {Path(nb).name}: {seconds:.0f} s")
    print(f"all {len(notebooks)} notebook(s) ran in {total:.0f} s")
    if not args.no_report:
        md = render.render()
        print(f"report: {md} and {render.render_html(md)}")
        try:
            print(f"static site (offline): {site.build(out_dir)}")
        except site.SiteUnavailable as exc:
            print(f"static site skipped: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
