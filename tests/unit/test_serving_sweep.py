"""utils.serving.sweep.choose_point (lesson 05 part 1's decision rule) on synthetic runs, without a server."""

from dataclasses import dataclass

import pytest

from utils.serving import repository, sweep


@dataclass
class Run:
    throughput: float
    p95: float


def point(instances, throughput, p95, name=""):
    return {"instances": instances, "run": Run(throughput, p95), "name": name}


# the same baseline twice: p95 95 and 105 (mean 100, band 5%), throughput 100 and 104 (tie band 5%)
BASELINE = [Run(100.0, 95.0), Run(104.0, 105.0)]


def test_clear_win():
    grid = [point(1, 150, 80, "a"), point(1, 200, 70, "b"), point(2, 160, 60, "c")]
    c = sweep.choose_point(grid, BASELINE)
    assert c.winner["name"] == "b" and c.leader is c.winner and c.ties == []
    assert c.budget_ms == pytest.approx(100.0) and c.p95_band == pytest.approx(0.05)
    assert c.tie_band == pytest.approx(0.05) and c.met_budget and c.status == ("yes", "yes", "yes")


def test_tie_broken_by_lowest_p95():
    grid = [point(1, 200, 90, "leader"), point(2, 195, 60, "lower p95"), point(1, 150, 10, "too slow")]
    c = sweep.choose_point(grid, BASELINE)
    assert c.leader["name"] == "leader" and c.winner["name"] == "lower p95"
    assert [p["name"] for p in c.ties] == ["leader"]  # "too slow" is outside the 5% band: not a tie


def test_tie_broken_by_fewest_instances():
    grid = [point(2, 200, 70, "two"), point(1, 196, 70, "one"), point(4, 199, 70, "four")]
    c = sweep.choose_point(grid, BASELINE)
    assert c.winner["name"] == "one" and {p["name"] for p in c.ties} == {"two", "four"}


def test_point_over_budget_is_not_eligible_and_at_budget_is():
    grid = [point(1, 300, 120, "over"), point(1, 200, 103, "at"), point(1, 150, 50, "under")]
    c = sweep.choose_point(grid, BASELINE)
    assert c.status == ("no", "at budget", "yes")
    assert [p["name"] for p in c.eligible] == ["at", "under"] and c.winner["name"] == "at"


def test_nothing_within_budget_chooses_among_all_and_says_so():
    grid = [point(1, 200, 150, "a"), point(2, 250, 180, "b")]
    c = sweep.choose_point(grid, BASELINE)
    assert not c.met_budget and c.status == ("no", "no") and c.winner["name"] == "b"
    assert len(c.eligible) == 2


def test_bands_come_from_the_baseline_spread_and_budget_can_be_set():
    wide = [Run(100.0, 80.0), Run(125.0, 120.0)]  # p95 spread 40/200 = 20%, throughput 25/100 = 25%
    grid = [point(1, 200, 115, "a"), point(1, 160, 90, "b")]
    c = sweep.choose_point(grid, wide)
    assert c.p95_band == pytest.approx(0.20) and c.tie_band == pytest.approx(0.25)
    assert c.winner["name"] == "b"  # 160 is within 25% of 200, and its p95 is lower
    fixed = sweep.choose_point(grid, wide, budget_ms=50.0)
    assert fixed.budget_ms == 50.0 and not fixed.met_budget and fixed.winner["name"] == "b"


@pytest.mark.parametrize("baseline, grid, budget, message", [
    (BASELINE[:1], [point(1, 1, 1)], None, "two runs"),
    (BASELINE, [], None, "no sweep points"),
    (BASELINE, [point(1, 1, 1)], 0.0, "budget_ms"),
])
def test_bad_arguments(baseline, grid, budget, message):
    with pytest.raises(ValueError, match=message):
        sweep.choose_point(grid, baseline, budget_ms=budget)


def test_the_notebook_can_print_the_rule():
    source = repository.function_source(sweep.__file__, "choose_point")
    assert source.startswith("def choose_point(") and "lowest p95, then the fewest instances" in source
