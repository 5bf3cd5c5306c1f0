"""utils.course.site: the executed course as an offline Sphinx book, opened in a headless browser.

The book is built from a temporary build folder with three lesson notebooks (lesson 00 and both parts of lesson 01,
so a lesson with parts is in the sidebar) and one lab: the first lesson gets an "executed" copy with a plot output, a
Markdown image and a widget, the others are rendered from their sources (the "not run yet" path). Checked: a page per
notebook, the sidebar by lesson and part on every page, the search index, no external references (HTML and CSS), and,
in Chromium (Debian package `chromium`) with the network off, pages that render without broken images, fetch nothing
from the network, and a search that finds a lesson. Without Sphinx (your own, lean environment) the build tests skip
and the one-line reason is checked; without Chromium the browser test is skipped with the reason.
"""

import base64
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from tests.server.browser import CHROMIUM, CHROMIUM_FLAGS
from utils.core import env
from utils.course import render, site
from utils.course.run import lesson_notebooks

# injected into a copy of each page: after load (and once a search has shown results, or 3 s), report images that did
# not decode, what the page fetched from outside file://, the sidebar's sections and links, the cells and the results
PROBE = """<script>
window.addEventListener('load', function () {
  var waited = 0;
  function report() {
    var results = document.querySelectorAll('#search-results li').length;
    if (document.getElementById('search-results') && results === 0 && waited < 3000) { waited += 100; setTimeout(report, 100); return; }
    var imgs = Array.prototype.slice.call(document.images);
    var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                     .map(function (i) { return (i.currentSrc || i.src).slice(0, 60); });
    var fetched = performance.getEntriesByType('resource').map(function (e) { return e.name; })
                             .filter(function (n) { return !/^(file|data|blob):/.test(n); });
    var sidebar = document.querySelector('nav.bd-docs-nav');
    var nav = sidebar ? Array.prototype.slice.call(sidebar.querySelectorAll('a')).map(function (a) { return a.getAttribute('href'); }) : [];
    var captions = sidebar ? Array.prototype.slice.call(sidebar.querySelectorAll('.caption-text')).map(function (c) { return c.textContent; }) : [];
    var out = document.createElement('pre'); out.id = 'render-check';
    out.textContent = JSON.stringify({images: imgs.length, broken: broken, fetched: fetched, nav: nav, captions: captions,
                                      title: document.title, cells: document.querySelectorAll('.cell').length,
                                      results: results, text: document.body.innerText.length});
    document.body.appendChild(out);
  }
  report();
});
</script>"""


def _png() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1, 2], [1, 3, 2])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _subset(lessons: list[Path]) -> list[Path]:
    """Lesson 00 and every part of the first lesson in parts: enough for the sidebar by lesson and part, and quick."""
    by_lesson: dict[str, list[Path]] = {}
    for nb in lessons:
        by_lesson.setdefault(nb.name[:2], []).append(nb)
    parts = next((nbs for nbs in by_lesson.values() if len(nbs) > 1), [])
    return [lessons[0], *(nb for nb in parts if nb != lessons[0])]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if site.missing():
        pytest.skip(site.missing())
    build = tmp_path_factory.mktemp("build")
    old = os.environ.get("WORKBOOK_BUILD_DIR")
    os.environ["WORKBOOK_BUILD_DIR"] = str(build)
    try:
        lessons = _subset(lesson_notebooks())
        sources, labs = build / "notebooks", build / "labs"
        sources.mkdir()
        labs.mkdir()
        for nb in lessons:
            shutil.copy(nb, sources / nb.name)
        lab = sorted(env.repo_root().joinpath("labs").glob("[0-9][0-9]_*.ipynb"))[0]
        shutil.copy(lab, labs / lab.name)
        executed = build / "executed"
        executed.mkdir()
        first = nbformat.read(str(lessons[0]), as_version=4)
        png = _png()
        (executed / "diagram.png").write_bytes(base64.b64decode(png))
        first.cells.insert(1, nbformat.v4.new_markdown_cell("A diagram from a file: ![diagram](diagram.png)"))
        code = next(c for c in first.cells if c.cell_type == "code")
        widget = {"model_id": "0123abcd", "version_major": 2, "version_minor": 0}
        code.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text="measured 1.23 GB/s by quokkameter\n"),
            nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}),
            nbformat.v4.new_output("display_data", data={
                "application/vnd.jupyter.widget-view+json": widget, "text/plain": "Quiz",
                "text/html": "<details><summary>Show the answer</summary><p>hidden answer</p></details>"}),
        ]
        first.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
            "state": {"0123abcd": {"model_name": "VBoxModel", "state": {}}}, "version_major": 2, "version_minor": 0}}
        nbformat.write(first, str(executed / lessons[0].name))
        (build / "results").mkdir()
        (build / "results" / f"{lessons[0].stem}.json").write_text(json.dumps(
            {"notebook": lessons[0].stem, "mode": "smoke", "runtime_s": 12.5, "metrics": {"x": 1.0}}))
        (build / "figures").mkdir()
        (build / "figures" / "plot.png").write_bytes(base64.b64decode(png))
        (build / "report.md").write_text("# Course report\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![plot](figures/plot.png)\n")
        index = site.build(executed, build / "site", notebooks_dir=sources, labs_dir=labs)
        yield index.parent, lessons, lab
    finally:
        if old is None:
            os.environ.pop("WORKBOOK_BUILD_DIR", None)
        else:
            os.environ["WORKBOOK_BUILD_DIR"] = old


