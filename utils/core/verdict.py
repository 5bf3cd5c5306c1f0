"""Verdicts, computed from numbers (lesson 00 states the rules; every lesson prints its verdicts through here).

Two questions, each with three answers, and no verdict is ever written by hand:

- ``speed(ratio, threshold)``: is one side faster? "faster" when the whole interval of the speedup lies above the
  threshold, "slower" when it lies below 1/threshold, "within noise" otherwise (and when measured in a single
  round). A noisy timing (IQR above bench.MAX_IQR_FRACTION of its median) is judged on the interval widened by its
  IQR fraction on each side (``Ratio.judged``): an effect larger than the noise still gets its verdict, one inside
  it does not.
- ``prediction(measured, low, high)``: did a prediction stated before the measurement hold? "held" when the whole
  measured interval lies inside the predicted range, "did not hold" when it lies wholly outside, "undecided" when it
  straddles an edge (the same widened interval for a noisy timing).

``speed_line`` / ``prediction_line`` return the one line a lesson prints: the number, its interval, the line it was
judged against, the verdict, and the caveat of a comparison that is not like for like.
"""

from __future__ import annotations

import math

from utils.core.bench import Ratio

__all__ = ["FASTER", "SLOWER", "NOISE", "HELD", "NOT_HELD", "UNDECIDED", "DEFAULT_THRESHOLD", "speed", "speed_line",
           "prediction", "prediction_line"]

FASTER, SLOWER, NOISE = "faster", "slower", "within noise"
HELD, NOT_HELD, UNDECIDED = "held", "did not hold", "undecided"
# A speedup must clear 5% with its whole interval to count as faster (lesson 00 shows the round-to-round spread).
DEFAULT_THRESHOLD = 1.05


def _interval(measured) -> tuple[float, float] | None:
    """The interval a verdict reads (None: nothing to judge: one round, or noisy with no known spread)."""
    if isinstance(measured, Ratio):
        return measured.judged if measured.rounds >= 2 else None
    if isinstance(measured, bool) or not isinstance(measured, int | float):
        raise TypeError(f"expected a bench.Ratio or a number, got {type(measured).__name__} ({measured!r:.60})")
    return float(measured), float(measured)


def _near_line_digits(ratio: Ratio, lines: tuple[float, ...]) -> int:
    """Decimals for the lines themselves: three only where an interval's edge would round onto one at two."""
    edges = [ratio.low, ratio.high, *(ratio.judged or ())]
    return 3 if any(round(e, 2) == round(line, 2) for e in edges for line in lines) else 2


def _small_digits(ratio: Ratio) -> int:
    """A ratio far below 1 (0.0066 [0.0051-0.0078]) keeps two significant digits instead of reading '0.01x [0.01-0.01]'."""
    smallest = min((abs(e) for e in (ratio.value, ratio.low, ratio.high, *(ratio.judged or ())) if e), default=1.0)
    return min(6, 1 - math.floor(math.log10(smallest))) if smallest < 0.1 else 2


def _noise_note(ratio: Ratio, digits: int = 2) -> str:
    if ratio.noisy and ratio.spread > 0:
        lo, hi = ratio.judged
        return (f"; noisy ({ratio.noisy}): judged on [{lo:.{digits}f}-{hi:.{digits}f}], the interval widened by "
                f"{ratio.spread:.0%}")
    if ratio.noisy:
        return f"; too noisy to judge ({ratio.noisy})"
    if ratio.rounds < 2:
        return "; one round: no spread to judge against"
    return ""


def speed(ratio: Ratio, threshold: float = DEFAULT_THRESHOLD) -> str:
    """"faster", "slower" or "within noise" for a speedup measured in rounds (a bench.Ratio)."""
    if not isinstance(ratio, Ratio):
        raise TypeError(f"speed() judges a bench.Ratio (a speedup with its interval), got {type(ratio).__name__}: "
                        "measure both sides with bench.compare(...) and pass .ratio(name)")
    if threshold < 1:
        raise ValueError(f"threshold is a speedup line >= 1 (e.g. 1.05), got {threshold}")
    judged = _interval(ratio)
    if judged is None:  # one round has no spread to judge against
        return NOISE
    lo, hi = judged
    if lo > threshold:
        return FASTER
    if hi < 1 / threshold:
        return SLOWER
    return NOISE


def _beyond_line(word: str, judged: tuple[float, float] | None, threshold: float, digits: int) -> str:
    """'within noise' means no difference beyond the line was shown, not that none exists: where the interval reaches
    past the line, say how large a difference it leaves open."""
    if word != NOISE or judged is None:
        return ""
    open_ = ([f"up to {judged[1]:.{digits}f}x faster"] if judged[1] > threshold else []) \
        + ([f"down to {judged[0]:.{digits}f}x (slower)"] if judged[0] < 1 / threshold else [])
    return ("; not ruled out: " + " or ".join(open_) + " (the interval crosses the line: more rounds would decide)"
            if open_ else "")


def speed_line(name: str, ratio: Ratio, baseline: str, threshold: float = DEFAULT_THRESHOLD) -> str:
    """One printed line: '<name> vs <baseline>: 1.34x [1.28-1.41, 5 rounds] -> faster (line 1.05x)'."""
    word = speed(ratio, threshold)
    near = _near_line_digits(ratio, (threshold, 1 / threshold, 1.0))
    digits = max(near, _small_digits(ratio))
    line = (f"{name} vs {baseline}: {ratio.text(digits)} -> {word} (line {threshold:.{near}f}x either way)"
            + _noise_note(ratio, digits))
    judged = _interval(ratio)
    if word == NOISE and judged and (judged[0] > 1 or judged[1] < 1):  # consistent, but smaller than the line
        side = "faster" if judged[0] > 1 else "slower"
        line += f"; every round {side} than {baseline}, but not every round by more than the line"
    line += _beyond_line(word, judged, threshold, digits)
    if ratio.caveat:
        line += f"; not like for like: {ratio.caveat}"
    return line


def prediction(measured, low: float, high: float | None = None) -> str:
    """"held", "did not hold" or "undecided": the measured value (a number or a bench.Ratio with its interval)
    against the range [low, high] predicted before measuring (`high` None: at least `low`)."""
    if high is not None and high < low:
        raise ValueError(f"the predicted range needs low <= high, got [{low}, {high}]")
    judged = _interval(measured)
    if judged is None:
        return UNDECIDED
    lo, hi = judged
    top = float("inf") if high is None else high
    if low <= lo and hi <= top:
        return HELD
    if hi < low or lo > top:
        return NOT_HELD
    return UNDECIDED


def prediction_line(what: str, measured, low: float, high: float | None = None, unit: str = "x") -> str:
    """One printed line: '<what>: predicted 1.10-1.50x, measured 1.34x [...] -> held'."""
    word = prediction(measured, low, high)
    rng = f"at least {low:.4g}{unit}" if high is None else f"{low:.4g}-{high:.4g}{unit}"
    digits = 3
    if isinstance(measured, Ratio):  # three decimals (more far below 1): an edge must read as the verdict reads it
        digits = max(3, _small_digits(measured))
        shown = measured.text(digits)
    else:
        shown = f"{float(measured):.4g}{unit}"
    line = f"{what}: predicted {rng}, measured {shown} -> {word}"
    if isinstance(measured, Ratio):
        line += _noise_note(measured, digits)
    if isinstance(measured, Ratio) and measured.caveat:
        line += f"; not like for like: {measured.caveat}"
    return line
