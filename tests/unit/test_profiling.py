"""utils.training.profiling (lesson 03): labelled phases, schedules, trace export, breakdowns and the bottleneck finder."""

import json

import pytest
import torch

from utils.training import profiling


def _step():
    # "heavy" is ~10,000x the arithmetic of "light" (tens of ms), so a scheduler hiccup on a loaded machine cannot
    # swap their order in the phase times
    x = torch.randn(384, 384) / 20
    with profiling.phase("light"):
        x.sum().item()
    with profiling.phase("heavy"):
        y = x
        for _ in range(30):
            y = torch.tanh(y @ x)
        y.sum().item()


@pytest.fixture(scope="module")
def prof():
    return profiling.profile_steps(_step, wait=1, warmup=1, active=2, trace_name="test_profiling")


def test_profile_exports_a_chrome_trace(prof):
    assert prof.trace_path.is_file() and prof.active_steps == 2
    n = profiling.trace_event_count(prof.trace_path)
    names = {e.get("name") for e in json.loads(prof.trace_path.read_text())["traceEvents"]}
    assert n > 10 and "phase/heavy" in names


def test_phase_times_and_bottleneck(prof):
    times = profiling.phase_times(prof)
    assert {"light", "heavy", "step", "other"} <= set(times)
    assert times["heavy"] > times["light"] > 0
    assert times["step"] >= times["heavy"] + times["light"] - 1e-6
    top = profiling.top_bottleneck(prof)
    assert top.phase == "heavy" and 0 < top.share <= 1
    assert top.top_op in {"aten::mm", "aten::tanh"}
    assert "heavy" in str(top)


def test_ops_by_phase_and_call_counts(prof):
    ops = profiling.ops_by_phase(prof)
    assert "aten::mm" in ops["heavy"] and "aten::mm" not in ops.get("light", {})
    assert profiling.calls_per_step(prof, "aten::item", phase="light") == 1
    assert profiling.calls_per_step(prof, "aten::mm", phase="heavy") == 30
    assert profiling.calls_per_step(prof, "aten::item") == 2


def test_table_and_plot(prof):
    text = profiling.table(prof, row_limit=5)
    assert "Self CPU" in text and "aten::" in text
    ax = profiling.plot_breakdown({"a": profiling.phase_times(prof), "b": {"heavy": 1.0, "light": 0.5}})
    assert len(ax.patches) > 0
    assert profiling.gpu_busy_fraction(prof) == pytest.approx(0.0, abs=1e-9)  # CPU-only profile: no kernels


def test_bad_inputs_are_explained(tmp_path):
    with pytest.raises(ValueError, match="short word"):
        with profiling.phase("a/b"):
            pass
    with pytest.raises(TypeError, match="callable"):
        profiling.profile_steps(42)
    with pytest.raises(ValueError, match="active >= 1"):
        profiling.profile_steps(_step, active=0)
    with pytest.raises(ValueError, match="file stem"):
        profiling.profile_steps(_step, trace_name="x.json")
    with pytest.raises(FileNotFoundError, match="no trace"):
        profiling.trace_event_count(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="traceEvents"):
        profiling.trace_event_count(tmp_path / "bad.json")
    unlabelled = profiling.profile_steps(lambda: torch.randn(8, 8) @ torch.randn(8, 8), wait=0, warmup=0, active=1)
    with pytest.raises(ValueError, match="phase"):
        profiling.phase_times(unlabelled)
    with pytest.raises(ValueError, match="active steps"):
        profiling.phase_times(unlabelled.prof)
    with pytest.raises(ValueError, match="at least one"):
        profiling.plot_breakdown({})