def test_every_lesson_and_lab_has_a_page_and_the_index_links_them(built):
    out, lessons, lab = built
    index = (out / "index.html").read_text()
    for nb in lessons:
        assert (out / f"{nb.stem}.html").is_file(), nb.stem
        assert f'href="{nb.stem}.html"' in index
    assert (out / "labs" / f"{lab.stem}.html").is_file() and f'href="labs/{lab.stem}.html"' in index
    assert 'href="report.html"' in index and (out / "report.html").is_file()
    assert "executed (smoke mode, 12 s)" in index and "not run yet" in index
    # the generated Sphinx sources live in the staging folder next to the output, not in the repository
    assert (out.with_name("site-src") / "conf.py").is_file() and not (env.repo_root() / "conf.py").exists()


def _sidebar(page: str, name: str) -> list[tuple[str, list[str]]]:
    """The sidebar's sections: (caption, [link, ...]) in order; the page's own entry (href "#") is its name."""
    nav = re.search(r'<nav class="[^"]*\bbd-docs-nav\b[^"]*"[^>]*>(.*?)</nav>', page, re.S)
    assert nav, "no sidebar navigation"
    sections = []
    for chunk in re.split(r'<p aria-level="2" class="caption"[^>]*>', nav.group(1))[1:]:
        caption = re.search(r'<span class="caption-text">([^<]*)</span>', chunk).group(1)
        links = re.findall(r'<a class="[^"]*\breference internal\b[^"]*" href="([^"]*)"', chunk)
        sections.append((caption, [name if link == "#" else link for link in links if not link.startswith("#") or link == "#"]))
    return sections


def test_every_page_has_the_sidebar_by_lesson_and_part(built):
    out, lessons, lab = built
    expected = {}
    for nb in lessons:
        expected.setdefault(f"Lesson {nb.name[:2]}", []).append(f"{nb.stem}.html")
    assert any(len(parts) > 1 for parts in expected.values()), "the subset must hold a lesson in parts"
    for page in [*sorted(out.glob("*.html")), out / "labs" / f"{lab.stem}.html"]:
        if page.name in ("genindex.html", "search.html"):
            continue
        prefix = "../" if page.parent.name == "labs" else ""
        sections = dict(_sidebar(page.read_text(), prefix + str(page.relative_to(out))))
        for caption, parts in expected.items():
            links = [link.removeprefix(prefix) for link in sections.get(caption, [])]
            assert links == parts, f"{page.name}: sidebar section {caption} is {links}, expected {parts}"
        assert [link.removeprefix(prefix) for link in sections["Labs"]] == [f"labs/{lab.stem}.html"], page.name
        assert [link.removeprefix(prefix) for link in sections["Results"]] == ["report.html"], page.name


def test_search_index_covers_every_page(built):
    out, lessons, lab = built
    index = (out / "searchindex.js").read_text()
    assert index.startswith("Search.setIndex(")
    data = json.loads(index[len("Search.setIndex("):].rstrip().rstrip(";").rstrip(")"))
    assert {nb.stem for nb in lessons} | {f"labs/{lab.stem}", "report", "index"} <= set(data["docnames"])
    assert "quokkamet" in data["terms"] or "quokkameter" in data["terms"]  # text from an executed output is searchable
    assert 'src="searchindex.js' in (out / "search.html").read_text()


def test_pages_are_offline_and_show_the_outputs(built):
    out, lessons, lab = built
    assert site._offline_leaks(out) == []
    pages = [*out.glob("*.html"), *out.glob("labs/*.html")]
    assert len(pages) >= len(lessons) + 3
    for page in pages:
        text = page.read_text()
        assert not site.external_references(text), f"{page.name} loads {site.external_references(text)[:3]}"
        assert "mathjax" not in text.lower() and "fonts.googleapis" not in text, page.name
    first = (out / f"{lessons[0].stem}.html").read_text()
    assert "measured 1.23 GB/s" in first and "Executed in smoke mode on this machine, 12 s" in first
    images = re.findall(r'<img[^>]*src="([^"]+)"', first)
    assert len(images) >= 2 and all((out / src).is_file() for src in images), images  # the plot and the diagram
    assert "<summary>Show the answer</summary>" in first and "widget-view+json" not in first  # widgets fall back
    assert "widget-state+json" not in first
    assert "has not been run on this machine yet" in (out / f"{lessons[1].stem}.html").read_text()
    report = (out / "report.html").read_text()
    assert "<table" in report and all((out / src).is_file() for src in re.findall(r'<img[^>]*src="([^"]+)"', report))


