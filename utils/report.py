"""Recorded metrics and the course report (lesson 00 introduces it; every lesson uses it).

A lesson's setup cell calls ``report.init("01_inference_modes")``; later cells call
``report.record(name, value, unit=..., note=..., anchor=...)``. Each call rewrites
build/results/<notebook stem>.json atomically::

    {"notebook": stem, "metrics": {name: value}, "units": {name: unit}, "notes": {...}, "anchors": {...},
     "skipped": {section: reason}, "figures": [...], "env": {...}, "mode": "smoke" | "full", "runtime_s": ...}

Values are numbers, booleans or strings (numpy and 0-d torch scalars are converted). ``python -m utils.report``
(``make report``) renders build/report.md and build/report.html: the source claims checked against the
measurements (utils.claims), each notebook's run time, one table per lesson with every metric and the published
anchor it compares to where the lesson gave one, the plots, and the machine inventory. ``python -m utils.report agenda
[--update docs/INSTRUCTOR.md]`` (``make agenda``) turns the measured run times into a one-day workshop agenda.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

from utils import claims, env

__all__ = [
    "init", "record", "record_skip", "save_figure", "results_dir", "load_all", "render", "render_html", "agenda",
    "current", "show", "lesson_markdown",
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


def record_ran(section: str) -> None:
    """Note an optional section whose capability was present, so it ran (called by env.requires; make gpu-check)."""
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
# rendering
# ---------------------------------------------------------------------------------------------------------------------


def load_all(directory: Path | None = None) -> dict[str, dict]:
    """Every results file, keyed by notebook stem, in lesson order (course report, claims, report.show()).

    A file that is not valid JSON (a run killed while writing, an edit by hand) is skipped with a warning that names
    it: its lesson then reads as not run, and the rest of the report still renders.
    """
    directory = Path(directory) if directory is not None else results_dir()
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
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("|", "\\|")


_HOW_TO_READ = (
    "Every number below was measured on the machine described at the end, by the lesson notebooks, side by side in "
    "one run. **Claims checked** compares the figures people repeat with what this machine measured: *holds* means "
    "the measurement falls inside the claimed range, *beyond the claimed range* means better than claimed, *does not "
    "hold* means below it, *not measurable here* names the missing hardware, and *not run* means the lesson has no "
    "results yet. Each lesson's table then lists everything it recorded, with the published figure it compares to "
    "(*published anchor*) where there is one. Numbers from a *smoke* run use shrunken sizes: run `make course` for "
    "real ones."
)

# One-day workshop plan: minutes of explanation and of lab work per lesson are planning estimates; the minutes spent
# running the notebook come from the measured run times (runtime_s) in build/results.
WORKSHOP_PLAN: dict[str, tuple[int, int]] = {
    "00_environment": (15, 15),
    "01_inference_modes": (25, 25),
    "02_graphs": (25, 25),
    "03_profiling_amp": (20, 25),
    "04_onnx_tensorrt": (25, 25),
    "05_triton_ensemble": (20, 20),
    "06_fused_softmax": (20, 25),
    "07_interview_prep": (10, 20),
}
_BREAKS = ((10 * 60 + 30, "coffee break", 15), (12 * 60 + 30, "lunch", 60), (15 * 60 + 15, "break", 15))


def lesson_title(stem: str) -> str:
    """The title of a lesson notebook (its first heading without the 'Lesson NN' prefix), or '' if there is none."""
    path = env.repo_root() / "notebooks" / f"{stem}.ipynb"
    try:
        cells = json.loads(path.read_text()).get("cells", [])
    except (OSError, json.JSONDecodeError):
        return ""
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            src = "".join(cell.get("source", []))
            for line in src.splitlines():
                if line.startswith("# "):
                    title = line[2:].strip()
                    for sep in (" — ", " - ", ": "):
                        if title.lower().startswith("lesson") and sep in title:
                            return title.split(sep, 1)[1].strip()
                    return title
    return ""


def _clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def agenda(results: dict[str, dict] | None = None, start: str = "09:00") -> str:
    """A one-day workshop agenda in Markdown, its run-time column taken from the measured runs (instructor guide).

    Each lesson's slot is explanation + running the notebook + lab. Explanation and lab minutes are the planning
    estimates in WORKSHOP_PLAN; the run minutes are the notebook's measured runtime_s (rounded up), with the mode it
    was measured in. A lesson without a measured run is marked and counted as 0 minutes of running.
    """
    results = load_all() if results is None else results
    try:
        hours, minutes = (int(x) for x in start.split(":"))
    except ValueError:
        raise ValueError(f"start must look like '09:00', got {start!r}") from None
    now = hours * 60 + minutes
    breaks = list(_BREAKS)
    lines = [
        "| time | session | explain (min, plan) | run the notebook (min, measured) | lab (min, plan) |",
        "|---|---|---|---|---|",
    ]
    unmeasured, modes = [], set()
    for stem, (talk, lab) in WORKSHOP_PLAN.items():
        data = results.get(stem, {})
        runtime = data.get("runtime_s")
        if isinstance(runtime, int | float):
            run_min = max(1, math.ceil(runtime / 60))
            modes.add(data.get("mode", "?"))
            run_txt = f"{run_min} ({data.get('mode', '?')} run, {runtime:.0f} s)"
        else:
            run_min = 0
            unmeasured.append(stem)
            run_txt = "not measured yet"
        # take a break before this lesson when more than half of it would run past the break's time
        while breaks and now + (talk + run_min + lab) / 2 >= breaks[0][0]:
            _, name, length = breaks.pop(0)
            lines.append(f"| {_clock(now)} | *{name}* | | | |")
            now += length
        title = lesson_title(stem)
        lines.append(f"| {_clock(now)} | {stem}{': ' + title if title else ''} | {talk} | {run_txt} | {lab} |")
        now += talk + run_min + lab
    lines.append(f"| {_clock(now)} | *end* | | | |")
    notes = []
    if unmeasured:
        notes.append(f"Not measured yet: {', '.join(unmeasured)} (run `make course`, then `make agenda`).")
    if "smoke" in modes:
        notes.append("Some run times come from smoke runs (small sizes); a full run takes longer.")
    if now > 17 * 60 + 30:
        notes.append(f"The day ends at {_clock(now)}: run the slowest lessons in smoke mode in class "
                     "(`WORKBOOK_SMOKE=1`) or pre-run them with `make course` and walk through the executed copies.")
    return "\n".join(lines + ([""] + notes if notes else []))


def update_agenda(path: Path, results: dict[str, dict] | None = None) -> bool:
    """Rewrite the block between '<!-- agenda:start -->' and '<!-- agenda:end -->' in `path`; True if it changed."""
    text = Path(path).read_text()
    begin, end = "<!-- agenda:start -->", "<!-- agenda:end -->"
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no '{begin}' ... '{end}' block to update")
    inv = env.inventory()
    stamp = f"Generated by `make agenda` on {_dt.date.today().isoformat()} from build/results ({inv['cpu']}, {inv['cpu_count']} cores)."
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{stamp}\n\n{agenda(results)}\n{end}{tail}"
    if new != text:
        Path(path).write_text(new)
        return True
    return False


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
        lines += ["", "| metric | value | unit | published anchor | note |", "|---|---|---|---|---|"]
        for name, value in metrics.items():
            lines.append(
                f"| `{name}` | {_fmt(value)} | {data.get('units', {}).get(name, '')} | "
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


def render(directory: Path | None = None, out: Path | None = None) -> Path:
    """Write build/report.md from the results files. Returns its path."""
    results = load_all(directory)
    out = out or env.build_dir() / "report.md"
    inv = env.inventory()
    lines = ["# ML Framework Internals Workbook: course report", ""]
    lines.append(f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} from {len(results)} notebook(s) on "
                 f"{inv['cpu']} ({inv['cpu_count']} cores, GPU: {inv.get('gpu') or 'none'}).")
    lines += ["", _HOW_TO_READ, ""]
    lines += ["## Claims checked on this machine", "", claims.markdown(results), ""]
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
        lines += ["", "A one-day workshop agenda built from these run times: `make agenda` (docs/INSTRUCTOR.md).", ""]
        for stem, data in results.items():
            title = lesson_title(stem)
            lines += [f"## {stem}" + (f": {title}" if title else ""), "", lesson_markdown(data, results)]
            for fig in data.get("figures", []):
                lines += ["", f"![{Path(fig).stem}]({fig})"]
            lines.append("")
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


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
line-height:1.45;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.92em}th,td{border:1px solid #ccc;padding:.3em .6em;
vertical-align:top;text-align:left}th{background:#f3f3f3}code{background:#f6f6f6;padding:0 .2em}
img{max-width:100%;border:1px solid #eee}.v-holds{color:#1a7f37}.v-beyond{color:#1f6feb}.v-fails{color:#c62828}
.v-na,.v-notrun{color:#777}nav a{margin-right:1em}
"""

