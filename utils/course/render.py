"""The course report: build/report.md and build/report.html from every lesson's results (``make report``; the runner
writes them after ``make course``).

The claims table (utils.core.claims), each notebook's run time, one section per lesson rendered by
utils.core.report.lesson_markdown (the same view report.show() gives inside the lesson) with its plots, and the
machine inventory. ``python -m utils.course.render`` renders both files.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

from utils.core import claims, env
from utils.core.report import lesson_markdown, load_all

__all__ = ["render", "render_html", "markdown_to_html", "lesson_title"]

_HOW_TO_READ = (
    "Every number below was measured on the machine described at the end, by the lesson notebooks, side by side in "
    "one run. **Claims checked** compares the figures people repeat with what this machine measured: *holds* means "
    "the measurement falls inside the claimed range, *beyond the claimed range* means better than claimed, *does not "
    "hold* means below it, *not measurable here* names the missing hardware, and *not run* means the lesson has no "
    "results yet. Each lesson's table then lists everything it recorded, with the published figure it compares to "
    "(*published anchor*) where there is one. Numbers from a *smoke* run use shrunken sizes: run `make course` for "
    "real ones."
)


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
        lines += ["", "A two-day workshop agenda built from these run times: `make agenda` (docs/INSTRUCTOR.md).", ""]
        for stem, data in results.items():
            title = lesson_title(stem)
            lines += [f"## {stem}" + (f": {title}" if title else ""), "", lesson_markdown(data, results)]
            for fig in data.get("figures", []):
                lines += ["", f"![{Path(fig).stem}]({fig})"]
            lines.append("")
    lines += ["## Machine", "", "| item | value |", "|---|---|"]
    for key in ("cpu", "cpu_count", "memory_gib", "torch_threads", "gpu", "python", "platform"):
        lines.append(f"| {key} | {claims.cell(claims.format_value(inv.get(key)))} |")
    feats = ", ".join(k for k, v in inv["cpu_features"].items() if v) or "none"
    lines.append(f"| cpu features | {feats} |")
    for name, version in inv["packages"].items():
        lines.append(f"| {name} | {version or 'not installed'} |")
    for name, cap in inv["capabilities"].items():
        lines.append(f"| capability: {name} | {'yes' if cap['available'] else 'no'}: {claims.cell(cap['reason'])} |")
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
    path = render()
    print(f"wrote {path}")
    print(f"wrote {render_html(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
