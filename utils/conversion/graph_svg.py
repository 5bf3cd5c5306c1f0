"""Draw an ONNX graph as a self-contained SVG string, offline (lesson 04, "graphs you can look at").

No Graphviz, no Netron, no network: nodes are placed in layers by their longest distance from the graph inputs and
drawn as boxes named by op type, edges as lines from producer to consumer. Good enough to see what a pass or an
optimizer changed; a notebook shows the string inline (IPython.display.HTML) and the same file opens in any browser.
"""

from __future__ import annotations

import colorsys
import hashlib
from xml.sax.saxutils import escape

from utils.conversion.onnx_tools import load_model

__all__ = ["graph_svg"]

_BOX_W, _BOX_H, _GAP_X, _GAP_Y, _MARGIN = 118, 26, 14, 22, 10


def _colour(op: str) -> str:
    """A stable pastel colour per op type, so the same op looks the same in the before and after drawings."""
    hue = int(hashlib.sha1(op.encode()).hexdigest()[:6], 16) / 0xFFFFFF
    r, g, b = colorsys.hls_to_rgb(hue, 0.82, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _layers(nodes) -> list[int]:
    """Layer of each node: 0 for nodes fed only by graph inputs or initializers, else 1 + the deepest producer."""
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    depth: dict[int, int] = {}
    for i in range(len(nodes)):  # iterative DFS: deep graphs (ResNet-50 export: ~180 nodes) must not hit recursion
        stack = [i]
        while stack:
            j = stack[-1]
            if j in depth:
                stack.pop()
                continue
            parents = [producer[t] for t in nodes[j].input if t in producer and producer[t] != j]
            pending = [p for p in parents if p not in depth]
            if pending:
                if len(stack) > len(nodes):
                    raise ValueError("the graph has a cycle; an ONNX graph must be acyclic")
                stack.extend(pending)
                continue
            depth[j] = 1 + max((depth[p] for p in parents), default=-1)
            stack.pop()
    return [depth[i] for i in range(len(nodes))]


def graph_svg(model, *, title: str | None = None, max_nodes: int = 600, columns: int = 6) -> str:
    """SVG drawing of the main graph of `model` (an onnx.ModelProto or a path) (lesson 04).

    Each node is a box labelled with its op type (custom domains as domain::Op, the node name in a tooltip); layers
    run top to bottom. Layers wider than `columns` boxes wrap onto extra rows. Raises ValueError for graphs with more
    than `max_nodes` nodes (the drawing would be unreadable: draw a subgraph instead).
    """
    model = load_model(model)
    nodes = list(model.graph.node)
    if not nodes:
        raise ValueError("the graph has no nodes to draw")
    if len(nodes) > max_nodes:
        raise ValueError(f"the graph has {len(nodes)} nodes, more than max_nodes={max_nodes}; raise max_nodes or "
                         "draw a subgraph (onnx.utils.extract_model)")
    if columns < 1:
        raise ValueError(f"columns must be >= 1, got {columns}")
    layer = _layers(nodes)
    rows: dict[int, list[int]] = {}
    for i, d in enumerate(layer):
        rows.setdefault(d, []).append(i)
    pos, y = {}, _MARGIN + (22 if title else 0)
    width = 0
    for d in sorted(rows):
        members = rows[d]
        for start in range(0, len(members), columns):
            chunk = members[start:start + columns]
            for k, i in enumerate(chunk):
                pos[i] = (_MARGIN + k * (_BOX_W + _GAP_X), y)
            width = max(width, _MARGIN + len(chunk) * (_BOX_W + _GAP_X))
            y += _BOX_H + _GAP_Y
    height = y + _MARGIN
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="onnx-graph" width="{width + _MARGIN}" '
             f'height="{height}" viewBox="0 0 {width + _MARGIN} {height}" font-family="sans-serif" font-size="11">']
    if title:
        parts.append(f'<text x="{_MARGIN}" y="{_MARGIN + 12}" font-weight="bold">{escape(title)}</text>')
    for i, n in enumerate(nodes):  # edges first, so the boxes cover their ends
        x1, y1 = pos[i]
        for t in n.input:
            if t in producer and producer[t] != i:
                x0, y0 = pos[producer[t]]
                a, b = (x0 + _BOX_W / 2, y0 + _BOX_H), (x1 + _BOX_W / 2, y1)
                if y1 - y0 <= _BOX_H + _GAP_Y:  # next row: a straight line
                    parts.append(f'<line class="edge" x1="{a[0]}" y1="{a[1]}" x2="{b[0]}" y2="{b[1]}" stroke="#888"/>')
                else:  # skips rows (a residual connection): bow out to the right so the boxes between do not hide it
                    bow = _BOX_W / 2 + _GAP_X
                    parts.append(f'<path class="edge" d="M{a[0]},{a[1]} C{a[0] + bow},{a[1]} {b[0] + bow},{b[1]} '
                                 f'{b[0]},{b[1]}" fill="none" stroke="#888"/>')
    for i, n in enumerate(nodes):
        x, y = pos[i]
        op = f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        label = op if len(op) <= 18 else op[:17] + "…"
        parts.append(f'<g class="node" data-op="{escape(op, {chr(34): "&quot;"})}"><title>{escape(n.name or op)}</title>'
                     f'<rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="4" fill="{_colour(op)}" '
                     f'stroke="#444"/><text x="{x + _BOX_W / 2}" y="{y + 17}" text-anchor="middle">{escape(label)}'
                     "</text></g>")
    parts.append("</svg>")
    return "".join(parts)