_VERDICT_CLASS = {
    "holds": "v-holds", "holds (beyond the claimed range)": "v-beyond", "does not hold": "v-fails",
    "not measurable here": "v-na", "not run": "v-notrun",
}


def markdown_to_html(text: str, base: Path, title: str, nav: str = "") -> str:
    """A self-contained HTML page from the report's Markdown: local images embedded, no external resources."""
    import base64
    import html as _html
    import re

    import mistune

    body = mistune.create_markdown(plugins=["table"], escape=True)(text)
    for verdict, css in _VERDICT_CLASS.items():
        body = body.replace(f"<strong>{verdict}</strong>", f'<strong class="{css}">{verdict}</strong>')

    def embed(match):
        src = match.group(2)
        path = (base / src).resolve()
        if src.startswith(("data:", "http:", "https:")) or not path.is_file():
            return match.group(0)
        mime = "image/png" if path.suffix.lower() == ".png" else "image/svg+xml" if path.suffix == ".svg" else "image/jpeg"
        data = base64.b64encode(path.read_bytes()).decode()
        return f'{match.group(1)}data:{mime};base64,{data}{match.group(3)}'

    body = re.sub(r'(<img src=")([^"]+)(")', embed, body)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>{nav}{body}</body></html>\n")


def render_html(md_path: Path | None = None, out: Path | None = None) -> Path:
    """Write build/report.html from build/report.md (rendered first if missing): tables, verdicts, plots embedded."""
    md_path = Path(md_path) if md_path is not None else env.build_dir() / "report.md"
    if not md_path.is_file():
        md_path = render(out=md_path)
    out = Path(out) if out is not None else md_path.with_suffix(".html")
    out.write_text(markdown_to_html(md_path.read_text(), md_path.parent, "Course report"))
    return out


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.report", description="Render the course report.")
    sub = parser.add_subparsers(dest="cmd")
    ag = sub.add_parser("agenda", help="print the workshop agenda from the measured run times")
    ag.add_argument("--update", type=Path, default=None, help="rewrite the agenda block of this file (docs/INSTRUCTOR.md)")
    ag.add_argument("--start", default="09:00")
    args = parser.parse_args(argv)
    if args.cmd == "agenda":
        if args.update:
            changed = update_agenda(args.update)
            print(f"{args.update}: agenda {'updated' if changed else 'unchanged'}")
        text = agenda(start=args.start)
        print(text)
        (env.build_dir() / "agenda.md").write_text("# Workshop agenda (from measured run times)\n\n" + text + "\n")
        return 0
    path = render()
    print(f"wrote {path}")
    print(f"wrote {render_html(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
