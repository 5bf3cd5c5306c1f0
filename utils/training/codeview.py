"""Show the code a configuration runs (lesson 03): a function's own source with its switches resolved.

A loop written once with ``if cfg.<switch>:`` blocks is hard to read as any one loop. ``specialize(func, values)``
returns the source of `func` as it runs for those switch values: each ``if cfg.x:`` / ``if not cfg.x:`` block is
replaced by the branch that runs (dedented), and every other ``cfg.x`` is replaced by its value. The lines come from
the very function that runs (``inspect.getsource``), comments included, so the listing cannot drift from the code.
``diff(a, b)`` is a unified diff of two such listings: what a fix changes in the step, in a few lines.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from collections.abc import Callable, Mapping

__all__ = ["specialize", "diff"]


def _switch(test: ast.expr, name: str) -> tuple[str, bool] | None:
    """('x', negated) for a test `name.x` or `not name.x`; None for any other test."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    node = test.operand if negated else test
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
        return node.attr, negated
    return None


def specialize(func: Callable, values: Mapping[str, object], *, name: str = "cfg") -> str:
    """The source of `func` as it runs when `name.<field>` has the given values (lesson 03).

    Resolved: ``if name.x:`` and ``if not name.x:`` statements (with or without ``else``; not ``elif``), the plain
    assignment ``name = ...`` (dropped, its uses are replaced) and every remaining ``name.x`` (replaced by
    ``repr(value)``). Any other code is kept as written. Raises ValueError for a field missing from `values`.
    """
    if not callable(func):
        raise TypeError(f"specialize() needs a function or method, got {type(func).__name__}")
    if not isinstance(values, Mapping):
        raise TypeError(f"values must be a mapping {{field: value}}, got {type(values).__name__}")
    lines = textwrap.dedent(inspect.getsource(func)).splitlines()
    tree = ast.parse("\n".join(lines))
    drop: set[int] = set()  # 0-based line numbers
    dedent = [0] * len(lines)
    subs: dict[int, list[tuple[int, int, str]]] = {}

    def value_of(field: str):
        if field not in values:
            raise ValueError(f"{func.__qualname__} reads {name}.{field}, which `values` lacks; it has {sorted(values)}")
        return values[field]

    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (sw := _switch(node.test, name)):
            field, negated = sw
            taken = node.body if bool(value_of(field)) != negated else node.orelse
            if node.orelse and isinstance(node.orelse[0], ast.If) and node.orelse[0].col_offset == node.col_offset:
                raise ValueError(f"{func.__qualname__} line {node.lineno}: `elif` after a {name} switch is not supported")
            header_end = node.test.end_lineno  # 0-based index of the first line after `if ...:`
            body_end = node.body[-1].end_lineno  # first line after the body
            if node.orelse:  # the `else:` line sits between the two branches; comments before it belong to the body
                else_line = next(i for i in range(body_end, node.orelse[0].lineno)
                                 if lines[i].strip().startswith("else"))
                body_end, else_span = else_line, range(else_line + 1, node.orelse[-1].end_lineno)
                drop.add(else_line)
            else:
                else_span = range(0)
            body_span = range(header_end, body_end)
            drop.update(range(node.lineno - 1, header_end))
            taken_span, skipped_span = (body_span, else_span) if taken is node.body else (else_span, body_span)
            drop.update(skipped_span)
            if taken:
                shift = taken[0].col_offset - node.col_offset
                for i in taken_span:
                    dedent[i] += shift
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and node.targets[0].id == name):
            drop.update(range(node.lineno - 1, node.end_lineno))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name:
            if node.lineno != node.end_lineno:
                raise ValueError(f"{func.__qualname__} line {node.lineno}: {name}.{node.attr} spans lines")
            subs.setdefault(node.lineno - 1, []).append(
                (node.col_offset, node.end_col_offset, repr(value_of(node.attr))))
    out = []
    for i, line in enumerate(lines):
        if i in drop:
            continue
        raw = line.encode()  # ast column offsets count UTF-8 bytes
        for start, end, text in sorted(subs.get(i, []), reverse=True):
            raw = raw[:start] + text.encode() + raw[end:]
        line = raw.decode()
        cut = min(dedent[i], len(line) - len(line.lstrip(" ")))
        out.append(line[cut:])
    source = "\n".join(out) + "\n"
    compile(source, f"<{func.__qualname__} specialized>", "exec")  # a listing that does not parse is a bug here
    return source


def diff(before: str, after: str, *, before_name: str = "before", after_name: str = "after", context: int = 1) -> str:
    """A unified diff of two listings (e.g. two specialize() results): '-' lines go, '+' lines come (lesson 03)."""
    if not isinstance(before, str) or not isinstance(after, str):
        raise TypeError(f"diff() compares two source strings, got {type(before).__name__} and {type(after).__name__}")
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), before_name, after_name, n=context,
                                 lineterm="")
    return "\n".join(lines)
