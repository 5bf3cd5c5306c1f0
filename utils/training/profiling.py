"""The PyTorch profiler, made readable (lesson 03).

- ``phase(name)`` labels a part of a training step (data, forward, backward, optimizer, ...) with
  ``torch.profiler.record_function`` and, on a GPU, an NVTX range that Nsight Systems shows.
- ``profile_steps(step, ...)`` runs a step function under ``torch.profiler.profile`` with a schedule
  (wait / warmup / active), exports a Chrome trace JSON into build/traces/ (open it in https://ui.perfetto.dev or
  chrome://tracing) and, where the ``tensorboard`` package is installed, TensorBoard's trace files too.
- ``phase_times`` turns the profile into a per-step breakdown (ms per phase), ``ops_by_phase`` says which operators
  inside each phase cost the most, and ``top_bottleneck`` names the biggest phase from the numbers, not by eye.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from utils.core import env

env.quiet_profiler_log()

__all__ = [
    "PHASE_PREFIX",
    "phase",
    "set_nvtx",
    "Profile",
    "profile_steps",
    "trace_event_count",
    "table",
    "phase_times",
    "ops_by_phase",
    "calls_per_step",
    "Bottleneck",
    "top_bottleneck",
    "gpu_busy_fraction",
    "plot_breakdown",
]

PHASE_PREFIX = "phase/"
_STEP_PREFIX = "ProfilerStep"


_NVTX = {"on": False}


def set_nvtx(enabled: bool) -> None:
    """Make every phase() also push an NVTX range on a GPU, for Nsight Systems (lesson 03: python -m utils.training --nvtx)."""
    _NVTX["on"] = bool(enabled)


@contextlib.contextmanager
def phase(name: str, nvtx: bool | None = None):
    """Label a block as one phase of a training step: a profiler range ``phase/<name>`` (+ an NVTX range on a GPU).

    `nvtx` None follows set_nvtx() (off by default).
    """
    import torch

    if not name or "/" in name:
        raise ValueError(f"a phase name is a short word such as 'forward', got {name!r}")
    use_nvtx = (_NVTX["on"] if nvtx is None else nvtx) and torch.cuda.is_available()
    if use_nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(PHASE_PREFIX + name):
            yield
    finally:
        if use_nvtx:
            torch.cuda.nvtx.range_pop()


@dataclass
class Profile:
    """What profile_steps() returns: the profiler, where its trace went, and how many steps it recorded."""

    prof: object
    active_steps: int
    trace_path: Path | None
    tensorboard_dir: Path | None = None
    extra: dict = field(default_factory=dict)

    def events(self):
        return self.prof.events()

    def key_averages(self, **kwargs):
        return self.prof.key_averages(**kwargs)


def profile_steps(step, *, wait: int = 1, warmup: int = 1, active: int = 3, trace_name: str | None = None,
                  profile_memory: bool = False, record_shapes: bool = False, with_stack: bool = False,
                  tensorboard: bool | None = None) -> Profile:
    """Run `step()` wait + warmup + active times under torch.profiler with a schedule (lesson 03).

    Only the `active` steps are recorded (the `wait` steps run unprofiled, the `warmup` steps run with the profiler on
    but are thrown away, so one-time costs stay out of the numbers). `trace_name` exports a Chrome trace to
    build/traces/<trace_name>.json. `tensorboard=None` also writes TensorBoard's trace files (build/tensorboard/...)
    when the tensorboard package is installed.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    if not callable(step):
        raise TypeError(f"profile_steps() needs a callable that runs one step, got {type(step).__name__}")
    if wait < 0 or warmup < 0 or active < 1:
        raise ValueError(f"need wait >= 0, warmup >= 0 and active >= 1, got wait={wait}, warmup={warmup}, active={active}")
    if trace_name is not None and (not trace_name or "/" in trace_name or trace_name.endswith(".json")):
        raise ValueError(f"trace_name is a file stem such as 'baseline', got {trace_name!r}")
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    trace_path = env.build_dir() / "traces" / f"{trace_name}.json" if trace_name else None
    if tensorboard is None:
        tensorboard = importlib.util.find_spec("tensorboard") is not None
    tb_dir = env.build_dir() / "tensorboard" / trace_name if (tensorboard and trace_name) else None
    tb_handler = torch.profiler.tensorboard_trace_handler(str(tb_dir)) if tb_dir else None

    def on_ready(p):
        if trace_path is not None:
            trace_path.parent.mkdir(parents=True, exist_ok=True)
            p.export_chrome_trace(str(trace_path))
        if tb_handler is not None:
            tb_handler(p)

    with profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=on_ready,
        profile_memory=profile_memory,
        record_shapes=record_shapes,
        with_stack=with_stack,
    ) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    return Profile(prof=prof, active_steps=active, trace_path=trace_path, tensorboard_dir=tb_dir)


def trace_event_count(path: str | Path) -> int:
    """The number of events in a Chrome trace JSON file (its ``traceEvents`` list)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace at {path}: pass trace_name=... to profile_steps() to export one")
    data = json.loads(path.read_text())
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path} is not a Chrome trace (no traceEvents list)")
    return len(events)


def _prof(profile):
    return profile.prof if isinstance(profile, Profile) else profile


def table(profile, sort_by: str | None = None, row_limit: int = 12, **kwargs) -> str:
    """The profiler's key_averages table, by self CPU time (self device time on a GPU run) by default."""
    import torch

    if sort_by is None:
        sort_by = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return _prof(profile).key_averages(**kwargs).table(sort_by=sort_by, row_limit=row_limit, max_name_column_width=48)


