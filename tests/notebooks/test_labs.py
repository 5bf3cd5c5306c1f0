"""Labs are generated from solutions; every check passes on the solution and fails on the untouched lab."""

import nbformat
import pytest
from nbclient import NotebookClient

from utils import checks
from utils.core import env
from utils.course import labs
from utils.course.run import run_notebook

ROOT = env.repo_root()
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
CHECK_TIMEOUT = 900


def _check_cells(nb):
    return [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.lstrip().startswith(labs.CHECK)]


def test_labs_in_sync_with_solutions():
    assert not labs.out_of_sync(), "\n".join(labs.out_of_sync())


def test_every_lesson_has_a_lab():
    # one lab per lesson number: the parts of a lesson (07_llm_inference, 07_llm_serving) share its lab
    lessons = {p.stem[:2] for p in (ROOT / "notebooks").glob("0[0-7]_*.ipynb")}  # 08 (interview prep) has no lab
    solutions = {p.stem[:2] for p in SOLUTIONS}
    assert lessons <= solutions, f"lessons without a solutions/<lesson>_lab.ipynb: {sorted(lessons - solutions)}"


@pytest.mark.notebook
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_passes_every_check(solution, tmp_path, monkeypatch):
    # speed targets are printed with their numbers here, not enforced: timing thresholds are benchmarks, not tests
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")
    nb = nbformat.read(str(solution), as_version=4)
    assert _check_cells(nb), f"{solution.name} has no '# CHECK' cell"
    run_notebook(solution, tmp_path, smoke=True, timeout=CHECK_TIMEOUT)
    executed = nbformat.read(str(tmp_path / solution.name), as_version=4)
    for i, cell in _check_cells(executed):
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert "PASSED" in text, f"{solution.name} cell {i}: check printed no PASSED line:\n{text}"


@pytest.mark.notebook
@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_untouched_lab_fails_every_check_clearly(solution):
    lab = ROOT / "labs" / solution.name
    nb = nbformat.read(str(lab), as_version=4)
    client = NotebookClient(
        nb, timeout=CHECK_TIMEOUT, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(lab.parent)}},
    )
    client.execute()
    checks = _check_cells(nb)
    assert checks
    for i, cell in checks:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert errors, f"{lab.name} cell {i}: a check passed on the untouched lab"
        err = errors[0]
        assert err.ename == "LabCheckFailed", f"{lab.name} cell {i}: expected LabCheckFailed, got {err.ename}: {err.evalue}"
        assert len(err.evalue) > 20, f"{lab.name} cell {i}: the failure message is not helpful: {err.evalue!r}"


def test_generator_blanks_solutions_and_keeps_hints(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("def f(x):\n    # BEGIN SOLUTION: double it\n    return 2 * x\n    # END SOLUTION\n"),
        nbformat.v4.new_code_cell("# CHECK\nprint(f(2))"),
    ]
    path = tmp_path / "demo_lab.ipynb"
    nbformat.write(nb, str(path))
    lab = labs.make_lab(path)
    code = [c.source for c in lab.cells if c.cell_type == "code"]
    assert code[0] == 'def f(x):\n    raise NotImplementedError("TODO: double it")'
    assert "return 2 * x" not in "".join(code)
    assert lab.cells[0].cell_type == "markdown" and "generated" in lab.cells[0].source


@pytest.mark.parametrize(
    "source, message",
    [
        ("# BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n# END SOLUTION\n", "without"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "inside another"),
    ],
)
def test_generator_rejects_unbalanced_markers(tmp_path, source, message):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source)]
    path = tmp_path / "bad_lab.ipynb"
    nbformat.write(nb, str(path))
    with pytest.raises(ValueError, match=message):
        labs.make_lab(path)


def test_check_helpers_explain_failures():
    def stub():
        raise NotImplementedError("TODO: write it")

    with pytest.raises(checks.LabCheckFailed, match="stub\\(\\) is not written yet"):
        checks.call(stub)
    with pytest.raises(checks.LabCheckFailed, match="expected 3, got 4"):
        checks.expect(False, "expected 3, got 4")
    assert checks.call(lambda a: a + 1, 1) == 2
