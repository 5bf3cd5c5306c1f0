"""Recorded metrics and the one view of them (lesson 00 introduces it; every lesson uses it).

A lesson's setup cell calls ``report.init("01_inference_modes")``; later cells call
``report.record(name, value, unit=..., note=..., anchor=...)``. Each call rewrites
build/results/<notebook stem>.json atomically::

    {"notebook": stem, "metrics": {name: value}, "units": {name: unit}, "notes": {...}, "anchors": {...},
     "intervals": {name: [low, high]}, "skipped": {section: reason}, "figures": [...], "env": {...},
     "mode": "smoke" | "full", "runtime_s": ...}

A ratio measured in rounds (a utils.core.bench.Ratio) is recorded with its interval: ``record(name, ratio)`` stores
the median in "metrics" and [low, high] in "intervals", and every view prints both.

Values are numbers, booleans or strings (numpy and 0-d torch scalars are converted). ``report.show()`` ends every
lesson: its metrics with units, notes and published anchors, the source claims they test (utils.core.claims) with a
verdict, and the sections it skipped. The course report that collects every lesson (``make report``) is rendered by
utils.course.render from the same lesson_markdown().
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from utils.core import claims, env
from utils.core.bench import Ratio

__all__ = [
    "init", "record", "value_with_interval", "record_skip", "record_ran", "save_figure", "set_mode", "set_runtime", "results_dir", "current",
    "load_all", "lesson_markdown", "show",
]

_current: dict[str, Any] | None = None


def results_dir() -> Path:
    path = env.build_dir() / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def figures_dir() -> Path:
    path = env.build_dir() / "figures"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_json(path: Path, data: dict) -> None:
    """Write JSON atomically: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _env_summary() -> dict:
    inv = env.inventory()
    return {
        "cpu": inv["cpu"],
        "cpu_count": inv["cpu_count"],
        "torch_threads": inv.get("torch_threads"),
        "gpu": inv.get("gpu"),
        "torch": inv["packages"].get("torch"),
        "python": inv["python"],
    }


def init(notebook: str) -> Path:
    """Start a fresh results file for this notebook (call once in the setup cell). Returns its path."""
    global _current
    if not notebook or "/" in notebook or notebook.endswith(".ipynb"):
        raise ValueError(f"init() takes the notebook stem such as '01_inference_modes', got {notebook!r}")
    _current = {
        "notebook": notebook,
        "mode": "smoke" if env.smoke_default() else "full",
        "started": _dt.datetime.now().isoformat(timespec="seconds"),
        "metrics": {},
        "units": {},
        "notes": {},
        "anchors": {},
        "intervals": {},
        "skipped": {},
        "ran": [],
        "figures": [],
        "env": _env_summary(),
    }
    path = results_dir() / f"{notebook}.json"
    _write_json(path, _current)
    return path


def current() -> dict:
    if _current is None:
        raise RuntimeError("no results file is open: call report.init('<notebook stem>') in the notebook's setup cell")
    return _current


def set_mode(smoke: bool) -> None:
    """Record the mode the notebook actually ran in (its SMOKE parameter may differ from the environment)."""
    cur = current()
    cur["mode"] = "smoke" if smoke else "full"
    _flush()


def _flush() -> None:
    cur = current()
    _write_json(results_dir() / f"{cur['notebook']}.json", cur)


def _clean_value(name: str, value: Any) -> bool | int | float | str:
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy scalar, 0-d tensor
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"metric {name!r}: value must be finite, got {value!r}")
        return value
    raise TypeError(f"metric {name!r}: expected a number, boolean or string, got {type(value).__name__} ({value!r:.80})")


