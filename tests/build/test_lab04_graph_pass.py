"""Lab 04's graph-pass task (section 6): the check passes a correct MatMul+Add -> Gemm pass and reports its measured
gain; it fails the typical wrong answers with a message that names the symptom, and refuses a pass that lets a library's
optimizer do the rewrite."""

import re

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from utils import checks
from utils.checks import LabCheckFailed, lab04


def a_pass(model, *, check_readers=True, check_outputs=True, drop_bias=False, trans_b=False, fold_first=False):
    """A correct pass with switches that turn it into the typical wrong answers."""
    graph = gs.import_onnx(model)
    if fold_first:
        graph.fold_constants().cleanup()
    for add in [n for n in graph.nodes if n.op == "Add"]:
        for k in (0, 1):
            y, b = add.inputs[k], add.inputs[1 - k]
            if len(y.inputs) != 1 or y.inputs[0].op != "MatMul":
                continue
            if (check_readers and len(y.outputs) != 1) or (check_outputs and y in graph.outputs):
                continue
            matmul = y.inputs[0]
            w = matmul.inputs[1]
            if not (isinstance(w, gs.Constant) and isinstance(b, gs.Constant) and w.values.ndim == 2
                    and b.values.ndim == 1):
                continue
            matmul.op = "Gemm"
            if not drop_bias:
                matmul.inputs.append(b)
            if trans_b:
                matmul.attrs["transB"] = 1
            matmul.outputs = add.outputs
            add.outputs = []
            break
    graph.cleanup().toposort()
    out = gs.export_onnx(graph)
    out.ir_version = model.ir_version
    return out


@pytest.fixture(autouse=True)
def _record_speed(monkeypatch):
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")  # a missed gain is printed here, not a test failure


def test_a_correct_pass_passes_and_reports_its_gain(capsys):
    result = lab04.check_graph_pass(a_pass)
    out = capsys.readouterr().out
    depth = lab04.GRAPH_PASS_DEPTH
    assert result["nodes_before"] - result["nodes_after"] == depth
    assert "PASSED graph pass" in out
    assert re.search(r"^FIGURE graph_pass_speedup: \S+ x \(higher is better\)$", out, re.MULTILINE)
    assert "after your pass vs the original graph" in out
    # two decimals, or three when an interval's edge sits near the line (verdict.speed_line)
    assert re.search(r"line 1\.100?x", out)
    assert "SMOKE MODE: the gain is reported, not judged" in out  # the suite runs with WORKBOOK_SMOKE=1


def test_full_mode_judges_the_gain_against_the_line(monkeypatch, capsys):
    monkeypatch.setenv("WORKBOOK_SMOKE", "0")
    result = lab04.check_graph_pass(a_pass)
    out = capsys.readouterr().out
    assert "SMOKE MODE" not in out
    judged = lab04.verdict.speed(result["speedup"], lab04.GRAPH_PASS_LINE) == lab04.verdict.FASTER
    # under WORKBOOK_SPEED_TARGETS=record a miss is printed with its numbers instead of failing the suite
    assert judged or "SPEED TARGET NOT ENFORCED" in out


def test_a_pass_that_uses_graphsurgeons_constant_folding_is_not_refused(capsys):
    lab04.check_graph_pass(lambda m: a_pass(m, fold_first=True))  # fold_constants() runs ONNX Runtime sessions
    assert "PASSED graph pass" in capsys.readouterr().out


def test_the_check_builds_both_timed_sessions_with_ort_optimizations_off(monkeypatch):
    levels = []
    real = lab04.onnx_io.ort_session

    def spy(model, **kw):
        levels.append(kw.get("level", "all"))
        return real(model, **kw)

    monkeypatch.setattr(lab04.onnx_io, "ort_session", spy)
    lab04.check_graph_pass(a_pass)
    assert levels and set(levels) == {"disabled"}


