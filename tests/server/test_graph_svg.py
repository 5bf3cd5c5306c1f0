"""utils.conversion.graph_svg: the offline ONNX graph drawing of lesson 04 (layout, bad input, and a headless-browser render)."""

import json
import os
import re
import subprocess
from xml.etree import ElementTree

import pytest

from tests.server.browser import CHROMIUM, CHROMIUM_FLAGS
from utils.checks.lab04 import graph_pass_model
from utils.conversion.graph_svg import graph_svg


def _parse(svg: str):
    return ElementTree.fromstring(svg)


def test_one_box_per_node_and_one_line_per_internal_edge():
    model = graph_pass_model()
    root = _parse(graph_svg(model, title="mlp <before>"))
    ns = {"s": "http://www.w3.org/2000/svg"}
    groups = root.findall("s:g", ns)
    assert [g.get("data-op") for g in groups] == [n.op_type for n in model.graph.node]
    producers = {o for n in model.graph.node for o in n.output}
    internal = sum(1 for n in model.graph.node for t in n.input if t in producers)
    edges = [e for e in root if e.get("class") == "edge"]
    assert len(edges) == internal and all(e.tag.endswith("line") for e in edges)  # a chain: row to next row


def test_an_edge_that_skips_rows_bows_around_the_boxes():
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["b"], ["c"]), helper.make_node("Add", ["a", "c"], ["y"])]  # a residual
    info = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(nodes, "residual", [info("x", TensorProto.FLOAT, [2])],
                                                [info("y", TensorProto.FLOAT, [2])]))
    root = _parse(graph_svg(model))
    edges = [e for e in root if e.get("class") == "edge"]
    assert sorted(e.tag.rsplit("}", 1)[-1] for e in edges) == ["line", "line", "line", "path"]
    assert "mlp &lt;before&gt;" in graph_svg(model, title="mlp <before>")  # titles are escaped


def test_layers_go_down_the_page_and_wrap():
    model = graph_pass_model()
    ns = {"s": "http://www.w3.org/2000/svg"}
    ys = [float(g.find("s:rect", ns).get("y")) for g in _parse(graph_svg(model)).findall("s:g", ns)]
    names = [n.op_type for n in model.graph.node]
    assert ys[names.index("Relu")] > ys[0]  # a consumer is drawn below its producer
    narrow = _parse(graph_svg(model, columns=1))
    assert len({g.find("s:rect", ns).get("x") for g in narrow.findall("s:g", ns)}) == 1


def test_bad_input_says_what_to_do(tmp_path):
    import onnx

    with pytest.raises(ValueError, match="max_nodes=3"):
        graph_svg(graph_pass_model(), max_nodes=3)
    with pytest.raises(ValueError, match="columns must be >= 1"):
        graph_svg(graph_pass_model(), columns=0)
    empty = onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], []))
    with pytest.raises(ValueError, match="no nodes"):
        graph_svg(empty)
    with pytest.raises(FileNotFoundError):
        graph_svg(tmp_path / "missing.onnx")


@pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed: apt-get install -y --no-install-recommends chromium")
def test_svg_renders_in_headless_chromium(tmp_path):
    model = graph_pass_model()
    page = tmp_path / "graph.html"
    probe = """<script>window.addEventListener('load', function () {
      var boxes = Array.prototype.slice.call(document.querySelectorAll('svg.onnx-graph g.node'));
      var drawn = boxes.filter(function (g) { var b = g.getBBox(); return b.width > 0 && b.height > 0; }).length;
      var out = document.createElement('pre'); out.id = 'render-check';
      out.textContent = JSON.stringify({boxes: boxes.length, drawn: drawn});
      document.body.appendChild(out); });</script>"""
    page.write_text(f"<html><body>{graph_svg(model, title='before')}{probe}</body></html>")
    proc = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HOME=str(tmp_path)))
    found = re.search(r'<pre id="render-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"chromium did not render the page (exit {proc.returncode}): {proc.stderr[-1500:]}"
    result = json.loads(found[1].replace("&quot;", '"'))
    assert result == {"boxes": len(model.graph.node), "drawn": len(model.graph.node)}
