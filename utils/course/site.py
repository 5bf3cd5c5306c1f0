"""The executed course as a static book, readable offline without running anything (course report, lesson 08).

    python -m utils.course.site [--executed build/executed] [--out build/site]     (make site; make course does it too)

The site is a Sphinx book (myst-nb + sphinx-book-theme, the stack Jupyter Book 1 is built on): a sidebar with one
section per lesson listing its parts (notebooks/NN_*.ipynb share the lesson number NN), the course report
(build/report.md) and the labs (labs/*.ipynb, unexecuted), and a search box backed by Sphinx's own search index
(searchindex.js: it works from file:// as well as from a local server). Nothing is executed: myst-nb renders the
runner's executed copies from build/executed/ (nb_execution_mode "off"); a lesson that has not been run yet is rendered
from its source with a note saying so, so the book always lists every lesson.

Everything Sphinx reads (conf.py, the index with one toctree per lesson, copies of the notebooks and the report) is
generated into a staging folder next to the output (build/site-src/, rewritten on every build; its warnings.log keeps
Sphinx's warnings); no Sphinx source is committed. Nothing is fetched at build or view time: the theme's assets are
local, widget and JavaScript outputs fall back to their HTML or text versions, math is shown as its TeX source (the
course has no formulas; MathJax would come from a CDN), and the build fails if a page or stylesheet would load anything
from the network. Output: build/site/index.html (lessons as build/site/<stem>.html, labs under labs/, report.html).

Needs sphinx, myst-nb and sphinx-book-theme (in requirements.txt). Where they are missing, as in your own (lean)
environment, `make site` says so in one line and the runner skips the site.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from utils.core import env

__all__ = ["Page", "SiteUnavailable", "lesson_pages", "lab_pages", "missing", "build", "external_references", "main"]

_NEEDS = ("sphinx", "myst_nb", "sphinx_book_theme")
INSTALL_HINT = "pip install sphinx myst-nb sphinx-book-theme"


class SiteUnavailable(RuntimeError):
    """The site cannot be built here (Sphinx, myst-nb or sphinx-book-theme missing); the message is one line."""


def missing() -> str | None:
    """Why the site cannot be built in this environment (one line), or None when it can."""
    import importlib.util

    absent = [name for name in _NEEDS if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    where = ("your own environment (WORKBOOK_OWN_ENV=1) does not have" if os.environ.get("WORKBOOK_OWN_ENV") == "1"
             else "this environment lacks")
    return (f"the static site needs Sphinx, myst-nb and sphinx-book-theme and {where} {', '.join(absent)}: "
            f"{INSTALL_HINT} (the course environment has them: make env)")


@dataclass(frozen=True)
class Page:
    """One page of the book: its stem, title, the notebook to render, and whether an executed copy was used."""

    stem: str
    title: str
    notebook: Path
    executed: bool
    mode: str = ""
    runtime_s: float | None = None

    @property
    def filename(self) -> str:
        return f"{self.stem}.html"

    @property
    def lesson(self) -> str:
        """The lesson number: the file name's two-digit prefix (the parts of a lesson share it)."""
        return self.stem[:2]

    @property
    def short_title(self) -> str:
        """The title without its 'Lesson NN' / 'Lab NN' prefix, as 'Part k: ...' for a lesson in parts."""
        found = re.match(r"(?:Lesson|Lab)\s+\d+\s*(?:,\s*part\s+(\d+)(?:\s+of\s+\d+)?)?\s*[—–:-]\s*(.+)$", self.title)
        if not found:
            return self.title
        part, rest = found.groups()
        return f"Part {part}: {rest}" if part else rest


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


def lab_pages(labs_dir: Path | None = None) -> list[Page]:
    """The generated labs (labs/NN_*_lab.ipynb), rendered as they are: unexecuted, TODO cells included."""
    labs_dir = Path(labs_dir) if labs_dir is not None else env.repo_root() / "labs"
    return [Page(p.stem, _title(p), p, False) for p in sorted(labs_dir.glob("[0-9][0-9]_*.ipynb"))]


