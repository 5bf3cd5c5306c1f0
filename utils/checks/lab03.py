"""Checks for labs/03_profiling_amp_lab.ipynb (lesson 03: profile a slow training loop and make it fast)."""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from utils import training
from utils.checks import LabCheckFailed, call, expect, expect_target, figure, no_reference, passed
from utils.core import bench, verdict
from utils.training import profiling


def check_profile(profile_fn, trace_path) -> None:
    """The learner's profiler run: a torch.profiler.profile with recorded steps and an exported Chrome trace."""
    import torch

    trace_path = Path(trace_path)
    trace_path.unlink(missing_ok=True)  # a trace left over from an earlier run must not count
    prof = call(profile_fn, what="profile_slow_loop()")
    expect(isinstance(prof, torch.profiler.profile),
           f"profile_slow_loop() should return the torch.profiler.profile object, got {type(prof).__name__}")
    try:
        events = prof.events()
    except (AssertionError, RuntimeError, AttributeError):
        events = None
    expect(bool(events), "the profiler recorded no events: no training step ran while it was recording (did its "
           "schedule ever reach an active step?)")
    steps = sum(1 for e in events if e.name.startswith("ProfilerStep"))
    expect(steps >= 1, "the profile has no ProfilerStep ranges: the profiler was never told where a training step "
           "ends, so it cannot split the run into steps")
    phases = {e.name for e in events if e.name.startswith(profiling.PHASE_PREFIX)}
    expect({"phase/forward", "phase/backward"} <= phases,
           f"the profile should contain slow_train's phase/... ranges, found {sorted(phases) or 'none'}")
    expect(trace_path.is_file(), f"no Chrome trace at {trace_path}: the profile was not written to that file")
    n_events = profiling.trace_event_count(trace_path)
    expect(n_events >= 100, f"the trace at {trace_path} has only {n_events} events; record whole training steps")
    print(profiling.table(prof, row_limit=8))
    print("biggest phase:", profiling.top_bottleneck(prof, active_steps=steps))
    passed("profile", f"{steps} recorded step(s), {n_events} trace events in {trace_path.name}")


def _reference_profile():
    """A small profile with known phases (cheap, so this check does not depend on an earlier cell)."""
    import torch

    x = torch.randn(128, 128)

    def step():
        with profiling.phase("data"):
            y = x.clone()
        with profiling.phase("forward"):
            for _ in range(8):
                y = torch.tanh(y @ x)
        with profiling.phase("backward"):
            for _ in range(4):
                y = y @ x
        return y

    return profiling.profile_steps(step, wait=0, warmup=1, active=3)


def check_breakdown(breakdown_fn) -> None:
    """The learner's per-phase breakdown (ms per step) agrees with utils.training.profiling.phase_times on a known profile."""
    ref_profile = _reference_profile()
    got = call(breakdown_fn, ref_profile.prof, what="phase_breakdown(prof)")
    expect(isinstance(got, dict) and got, f"phase_breakdown() should return a dict {{phase: ms per step}}, got {got!r:.80}")
    got = {str(k).removeprefix(profiling.PHASE_PREFIX): v for k, v in got.items()}
    want = {k: v for k, v in profiling.phase_times(ref_profile).items() if k not in {"step", "other"}}
    missing = sorted(set(want) - set(got))
    expect(not missing, f"phase_breakdown() is missing phase(s) {missing}; it returned {sorted(got)}")
    for name, ms in want.items():
        value = got[name]
        expect(isinstance(value, int | float) and abs(value - ms) <= 0.05 * ms + 1e-3,
               f"phase {name!r}: expected {ms:.3f} ms per step, got {value!r}: is it in milliseconds, and per "
               "recorded step rather than summed over all of them?")
    passed("breakdown", ", ".join(f"{k} {v:.2f} ms" for k, v in want.items()))


# the course's own training loop: an answer that calls it is the lesson's answer, not the learner's
_REFERENCE_LOOP = (training.Trainer.train_on, training.Trainer.run, training.compare_loops)
WEIGHT_RTOL = 1e-2  # the fast loop's weight update after N steps vs the slow loop's (relative, whole model)
BOUND_LINE = 3.0  # a loop whose steps beat the compute bound by this much (whole interval) is not training


