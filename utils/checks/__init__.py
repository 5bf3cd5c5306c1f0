"""Lab checks: one module per lab (utils.checks.lab00 ... lab07), each called by its lab's `# CHECK` cells, and the
helpers they share. On the solution every check passes; on the untouched lab every check raises LabCheckFailed with a
message that says what was expected, what came, and which TODO to fill in (generation: utils.course.labs).
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["LabCheckFailed", "call", "expect", "passed"]


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


def passed(check: str, detail: str = "") -> None:
    """Print the one line a passing check shows."""
    print(f"PASSED {check}" + (f": {detail}" if detail else ""))