_EXTERNAL = re.compile(r"""<(?:script|link|img|iframe|source|embed|object)\b[^>]*?\b(?:src|href|data)\s*=\s*["']"""
                       r"""((?:https?:)?//[^"']+)""", re.I)
_CSS_EXTERNAL = re.compile(r"""(?:@import\s+(?:url\()?|url\()\s*["']?((?:https?:)?//[^"')\s]+)""", re.I)


def external_references(page_html: str) -> list[str]:
    """URLs a page would fetch from the network (scripts, styles, images, frames); hyperlinks do not count."""
    return _EXTERNAL.findall(page_html)


def css_external_references(css: str) -> list[str]:
    """URLs a stylesheet would fetch (url(...) and @import of http(s) or protocol-relative addresses)."""
    return _CSS_EXTERNAL.findall(css)


def _offline_leaks(out_dir: Path) -> list[str]:
    leaks = []
    for path in sorted(out_dir.rglob("*")):
        if path.suffix == ".html":
            found = external_references(path.read_text(errors="replace"))
        elif path.suffix == ".css":
            found = css_external_references(path.read_text(errors="replace"))
        else:
            continue
        leaks += [f"{path.relative_to(out_dir)}: {url}" for url in found]
    return leaks


# conf.py of the generated book. Math: the html math renderer below writes the TeX source as text (MathJax would be
# loaded from a CDN, and the course has no formulas). Widget and JavaScript outputs are dropped from the HTML
# priority list so that their text/html or text/plain version shows (the widget manager also comes from a CDN).
_CONF = '''# Generated by utils/course/site.py on every build; edit that file, not this one.
project = "ML Framework Internals Workbook"
html_title = project
author = "ML Framework Internals Workbook"
extensions = ["myst_nb"]
exclude_patterns = ["_build", ".doctrees", "**.ipynb_checkpoints", "warnings.log"]
master_doc = root_doc = "index"
nb_execution_mode = "off"
nb_merge_streams = True
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [
    ("html", "application/vnd.jupyter.widget-view+json", None),
    ("html", "application/javascript", None),
]
myst_enable_extensions = []
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]
html_theme = "sphinx_book_theme"
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "show_toc_level": 1,
}
html_copy_source = False
html_show_sourcelink = False
html_show_sphinx = False
html_search_language = "en"
html_math_renderer = "workbook_plain"
html_last_updated_fmt = None


def _math_as_text(self, node):
    from docutils import nodes

    tag = "div" if isinstance(node, nodes.math_block) else "span"
    self.body.append(f'<{tag} class="math notranslate nohighlight">' + self.encode(node.astext()) + f"</{tag}>")
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("workbook_plain", (_math_as_text, None), (_math_as_text, None))
'''


_MD_IMAGE = re.compile(r"""!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+["'][^)]*["'])?\s*\)|<img\b[^>]*?\bsrc\s*=\s*["']([^"']+)["']""",
                       re.I)


def _copy_local_images(markdown: str, base: Path, dest: Path) -> None:
    """Copy the files a Markdown text shows as images (relative paths under base) to the same places under dest."""
    for found in _MD_IMAGE.finditer(markdown):
        ref = found.group(1) or found.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:|/|#", ref, re.I) or ".." in Path(ref).parts:
            continue
        src = base / ref
        if src.is_file():
            (dest / ref).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / ref)


