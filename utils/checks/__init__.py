"""Lab checks: one module per lab (utils.checks.lab00 ... lab07), each called by its lab's `# CHECK` cells, and the
helpers they share. On the solution every check passes; on the untouched lab every check raises LabCheckFailed with a
message that says what was expected, what came, and which TODO to fill in (generation: utils.course.labs).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import threading
from collections.abc import Callable

from utils.core import verdict

__all__ = ["LabCheckFailed", "call", "expect", "expect_gain", "expect_speed", "expect_target", "passed", "figure",
           "no_reference", "speed_targets_enforced"]

# Speed targets are enforced for a learner and for `make grade`. The test suite runs the solutions with
# WORKBOOK_SPEED_TARGETS=record: timing thresholds are benchmarks, not tests (DESIGN.md), so there a missed target is
# printed with its numbers instead of failing the run, and correctness is still enforced.
SPEED_TARGETS_VAR = "WORKBOOK_SPEED_TARGETS"


class LabCheckFailed(AssertionError):
    """A lab check did not pass; the message says what was expected and what came."""


def call(fn: Callable, *args, what: str | None = None, **kwargs):
    """Call the learner's function; a TODO stub becomes a LabCheckFailed that says which TODO to fill in."""
    name = what or f"{getattr(fn, '__name__', 'your function')}()"
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        raise LabCheckFailed(f"{name} is not written yet ({exc}). Fill in its TODO and run this cell again.") from None


def expect(condition: bool, message: str) -> None:
    """Fail the check with `message` (what was expected and what came) unless `condition` holds."""
    if not condition:
        raise LabCheckFailed(message)


def speed_targets_enforced() -> bool:
    """True unless $WORKBOOK_SPEED_TARGETS is 'record' (the test suite); anything but 'enforce' or 'record' is an error."""
    value = os.environ.get(SPEED_TARGETS_VAR, "enforce").strip().lower()
    if value not in ("enforce", "record"):
        raise ValueError(f"{SPEED_TARGETS_VAR} must be 'enforce' or 'record', got {value!r}")
    return value == "enforce"


def expect_speed(condition: bool, message: str) -> None:
    """Like expect(), for a speed target: fails when targets are enforced, otherwise prints the miss and goes on."""
    if condition:
        return
    if speed_targets_enforced():
        raise LabCheckFailed(message)
    print(f"SPEED TARGET NOT ENFORCED ({SPEED_TARGETS_VAR}=record, as the test suite runs; a learner's check fails "
          f"here):\n{message}")


def expect_target(met: bool, could_meet: bool, undecided: str, missed: str) -> None:
    """A speed target judged over rounds: nothing when `met`; otherwise expect_speed() fails with `undecided` while the
    interval still reaches the target (`could_meet`: the rounds disagree, run again), with `missed` when it does not."""
    if not met:
        expect_speed(False, undecided if could_meet else missed)


def expect_gain(name: str, ratio, baseline: str, line: float, look: str, *, smoke: bool) -> str:
    """A speedup measured in interleaved rounds (a bench.Ratio) judged against `line`; returns the printed verdict.

    Smoke mode has too few rounds to judge, so it prints the gain and moves on. Otherwise expect_target() fails with
    "undecided, run again" while the interval still reaches the line and with "no gain beyond the line" when it does
    not; `look` (a question, never the answer) ends both messages."""
    text = verdict.speed_line(name, ratio, baseline, line)
    if smoke:
        print(f"SMOKE MODE: the gain is reported, not judged (too few rounds to judge); correctness is judged. {text}")
        return text
    judged = ratio.judged
    expect_target(verdict.speed(ratio, line) == verdict.FASTER, judged is not None and judged[1] >= line,
                  f"the gain was not measurable: {text}. The rounds disagree, as they do when other programs keep "
                  f"this machine's cores busy: run the check again. {look}",
                  f"no gain beyond the line: {text}; the task wants every round above {line:.2f}x. {look}")
    return text


def passed(check: str, detail: str = "") -> None:
    """Print the one line a passing check shows."""
    print(f"PASSED {check}" + (f": {detail}" if detail else ""))


def figure(name: str, value: float, unit: str, *, better: str = "higher") -> None:
    """Print the check's performance figure on one line the grader reads for the workshop leaderboard
    (utils.course.grade): ``FIGURE <name>: <value> <unit> (higher is better)``. Print it after the check passed."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if not (isinstance(name, str) and name and " " not in name and ":" not in name):
        raise ValueError(f"a figure's name is one word without ':', got {name!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"a figure must be a finite number, got {value!r} for {name}")
    print(f"FIGURE {name}: {value:.6g} {unit or '-'} ({better} is better)")


@contextlib.contextmanager
def no_reference(*functions: Callable, what: str = "your function"):
    """Fail with LabCheckFailed when one of `functions` (the course's own implementation of the task) runs inside the
    block, however the learner imported it: calls are recognised by sys.setprofile (this thread and threads started
    in the block), Python functions by their code object and built-ins (C functions such as torch's) by identity, so
    an answer that only wraps the reference cannot pass. That failure replaces any other one the block raised."""
    names = {}
    for fn in map(inspect.unwrap, functions):  # a decorated function (torch.inference_mode, ...) by its own code
        key = getattr(fn, "__code__", None) or (fn if callable(fn) and not hasattr(fn, "__dict__") else None)
        if key is None:
            raise TypeError(f"no_reference() takes Python functions or built-ins, got {fn!r}")
        name = fn.__qualname__ if key is getattr(fn, "__code__", None) else fn.__name__
        names[key] = f"{getattr(fn, '__module__', None) or 'builtins'}.{name}"
    seen: list[str] = []
    previous, previous_threads = sys.getprofile(), threading.getprofile()

    def watch(frame, event, arg):
        if not seen and ((event == "call" and frame.f_code in names) or (event == "c_call" and arg in names)):
            seen.append(names[frame.f_code if event == "call" else arg])
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)
        threading.setprofile(previous_threads)
        if seen:
            raise LabCheckFailed(f"{what} calls {seen[0]}, the course's reference implementation of this task: "
                                 "write the steps yourself") from None
