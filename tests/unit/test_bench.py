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
        bench.copy_into_gbps(1)


def test_geomean():
    assert bench.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_probes_return_plausible_magnitudes():
    assert 0.01 < bench.copy_into_gbps(1 << 20, min_run_time=0.05) < 10_000
    assert 0.001 < bench.matmul_gflops(64, min_run_time=0.05) < 1_000_000


def test_ratio_from_rounds_has_median_and_min_max():
    r = bench.Ratio.from_times([10.0, 12.0, 11.0], [5.0, 5.0, 10.0])
    assert (r.value, r.low, r.high, r.rounds) == (pytest.approx(2.0), pytest.approx(1.1), pytest.approx(2.4), 3)
    inv = r.inverse()
    assert inv.low == pytest.approx(1 / 2.4) and inv.high == pytest.approx(1 / 1.1)
    assert str(r) == "2.00x [1.10-2.40, 3 rounds]"
    assert f"{r:.1f}" == "2.0"
    with pytest.raises(ValueError, match="paired rounds"):
        bench.Ratio.from_times([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="low <= value <= high"):
        bench.Ratio(1.0, 1.5, 2.0)
    with pytest.raises(ValueError, match="positive finite"):
        bench.Ratio(float("nan"), 1.0, 1.0)


def test_compare_interleaves_rounds_and_gives_ratios_with_intervals():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    out = bench.compare(fns, rounds=3, min_run_time=0.01, warmup=0, quiet=True)
    assert len(out.round_ms["a"]) == len(out.round_ms["b"]) == 3
    # interleaved, every other round reversed: a b | b a | a b (runs of one callable's calls, merged where they meet)
    runs = [order[0]] + [x for prev, x in zip(order, order[1:], strict=False) if x != prev]
    assert runs == ["a", "b", "a", "b"]
    r = out.ratio("b")
    assert r.rounds == 3 and r.low <= r.value <= r.high
    assert out.ratio("a").value == pytest.approx(1.0)
    with pytest.raises(KeyError, match="'z' was not compared"):
        out.ratio("z")


def test_copy_into_is_the_roof_and_clone_pays_allocation():
    # correctness of the probes' arithmetic only: both return a positive bandwidth for the bytes moved
    assert bench.copy_into_gbps(1 << 16, min_run_time=0.02) > 0
    assert bench.clone_gbps(1 << 16, min_run_time=0.02) > 0


def test_compare_gives_one_callable_its_own_warmup_every_round():
    calls = {"a": 0, "b": 0}
    fns = {"a": lambda: calls.__setitem__("a", calls["a"] + 1), "b": lambda: calls.__setitem__("b", calls["b"] + 1)}
    out = bench.compare(fns, rounds=2, min_run_time=0.001, warmup=0, warmup_each_round=True,
                        per_fn={"b": {"items": 4}}, quiet=True)
    assert out["b"].items == 4 and out["a"].items == 1
    assert set(out.round_ms) == {"a", "b"} and all(len(v) == 2 for v in out.round_ms.values())


def test_a_measurement_rests_on_at_least_three_blocks():
    import time

    calls = []
    res = bench.measure(lambda: calls.append(time.sleep(0.02)), min_run_time=0.001, warmup=0)  # each outlasts it
    assert len(res.times_ms) >= bench.MIN_BLOCKS and res.runs >= bench.MIN_BLOCKS
    # the three blocks cost one untimed call (blocked_autorange's block-size estimate), no warm-up per top-up block
    assert len(calls) <= res.runs + 1, (len(calls), res.runs)
    with pytest.raises(ValueError, match="min_blocks must be a positive int"):
        bench.measure(lambda: None, min_blocks=0)


def test_a_fixed_block_size_skips_the_estimate():
    calls = []
    res = bench.measure(lambda: calls.append(1), min_run_time=10.0, warmup=1, min_blocks=2, number=1)
    # one warm-up call, then exactly two timed blocks of one call: no block-size estimate, min_run_time unused
    assert len(calls) == 3 and res.runs == 2 and len(res.times_ms) == 2
    with pytest.raises(ValueError, match="number must be a positive int"):
        bench.measure(lambda: None, number=0)


def test_rounds_that_disagree_make_a_ratio_noisy():
    # b's rounds: one fast, two slow; the ratio of medians (1.0x) and the median of per-round ratios (2.0x) disagree
    results = {k: bench.BenchResult(label=k, median_ms=m, iqr_ms=0.0, runs=3) for k, m in (("a", 10.0), ("b", 10.0))}
    cmp = bench.Comparison(results, {"a": [10.0, 10.0, 40.0], "b": [5.0, 5.0, 10.0]}, "a")
    r = cmp.ratio("b")
    assert r.value == pytest.approx(2.0) and "the rounds disagree" in r.noisy and r.spread == pytest.approx(1.0)
    # 3% apart, but on opposite sides of 1: the medians say b is slower, the per-round ratios that it is faster
    medians = {"a": bench.BenchResult(label="a", median_ms=10.0, iqr_ms=0.0, runs=3),
               "b": bench.BenchResult(label="b", median_ms=10.4, iqr_ms=0.0, runs=3)}
    split = bench.Comparison(medians, {"a": [10.0, 10.3, 9.0], "b": [9.7, 10.0, 10.4]}, "a").ratio("b")
    assert split.value > 1 and "the rounds disagree" in split.noisy
    steady = bench.Comparison(results, {"a": [10.0, 10.0, 10.0], "b": [10.0, 10.0, 10.0]}, "a").ratio("b")
    assert steady.noisy == "" and steady.spread == 0.0
