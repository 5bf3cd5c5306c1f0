"""Lesson 03's ablation: each performance fix as the switches it turns on, tried one at a time against the current
loop and kept only when it measurably helps (the profile-driven half of the lesson, after one fix done by hand).

Every trial re-measures the current loop inside the same interleaved rounds as its candidates, so each fix's speedup
is a bench.Ratio with an interval, judged by utils.core.verdict; ``ceiling`` states before the trial the most a fix
can save: the time of the phases it targets. On a shared machine a trial can be disturbed, and the lesson already
has the numbers that show it (``disturbed``): the current loop drifting from its last measurement, a waste removal
slower in every round, a saving above the ceiling even at the interval's low end. ``try_fix_gated`` re-runs such a
trial and, when it stays disturbed, returns it marked so that the lesson withholds its verdict.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from utils.core import bench, verdict
from utils.training.loop import LoopConfig, Trainer, compare_loops

__all__ = ["Fix", "fixes", "FixTrial", "try_fix", "try_fix_gated", "ceiling", "over_ceiling", "disturbed",
           "product_line", "saved_ms", "MAX_DRIFT", "ATTEMPTS", "MAX_PRODUCT_WIDTH"]

# The current loop is the same code in every trial: a time that moved by more than this since its last measurement
# means the machine moved, not the loop.
MAX_DRIFT = 0.25
# a disturbed trial runs again, up to this many attempts in all, before its verdict is withheld
ATTEMPTS = 3
# the product of the kept fixes' ratios checks the direct measurement only when its bounds (high / low) are narrower
# than this: the product of every trial's extremes is a bound, and a wide one contains anything (this gates whether
# there is a check at all; the check itself is verdict.prediction on the intervals)
MAX_PRODUCT_WIDTH = 1.5


@dataclass(frozen=True)
class Fix:
    """One fix of lesson 03's ablation: the phases it attacks, whether it is pure waste removal, its switch settings.

    `options` holds one or more alternative settings (e.g. one per worker count); try_fix() measures them all and
    keeps the one with the highest speedup over the current loop.
    """

    name: str
    phases: tuple[str, ...]
    waste: bool  # pure waste removal (it cannot cost anything) vs a trade-off that has to win its measurement
    options: tuple[dict, ...]
    gpu_only: bool = False

    def __post_init__(self):
        if not self.options:
            raise ValueError(f"fix {self.name!r} needs at least one option")
        fields = {f.name for f in dataclasses.fields(LoopConfig)}
        for opt in self.options:
            if set(opt) - fields:
                raise ValueError(f"fix {self.name!r}: unknown LoopConfig field(s) {sorted(set(opt) - fields)}")


def fixes(*, worker_choices=(1, 2), compile_backend: str = "inductor") -> list[Fix]:
    """The fixes lesson 03 tries, each with the profile phase(s) it attacks."""
    cuda = torch.cuda.is_available()
    if not worker_choices or any((not isinstance(n, int)) or n < 1 for n in worker_choices):
        raise ValueError(f"worker_choices must be worker counts >= 1, got {worker_choices!r}")
    workers = tuple({"num_workers": n, "persistent_workers": True, "pin_memory": cuda} for n in worker_choices)
    return [
        Fix("remove per-step host syncs", ("logging",), True, ({"host_syncs": False},)),
        Fix("remove needless copies", ("copy",), True, ({"needless_copies": False},)),
        # zeroing writes every gradient, and then backward's AccumulateGrad reads it, adds and writes it back: with
        # None it just stores the fresh gradient. So the saving lands in both phases
        Fix("zero_grad(set_to_none=True)", ("zero_grad", "backward"), True, ({"set_to_none": True},)),
        Fix("fused optimizer (SGD fused=True)", ("optimizer",), False, ({"fused_optimizer": True},)),
        Fix("DataLoader workers" + (" + pin_memory" if cuda else ""), ("data", "to_device"), False, workers),
        Fix("channels_last", ("forward", "backward"), False, ({"channels_last": True},)),
        Fix("AMP autocast (" + ("fp16 + GradScaler" if cuda else "bf16") + ")", ("forward", "backward"), False,
            ({"amp": True},)),
        Fix("cudnn.benchmark", ("forward", "backward"), False, ({"cudnn_benchmark": True},), gpu_only=True),
        Fix(f"torch.compile ({compile_backend})", ("forward", "backward"), False,
            ({"compile_backend": compile_backend},)),
    ]


def ceiling(fix: Fix, phase_ms: dict, step_ms: float) -> tuple[float, float]:
    """(most ms a fix can save per step, the largest speedup that allows) from a profile's phase times (lesson 03).

    A fix changes only the phases it targets, so at best it removes all of their time: `phase_ms` is
    profiling.phase_times of the loop it is applied to and `step_ms` that loop's step.
    """
    if not step_ms > 0:
        raise ValueError(f"step_ms must be positive, got {step_ms!r}")
    saving = min(sum(phase_ms.get(p, 0.0) for p in fix.phases), step_ms)
    return saving, (step_ms / (step_ms - saving) if saving < step_ms else float("inf"))


def saved_ms(speedup: float, current_ms: float) -> float:
    """The time per step a speedup saves on a loop that takes `current_ms` (what the ratio says, not a difference of
    two medians taken at different moments)."""
    return current_ms * (1 - 1 / speedup)


def over_ceiling(ratio: bench.Ratio, cap_x: float, current_ms: float) -> str:
    """The flag a row of the ablation gets when its measured speedup exceeds its ceiling (lesson 03), else "".

    `cap_x` is the largest speedup the ceiling allows (``ceiling``'s second value), `ratio` the fix's speedup over
    the loop that took `current_ms` per step. Judged on speedups, so the flag does not depend on which measurement of
    the step the ceiling was scaled from; it says whether the interval's low end is still within the ceiling.
    """
    if ratio.value <= cap_x:
        return ""
    low = f"the interval's low end ({ratio.low:.2f}x, {saved_ms(ratio.low, current_ms):.1f} ms saved)"
    return ("  <- MORE THAN THE CEILING: noise, or the fix changed more than its phases; "
            + (f"only {low} is consistent with it" if ratio.low <= cap_x else f"even {low} exceeds it"))


def disturbed(ratio: bench.Ratio, *, waste: bool = False, cap_x: float = float("inf"),
              current_ms: float | None = None, reference_ms=()) -> list[str]:
    """Why a trial's rounds are not a finding (lesson 03): [] when nothing says the machine disturbed them.

    - the current loop (the same code every time) took `current_ms`, more than MAX_DRIFT away from every time in
      `reference_ms` (its last undisturbed measurement, and the previous attempt's: a level two attempts agree on is
      the machine's new level, not a disturbance);
    - a `waste` removal (it only removes work) came out slower in every round;
    - even the interval's low end is above `cap_x`, the largest speedup the fix's ceiling allows.
    The interval tests need at least two rounds (one round has no interval).
    """
    if not isinstance(ratio, bench.Ratio):
        raise TypeError(f"disturbed() reads a bench.Ratio, got {type(ratio).__name__}")
    refs = [float(r) for r in reference_ms if r]
    if any(r <= 0 for r in refs) or (current_ms is not None and not current_ms > 0):
        raise ValueError(f"times must be positive, got current_ms={current_ms!r}, reference_ms={list(reference_ms)!r}")
    reasons = []
    if current_ms is not None and refs and all(abs(current_ms / r - 1) > MAX_DRIFT for r in refs):
        reasons.append(f"the current loop took {current_ms:.1f} ms, {current_ms / refs[0] - 1:+.0%} from its last "
                       f"undisturbed {refs[0]:.1f} ms (more than {MAX_DRIFT:.0%})")
    if ratio.rounds >= 2 and waste and ratio.high < 1:
        reasons.append(f"a waste removal came out slower in every round ({ratio}), which removing work cannot do")
    if ratio.rounds >= 2 and ratio.low > cap_x:
        reasons.append(f"even the interval's low end ({ratio.low:.2f}x) is above the ceiling's {cap_x:.2f}x")
    return reasons


def product_line(kept: dict, direct: bench.Ratio) -> str:
    """Lesson 03's check of the ablation: does the product of the kept fixes' own ratios reproduce the direct
    measurement of the final loop against the slow one (`kept`: {label: Ratio})?

    The product's bounds multiply every kept trial's judged interval (the rounds' extremes, widened by a noisy
    trial's IQR fraction as ``Ratio.judged`` widens it); the judgement is ``verdict.prediction`` of the direct
    ratio (its own judged interval) against those bounds, the way every stated range in the course is judged:
    "held" (the direct interval lies inside: reproduced), "did not hold" (wholly outside), "undecided" (it
    straddles an edge, or one round). No fixed tolerance on the medians: they are compared, and by how much they
    differ is printed, but only the intervals decide. The check is skipped, and says so, when the product's bounds
    span more than MAX_PRODUCT_WIDTH (a bound that wide would contain almost any direct measurement) or a kept
    trial was noisy with no known spread.
    """
    if not isinstance(direct, bench.Ratio) or not all(isinstance(r, bench.Ratio) for r in kept.values()):
        raise TypeError("product_line() takes {label: bench.Ratio} and a bench.Ratio")
    value = low = high = 1.0
    unknown = []
    for name, r in kept.items():
        judged = r.judged
        if judged is None:
            unknown.append(name)
            judged = (r.low, r.high)
        value, low, high = value * r.value, low * judged[0], high * judged[1]
    differ = max(value / direct.value, direct.value / value)
    widened = [name for name, r in kept.items() if r.noisy and r.judged is not None]
    head = (f"the product of the {len(kept)} kept fixes' own ratios is {value:.2f}x [{low:.2f}-{high:.2f}"
            + (f", widened for the noisy rounds of {', '.join(widened)}" if widened else "")
            + f"], the direct measurement {direct}: the medians differ by {differ:.2f}x")
    if unknown:
        return head + f"; not a check: the rounds of {', '.join(unknown)} were too noisy to bound"
    if high / low > MAX_PRODUCT_WIDTH:
        return head + (f"; not a check: the product's bounds span {high / low:.2f}x (wider than "
                       f"{MAX_PRODUCT_WIDTH}x), so they would contain almost any direct measurement")
    word = verdict.prediction(direct, low, high)
    line = head + f"; the direct interval against the product's bounds (verdict.prediction): {word}"
    if word == verdict.HELD:
        return line + " -> the product reproduces the direct measurement"
    if word == verdict.NOT_HELD:
        return line + (" -> not reproduced, by more than the intervals allow: each trial measured its fix against a "
                       "different loop at a different time, or a fix's gain depends on the ones kept before it")
    return line + " -> undecided: the direct interval straddles an edge of the product's bounds"


@dataclass
class FixTrial:
    """What try_fix() measured (lesson 03): the best candidate (a live Trainer), its speedup over the current loop
    as a bench.Ratio from interleaved rounds, every candidate's timing (a bench.Comparison)."""

    fix: Fix
    trainer: Trainer
    ratio: bench.Ratio
    current_ms: float
    candidate_ms: float
    first_step_ms: float
    timings: bench.Comparison
    rejected: tuple[str, ...] = ()  # why each earlier attempt was re-run (try_fix_gated)
    disturbed: str = ""  # why this attempt too is not a finding; "" when nothing disturbed it

    @property
    def after_ms(self) -> float:
        """The candidate's step as the ratio says (current loop / speedup): the number printed beside the ratio."""
        return self.current_ms / self.ratio.value

    @property
    def saved_ms(self) -> float:
        """The time per step the fix saves, as the ratio says."""
        return saved_ms(self.ratio.value, self.current_ms)

    @property
    def speedup(self) -> float:
        """The median of the per-round speedups (ratio.value)."""
        return self.ratio.value

    def verdict(self, threshold: float = verdict.DEFAULT_THRESHOLD) -> str:
        """"faster", "slower" or "within noise" (utils.core.verdict.speed on the ratio's interval)."""
        return verdict.speed(self.ratio, threshold)

    @property
    def label(self) -> str:
        """The fix's name, plus the chosen setting when it had several options (e.g. the worker count)."""
        varying = [k for k in self.fix.options[0] if len({repr(o.get(k)) for o in self.fix.options}) > 1]
        chosen = ", ".join(f"{k}={getattr(self.trainer.config, k)}" for k in varying)
        return f"{self.fix.name} ({chosen})" if chosen else self.fix.name


def try_fix(current: Trainer, fix: Fix, dataset, *, min_run_time: float = 1.0, rounds: int = 2,
            verbose: bool = True, min_blocks: int = bench.MIN_BLOCKS, number: int | None = None,
            **trainer_kwargs) -> FixTrial:
    """Lesson 03's ablation step: build current.config + each option of `fix`, time them beside `current` in the same
    interleaved rounds, return the best (by its speedup over `current`, the median of the per-round ratios) with that
    speedup as a bench.Ratio.

    The other candidates are closed; the caller decides whether to keep the returned trainer (and closes it if not).
    `trainer_kwargs` go to Trainer (batch_size, device, lr, ...); `min_blocks` and `number` to compare_loops.
    """

    candidates, first = {}, {}
    for i, opt in enumerate(fix.options):
        name = f"option {i}: " + ", ".join(f"{k}={v}" for k, v in opt.items())
        candidates[name] = Trainer(dataset, current.config.with_(**opt), **trainer_kwargs)
        first[name] = bench.first_call_ms(candidates[name].step)  # one-time costs (worker start, compilation)
    timings = compare_loops({"current loop": current, **candidates}, min_run_time=min_run_time, rounds=rounds,
                            verbose=verbose, min_blocks=min_blocks, number=number)
    best = max(candidates, key=lambda k: timings.ratio(k).value)  # the number the verdict judges
    for name, tr in candidates.items():
        if name != best:
            tr.close()
    return FixTrial(fix, candidates[best], timings.ratio(best), timings["current loop"].median_ms,
                    timings[best].median_ms, first[best], timings)


def try_fix_gated(current: Trainer, fix: Fix, dataset, *, last_ms: float, cap_x: float = float("inf"),
                  attempts: int = ATTEMPTS, **kwargs) -> FixTrial:
    """try_fix, re-run while ``disturbed`` finds a reason (at most `attempts` in all; lesson 03).

    `last_ms` is the current loop's last undisturbed step time, `cap_x` the largest speedup the fix's ceiling allows.
    Returns the last attempt: ``rejected`` holds why the earlier ones were re-run (their candidates are closed),
    ``disturbed`` why this one is not a finding either ("" when it is clean). `kwargs` go to try_fix.
    """
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"attempts must be a positive int, got {attempts!r}")
    rejected, refs = [], [last_ms]
    while True:
        trial = try_fix(current, fix, dataset, **kwargs)
        reasons = disturbed(trial.ratio, waste=fix.waste, cap_x=cap_x, current_ms=trial.current_ms,
                            reference_ms=refs)
        if not reasons or len(rejected) == attempts - 1:
            return dataclasses.replace(trial, rejected=tuple(rejected), disturbed="; ".join(reasons))
        rejected.append("; ".join(reasons))
        trial.trainer.close()
        refs = [last_ms, trial.current_ms]
