"""utils.core.bench: timing results and the roofline probes (correctness only; no timing thresholds)."""

import pytest
import torch

from utils.core import bench


def test_measure_returns_positive_median_and_throughput():
    x = torch.randn(256, 256)
    res = bench.measure(lambda: x @ x, "mm", min_run_time=0.05, items=4)
    assert res.median_ms > 0 and res.iqr_ms >= 0 and res.runs >= 1
    assert res.throughput == pytest.approx(4 / (res.median_ms / 1e3))
    assert "mm: median" in str(res)


def test_compare_reports_each_and_keeps_baseline(capsys):
    fns = {"a": lambda: torch.zeros(10), "b": lambda: torch.ones(10)}
    out = bench.compare(fns, min_run_time=0.02)
    assert set(out) == {"a", "b"}
    assert "vs a" in capsys.readouterr().out
    with pytest.raises(KeyError, match="baseline 'z'"):
        bench.compare(fns, baseline="z", min_run_time=0.02)


def test_bad_arguments():
    with pytest.raises(TypeError, match="callable"):
        bench.measure(42)
    with pytest.raises(ValueError, match="min_run_time"):
        bench.measure(lambda: None, min_run_time=0)
    with pytest.raises(ValueError, match="positive"):
        bench.geomean([1.0, 0.0])
    with pytest.raises(ValueError, match="at least one"):
        bench.copy_bandwidth_gbps(1)


def test_geomean():
    assert bench.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_probes_return_plausible_magnitudes():
    assert 0.01 < bench.copy_bandwidth_gbps(1 << 20, min_run_time=0.05) < 10_000
    assert 0.001 < bench.matmul_gflops(64, min_run_time=0.05) < 1_000_000
