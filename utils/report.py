"""Recorded metrics and the course report (lesson 00 introduces it; every lesson uses it).

A lesson's setup cell calls ``report.init("01_inference_modes")``; later cells call
``report.record(name, value, unit=..., note=..., anchor=...)``. Each call rewrites
build/results/<notebook stem>.json atomically::

    {"notebook": stem, "metrics": {name: value}, "units": {name: unit}, "notes": {...}, "anchors": {...},
     "skipped": {section: reason}, "figures": [...], "env": {...}, "mode": "smoke" | "full", "runtime_s": ...}

Values are numbers, booleans or strings (numpy and 0-d torch scalars are converted). ``python -m utils.report``
(``make report``) renders build/report.md: one table per lesson with every metric, the published anchor it compares
to where the lesson gave one, the machine inventory and each notebook's run time.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from utils import env

__all__ = ["init", "record", "record_skip", "save_figure", "results_dir", "load_all", "render", "current"]

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
        "skipped": {},
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


def record(name: str, value: Any, unit: str = "", note: str = "", anchor: str = ""):
    """Record one metric for the course report and print it. Returns the (cleaned) value.

    `anchor` is the published figure the metric compares to, e.g. "1.8x BERT-base CPU (onnxruntime notebook)".
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"metric names are identifiers like 'cpu_copy_gbps', got {name!r}")
    cur = current()
    clean = _clean_value(name, value)
    cur["metrics"][name] = clean
    for key, text in (("units", unit), ("notes", note), ("anchors", anchor)):
        if text:
            cur[key][name] = str(text)
        else:
            cur[key].pop(name, None)
    _flush()
    shown = f"{clean:.4g}" if isinstance(clean, float) else str(clean)
    print(f"recorded {name} = {shown}{(' ' + unit) if unit else ''}")
    return clean


def record_skip(section: str, reason: str) -> None:
    """Note a skipped optional section (called by env.requires)."""
    if _current is None:  # a skip outside a lesson (e.g. a script) has nowhere to go
        return
    _current["skipped"][section] = reason
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
# rendering
# ---------------------------------------------------------------------------------------------------------------------


def load_all(directory: Path | None = None) -> dict[str, dict]:
    """Every results file, keyed by notebook stem, in lesson order."""
    directory = directory or results_dir()
    out = {}
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); rerun that notebook") from exc
        out[data.get("notebook", path.stem)] = data
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("|", "\\|")


def render(directory: Path | None = None, out: Path | None = None) -> Path:
    """Write build/report.md from the results files. Returns its path."""
    results = load_all(directory)
    out = out or env.build_dir() / "report.md"
    lines = ["# ML Framework Internals Workbook: course report", ""]
    lines.append(f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} from {len(results)} notebook(s).")
    lines.append("")
    if not results:
        lines.append("No results yet: run `make course`.")
    else:
        lines += ["## Run times", "", "| notebook | mode | run time (s) | metrics | skipped sections |", "|---|---|---|---|---|"]
        for stem, data in results.items():
            runtime = data.get("runtime_s")
            lines.append(
                f"| {stem} | {data.get('mode', '?')} | {runtime if runtime is not None else 'n/a'} | "
                f"{len(data.get('metrics', {}))} | {len(data.get('skipped', {}))} |"
            )
        lines.append("")
        for stem, data in results.items():
            lines += [f"## {stem}", ""]
            metrics = data.get("metrics", {})
            if metrics:
                lines += ["| metric | value | unit | published anchor | note |", "|---|---|---|---|---|"]
                for name, value in metrics.items():
                    lines.append(
                        f"| `{name}` | {_fmt(value)} | {data.get('units', {}).get(name, '')} | "
                        f"{_fmt(data.get('anchors', {}).get(name, ''))} | {_fmt(data.get('notes', {}).get(name, ''))} |"
                    )
                lines.append("")
            for section, reason in data.get("skipped", {}).items():
                lines.append(f"- skipped `{section}`: {reason}")
            for fig in data.get("figures", []):
                lines.append(f"![{Path(fig).stem}]({fig})")
            lines.append("")
    inv = env.inventory()
    lines += ["## Machine", "", "| item | value |", "|---|---|"]
    for key in ("cpu", "cpu_count", "memory_gib", "torch_threads", "gpu", "python", "platform"):
        lines.append(f"| {key} | {_fmt(inv.get(key))} |")
    feats = ", ".join(k for k, v in inv["cpu_features"].items() if v) or "none"
    lines.append(f"| cpu features | {feats} |")
    for name, version in inv["packages"].items():
        lines.append(f"| {name} | {version or 'not installed'} |")
    for name, cap in inv["capabilities"].items():
        lines.append(f"| capability: {name} | {'yes' if cap['available'] else 'no'}: {_fmt(cap['reason'])} |")
    lines.append("")
    out.write_text("\n".join(lines))
    return out


if __name__ == "__main__":
    path = render()
    print(f"wrote {path}")
    sys.exit(0)
