"""Checks for labs/03_profiling_amp_lab.ipynb (lesson 03: profile a slow training loop and make it fast)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from utils import training
from utils.checks import LabCheckFailed, call, expect, passed
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
    expect(bool(events), "the profiler recorded no events: run slow_train inside `with torch.profiler.profile(...)`, "
           "pass on_step=prof.step so the schedule advances, and record at least one active step")
    steps = sum(1 for e in events if e.name.startswith("ProfilerStep"))
    expect(steps >= 1, "no ProfilerStep ranges: call prof.step() after every training step (on_step=prof.step) "
           "and use a schedule such as schedule(wait=1, warmup=1, active=2)")
    phases = {e.name for e in events if e.name.startswith(profiling.PHASE_PREFIX)}
    expect({"phase/forward", "phase/backward"} <= phases,
           f"the profile should contain slow_train's phase/... ranges, found {sorted(phases) or 'none'}")
    expect(trace_path.is_file(), f"no Chrome trace at {trace_path}: export it (on_trace_ready or "
           "prof.export_chrome_trace(str(TRACE)))")
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
               f"phase {name!r}: expected {ms:.3f} ms per step, got {value!r}. Use the 'phase/...' rows of "
               "prof.key_averages(): cpu_time_total is in microseconds and covers all recorded steps (count the "
               "ProfilerStep* events, or read its .count)")
    passed("breakdown", ", ".join(f"{k} {v:.2f} ms" for k, v in want.items()))


def _timed_run(fn, dataset, steps, batch_size, what):
    stamps: list[float] = []
    losses = call(fn, dataset, steps, batch_size, on_step=lambda: stamps.append(time.perf_counter()), what=what)
    try:
        values = [float(v) for v in losses]
    except (TypeError, ValueError):
        raise LabCheckFailed(f"{what} should return the list of per-step losses (floats), got {losses!r:.80}") from None
    expect(len(values) == steps, f"{what} should return {steps} losses (one per step), got {len(values)}")
    expect(len(stamps) == steps, f"{what} called on_step() {len(stamps)} times for {steps} steps: call it once at the "
           "end of every step (the check uses it to time the steps)")
    return values, [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:], strict=False)]


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
                    rtol: float = 1e-3, rounds: int = 3) -> float:
    """The learner's loop vs the slow loop, in the same run: same losses (rtol) and at least `min_speedup` faster.

    Both loops run `rounds` times, alternating. A loop's step time is the *fastest* interval between two of its
    on_step() calls over all rounds: start-up costs (building the model, starting workers) are not counted, and on a
    shared machine the fastest step is the one least disturbed by other processes, so the ratio is stable. The
    compute bound (the same model's step on batches in memory) runs in the same rounds; the learner's efficiency
    against it is reported, not judged.
    """
    if steps < 3:
        raise ValueError(f"steps must be >= 3 to time steps between on_step() calls, got {steps}")
    fast_losses, fast_ms = _timed_run(fast_train, dataset, steps, batch_size, "fast_train()")
    slow_losses, slow_ms = _timed_run(slow_train, dataset, steps, batch_size, "slow_train()")
    rel = max(abs(a - b) / abs(a) for a, b in zip(slow_losses, fast_losses, strict=True))
    expect(rel <= rtol,
           f"the losses changed: max relative difference {rel:.2e} > {rtol:g} over {steps} steps.\n"
           f"  slow: {[round(v, 4) for v in slow_losses]}\n  fast: {[round(v, 4) for v in fast_losses]}\n"
           "Same seed, same dataset, same batch size and learning rate must give the same losses: keep the math in "
           "fp32 (AMP is measured in the lesson and changes the numbers by design) and keep the data order "
           "(image_data.make_loader with the same seed; the number of workers does not change the batches).")
    bound_ms = _compute_bound_ms(dataset, steps, batch_size)
    for _ in range(rounds - 1):
        fast_ms += _timed_run(fast_train, dataset, steps, batch_size, "fast_train()")[1]
        slow_ms += _timed_run(slow_train, dataset, steps, batch_size, "slow_train()")[1]
        bound_ms += _compute_bound_ms(dataset, steps, batch_size)
    fast_step, slow_step, bound_step = min(fast_ms), min(slow_ms), min(bound_ms)
    speedup = slow_step / fast_step
    expect(speedup >= min_speedup,
           f"fast_train is {speedup:.2f}x the slow loop ({fast_step:.1f} vs {slow_step:.1f} ms for its fastest step; "
           f"medians {statistics.median(fast_ms):.1f} vs {statistics.median(slow_ms):.1f} ms); the check wants at "
           f"least {min_speedup:.2f}x. Look at the slow loop's profile: what does it do every step that training "
           "does not need?")
    passed("fast loop", f"{speedup:.2f}x faster ({slow_step:.1f} -> {fast_step:.1f} ms per step, fastest of "
           f"{len(fast_ms)} steps each), losses match to {rel:.1e}")
    print(f"compute bound (the same model's fp32 forward, backward and fused SGD step on batches already in memory): "
          f"{bound_step:.1f} ms per step. Your loop runs at {bound_step / fast_step:.0%} of it, the slow loop at "
          f"{bound_step / slow_step:.0%}" + (": the rest of your step is spent outside the model's math; profile "
                                             "fast_train to see where" if bound_step / fast_step < 0.95 else
                                             ": at least 95%, little is left on the table"))
    return speedup