_MD_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def _book_links(markdown: str, authored_in: str) -> str:
    """Links written relative to the repository folder a notebook lives in (notebooks/ or labs/), made relative to
    the book: a lesson or lab becomes a link to its page, any other repository file plain text naming it (the book
    has no page for it, and a link would be broken)."""
    def fix(found: re.Match) -> str:
        text, target, anchor = found.group(1), found.group(2), found.group(3) or ""
        repo_path = Path(authored_in, target).as_posix()
        parts = Path(repo_path.replace("notebooks/../", "").replace("labs/../", "")).parts
        book = {"notebooks": "", "labs": "labs/"}.get(parts[0]) if len(parts) == 2 else None
        if book is not None and parts[1].endswith(".ipynb"):
            here = "../" if authored_in == "labs" else ""
            return f"[{text}]({here}{book}{parts[1]}{anchor})"
        where = "/".join(parts)
        return text if where in text else f"{text} (`{where}` in the repository)"
    return _MD_LINK.sub(fix, markdown)


def _banner(page: Page) -> str:
    if not page.executed:
        return (":::{note}\nThis lesson has not been run on this machine yet, so the page shows its code without "
                "outputs. Run `make course` (or open the notebook with `make lab`) to see the measurements.\n:::")
    if page.mode:
        when = f", {page.runtime_s:.0f} s" if isinstance(page.runtime_s, int | float) else ""
        return f":::{{note}}\nExecuted in {page.mode} mode on this machine{when}.\n:::"
    return ""


def _stage_notebook(page: Page, dest: Path, banner: str = "") -> None:
    """A copy of the notebook for Sphinx: widget state dropped (it needs the CDN widget manager), banner after the title."""
    import nbformat

    nb = nbformat.read(str(page.notebook), as_version=4)
    nb.metadata.pop("widgets", None)
    authored_in = "labs" if dest.parent.name == "labs" else "notebooks"
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            _copy_local_images(cell.source, page.notebook.parent, dest.parent)
            cell.source = _book_links(cell.source, authored_in)
    if banner:
        first = next((i for i, c in enumerate(nb.cells)
                      if c.cell_type == "markdown" and re.search(r"^# ", c.source, re.M)), -1)
        nb.cells.insert(first + 1, nbformat.v4.new_markdown_cell(banner))
    for cell in nb.cells:  # new cells get random ids; keep them stable so that rebuilds of one run are identical
        cell.pop("id", None)
    nb.nbformat_minor = min(nb.nbformat_minor, 4)
    nbformat.write(nb, str(dest))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _index_md(pages: list[Page], labs: list[Page], has_report: bool) -> str:
    lines = ["# ML Framework Internals Workbook", "",
             "The course as run on this machine: each lesson page shows the notebook with its outputs, so it can be "
             "read without running anything. The sidebar lists every lesson by its parts; the search box searches "
             "every page, offline.", ""]
    lines += (["The [course report](report.md) lists every measured number, checks the common claims against them and "
               "describes the machine.", ""] if has_report else
              ["No course report yet: `make course` writes it.", ""])
    lines += ["| lesson | part | state |", "|---|---|---|"]
    for p in pages:
        state = (f"executed ({p.mode or '?'} mode"
                 + (f", {p.runtime_s:.0f} s" if isinstance(p.runtime_s, int | float) else "") + ")"
                 if p.executed else "not run yet: code only")
        lines.append(f"| {p.lesson} | [{_cell(p.title)}]({p.stem}.ipynb) | {state} |")
    lines.append("")
    if labs:
        lines += ["The labs (from `labs/` of the repository, unexecuted: open them with `make lab` to solve them):", ""]
        lines += [f"- [{_cell(lab.title)}](labs/{lab.stem}.ipynb)" for lab in labs]
        lines.append("")
    by_lesson: dict[str, list[Page]] = {}
    for p in pages:
        by_lesson.setdefault(p.lesson, []).append(p)
    for lesson, parts in by_lesson.items():
        lines += ["```{toctree}", ":hidden:", f":caption: Lesson {lesson}", ""]
        lines += [f"{_toc_title(p.short_title)} <{p.stem}>" for p in parts]
        lines += ["```", ""]
    if has_report:
        lines += ["```{toctree}", ":hidden:", ":caption: Results", "", "Course report <report>", "```", ""]
    if labs:
        lines += ["```{toctree}", ":hidden:", ":caption: Labs", ""]
        lines += [f"{_toc_title(lab.title)} <labs/{lab.stem}>" for lab in labs]
        lines += ["```", ""]
    return "\n".join(lines)