@dataclass
class _Run:
    """One run of a training loop: its losses, the time between successive on_step() calls, and (when asked) how far
    the stepped optimizer moved its parameters (final - initial, flattened)."""

    losses: list[float]
    gaps_ms: list[float]
    update: object = None  # a 1-D tensor


def _run(fn, dataset, steps: int, batch_size: int, what: str, *, update: bool = False, watch=()) -> _Run:
    """Run a learner's (or the lab's) loop, counting optimizer steps with torch's global step hooks: every on_step()
    must follow exactly one optimizer.step(), so the gaps between on_step() calls are training steps."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    stamps: list[float] = []
    steps_before: list[int] = []  # optimizer steps counted when each on_step() came
    stepped: list = []  # the optimizer of every step
    initial: dict = {}

    def before(optimizer, args, kwargs):
        if update and not initial:
            initial["params"] = [p.detach().clone() for g in optimizer.param_groups for p in g["params"]]

    def after(optimizer, args, kwargs):
        stepped.append(optimizer)

    def on_step():
        stamps.append(time.perf_counter())
        steps_before.append(len(stepped))

    handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
    try:
        with no_reference(*watch, what=what) if watch else contextlib.nullcontext():
            losses = call(fn, dataset, steps, batch_size, on_step=on_step, what=what)
    finally:
        for handle in handles:
            handle.remove()
    try:
        values = [float(v) for v in losses]
    except (TypeError, ValueError):
        raise LabCheckFailed(f"{what} should return the list of per-step losses (floats), got {losses!r:.80}") from None
    expect(len(values) == steps, f"{what} should return {steps} losses (one per step), got {len(values)}")
    expect(len(stamps) == steps, f"{what} called on_step() {len(stamps)} times for {steps} steps (the check times the "
                                 "steps between on_step() calls, so it must come once at the end of every step)")
    per_step = [b - a for a, b in zip([0, *steps_before], steps_before, strict=False)]
    expect(per_step == [1] * steps,
           f"{what}: the optimizer stepped {per_step} times before each of its {steps} on_step() calls (once each "
           "expected): the time between two on_step() calls is not one training step")
    run = _Run(values, [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)])
    if update:
        final = [p.detach() for g in stepped[-1].param_groups for p in g["params"]]
        shapes = [tuple(p.shape) for p in final]
        expect(shapes == [tuple(p.shape) for p in initial["params"]],
               f"{what}: the optimizer that stepped last is not the one that stepped first")
        pairs = zip(final, initial["params"], strict=True)
        run.update = torch.cat([(f.float() - i.float()).flatten() for f, i in pairs])
    return run


def _compute_bound_ms(dataset, steps: int, batch_size: int) -> list[float]:
    """Per-step times of the compute bound: the same model's fp32 forward, backward and fused SGD step, on batches
    already in memory (no loader, no copies, no syncs); lesson 03 section 7 measures it the same way."""
    trainer = training.Trainer(dataset, training.LoopConfig.fast(num_workers=0), batch_size=batch_size)
    try:
        batches = [trainer.next_batch() for _ in range(min(4, len(trainer.loader)))]
        trainer.train_on(*batches[0])  # the first step allocates
        stamps = [time.perf_counter()]
        for i in range(steps - 1):
            trainer.train_on(*batches[i % len(batches)])
            stamps.append(time.perf_counter())
    finally:
        trainer.close()
    return [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]


def check_fast_loop(fast_train, slow_train, dataset, *, batch_size: int, steps: int, min_speedup: float = 1.1,
                    rtol: float = 1e-3, rounds: int = 3) -> bench.Ratio:
    """The learner's loop vs the slow loop, in the same run: the same training, and a faster step.

    Same training: every on_step() follows exactly one optimizer step; the losses agree with the slow loop's within
    `rtol` and the weights' update after `steps` steps within WEIGHT_RTOL; the course's own loop (Trainer) is not
    called. Faster: `rounds` interleaved rounds of the slow loop, the learner's loop and the compute bound (the same
    model's step on batches already in memory), each round run as slow, fast, bound, fast, slow; a loop's time in a
    round is the median gap between its on_step() calls, and the speedup (a bench.Ratio over the rounds) must clear `min_speedup` with its whole interval
    (utils.core.verdict). A loop measured BOUND_LINE times faster than the compute bound is not doing the training
    it reports, and fails.
    """
    if steps < 3:
        raise ValueError(f"steps must be >= 3 to time steps between on_step() calls, got {steps}")
    if rounds < 2:
        raise ValueError(f"rounds must be >= 2 for an interval over rounds, got {rounds}")
    fast = _run(fast_train, dataset, steps, batch_size, "fast_train()", update=True, watch=_REFERENCE_LOOP)
    slow = _run(slow_train, dataset, steps, batch_size, "slow_train()", update=True)
    rel = max(abs(a - b) / abs(a) for a, b in zip(slow.losses, fast.losses, strict=True))
    expect(rel <= rtol,
           f"the losses changed: max relative difference {rel:.2e} > {rtol:g} over {steps} steps.\n"
           f"  slow: {[round(v, 4) for v in slow.losses]}\n  fast: {[round(v, 4) for v in fast.losses]}\n"
           "The fast loop must train the same model on the same batches, in the same order, with the same fp32 "
           "math and learning rate (AMP changes the numbers by design: the lesson measures it).")
    expect(fast.update.shape == slow.update.shape,
           f"fast_train's optimizer updates {fast.update.numel():,} parameter values, the slow loop's "
           f"{slow.update.numel():,}: the two loops do not train the same model")
    wrel = float((fast.update - slow.update).norm() / slow.update.norm().clamp_min(1e-30))
    expect(wrel <= WEIGHT_RTOL,
           f"after {steps} steps fast_train's weights moved differently from the slow loop's (relative difference "
           f"of the updates {wrel:.2e} > {WEIGHT_RTOL:g}): its steps do not train the model the way the slow loop's do")
    loops = {"slow": lambda: _run(slow_train, dataset, steps, batch_size, "slow_train()").gaps_ms,
             "fast": lambda: _run(fast_train, dataset, steps, batch_size, "fast_train()").gaps_ms,
             "bound": lambda: _compute_bound_ms(dataset, steps, batch_size)}
    times = {name: [] for name in loops}
    for _ in range(rounds):
        gaps = {name: [] for name in loops}
        for name in ("slow", "fast", "bound", "fast", "slow"):  # symmetric: a drift within the round hits all alike
            gaps[name] += loops[name]()
        for name, values in gaps.items():
            times[name].append(statistics.median(values))
    speedup = bench.Ratio.from_times(times["slow"], times["fast"])
    over_bound = bench.Ratio.from_times(times["bound"], times["fast"])
    median = {k: statistics.median(v) for k, v in times.items()}
    expect(verdict.speed(over_bound, BOUND_LINE) != verdict.FASTER,
           f"fast_train's steps took {median['fast']:.2f} ms (median), {over_bound} faster than the compute bound "
           f"measured in the same rounds ({median['bound']:.1f} ms: the model's forward, backward and optimizer step "
           "alone, on batches already in memory). Steps that fast are not training the model.")
    line = (f"{verdict.speed_line('fast_train', speedup, 'slow_train', min_speedup)} (median step "
            f"{median['slow']:.1f} -> {median['fast']:.1f} ms over {rounds} interleaved rounds)")
    look = "Look at the slow loop's profile: what does it do every step that training does not need?"
    met = verdict.speed(speedup, min_speedup) == verdict.FASTER
    expect_target(met, speedup.high >= min_speedup,
                  f"undecided: {line}. The rounds disagree, as they do when other programs keep this machine's cores "
                  f"busy: run the check again. The check wants every round above {min_speedup:.2f}x; if the median "
                  f"stays below it, the loop is not fast enough yet. {look}",
                  f"not fast enough: {line}; the check wants every round above {min_speedup:.2f}x. {look}")
    passed("fast loop" if met else "fast loop's training (speed target recorded above, not enforced)",
           f"{line}; losses match to {rel:.1e}, weight updates to {wrel:.1e}")
    efficiency = over_bound.value
    figure("fraction_of_compute_bound", efficiency, "x")
    figure("speedup_over_slow_loop", speedup.value, "x")
    print(f"compute bound (the same model's fp32 forward, backward and fused SGD step on batches already in memory): "
          f"{median['bound']:.1f} ms per step. Your loop runs at {efficiency:.0%} of it ({over_bound}), the slow loop "
          f"at {median['bound'] / median['slow']:.0%}" + (": the rest of your step is spent outside the model's math; "
                                                          "profile fast_train to see where" if efficiency < 0.95 else
                                                          ": at least 95%, little is left on the table"))
    return speedup
