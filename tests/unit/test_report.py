"""utils.core.report: the results-file contract and the rendered report."""

import json

import numpy as np
import pytest

from utils.core import report
from utils.course import render


@pytest.fixture
def build(monkeypatch, tmp_path):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    return tmp_path


def test_record_writes_the_contract(build):
    path = report.init("98_contract")
    assert path == build / "results" / "98_contract.json"
    report.record("speedup", np.float32(1.5), unit="x", note="side by side", anchor="1.8x published")
    report.record("ok", True)
    report.record("label", "conv")
    report.record("count", 3)
    data = json.loads(path.read_text())
    assert data["notebook"] == "98_contract"
    assert data["metrics"] == {"speedup": 1.5, "ok": True, "label": "conv", "count": 3}
    assert data["units"] == {"speedup": "x"}
    assert data["notes"]["speedup"] == "side by side"
    assert data["anchors"]["speedup"] == "1.8x published"
    assert {"cpu", "torch"} <= set(data["env"])


def test_a_ratio_is_recorded_with_its_interval(build, capsys):
    from utils.core.bench import Ratio

    path = report.init("98_interval")
    got = report.record("fast_speedup", Ratio(1.4, 1.3, 1.5, rounds=5), note="interleaved")
    report.record("rate", 3.0, unit="GB/s", interval=(2.5, 3.5))
    assert isinstance(got, Ratio) and "[1.3, 1.5]" in capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["metrics"]["fast_speedup"] == 1.4 and data["units"]["fast_speedup"] == "x"
    assert data["intervals"] == {"fast_speedup": [1.3, 1.5], "rate": [2.5, 3.5]}
    report.record("rate", 3.0, unit="GB/s")  # re-recorded without one: the old interval goes
    assert "rate" not in json.loads(path.read_text())["intervals"]
    assert "1.4 [1.3, 1.5]" in report.lesson_markdown(report.current())
    with pytest.raises(ValueError, match="around the value"):
        report.record("rate", 3.0, interval=(3.5, 4.0))


def test_record_rejects_bad_values(build):
    report.init("98_bad")
    with pytest.raises(TypeError, match="expected a number, boolean or string"):
        report.record("arr", [1, 2])
    with pytest.raises(ValueError, match="must be finite"):
        report.record("nan", float("nan"))
    with pytest.raises(ValueError, match="identifiers"):
        report.record("has space", 1)


def test_init_rejects_paths(build):
    with pytest.raises(ValueError, match="notebook stem"):
        report.init("notebooks/01_x.ipynb")


def test_render_has_tables_runtime_and_skips(build):
    report.init("98_render")
    report.record("gbps", 12.5, unit="GB/s", anchor="57 GB/s probe")
    report.record_skip("00.gpu-probe", "needs cuda: none")
    report.set_runtime("98_render", 12.34, "smoke")
    text = render.render().read_text()
    assert "## 98_render" in text
    assert "| `gbps` | 12.5 | GB/s | 57 GB/s probe |" in text
    assert "skipped `00.gpu-probe`" in text
    assert "| 98_render | smoke | 12.3 |" in text
    assert "## Machine" in text


def test_record_before_init_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(report, "_current", None)
    with pytest.raises(RuntimeError, match=r"call report.init"):
        report.record("x", 1)


def test_show_renders_metrics_claims_and_skips_the_same_way_for_every_lesson(build, capsys):
    report.init("02_jit_compilers")  # part 2 of lesson 02 records the TorchScript claim's metric
    report.record("script_speedup_resnet50", 1.2, unit="x", note="scripted vs eager", anchor="10-30% (source)")
    report.record_skip("02.cuda-graphs", "needs cuda: no GPU")
    capsys.readouterr()
    report.show()
    text = capsys.readouterr().out
    assert "| `script_speedup_resnet50` | 1.2 | x | 10-30% (source) | scripted vs eager |" in text
    assert "TorchScript: 10-30% faster" in text and "**holds**" in text  # the claim this metric tests, judged
    assert "- skipped `02.cuda-graphs`: needs cuda: no GPU" in text
    assert text.strip() == report.lesson_markdown(report.current()).strip()
    with pytest.raises(FileNotFoundError, match="05_triton_ensemble.*run that notebook"):
        report.show("05_triton_ensemble")