def test_external_reference_detector():
    assert site.external_references('<script src="https://cdn.example/x.js"></script>') == ["https://cdn.example/x.js"]
    assert site.external_references('<link rel="stylesheet" href="//cdn.example/x.css">') == ["//cdn.example/x.css"]
    assert site.external_references('<a href="https://pytorch.org">docs</a><img src="data:image/png;base64,AA">') == []
    assert site.css_external_references("@import url('https://fonts.googleapis.com/css?family=X');") == [
        "https://fonts.googleapis.com/css?family=X"]
    assert site.css_external_references("a{background:url(//cdn.example/i.png)} b{src:url(../fonts/x.woff2)}") == [
        "//cdn.example/i.png"]


def test_without_sphinx_the_site_says_what_to_install_in_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(site, "_NEEDS", ("sphinx", "no_such_module_for_the_site"))
    reason = site.missing()
    assert reason and "\n" not in reason and site.INSTALL_HINT in reason
    with pytest.raises(site.SiteUnavailable):
        site.build(out_dir=tmp_path / "site")
    monkeypatch.delenv("WORKBOOK_OWN_ENV", raising=False)
    assert site.main(["--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err and site.INSTALL_HINT in err and "Traceback" not in err
    monkeypatch.setenv("WORKBOOK_OWN_ENV", "1")  # the lean environment: skipped, not failed
    assert site.main(["--out", str(tmp_path / "site")]) == 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "skipped" in err and "your own environment" in err
    assert not (tmp_path / "site").exists()


def _render_in_chromium(page: Path, profile: Path, query: str = "") -> dict:
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
                               probe.as_uri() + query], capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    found = re.search(r'<pre id="render-check"[^>]*>(.*?)</pre>', proc.stdout, re.S)  # the theme adds tabindex to <pre>
    assert found, f"{page.name}: chromium rendered nothing (exit {proc.returncode}): {proc.stderr[-500:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed: apt-get install -y --no-install-recommends chromium")
def test_pages_render_in_a_headless_browser_offline_with_sidebar_and_search(built, tmp_path):
    out, lessons, lab = built
    profile = tmp_path / "chromium-profile"
    files = [out / "index.html", out / "report.html", *(out / f"{nb.stem}.html" for nb in lessons),
             out / "labs" / f"{lab.stem}.html"]
    pages = {str(p.relative_to(out)): _render_in_chromium(p, profile) for p in files}
    for name, seen in pages.items():
        assert seen["broken"] == [], f"{name}: broken images {seen['broken']}"
        assert seen["fetched"] == [], f"{name}: fetched from the network {seen['fetched']}"
        assert seen["title"], f"{name}: no title"
        prefix = "../" if name.startswith("labs/") else ""
        nav = {name if link == "#" else link.removeprefix(prefix) for link in seen["nav"]}  # "#": the page itself
        assert {f"{nb.stem}.html" for nb in lessons} <= nav, f"{name}: sidebar incomplete {seen['nav']}"
        assert {f"Lesson {nb.name[:2]}" for nb in lessons} <= set(seen["captions"]), f"{name}: {seen['captions']}"
    for nb in lessons:
        assert pages[f"{nb.stem}.html"]["cells"] > 3, f"{nb.stem}: the notebook cells did not render"
    assert pages[f"labs/{lab.stem}.html"]["cells"] > 3
    assert pages[f"{lessons[0].stem}.html"]["images"] >= 2  # the plot output and the Markdown image
    assert pages["report.html"]["images"] >= 1
    # Sphinx's search from file://: the index is a script, so a query finds the executed output's word offline
    searched = _render_in_chromium(out / "search.html", profile, "?q=quokkameter")
    assert searched["results"] >= 1, f"the search found nothing: {searched}"
    assert searched["fetched"] == []


@pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed: apt-get install -y --no-install-recommends chromium")
def test_the_browser_check_does_catch_a_broken_image(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(render.markdown_to_html("![missing](nowhere.png)", tmp_path, "bad"))
    seen = _render_in_chromium(page, tmp_path / "profile")
    assert seen["images"] == 1 and len(seen["broken"]) == 1


def test_site_build_needs_lesson_notebooks(tmp_path):
    with pytest.raises(FileNotFoundError, match="no lesson notebooks"):
        site.lesson_pages(tmp_path, tmp_path)
    assert env.repo_root().joinpath("notebooks").is_dir()


def test_repository_links_become_book_links_or_plain_text():
    fixed = site._book_links("[a](../docs/source-coverage.md), [b](../labs/02_graphs_lab.ipynb#x), "
                             "[c](02_graphs.ipynb) ![d](../x.png)", "notebooks")
    assert fixed == ("a (`docs/source-coverage.md` in the repository), [b](labs/02_graphs_lab.ipynb#x), "
                     "[c](02_graphs.ipynb) ![d](../x.png)")
    assert site._book_links("[lesson](../notebooks/02_graphs.ipynb)", "labs") == "[lesson](../02_graphs.ipynb)"