@pytest.mark.parametrize("wrong, symptom", [
    (lambda m: m, "returned the graph unchanged"),
    (lambda m: a_pass(m, check_readers=False), "reads 'feat', which no node writes any more"),
    (lambda m: a_pass(m, check_outputs=False), "graph output 'scores' is no longer written by any node"),
    (lambda m: a_pass(m, trans_b=True), "first tensor that differs from the original is 'lin0', written by your Gemm"),
    (lambda m: a_pass(m, drop_bias=True), "same amount in every row"),
    (lambda m: a_pass(lab04.graph_pass_model()), "a rewrite of the model it is given"),  # the lab's small graph, whatever comes in
])
def test_typical_wrong_answers_fail_with_their_symptom(wrong, symptom):
    with pytest.raises(LabCheckFailed, match=re.escape(symptom)):
        lab04.check_graph_pass(wrong)


def test_a_pass_that_computes_an_unfusable_product_twice_fails():
    def twice(model):
        out = a_pass(model)
        graph = gs.import_onnx(out)
        add = next(n for n in graph.nodes if n.op == "Add" and n.inputs[0].name == "feat")
        matmul = add.inputs[0].inputs[0]
        fused = gs.Variable("lin_gate_fused", dtype=np.float32)
        graph.nodes.append(gs.Node("Gemm", inputs=[matmul.inputs[0], matmul.inputs[1], add.inputs[1]],
                                   outputs=[fused]))
        lin_gate = add.outputs[0]
        add.outputs = []
        graph.nodes.append(gs.Node("Identity", inputs=[fused], outputs=[lin_gate]))
        graph.cleanup().toposort()
        model2 = gs.export_onnx(graph)
        model2.ir_version = model.ir_version
        return model2

    with pytest.raises(LabCheckFailed, match="must stay as they are"):
        lab04.check_graph_pass(twice)


def test_a_pass_that_lets_onnx_runtime_optimize_is_refused(tmp_path):
    import onnxruntime as ort

    def ort_does_it(model):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # fuses MatMul+Add itself
        options.optimized_model_filepath = str(tmp_path / "ort.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(str(tmp_path / "ort.onnx"))

    with pytest.raises(LabCheckFailed, match="saves the graph ONNX Runtime optimized"):
        lab04.check_graph_pass(ort_does_it)


def test_a_graph_written_by_onnx_runtime_beforehand_is_recognised(tmp_path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(lab04.graph_pass_model().SerializeToString(), options, providers=["CPUExecutionProvider"])
    cached = onnx.load(str(tmp_path / "ort.onnx"))
    with pytest.raises(LabCheckFailed, match="ONNX Runtime's own fusion names"):
        lab04.check_graph_pass(lambda m: cached)


def test_a_pass_that_calls_a_library_rewriter_is_refused():
    def onnxscript_does_it(model):
        from onnxscript import rewriter

        return rewriter.rewrite(model)

    with pytest.raises(LabCheckFailed, match="onnxscript\\.(rewriter|optimizer).*a library's graph optimizer"):
        lab04.check_graph_pass(onnxscript_does_it)


def test_a_stub_says_which_todo_to_fill_in():
    def stub(model):
        raise NotImplementedError("TODO: write the pass")

    with pytest.raises(LabCheckFailed, match="fuse_matmul_add\\(model\\) is not written yet"):
        lab04.check_graph_pass(stub)


def test_a_pass_that_turns_ort_optimizations_on_for_the_timed_sessions_is_caught(monkeypatch):
    real = lab04.onnx_io.ort_session

    def optimizing(model, **kw):
        return real(model, **{**kw, "level": "all"})

    def faker(model):  # a correct rewrite that also makes the check's own sessions optimize the graph
        monkeypatch.setattr(lab04.onnx_io, "ort_session", optimizing)
        return a_pass(model)

    with pytest.raises(LabCheckFailed, match="not ORT_DISABLE_ALL"):
        lab04.check_graph_pass(faker)
