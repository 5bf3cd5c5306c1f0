"""utils.core.verdict: the one helper that turns a measured interval and a line into a verdict."""

import pytest

from utils.core import verdict
from utils.core.bench import Ratio


def r(value, low, high, **kw):
    return Ratio(value, low, high, rounds=5, **kw)


@pytest.mark.parametrize(("ratio", "word"), [
    (r(1.30, 1.20, 1.40), "faster"),
    (r(1.10, 1.02, 1.20), "within noise"),      # interval crosses the 1.05 line
    (r(0.80, 0.70, 0.90), "slower"),
    (r(0.97, 0.94, 1.02), "within noise"),
    (r(1.50, 1.40, 1.60, noisy="a: IQR 40% of the median"), "within noise"),  # noisy, spread unknown: no verdict
    (r(1.50, 1.40, 1.60, noisy="a: IQR 40%", spread=0.40), "within noise"),  # widened to [1.00-2.24]: crosses 1.05
    (r(0.10, 0.09, 0.14, noisy="a: IQR 40%", spread=0.40), "slower"),  # an 11x effect clears even the widened line
    (r(6.10, 5.00, 7.00, noisy="a: IQR 60%", spread=0.60), "faster"),  # [3.13-11.2]
])
def test_speed_needs_the_whole_interval_past_the_line(ratio, word):
    assert verdict.speed(ratio) == word


def test_speed_line_says_the_caveat_and_the_noise():
    line = verdict.speed_line("fused", r(1.3, 1.2, 1.4, caveat="20-ulp exp against 1-ulp"), "torch.softmax")
    assert "fused vs torch.softmax: 1.30x [1.20-1.40, 5 rounds] -> faster" in line
    assert "not like for like: 20-ulp exp" in line
    assert "too noisy" in verdict.speed_line("x", r(1.3, 1.2, 1.4, noisy="b: IQR 30%"), "y")
    line = verdict.speed_line("x", r(0.1, 0.09, 0.14, noisy="b: IQR 40%", spread=0.4), "y")
    assert "-> slower" in line and "judged on [0.064-0.196], the interval widened by 40%" in line


def test_speed_line_names_a_consistent_effect_smaller_than_the_line():
    line = verdict.speed_line("amp", r(0.92, 0.91, 0.93), "fp32", threshold=1.10)
    assert "-> within noise" in line and "every round slower than fp32, but not every round by more than the line" in line
    assert "every round" not in verdict.speed_line("amp", r(1.0, 0.97, 1.03), "fp32")


def test_speed_refuses_a_bare_number():
    with pytest.raises(TypeError, match="bench.compare"):
        verdict.speed(1.3)
    with pytest.raises(ValueError, match="threshold"):
        verdict.speed(r(1, 1, 1), threshold=0.9)


@pytest.mark.parametrize(("measured", "low", "high", "word"), [
    (r(1.3, 1.2, 1.4), 1.1, 1.5, "held"),
    (r(1.3, 1.2, 1.6), 1.1, 1.5, "undecided"),
    (r(1.8, 1.7, 1.9), 1.1, 1.5, "did not hold"),
    (r(0.9, 0.85, 0.95), 1.0, None, "did not hold"),
    (2.0, 1.0, None, "held"),
    (0.5, 1.0, 2.0, "did not hold"),
    (r(1.3, 1.2, 1.4, noisy="IQR 30%"), 1.1, 1.5, "undecided"),
    (r(1.3, 1.2, 1.4, noisy="IQR 30%", spread=0.3), 1.1, 1.5, "undecided"),  # widened to [0.92-1.82]
    (r(0.1, 0.09, 0.11, noisy="IQR 30%", spread=0.3), 0.01, 0.5, "held"),  # [0.069-0.143] inside the range
])
def test_prediction_reads_the_interval_against_the_range(measured, low, high, word):
    assert verdict.prediction(measured, low, high) == word


def test_prediction_line_and_bad_range():
    assert verdict.prediction_line("AMP", r(1.3, 1.2, 1.4), 1.1, 1.5).endswith("-> held")
    with pytest.raises(ValueError, match="low <= high"):
        verdict.prediction(1.0, 2.0, 1.0)
    with pytest.raises(TypeError, match="bench.Ratio or a number"):
        verdict.prediction("fast", 1.0, 2.0)


def test_one_round_has_no_spread_to_judge():
    one = Ratio(2.0, 2.0, 2.0, rounds=1)
    assert verdict.speed(one) == "within noise" and "one round" in verdict.speed_line("a", one, "b")
    assert verdict.prediction(one, 1.0, 3.0) == "undecided"


def test_speed_line_prints_three_decimals_where_two_would_put_an_edge_on_the_line():
    near = verdict.speed_line("batch 8", Ratio(1.085, 1.0451, 1.342, 5), "batch 1")
    assert "1.045-1.342" in near and "line 1.050x" in near and verdict.NOISE in near
    clear = verdict.speed_line("batch 8", Ratio(1.3, 1.2, 1.4, 5), "batch 1")
    assert "1.30x [1.20-1.40, 5 rounds]" in clear and verdict.FASTER in clear


def test_a_ratio_far_below_one_keeps_two_significant_digits():
    tiny = Ratio(value=0.0066, low=0.0051, high=0.0078, rounds=5)
    line = verdict.speed_line("bf16 matmul", tiny, "fp32 matmul")
    assert "0.0066x [0.0051-0.0078, 5 rounds]" in line and verdict.SLOWER in line
    assert "0.0066x [0.0051-0.0078" in verdict.prediction_line("bf16 over fp32", tiny, 0.001, 0.05)
    assert "1.34x [1.28-1.41" in verdict.speed_line("x", Ratio(value=1.34, low=1.28, high=1.41, rounds=5), "y")
    assert "(line 1.05x either way)" in verdict.speed_line("bf16 matmul", tiny, "fp32 matmul")


def test_within_noise_says_how_large_a_difference_the_interval_leaves_open():
    crossing = verdict.speed_line("fused", Ratio(1.07, 0.996, 1.156, 5), "unfused")
    assert verdict.NOISE in crossing and "not ruled out: up to 1.156x faster" in crossing
    both = verdict.speed_line("x", Ratio(0.93, 0.85, 2.40, 5), "y")
    assert "up to 2.40x faster or down to 0.85x (slower)" in both
    inside = verdict.speed_line("x", Ratio(1.01, 0.99, 1.03, 5), "y")
    assert verdict.NOISE in inside and "not ruled out" not in inside
    assert "not ruled out" not in verdict.speed_line("x", Ratio(1.3, 1.2, 1.4, 5), "y")
