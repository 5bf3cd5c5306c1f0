"""The layers of utils/ (README "How the course is built"): imports run one way, and no course import hides inside a
function. The core imports only the core; a lesson's subject module imports the core and itself; lab checks add the
lesson modules; course tooling may import anything; every notebook imports the core and its own lesson's module.
"""

import ast
import json
import re
from pathlib import Path

import pytest

from utils.core import env

ROOT = env.repo_root()
LESSON_MODULES = {"00": None, "01": "inference", "02": "graphs", "03": "training", "04": "conversion",
                  "05": "serving", "06": "kernels", "07": "llm", "08": "interview"}
# A later part of a lesson keeps its own module, in its lesson's layer (it may import the part 1 module).
LESSON_PART_MODULES = {"llm_serving": "llm", "llm_tuning": "llm", "quantization": "conversion", "numerics": "kernels"}
# A lesson part that works on another lesson's model (not its subject): 04 part 3 quantizes lesson 07's TinyGPT,
# 06 part 3 decodes it alone and in a batch; 07 runs lesson 06's Triton language on its FlashAttention kernel.
BORROWED_MODULES = {"04_quantization": {"llm"}, "06_numerics": {"llm"}, "07_llm_inference": {"kernels"}}
MODULES = sorted((ROOT / "utils").rglob("*.py"))


def _name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _course_imports(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """(imported utils module, line, at module level) for every import of a course module in `tree`."""
    top = {id(n) for n in getattr(tree, "body", [])}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "utils":
            names = [f"{node.module}.{a.name}" for a in node.names]
            out += [(n, node.lineno, id(node) in top) for n in names]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names if a.name.split(".")[0] == "utils"]
    return out


def _layer(module: str) -> str:
    part = module.split(".")[1] if module.count(".") else ""
    return part if part in ("core", "course", "checks") else "lesson:" + LESSON_PART_MODULES.get(part, part)


def _allowed(importer: str, imported: str) -> bool:
    layer, target = _layer(importer), _layer(imported)
    if layer == "core":
        return target == "core"
    if layer.startswith("lesson:"):
        return target == "core" or target == layer
    if layer == "checks":
        return target != "course"
    return True  # course tooling


@pytest.mark.parametrize("path", MODULES, ids=[_name(p) for p in MODULES])
def test_imports_run_one_way_and_at_the_top(path):
    me = _name(path)
    for imported, line, at_top in _course_imports(ast.parse(path.read_text())):
        assert at_top, f"{me}:{line} imports {imported} inside a function: import it at the top of the module"
        assert _allowed(me, imported), f"{me}:{line} imports {imported}: the {_layer(me)} layer may not use it"


def test_the_layer_rule_can_fail():
    assert _allowed("utils.core.env", "utils.core.report") is not False  # core -> core is fine
    assert not _allowed("utils.core.report", "utils.course.render")
    assert not _allowed("utils.llm", "utils.serving.loadgen")
    assert not _allowed("utils.checks.lab05", "utils.course.run")
    tree = ast.parse("def f():\n    from utils.core import env\n")
    assert _course_imports(tree) == [("utils.core.env", 2, False)]


NOTEBOOKS = sorted([*(ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"), *(ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")])


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS])
def test_a_notebook_imports_the_core_and_its_own_lesson(nb):
    lesson = LESSON_MODULES[nb.name[:2]]
    source = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
    imported = set()
    for m in re.finditer(r"^\s*from (utils[\w.]*) import ([\w, ]+)", source, re.M):
        imported |= {f"{m.group(1)}.{n.strip().split(' as ')[0]}" for n in m.group(2).split(",")}
    imported |= set(re.findall(r"^\s*import (utils[\w.]*)", source, re.M))
    wrong = []
    for name in imported:
        parts = name.split(".")
        ok = parts[1] == "core" or (lesson is not None and LESSON_PART_MODULES.get(parts[1], parts[1]) == lesson)
        ok = ok or (nb.parent.name == "solutions" and parts[1] == "checks")
        ok = ok or parts[1] in BORROWED_MODULES.get(nb.stem, set())
        if not ok:
            wrong.append(name)
    assert not wrong, f"{nb.parent.name}/{nb.name} imports {sorted(wrong)}; a lesson uses utils.core and utils.{lesson}"
