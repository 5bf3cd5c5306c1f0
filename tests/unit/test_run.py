"""utils.course.run: parameters, failures that name the notebook and cell, unknown parameters rejected."""

import json
import time

import nbformat
import pytest

from utils.course import run


def _notebook(path, *cells, params="SMOKE = False\nN = 2"):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = nbformat.v4.new_code_cell(params)
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))
    return path


def test_parameters_are_injected(tmp_path):
    nb = _notebook(tmp_path / "ok.ipynb", "import json, pathlib\npathlib.Path('out.json').write_text(json.dumps([SMOKE, N]))")
    t0 = time.perf_counter()
    seconds = run.run_notebook(nb, tmp_path / "exec", smoke=True, parameters={"N": 5})
    assert 0 < seconds <= time.perf_counter() - t0  # the notebook's own run time, inside the call's wall time
    assert json.loads((tmp_path / "out.json").read_text()) == [True, 5]


def test_unknown_parameter_is_an_error(tmp_path):
    nb = _notebook(tmp_path / "p.ipynb", "pass")
    with pytest.raises(run.NotebookFailed, match=r"unknown parameter\(s\) \['BATCH'\]; this notebook declares \['N', 'SMOKE'\]"):
        run.run_notebook(nb, tmp_path / "exec", smoke=True, parameters={"BATCH": 8})


def test_failure_names_notebook_cell_and_error(tmp_path):
    nb = _notebook(tmp_path / "bad.ipynb", "x = 1", "raise ValueError('shape (3,) expected (4,)')")
    with pytest.raises(run.NotebookFailed, match=r'bad.ipynb failed in cell 2 \(counting from 0, first line: "raise ValueError.*"\): ValueError: shape \(3,\) expected \(4,\)'):
        run.run_notebook(nb, tmp_path / "exec", smoke=True)


def test_notebook_without_parameters_cell_is_rejected(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("pass")]
    nbformat.write(nb, str(tmp_path / "np.ipynb"))
    with pytest.raises(run.NotebookFailed, match="exactly one cell tagged 'parameters'"):
        run.declared_parameters(tmp_path / "np.ipynb")


def test_declared_parameters_reads_expressions(tmp_path):
    nb = _notebook(tmp_path / "e.ipynb", params="SMOKE = env.smoke_default()\nSIZES: list = [1, 2]\nDEVICE = 'auto'")
    assert run.declared_parameters(nb) == ["SMOKE", "SIZES", "DEVICE"]


def test_main_exits_nonzero_and_names_the_cell(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path / "build"))
    good = _notebook(tmp_path / "01_good.ipynb", "pass")
    bad = _notebook(tmp_path / "02_bad.ipynb", "1/0")
    code = run.main(["--smoke", "--no-report", "--out", str(tmp_path / "exec"), str(good), str(bad)])
    assert code == 1
    err = capsys.readouterr().err
    assert "FAILED: 02_bad.ipynb failed in cell 1" in err and "ZeroDivisionError" in err
