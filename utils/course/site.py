"""The executed course as a static website, readable offline without running anything (course report, lesson 08).

    python -m utils.course.site [--executed build/executed] [--out build/site]     (make site; make course does it too)

Every lesson notebook (notebooks/NN_*.ipynb) becomes build/site/<stem>.html through nbconvert's HTML exporter with
the JupyterLab look. The executed copy from build/executed/ is used where it exists; a lesson that has not been run
yet is rendered from its source with a banner saying so, so the site always lists every lesson. Each page carries
the same navigation (index, previous, next, every lesson, the report). Pages are self-contained: images are embedded,
and the scripts the stock template loads from CDNs (require.js, MathJax, mermaid, the widget manager) are left out,
so nothing is fetched from the network (TeX in Markdown shows as source; a widget shows its HTML fallback). build/site/index.html lists the lessons
with their run mode and time; build/site/report.html is the course report with the same navigation.
"""

from __future__ import annotations

import html
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from utils.core import env
from utils.course import render

__all__ = ["Page", "lesson_pages", "build", "external_references", "main"]

_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block extra_css -%}<style>{{ resources.site_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}
{{ super() }}
{{ resources.site_nav }}
{{ resources.site_banner }}
{%- endblock body_header -%}
{%- block body_footer -%}
{{ resources.site_nav }}
{{ super() }}
{%- endblock body_footer -%}
"""

_CSS = """
nav.site{font-family:system-ui,sans-serif;background:#f5f7fa;border:1px solid #dde;padding:.5em .8em;margin:.5em 0 1em;
font-size:.9em;line-height:1.8}nav.site a{margin-right:.9em;text-decoration:none}nav.site a.current{font-weight:bold;
text-decoration:underline}nav.site .step{float:right}.site-banner{background:#fff4e5;border:1px solid #f0c36d;
padding:.6em .9em;margin:0 0 1em;font-family:system-ui,sans-serif}
"""


@dataclass(frozen=True)
class Page:
    """One lesson page of the site: its stem, title, source notebook, and whether an executed copy was used."""

    stem: str
    title: str
    notebook: Path
    executed: bool
    mode: str = ""
    runtime_s: float | None = None

    @property
    def filename(self) -> str:
        return f"{self.stem}.html"


def _title(nb_path: Path) -> str:
    try:
        cells = json.loads(nb_path.read_text()).get("cells", [])
    except (OSError, json.JSONDecodeError):
        return nb_path.stem
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            for line in "".join(cell.get("source", [])).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return nb_path.stem


def lesson_pages(executed_dir: Path | None = None, notebooks_dir: Path | None = None) -> list[Page]:
    """The lessons in order, each with the notebook to render (executed copy where there is one)."""
    executed_dir = Path(executed_dir) if executed_dir is not None else env.build_dir() / "executed"
    notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else env.repo_root() / "notebooks"
    sources = sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        raise FileNotFoundError(f"no lesson notebooks (NN_*.ipynb) in {notebooks_dir}")
    results = env.build_dir() / "results"
    pages = []
    for src in sources:
        done = executed_dir / src.name
        data = {}
        if (results / f"{src.stem}.json").is_file():
            try:
                data = json.loads((results / f"{src.stem}.json").read_text())
            except json.JSONDecodeError:
                data = {}
        pages.append(Page(src.stem, _title(src), done if done.is_file() else src, done.is_file(),
                          data.get("mode", ""), data.get("runtime_s")))
    return pages


def _nav(pages: list[Page], current: str) -> str:
    links = ['<a href="index.html"' + (' class="current"' if current == "index" else "") + ">Course index</a>"]
    for p in pages:
        cls = ' class="current"' if p.stem == current else ""
        links.append(f'<a href="{p.filename}"{cls} title="{html.escape(p.title)}">{html.escape(p.stem[:2])}</a>')
    links.append('<a href="report.html"' + (' class="current"' if current == "report" else "") + ">Report</a>")
    stems = [p.stem for p in pages]
    step = ""
    if current in stems:
        i = stems.index(current)
        prev = f'<a href="{pages[i - 1].filename}">&larr; {html.escape(pages[i - 1].stem)}</a>' if i > 0 else ""
        nxt = f'<a href="{pages[i + 1].filename}">{html.escape(pages[i + 1].stem)} &rarr;</a>' if i + 1 < len(pages) else ""
        step = f'<span class="step">{prev}{nxt}</span>'
    return f'<nav class="site">{step}{"".join(links)}</nav>'


def _exporter():
    import jinja2
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[jinja2.DictLoader({"site.html.j2": _TEMPLATE})],
        template_file="site.html.j2",
    )
    exporter.embed_images = True  # Markdown images become data: URIs
    exporter.exclude_anchor_links = True
    return exporter


_EXTERNAL = re.compile(r"""<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)\s*=\s*["']((?:https?:)?//[^"']+)""", re.I)


def external_references(page_html: str) -> list[str]:
    """URLs a page would fetch from the network (scripts, styles, images, frames); hyperlinks do not count."""
    return _EXTERNAL.findall(page_html)


def _render_lesson(exporter, page: Page, pages: list[Page], out_dir: Path) -> Path:
    import nbformat

    nb = nbformat.read(str(page.notebook), as_version=4)
    # without the widget manager script (it comes from a CDN) widgets cannot render offline: dropping their saved
    # state makes nbconvert fall back to each output's HTML version (the quiz of lesson 08 carries one)
    nb.metadata.pop("widgets", None)
    banner = ""
    if not page.executed:
        banner = ('<div class="site-banner">This lesson has not been run on this machine yet, so the page shows its '
                  "code without outputs. Run <code>make course</code> (or open the notebook with <code>make lab</code>)"
                  " to see the measurements.</div>")
    elif page.mode:
        when = f", {page.runtime_s:.0f} s" if isinstance(page.runtime_s, int | float) else ""
        banner = f'<div class="site-banner">Executed in {html.escape(page.mode)} mode on this machine{when}.</div>'
    resources = {
        "metadata": {"name": page.title, "path": str(page.notebook.parent)},
        "site_nav": _nav(pages, page.stem),
        "site_banner": banner,
        "site_css": _CSS,
    }
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    leaks = external_references(body)
    if leaks:
        raise RuntimeError(f"{page.notebook.name}: the page would load {leaks[:3]} from the network; "
                           "the site must work offline (check the template blocks in utils/course/site.py)")
    out = out_dir / page.filename
    out.write_text(body)
    return out


def _index(pages: list[Page], has_report: bool) -> str:
    rows = []
    for p in pages:
        state = (f"executed ({html.escape(p.mode or '?')} mode"
                 + (f", {p.runtime_s:.0f} s" if isinstance(p.runtime_s, int | float) else "") + ")"
                 if p.executed else "not run yet: code only")
        rows.append(f'<tr><td>{html.escape(p.stem[:2])}</td><td><a href="{p.filename}">{html.escape(p.title)}</a>'
                    f"</td><td>{state}</td></tr>")
    report = ('<p>The <a href="report.html">course report</a> lists every measured number, checks the common claims '
              "against them and describes the machine.</p>" if has_report else
              "<p>No course report yet: <code>make course</code> writes it.</p>")
    body = (
        "<h1>ML Framework Internals Workbook</h1>"
        "<p>The course as run on this machine: each lesson page shows the notebook with its outputs, so it can be "
        "read without running anything. Labs are in <code>labs/</code> of the repository.</p>"
        f"{report}<table><thead><tr><th>#</th><th>lesson</th><th>state</th></tr></thead><tbody>{''.join(rows)}"
        "</tbody></table>"
    )
    return body


def build(executed_dir: Path | None = None, out_dir: Path | None = None, report_md: Path | None = None,
          notebooks_dir: Path | None = None) -> Path:
    """Render the site; returns build/site/index.html. The report page is made from build/report.md if it exists."""
    out_dir = Path(out_dir) if out_dir is not None else env.build_dir() / "site"
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = lesson_pages(executed_dir, notebooks_dir)
    exporter = _exporter()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is in the environment; a bare list keeps the module importable without it
        tqdm = lambda it, **_: it  # noqa: E731
    for page in tqdm(pages, desc="site", unit="page"):
        _render_lesson(exporter, page, pages, out_dir)
    report_md = Path(report_md) if report_md is not None else env.build_dir() / "report.md"
    has_report = report_md.is_file()
    if has_report:
        page = render.markdown_to_html(report_md.read_text(), report_md.parent, "Course report", _nav(pages, "report"))
        (out_dir / "report.html").write_text(page)
    else:
        (out_dir / "report.html").unlink(missing_ok=True)
    index = out_dir / "index.html"
    index.write_text(render.markdown_to_html("", out_dir, "ML Framework Internals Workbook", _nav(pages, "index"))
                     .replace("</body>", _index(pages, has_report) + "</body>"))
    return index


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.course.site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, default=None, help="executed notebooks (default build/executed)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default build/site)")
    args = parser.parse_args(argv)
    index = build(args.executed, args.out)
    print(f"site: {index} (open it in a browser; works offline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