def record(name: str, value: Any, unit: str = "", note: str = "", anchor: str = "",
           interval: tuple[float, float] | None = None):
    """Record one metric for the course report and print it. Returns what it was given (a Ratio stays a Ratio).

    `value` may be a bench.Ratio: its median is the value, its interval is stored, and the unit defaults to "x".
    `interval` gives [low, high] for any other number. `anchor` is the published figure the metric compares to,
    with its setup, e.g. "1.8x BERT-base CPU batch 1 seq 128 (onnxruntime transformers notebook)".
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"metric names are identifiers like 'copy_into_gbps_dram', got {name!r}")
    cur = current()
    given = value
    if isinstance(value, Ratio):
        if interval is not None:
            raise ValueError(f"metric {name!r}: a Ratio carries its own interval; pass interval= only with a number")
        value, interval, unit = value.value, value.interval, unit or "x"
    clean = _clean_value(name, value)
    intervals = cur.setdefault("intervals", {})
    if interval is not None:
        lo, hi = (float(v) for v in interval)
        if not (isinstance(clean, int | float) and not isinstance(clean, bool)) or not lo <= clean <= hi:
            raise ValueError(f"metric {name!r}: interval [{lo}, {hi}] must be numbers around the value {clean!r}")
        intervals[name] = [lo, hi]
    else:
        intervals.pop(name, None)
    cur["metrics"][name] = clean
    for key, text in (("units", unit), ("notes", note), ("anchors", anchor)):
        if text:
            cur[key][name] = str(text)
        else:
            cur[key].pop(name, None)
    _flush()
    shown = f"{clean:.4g}" if isinstance(clean, float) else str(clean)
    if name in intervals:
        shown += f" [{intervals[name][0]:.4g}, {intervals[name][1]:.4g}]"
    print(f"recorded {name} = {shown}{(' ' + unit) if unit else ''}")
    return given if isinstance(given, Ratio) else clean


def value_with_interval(data: dict, name: str) -> str:
    """A recorded metric as text with its interval when it has one: '1.34 [1.28, 1.41]' (views of the results)."""
    value = data.get("metrics", {}).get(name)
    text = claims.format_value(value)
    interval = data.get("intervals", {}).get(name)
    if interval:
        text += f" [{interval[0]:.3g}, {interval[1]:.3g}]"
    return text


def record_skip(section: str, reason: str) -> None:
    """Note a skipped optional section (called by sections.requires)."""
    if _current is None:  # a skip outside a lesson (e.g. a script) has nowhere to go
        return
    _current["skipped"][section] = reason
    _flush()


def record_ran(section: str) -> None:
    """Note an optional section whose capability was present, so it ran (called by sections.requires; make gpu-check)."""
    if _current is None:
        return
    ran = _current.setdefault("ran", [])
    if section not in ran:
        ran.append(section)
        _flush()


def save_figure(fig, name: str) -> Path:
    """Save a matplotlib figure under build/figures/<notebook>_<name>.png and list it in the results."""
    cur = current()
    path = figures_dir() / f"{cur['notebook']}_{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    rel = str(path.relative_to(env.build_dir()))
    if rel not in cur["figures"]:
        cur["figures"].append(rel)
        _flush()
    return path


def set_runtime(notebook: str, seconds: float, mode: str) -> None:
    """Called by the runner after a notebook finished: store its wall time in its results file."""
    path = results_dir() / f"{notebook}.json"
    data = json.loads(path.read_text()) if path.exists() else {"notebook": notebook, "metrics": {}}
    data["runtime_s"] = round(seconds, 1)
    data["mode"] = mode
    _write_json(path, data)


# ---------------------------------------------------------------------------------------------------------------------
# reading results back, and one lesson's view of them
# ---------------------------------------------------------------------------------------------------------------------


def load_all(directory: Path | None = None) -> dict[str, dict]:
    """Every results file, keyed by notebook stem, in lesson order (course report, claims, report.show()).

    A file that is not valid JSON (a run killed while writing, an edit by hand) is skipped with a warning that names
    it: its lesson then reads as not run, and the rest of the report still renders.
    """
    directory = Path(directory) if directory is not None else env.build_dir() / "results"  # read only: no mkdir
    out = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            warnings.warn(f"{path} is unreadable ({exc}); skipped: rerun that notebook", stacklevel=2)
            continue
        out[data.get("notebook", path.stem)] = data
    return out


def _fmt(value: Any) -> str:
    """A value for a Markdown table cell (claims.format_value, pipes escaped)."""
    return claims.cell(claims.format_value(value))


def lesson_markdown(data: dict, results: dict[str, dict] | None = None) -> str:
    """One lesson's results as Markdown: every metric with its value, unit, published anchor and note, the source
    claims its metrics test with their verdicts, and the sections it skipped (report.show() in every lesson; the
    course report's per-lesson tables).

    `data` is one results file (report.current() or an entry of load_all()); `results` are all of them, for claims
    that read metrics of other lessons too (default: the files on disk, with `data` in place of its own).
    """
    stem = data.get("notebook", "")
    lines = [f"*{data.get('mode', '?')} run*" + (" (shrunken sizes: `make course` runs the full one)"
                                                 if data.get("mode") == "smoke" else "")]
    metrics = data.get("metrics", {})
    if metrics:
        lines += ["", "| metric | value [interval] | unit | published anchor | note |", "|---|---|---|---|---|"]
        for name in metrics:
            lines.append(
                f"| `{name}` | {claims.cell(value_with_interval(data, name))} | {data.get('units', {}).get(name, '')} | "
                f"{_fmt(data.get('anchors', {}).get(name, ''))} | {_fmt(data.get('notes', {}).get(name, ''))} |"
            )
    else:
        lines += ["", "No metrics recorded yet."]
    mine = claims.for_lesson(stem)
    if mine:
        everything = {**(load_all() if results is None else results), stem: data}
        lines += ["", "Claims these measurements test:", "", claims.markdown(everything, mine)]
    skipped = data.get("skipped", {})
    if skipped:
        lines.append("")
        lines += [f"- skipped `{section}`: {_fmt(reason)}" for section, reason in skipped.items()]
    return "\n".join(lines)


def show(notebook: str | None = None) -> None:
    """Show a lesson's recorded results the way every lesson ends (its "measured on this machine" cell): in Jupyter
    as rendered tables, elsewhere as Markdown text (lesson_markdown). `notebook`: a lesson stem; default the open one.
    """
    if notebook is None:
        data = current()
    else:
        data = load_all().get(notebook)
        if data is None:
            raise FileNotFoundError(f"no results for {notebook!r} in {results_dir()}: run that notebook first")
    text = lesson_markdown(data)
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and getattr(get_ipython(), "kernel", None) is not None:
        display(Markdown(text))
    else:
        print(text)
