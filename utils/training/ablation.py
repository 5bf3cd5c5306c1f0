"""Lesson 03's ablation: each performance fix as the switches it turns on, tried one at a time against the current
loop and kept only when it measurably helps (the profile-driven half of the lesson, after one fix done by hand).

Every trial re-measures the current loop inside the same interleaved rounds as its candidates, so each fix's speedup
is a bench.Ratio with an interval, judged by utils.core.verdict; ``ceiling`` states before the trial the most a fix
can save: the time of the phases it targets.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from utils.core import bench, verdict
from utils.training.loop import LoopConfig, Trainer, compare_loops

__all__ = ["Fix", "fixes", "FixTrial", "try_fix", "ceiling"]


@dataclass(frozen=True)
class Fix:
    """One fix of lesson 03's ablation: the phases it attacks, whether it is pure waste removal, its switch settings.

    `options` holds one or more alternative settings (e.g. one per worker count); try_fix() measures them all and
    keeps the fastest.
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


def over_ceiling(saved_ms: float, cap_ms: float, ratio: bench.Ratio, current_ms: float) -> str:
    """The flag a row of the ablation gets when its measured saving exceeds its ceiling (lesson 03), else "".

    `saved_ms` is the median saving, `ratio` the fix's speedup over the loop that took `current_ms` per step: the
    flag says whether the interval's low end (the smallest saving the rounds allow) is still within the ceiling.
    """
    if saved_ms <= cap_ms:
        return ""
    low_saved = current_ms * (1 - 1 / ratio.low) if ratio.low > 0 else float("-inf")
    low = f"the interval's low end ({ratio.low:.2f}x, {low_saved:.1f} ms saved)"
    return ("  <- MORE THAN THE CEILING: noise, or the fix changed more than its phases; "
            + (f"only {low} is consistent with it" if low_saved <= cap_ms else f"even {low} exceeds it"))


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
            **trainer_kwargs) -> FixTrial:
    """Lesson 03's ablation step: build current.config + each option of `fix`, time them beside `current` in the same
    interleaved rounds, return the best (by pooled median) with its speedup over `current` as a bench.Ratio.

    The other candidates are closed; the caller decides whether to keep the returned trainer (and closes it if not).
    `trainer_kwargs` go to Trainer (batch_size, device, lr, ...).
    """

    candidates, first = {}, {}
    for i, opt in enumerate(fix.options):
        name = f"option {i}: " + ", ".join(f"{k}={v}" for k, v in opt.items())
        candidates[name] = Trainer(dataset, current.config.with_(**opt), **trainer_kwargs)
        first[name] = bench.first_call_ms(candidates[name].step)  # one-time costs (worker start, compilation)
    timings = compare_loops({"current loop": current, **candidates}, min_run_time=min_run_time, rounds=rounds)
    best = min(candidates, key=lambda k: timings[k].median_ms)
    for name, tr in candidates.items():
        if name != best:
            tr.close()
    return FixTrial(fix, candidates[best], timings.ratio(best), timings["current loop"].median_ms,
                    timings[best].median_ms, first[best], timings)
