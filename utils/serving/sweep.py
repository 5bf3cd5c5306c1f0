"""The batching sweep's decision rule (lesson 05, part 1): the highest throughput within a p95 budget, ties broken.

``choose_point`` is a pure function of the measured runs: the notebook runs the sweep on a server, then prints this
function's source and applies it, so the rule a learner reads is the code that decides. ``Choice`` holds what it
decided and the numbers it decided with (the budget and the two tie bands).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Choice", "choose_point"]


@dataclass(frozen=True)
class Choice:
    """What ``choose_point`` decided. Points are the caller's own objects (mappings with "instances" and "run")."""

    winner: Mapping  # the chosen point
    leader: Mapping  # the highest throughput among the eligible points
    tied: tuple  # the eligible points within tie_band of the leader's throughput, the winner among them
    eligible: tuple  # the points not clearly over the budget (all points when none is: see met_budget)
    met_budget: bool  # False when every point was over the budget by more than p95_band
    status: tuple  # per point, in the caller's order: "yes" (below the budget), "at budget" or "no" (over it)
    budget_ms: float
    p95_band: float  # a p95 within this fraction of the budget is "at budget": neither in nor out
    tie_band: float  # a throughput within this fraction of the leader's is a tie, not a ranking

    @property
    def ties(self) -> list:
        """The other tied points: empty when the winner won by more than the tie band."""
        return [p for p in self.tied if p is not self.winner]


def choose_point(points: Sequence[Mapping], baseline: Sequence, *, budget_ms: float | None = None,
                 min_band: float = 0.05) -> Choice:
    """The highest throughput within a p95 budget; a tie is broken by the lowest p95, then the fewest instances.

    points: the sweep's points, each a mapping with "instances" and "run" (a result with .throughput and .p95);
    baseline: two runs of the unbatched deployment at the same load, one before the sweep and one after it: the
    same thing measured twice, so their spread sizes both tie bands (at least min_band each).
    """
    if len(baseline) != 2:
        raise ValueError(f"baseline must be the two runs before and after the sweep, got {len(baseline)}")
    if not points:
        raise ValueError("no sweep points to choose from")
    if budget_ms is not None and not budget_ms > 0:
        raise ValueError(f"budget_ms must be a positive number of milliseconds or None, got {budget_ms!r}")
    b0, b1 = baseline
    # the budget: the baseline's mean p95 unless one is given; each baseline run sits half their spread from that
    # mean, so a p95 that close to the budget is "at budget"
    budget = budget_ms or float((b0.p95 + b1.p95) / 2)
    p95_band = max(min_band, abs(b0.p95 - b1.p95) / (b0.p95 + b1.p95))
    status = tuple("yes" if p["run"].p95 < budget * (1 - p95_band)
                   else "no" if p["run"].p95 > budget * (1 + p95_band) else "at budget" for p in points)
    # eligible: every point not clearly over the budget (one at it cannot be told from the baseline's own p95)
    eligible = [p for p, s in zip(points, status, strict=True) if s != "no"]
    met_budget = bool(eligible)
    eligible = eligible or list(points)  # none met it: choose among all, and say so (met_budget)
    leader = max(eligible, key=lambda p: p["run"].throughput)
    # the throughput tie band: how far the two baseline runs differ; eligible points closer than that to the leader
    # are a tie, broken by the rule stated before the sweep: the lowest p95, then the fewest instances
    tie_band = max(min_band, abs(b0.throughput - b1.throughput) / min(b0.throughput, b1.throughput))
    tied = [p for p in eligible if p["run"].throughput >= leader["run"].throughput * (1 - tie_band)]
    winner = min(tied, key=lambda p: (p["run"].p95, p["instances"]))
    return Choice(winner=winner, leader=leader, tied=tuple(tied), eligible=tuple(eligible), met_budget=met_budget,
                  status=status, budget_ms=budget, p95_band=p95_band, tie_band=tie_band)
