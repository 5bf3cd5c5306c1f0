"""utils.course.site: the executed course as static HTML, opened in a headless browser (no broken images, every lesson).

The site is built from a temporary build folder: the first lesson gets an "executed" copy with a plot output and a
Markdown image, the others are rendered from their sources (the "not run yet" path). Chromium (Debian package
`chromium`) loads every page with the network off; without it the browser test is skipped with the reason.
"""

import base64
import io
import json
import os
import re
import subprocess
from pathlib import Path

import nbformat
import pytest

from tests.server.browser import CHROMIUM, CHROMIUM_FLAGS
from utils.core import env
from utils.course import render, site
from utils.course.run import lesson_notebooks

# injected into a copy of each page: after load, report images that did not decode, the navigation and the cells
PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                   .map(function (i) { return (i.currentSrc || i.src).slice(0, 60); });
  var nav = Array.prototype.slice.call(document.querySelectorAll('nav.site a')).map(function (a) { return a.getAttribute('href'); });
  var links = Array.prototype.slice.call(document.querySelectorAll('a')).map(function (a) { return a.getAttribute('href'); });
  var out = document.createElement('pre'); out.id = 'render-check';
  out.textContent = JSON.stringify({images: imgs.length, broken: broken, nav: nav, links: links, title: document.title,
                                    cells: document.querySelectorAll('.jp-Cell').length, text: document.body.innerText.length});
  document.body.appendChild(out);
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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    build = tmp_path_factory.mktemp("build")
    old = os.environ.get("WORKBOOK_BUILD_DIR")
    os.environ["WORKBOOK_BUILD_DIR"] = str(build)
    try:
        lessons = lesson_notebooks()
        executed = build / "executed"
        executed.mkdir()
        first = nbformat.read(str(lessons[0]), as_version=4)
        png = _png()
        (executed / "diagram.png").write_bytes(base64.b64decode(png))
        first.cells.insert(1, nbformat.v4.new_markdown_cell("A diagram from a file: ![diagram](diagram.png)"))
        code = next(c for c in first.cells if c.cell_type == "code")
        widget = {"model_id": "0123abcd", "version_major": 2, "version_minor": 0}
        code.outputs = [
            nbformat.v4.new_output("stream", name="stdout", text="measured 1.23 GB/s\n"),
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
        index = site.build(executed, build / "site")
        yield index.parent, lessons
    finally:
        if old is None:
            os.environ.pop("WORKBOOK_BUILD_DIR", None)
        else:
            os.environ["WORKBOOK_BUILD_DIR"] = old


def test_every_lesson_has_a_page_and_the_index_links_them(built):
    out, lessons = built
    index = (out / "index.html").read_text()
    for nb in lessons:
        assert (out / f"{nb.stem}.html").is_file(), nb.stem
        assert f'href="{nb.stem}.html"' in index
    assert 'href="report.html"' in index and (out / "report.html").is_file()
    assert "executed (smoke mode, 12 s)" in index and "not run yet" in index


def test_pages_are_offline_and_navigable(built):
    out, lessons = built
    for page in sorted(out.glob("*.html")):
        text = page.read_text()
        assert not site.external_references(text), f"{page.name} loads {site.external_references(text)[:3]}"
        for nb in lessons:
            assert f'href="{nb.stem}.html"' in text, f"{page.name} has no link to {nb.stem}"
    first = (out / f"{lessons[0].stem}.html").read_text()
    assert "data:image/png;base64," in first and "diagram.png" not in re.sub(r'alt="[^"]*"', "", first)
    assert "Executed in smoke mode" in first
    assert "<summary>Show the answer</summary>" in first and "widget-view+json" not in first  # widgets fall back
    if len(lessons) > 1:
        assert "has not been run on this machine yet" in (out / f"{lessons[1].stem}.html").read_text()


def test_external_reference_detector():
    assert site.external_references('<script src="https://cdn.example/x.js"></script>') == ["https://cdn.example/x.js"]
    assert site.external_references('<link rel="stylesheet" href="//cdn.example/x.css">') == ["//cdn.example/x.css"]
    assert site.external_references('<a href="https://pytorch.org">docs</a><img src="data:image/png;base64,AA">') == []


def _render_in_chromium(page: Path, profile: Path) -> dict:
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", probe.as_uri()],
                              capture_output=True, text=True, timeout=120)
    finally:
        probe.unlink()
    found = re.search(r'<pre id="render-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"{page.name}: chromium rendered nothing (exit {proc.returncode}): {proc.stderr[-500:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


@pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed: apt-get install -y --no-install-recommends chromium")
def test_pages_render_in_a_headless_browser_without_broken_images(built, tmp_path):
    out, lessons = built
    profile = tmp_path / "chromium-profile"
    pages = {p.name: _render_in_chromium(p, profile) for p in sorted(out.glob("*.html"))}
    assert set(pages) == {"index.html", "report.html", *(f"{nb.stem}.html" for nb in lessons)}
    for name, seen in pages.items():
        assert seen["broken"] == [], f"{name}: broken images {seen['broken']}"
        assert seen["title"], f"{name}: no title"
        assert {f"{nb.stem}.html" for nb in lessons} <= set(seen["nav"]), f"{name}: navigation incomplete {seen['nav']}"
    for nb in lessons:
        assert pages[f"{nb.stem}.html"]["cells"] > 3, f"{nb.stem}: the notebook cells did not render"
    assert pages[f"{lessons[0].stem}.html"]["images"] >= 2  # the plot output and the embedded Markdown image
    assert pages["report.html"]["images"] == 1
    assert {f"{nb.stem}.html" for nb in lessons} <= set(pages["index.html"]["links"])


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
