"""Labs are generated from solutions/ (every lab; README "Labs"); the check helpers live in utils.checks.

Authoring rule: in a solutions/ notebook the answer sits between two marker lines::

    def predict(model, x):
        # BEGIN SOLUTION: put the model in eval mode and run it under torch.inference_mode()
        model.eval()
        ...
        # END SOLUTION

``python -m utils.course.labs generate`` writes labs/ with each marked block replaced by
``raise NotImplementedError("TODO: <hint>")`` at the same indentation. A cell whose first line is ``# CHECK`` calls
a check (utils.checks); on the solution every check passes, on the untouched lab every check raises ``LabCheckFailed``
with a message that says what to do. ``python -m utils.course.labs check`` fails when labs/ is out of date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

from utils.core import env
from utils.course.nbtools import strip

__all__ = [
    "BEGIN",
    "END",
    "CHECK",
    "make_lab",
    "generate",
    "out_of_sync",
]

BEGIN = "# BEGIN SOLUTION"
END = "# END SOLUTION"
CHECK = "# CHECK"
_BEGIN_RE = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?::\s*(?P<hint>.*))?$")
_BANNER = (
    "> **Lab notebook, generated from `solutions/{name}` by `make labs`: edit the solution, not this file.**\n"
    "> Fill in every `TODO` (each raises `NotImplementedError` until you do), then run the `# CHECK` cells."
)


# ---------------------------------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------------------------------


def _blank_solutions(source: str, where: str) -> str:
    out, inside = [], False
    for lineno, line in enumerate(source.splitlines(), 1):
        m = _BEGIN_RE.match(line)
        if m:
            if inside:
                raise ValueError(f"{where} line {lineno}: {BEGIN} inside another solution block")
            inside = True
            hint = (m.group("hint") or "write this part").strip().replace('"', "'")
            out.append(f'{m.group("indent")}raise NotImplementedError("TODO: {hint}")')
        elif line.strip() == END:
            if not inside:
                raise ValueError(f"{where} line {lineno}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {BEGIN} is never closed by {END}")
    return "\n".join(out)


def make_lab(solution_path: Path):
    """The lab notebook (an nbformat node) for one solution notebook."""
    nb = nbformat.read(str(solution_path), as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and (BEGIN in cell.source or END in cell.source):
            cell.source = _blank_solutions(cell.source, f"{solution_path.name} cell {i}")
    if not any(c.cell_type == "code" and BEGIN in c.source for c in nbformat.read(str(solution_path), as_version=4).cells):
        raise ValueError(f"{solution_path}: no '{BEGIN}' block, so the lab would have nothing to do")
    banner = nbformat.v4.new_markdown_cell(_BANNER.format(name=solution_path.name))
    banner.metadata["tags"] = ["generated-banner"]
    nb.cells.insert(0, banner)
    for cell in nb.cells:
        cell.pop("id", None)  # deterministic output: ids are regenerated below from the position
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"lab-cell-{i:03d}"
    return strip(nb)


def _lab_text(solution_path: Path) -> str:
    return nbformat.writes(make_lab(solution_path)) + "\n"


def _pairs(root: Path | None = None):
    root = root or env.repo_root()
    for sol in sorted((root / "solutions").glob("*.ipynb")):
        yield sol, root / "labs" / sol.name


def generate(root: Path | None = None) -> list[Path]:
    """Write labs/ from solutions/; returns the files that changed."""
    changed = []
    for sol, lab in _pairs(root):
        text = _lab_text(sol)
        if not lab.exists() or lab.read_text() != text:
            lab.parent.mkdir(parents=True, exist_ok=True)
            lab.write_text(text)
            changed.append(lab)
    return changed


def out_of_sync(root: Path | None = None) -> list[str]:
    """Descriptions of labs that do not match their solutions (missing, stale or orphaned)."""
    root = root or env.repo_root()
    problems = []
    for sol, lab in _pairs(root):
        if not lab.exists():
            problems.append(f"{lab.relative_to(root)} is missing (run `make labs`)")
        elif lab.read_text() != _lab_text(sol):
            problems.append(f"{lab.relative_to(root)} differs from what {sol.relative_to(root)} generates (run `make labs`)")
    solutions = {s.name for s in (root / "solutions").glob("*.ipynb")}
    for lab in sorted((root / "labs").glob("*.ipynb")):
        if lab.name not in solutions:
            problems.append(f"{lab.relative_to(root)} has no solution in solutions/")
    return problems


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "generate":
        changed = generate()
        print(f"labs regenerated: {len(changed)} changed" + "".join(f"\n  {p}" for p in changed))
    elif cmd == "check":
        problems = out_of_sync()
        print("\n".join(problems) or "labs are in sync with solutions")
        sys.exit(1 if problems else 0)
    else:
        print("usage: python -m utils.course.labs generate|check", file=sys.stderr)
        sys.exit(2)
