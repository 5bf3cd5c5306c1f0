"""Notebook file hygiene: outputs stripped except nbval-checked cells (README: contributing).

``python -m utils.course.nbtools strip [paths]`` strips notebooks in place (default: notebooks/, solutions/, labs/).
A cell whose source contains ``# NBVAL_CHECK_OUTPUT`` keeps its outputs: nbval compares them on every test run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from utils.core import env

CHECK_MARK = "# NBVAL_CHECK_OUTPUT"
NOTEBOOK_DIRS = ("notebooks", "solutions", "labs")

__all__ = ["CHECK_MARK", "course_notebooks", "unstripped_cells", "strip", "strip_file"]


def course_notebooks(dirs=NOTEBOOK_DIRS) -> list[Path]:
    root = env.repo_root()
    return sorted(p for d in dirs for p in (root / d).glob("*.ipynb"))


def _keeps_output(cell) -> bool:
    return cell.cell_type == "code" and CHECK_MARK in cell.source


def unstripped_cells(nb) -> list[int]:
    """Indices of code cells that carry outputs or execution counts they should not."""
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _keeps_output(cell):
            continue
        if cell.get("outputs") or cell.get("execution_count") is not None:
            bad.append(i)
    return bad


def strip(nb):
    """Remove outputs, execution counts and volatile metadata in place (nbval-checked cells keep outputs).

    Cells papermill injected (tag "injected-parameters") are dropped, so an executed copy can be stripped back into
    the committed notebook with its nbval-checked outputs.
    """
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        if cell.cell_type == "code":
            if not _keeps_output(cell):
                cell.outputs = []
                cell.execution_count = None  # nbval-checked cells keep theirs: nbval skips "unrun" reference cells
            for key in ("execution", "collapsed", "scrolled", "papermill"):
                cell.metadata.pop(key, None)
            for out in cell.get("outputs", []):
                if "execution_count" in out:
                    out["execution_count"] = None
    for key in ("papermill", "widgets"):
        nb.metadata.pop(key, None)
    return nb


def strip_file(path: Path) -> bool:
    """Strip one notebook file; True if it changed."""
    before = Path(path).read_text()
    nb = nbformat.reads(before, as_version=4)
    after = nbformat.writes(strip(nb)) + "\n"
    if after != before:
        Path(path).write_text(after)
        return True
    return False


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "strip":
        print("usage: python -m utils.course.nbtools strip [notebook ...]", file=sys.stderr)
        sys.exit(2)
    paths = [Path(a) for a in args[1:]] or course_notebooks()
    changed = [p for p in paths if strip_file(p)]
    print(f"stripped {len(changed)} of {len(paths)} notebook(s)" + "".join(f"\n  {p}" for p in changed))
