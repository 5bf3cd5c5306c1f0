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
    (r(1.50, 1.40, 1.60, noisy="a: IQR 40% of the median"), "within noise"),  # too noisy to judge at all
])
def test_speed_needs_the_whole_interval_past_the_line(ratio, word):
    assert verdict.speed(ratio) == word


def test_speed_line_says_the_caveat_and_the_noise():
    line = verdict.speed_line("fused", r(1.3, 1.2, 1.4, caveat="20-ulp exp against 1-ulp"), "torch.softmax")
    assert "fused vs torch.softmax: 1.30x [1.20-1.40, 5 rounds] -> faster" in line
    assert "not like for like: 20-ulp exp" in line
    assert "too noisy" in verdict.speed_line("x", r(1.3, 1.2, 1.4, noisy="b: IQR 30%"), "y")


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