def _phase_of(event) -> str | None:
    node = event
    while node is not None:
        if node.name.startswith(PHASE_PREFIX):
            return node.name[len(PHASE_PREFIX):]
        node = node.cpu_parent
    return None


def phase_times(profile, active_steps: int | None = None) -> dict[str, float]:
    """Milliseconds per step in each labelled phase, plus 'other' (unlabelled time) and 'step' (the whole step).

    Read from the CPU timeline: on a GPU run, phases that launch kernels asynchronously look short unless the loop
    synchronises; use the device-time columns of table() for the GPU side.
    """
    steps = active_steps or (profile.active_steps if isinstance(profile, Profile) else None)
    if not steps:
        raise ValueError("phase_times() needs the number of active steps (pass a Profile or active_steps=...)")
    totals: dict[str, float] = defaultdict(float)
    step_us = 0.0
    for ev in _prof(profile).events():
        if ev.name.startswith(_STEP_PREFIX):
            step_us += ev.cpu_time_total
        elif ev.name.startswith(PHASE_PREFIX) and _phase_of(ev.cpu_parent) is None:  # nested phases count once
            totals[ev.name[len(PHASE_PREFIX):]] += ev.cpu_time_total
    if not totals:
        raise ValueError(f"the profile has no '{PHASE_PREFIX}...' ranges: label the step with utils.training.profiling.phase()")
    out = {name: us / 1e3 / steps for name, us in totals.items()}
    if step_us:
        out["step"] = step_us / 1e3 / steps
        out["other"] = max(0.0, out["step"] - sum(v for k, v in out.items() if k != "step"))
    return out


def ops_by_phase(profile, active_steps: int | None = None) -> dict[str, dict[str, float]]:
    """{phase: {operator: self CPU ms per step}}, each sorted from the most expensive operator down."""
    steps = active_steps or (profile.active_steps if isinstance(profile, Profile) else 1)
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for ev in _prof(profile).events():
        if ev.name.startswith((PHASE_PREFIX, _STEP_PREFIX)):
            continue
        acc[_phase_of(ev) or "other"][ev.name] += ev.self_cpu_time_total / 1e3 / steps
    return {ph: dict(sorted(ops.items(), key=lambda kv: -kv[1])) for ph, ops in acc.items()}


def calls_per_step(profile, op: str, phase: str | None = None, active_steps: int | None = None) -> float:
    """How many times operator `op` (e.g. 'aten::item', a host sync) ran per step, optionally inside one phase."""
    steps = active_steps or (profile.active_steps if isinstance(profile, Profile) else None)
    if not steps:
        raise ValueError("calls_per_step() needs the number of active steps (pass a Profile or active_steps=...)")
    n = sum(1 for ev in _prof(profile).events() if ev.name == op and (phase is None or _phase_of(ev) == phase))
    return n / steps


@dataclass(frozen=True)
class Bottleneck:
    """The phase that takes the largest share of the step, and the operator that costs most inside it."""

    phase: str
    ms_per_step: float
    share: float
    top_op: str
    top_op_ms: float

    def __str__(self) -> str:
        return (f"{self.phase}: {self.ms_per_step:.1f} ms per step ({self.share:.0%} of the step); "
                f"costliest operator inside it: {self.top_op} ({self.top_op_ms:.1f} ms self CPU)")


def top_bottleneck(profile, active_steps: int | None = None) -> Bottleneck:
    """Name the biggest phase of the step from the profile (lesson 03): the place to look first."""
    times = phase_times(profile, active_steps)
    phases = {k: v for k, v in times.items() if k not in {"step", "other"}}
    step_ms = times.get("step") or sum(phases.values())
    name = max(phases, key=phases.get)
    ops = ops_by_phase(profile, active_steps).get(name, {})
    top_op, top_ms = next(iter(ops.items()), ("(none)", 0.0))
    return Bottleneck(name, phases[name], phases[name] / step_ms if step_ms else 0.0, top_op, top_ms)


def gpu_busy_fraction(profile) -> float:
    """Share of the profiled steps' wall time the GPU spent running kernels (lesson 03's GPU-utilization view).

    Sums the self device time of every operator and divides by the total ProfilerStep time; overlapping kernels on
    several streams can push it above 1. Needs a profile recorded with CUDA activity.
    """
    from torch.autograd import DeviceType

    events = _prof(profile).events()
    step_us = sum(ev.cpu_time_total for ev in events if ev.name.startswith(_STEP_PREFIX))
    if not step_us:
        raise ValueError("no ProfilerStep ranges in this profile: record it with profile_steps()")
    # count device-side events only (kernels, memcpy), as the key_averages table's "Self CUDA time total" does
    device_us = sum(ev.self_device_time_total for ev in events
                    if ev.device_type == DeviceType.CUDA and not ev.is_user_annotation)
    return device_us / step_us


def plot_breakdown(breakdowns: dict[str, dict[str, float]], ax=None, order=None):
    """A stacked bar per run (e.g. {'baseline': phase_times(...), 'optimized': ...}): ms per step by phase."""
    import matplotlib.pyplot as plt

    if not breakdowns:
        raise ValueError("plot_breakdown() needs at least one {phase: ms} breakdown")
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    phases = order or sorted({p for b in breakdowns.values() for p in b if p != "step"},
                             key=lambda p: -max(b.get(p, 0.0) for b in breakdowns.values()))
    names = list(breakdowns)
    bottom = [0.0] * len(names)
    for ph in phases:
        vals = [breakdowns[n].get(ph, 0.0) for n in names]
        ax.bar(names, vals, bottom=bottom, label=ph)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("ms per step (profiled)")
    ax.set_title("Where a training step's time goes")
    ax.legend(loc="upper right", fontsize=8)
    return ax