def _toc_title(title: str) -> str:
    return title.replace("<", "&lt;").replace(">", "&gt;").replace("`", "")


def _stage(pages: list[Page], labs: list[Page], report_md: Path, src: Path) -> bool:
    if src.exists():
        shutil.rmtree(src)
    (src / "labs").mkdir(parents=True)
    (src / "conf.py").write_text(_CONF)
    for page in pages:
        _stage_notebook(page, src / f"{page.stem}.ipynb", _banner(page))
    for lab in labs:
        _stage_notebook(lab, src / "labs" / f"{lab.stem}.ipynb")
    has_report = report_md.is_file()
    if has_report:
        text = report_md.read_text()
        (src / "report.md").write_text(text)
        _copy_local_images(text, report_md.parent, src)
    (src / "index.md").write_text(_index_md(pages, labs, has_report))
    return has_report


def _clear_output(out_dir: Path) -> None:
    """Remove the previous site (only a folder that holds one, or an empty one: never an arbitrary --out folder)."""
    if not out_dir.exists():
        return
    if any(out_dir.iterdir()) and not (out_dir / "index.html").is_file():
        raise SiteUnavailable(f"{out_dir} is not empty and holds no site (no index.html): choose another --out")
    shutil.rmtree(out_dir)


def build(executed_dir: Path | None = None, out_dir: Path | None = None, report_md: Path | None = None,
          notebooks_dir: Path | None = None, labs_dir: Path | None = None, quiet: bool = True) -> Path:
    """Build the book; returns build/site/index.html. Raises SiteUnavailable (one line) where Sphinx is missing."""
    reason = missing()
    if reason:
        raise SiteUnavailable(reason)
    from sphinx.cmd.build import build_main

    out_dir = Path(out_dir) if out_dir is not None else env.build_dir() / "site"
    src = out_dir.with_name(out_dir.name + "-src")
    pages = lesson_pages(executed_dir, notebooks_dir)
    labs = lab_pages(labs_dir)
    report_md = Path(report_md) if report_md is not None else env.build_dir() / "report.md"
    _stage(pages, labs, report_md, src)
    _clear_output(out_dir)
    log = src / "warnings.log"
    args = ["-b", "html", "-d", str(src / ".doctrees"), "-w", str(log), *(["-q"] if quiet else []),
            str(src), str(out_dir)]
    with warnings.catch_warnings():  # myst-parser's use of APIs Sphinx 11 removes: not the learner's business
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        code = build_main(args)
    if code != 0 or not (out_dir / "index.html").is_file():
        raise RuntimeError(f"Sphinx failed (exit {code}) building {out_dir}; its messages are in {log}")
    leaks = _offline_leaks(out_dir)
    if leaks:
        raise RuntimeError(f"the site would load {leaks[:3]} from the network; it must work offline "
                           "(check the generated conf.py in utils/course/site.py)")
    return out_dir / "index.html"


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.course.site", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executed", type=Path, default=None, help="executed notebooks (default build/executed)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default build/site)")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        index = build(args.executed, args.out, quiet=not args.verbose)
    except SiteUnavailable as exc:
        own = os.environ.get("WORKBOOK_OWN_ENV") == "1"
        print(f"site: {'skipped' if own else 'error'}: {exc}", file=sys.stderr)
        return 0 if own else 2
    log = index.parent.with_name(index.parent.name + "-src") / "warnings.log"
    warnings = sum(1 for line in log.read_text().splitlines() if "WARNING" in line) if log.is_file() else 0
    note = f"; {warnings} Sphinx warning(s) in {log}" if warnings else ""
    print(f"site: {index} in {time.perf_counter() - start:.0f} s (open it in a browser; works offline{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
