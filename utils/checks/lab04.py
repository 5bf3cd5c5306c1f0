"""Checks for labs/04_onnx_tensorrt_lab.ipynb (lesson 04: export, parity, optimization, int8, a latency budget, a graph
pass that pays in ONNX Runtime).

Every check calls the learner's functions itself (through utils.checks.call), so each one fails with a clear
LabCheckFailed on an untouched lab and none depends on a variable an earlier, failing check would have produced.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
from pathlib import Path

from utils.checks import LabCheckFailed, call, expect, expect_gain, expect_target, figure, passed
from utils.conversion import onnx_tools
from utils.core import bench, env, onnx_io, verdict

ATOL, RTOL = 1e-4, 1e-3


def _inputs(image_size: int, batches=(1, 8, 3), seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, 3, image_size, image_size, generator=gen) for b in batches]


def _written(fn, args, path, *, what: str, missing: str) -> Path:
    """Call the learner's file writer fn(*args), which should write `path` (or return where it wrote instead).

    An old file at `path` is removed first, so a leftover from an earlier run cannot pass; `missing` is the message
    when no file appears.
    """
    path = Path(path)
    path.unlink(missing_ok=True)
    out = call(fn, *args, what=what)
    path = Path(out) if out is not None else path
    expect(path.is_file(), missing)
    return path


def _exported(export_fn, model, path, image_size) -> Path:
    """The learner's exported file: reuse it when check 1 already wrote it, else export now."""
    path = Path(path)
    if not path.is_file():
        out = call(export_fn, model, path, image_size, what="export_with_dynamic_batch(model, path, image_size)")
        path = Path(out) if out is not None else path
    expect(path.is_file(), f"export_with_dynamic_batch should write {path}, but there is no such file")
    return path


def _session(path):
    try:
        return onnx_io.ort_session(path)
    except Exception as exc:  # noqa: BLE001 - any load failure becomes a lab message
        raise LabCheckFailed(f"ONNX Runtime cannot load {path}: {type(exc).__name__}: {exc}") from None


def _max_abs(model, session, xs) -> float:
    import numpy as np
    import torch

    worst = 0.0
    with torch.inference_mode():
        for x in xs:
            ref = model(x).numpy()
            got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
            expect(got.shape == ref.shape, f"ONNX Runtime returned shape {got.shape} for input {tuple(x.shape)}, "
                                           f"eager PyTorch {ref.shape}")
            worst = max(worst, float(np.abs(got - ref).max()))
    return worst


def check_export(export_fn, model, path, image_size: int) -> Path:
    """The file exists, passes onnx.checker (full_check) and strict shape inference, has one input 'images' with a
    symbolic batch axis, and runs at batch 1 and 3."""
    path = _written(export_fn, (model, path, image_size), path, what="export_with_dynamic_batch(model, path, image_size)",
                    missing=f"export_with_dynamic_batch should write an ONNX file at {path} (and return its path)")
    try:
        onnx_tools.check_model(path, full_check=True, strict=True)
    except Exception as exc:  # noqa: BLE001 - the checker's message is what the learner needs
        raise LabCheckFailed(f"the ONNX checker / strict shape inference rejected {path.name}: {exc}") from None
    session = _session(path)
    inputs = session.get_inputs()
    expect([i.name for i in inputs] == ["images"], f"the graph should have one input named 'images', it has "
                                                   f"{[i.name for i in inputs]}: the exporter names the graph's inputs after what you tell it")
    batch_dim = inputs[0].shape[0]
    expect(isinstance(batch_dim, str), f"the batch axis of 'images' is fixed at {batch_dim}, the batch size of your "
                                       "example: the exporter keeps every size it is not told may vary")
    for x in _inputs(image_size, batches=(1, 3)):
        out = session.run(None, {"images": x.numpy()})[0]
        expect(out.shape[0] == x.shape[0], f"batch {x.shape[0]} in gave batch {out.shape[0]} out")
    passed("export", f"checker passed, input images{inputs[0].shape}, runs at batch 1 and 3")
    return path


def check_parity(max_abs_error_fn, export_fn, model, path, image_size: int) -> float:
    """The learner's max_abs_error agrees with ours, notices a real difference, and the export is within tolerance."""
    import torch

    path = _exported(export_fn, model, path, image_size)
    session = _session(path)
    xs = _inputs(image_size)
    mine = call(max_abs_error_fn, model, session, xs, what="max_abs_error(model, session, batches)")
    expect(isinstance(mine, int | float), f"max_abs_error should return a float, got {type(mine).__name__}")
    ref = _max_abs(model, session, xs)
    expect(abs(mine - ref) <= 1e-6 + 1e-3 * ref, f"max_abs_error returned {mine:.3g}, but the largest "
                                                 f"|ONNX Runtime - eager| over these batches is {ref:.3g}")

    class Shifted(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) + 0.05

    shifted = call(max_abs_error_fn, Shifted(model).eval(), session, xs, what="max_abs_error(shifted model, ...)")
    expect(shifted >= 0.04, f"a model whose outputs are all 0.05 larger gave max_abs_error {shifted:.3g}: compare "
                            "every output element of every batch with the eager model's")
    expect(ref <= ATOL + RTOL * 10, f"the export disagrees with eager PyTorch by {ref:.3g} (tolerance ~{ATOL}): "
                                    "is the model in eval mode?")
    passed("parity", f"max abs error {ref:.2e} over batches 1, 8 and 3; a 0.05 shift is detected")
    return ref


def check_optimized(optimize_fn, export_fn, model, path, out_path, image_size: int) -> Path:
    """The optimized graph has fewer nodes than the export, loads, and still matches eager PyTorch."""
    path = _exported(export_fn, model, path, image_size)
    out_path = _written(optimize_fn, (path, out_path), out_path, what="optimize(path, out_path)",
                        missing=f"optimize should write the optimized graph to {out_path}")
    before, after = onnx_tools.node_count(path), onnx_tools.node_count(out_path)
    expect(after < before, f"the optimized graph has {after} nodes, the export {before}: nothing was fused. Is the "
                           "file the graph ONNX Runtime runs after optimizing, and at a level that fuses nodes?")
    err = _max_abs(model, _session(out_path), _inputs(image_size))
    expect(err <= ATOL + RTOL * 10, f"the optimized graph disagrees with eager PyTorch by {err:.3g}")
    passed("optimize", f"{before} -> {after} nodes, max abs error {err:.2e}")
    return out_path


def check_quantized(quantize_fn, export_fn, model, path, out_path, image_size: int, calibration) -> dict:
    """int8 file at least 3x smaller than fp32, with int8 ops, agreeing with fp32 on top-1 for >= 90% of inputs."""
    import numpy as np

    path = _exported(export_fn, model, path, image_size)
    out_path = _written(quantize_fn, (path, out_path, calibration), out_path,
                        what="quantize_int8(path, out_path, calibration)",
                        missing=f"quantize_int8 should write the int8 model to {out_path}")
    ratio = onnx_io.onnx_size_bytes(path) / onnx_io.onnx_size_bytes(out_path)
    expect(ratio >= 3.0, f"the int8 file is only {ratio:.2f}x smaller than fp32; int8 weights should make it ~4x")
    ops = onnx_tools.op_histogram(out_path)
    int8_ops = {"QuantizeLinear", "QLinearConv", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"}
    expect(bool(int8_ops & set(ops)), f"no int8 operators in the graph (ops: {sorted(ops)})")
    fp32, int8 = _session(path), _session(out_path)
    xs = _inputs(image_size, batches=(8, 8, 8, 8), seed=5)
    a = np.concatenate([fp32.run(None, {"images": x.numpy()})[0] for x in xs])
    b = np.concatenate([int8.run(None, {"images": x.numpy()})[0] for x in xs])
    agree = float((a.argmax(1) == b.argmax(1)).mean())
    expect(agree >= 0.9, f"int8 and fp32 agree on the top class for only {agree:.0%} of 32 inputs: are the "
                         "calibration batches like the inputs served, and does each weight tensor share one scale "
                         "across output channels whose ranges differ?")
    passed("quantize", f"{ratio:.2f}x smaller, top-1 agreement {agree:.0%} on 32 inputs")
    return {"size_ratio": ratio, "top1_agreement": agree}


def check_latency_budget(session_fn, model, image_size: int, budget: float, paths=(),
                         min_run_time: float = 0.3) -> float:
    """The learner's session is at least `budget` times faster than eager PyTorch at batch 8, measured side by side
    now, and agrees with eager on the top class for >= 90% of the batch. `paths` are passed to session_fn."""
    import numpy as np
    import torch

    try:
        session = call(session_fn, *paths, what="fast_session(fp32_path, optimized_path, int8_path)")
    except LabCheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - becomes a message that names what is missing
        missing = [str(p) for p in paths if not Path(p).is_file()]
        hint = f"; these files do not exist yet, run the earlier checks first: {missing}" if missing else ""
        raise LabCheckFailed(f"fast_session raised {type(exc).__name__}: {exc}{hint}") from None
    expect(hasattr(session, "run") and hasattr(session, "get_inputs"),
           f"fast_session should return an onnxruntime.InferenceSession, got {type(session).__name__}")
    x = _inputs(image_size, batches=(8,), seed=7)[0]
    feeds = {session.get_inputs()[0].name: x.numpy()}
    with torch.inference_mode():
        ref = model(x).numpy()
    agree = float((session.run(None, feeds)[0].argmax(1) == ref.argmax(1)).mean())
    expect(agree >= 0.9, f"the session's top class matches eager for only {agree:.0%} of the batch")

    def eager():
        with torch.inference_mode():
            return model(x)

    res = bench.compare({"eager": eager, "your session": lambda: session.run(None, feeds)}, min_run_time=min_run_time,
                        items=8, quiet=True)
    ratio = res.ratio("your session")
    line = verdict.speed_line("your session", ratio, "eager at batch 8", budget)
    met = verdict.speed(ratio, budget) == verdict.FASTER
    look = ("Which of the files you built does the least work per image, and how many threads does ONNX Runtime use "
            "next to PyTorch's?")
    expect_target(met, ratio.judged is not None and ratio.judged[1] >= budget,
                  f"undecided: {line}. The rounds disagree, as they do when other programs keep this machine's cores "
                  f"busy: run the check again. The budget wants every round above {budget:.2f}x. {look}",
                  f"over budget: {line}; the budget wants every round above {budget:.2f}x. {look}")
    passed("latency budget" if met else "latency budget's parity (speed target recorded above, not enforced)",
           f"{line}, top-1 agreement {agree:.0%}")
    figure("speedup_over_eager_bs8", ratio.value, "x")
    return float(np.round(ratio.value, 3))


# ---------------------------------------------------------------------------------------------------------------------
# section 6: a graph pass that pays in ONNX Runtime

# The fused graph must be faster than the original by more than this with every round of the comparison (both run by
# ONNX Runtime with its own graph optimizations off, so the learner's pass is the only difference between them).
GRAPH_PASS_LINE = 1.10
# The timed model: a deep, narrow MLP at a small batch, where each node's dispatch and the intermediate tensor each
# extra node writes and reads back are a large share of the work (measured on 2 cores: ~1.5x from MatMul+Add -> Gemm).
GRAPH_PASS_WIDTH, GRAPH_PASS_DEPTH, GRAPH_PASS_BATCH = 32, 64, 64
# Graph optimizers that would do the rewrite for the learner: a pass that calls into them is refused.
_OPTIMIZER_MODULES = ("onnxruntime.transformers", "onnxruntime.tools", "onnxscript.rewriter", "onnxscript.optimizer",
                      "onnxoptimizer", "onnxsim", "tf2onnx.optimizer", "polygraphy")


def graph_pass_model(seed: int = 0, depth: int = 3, width: int = 16):
    """The graph the graph-pass task rewrites (lesson 04, section 3e): `depth` layers MatMul(h, W) -> Add(b) -> Relu,
    then a gated layer whose MatMul output 'feat' feeds both its Add and a Sigmoid, and a last MatMul -> Add whose
    MatMul output 'scores' is also a graph output. Outputs: 'y' and 'scores'; `depth` pairs can be fused."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, h = [], [], "x"

    def linear(name, n_in, n_out):
        w = rng.standard_normal((n_in, n_out)) * np.sqrt(2.0 / n_in)
        inits.extend([numpy_helper.from_array(w.astype(np.float32), f"W_{name}"),
                      numpy_helper.from_array((0.5 * rng.standard_normal(n_out)).astype(np.float32), f"b_{name}")])
        return f"W_{name}", f"b_{name}"

    for i in range(depth):
        w, b = linear(str(i), width, width)
        nodes += [helper.make_node("MatMul", [h, w], [f"mm{i}"]), helper.make_node("Add", [f"mm{i}", b], [f"lin{i}"]),
                  helper.make_node("Relu", [f"lin{i}"], [f"h{i}"])]
        h = f"h{i}"
    w, b = linear("gate", width, width)
    nodes += [helper.make_node("MatMul", [h, w], ["feat"]), helper.make_node("Add", ["feat", b], ["lin_gate"]),
              helper.make_node("Sigmoid", ["feat"], ["gate"]), helper.make_node("Mul", ["lin_gate", "gate"], ["hg"])]
    w, b = linear("out", width, 4)
    nodes += [helper.make_node("MatMul", ["hg", w], ["scores"]), helper.make_node("Add", ["scores", b], ["y"])]
    graph = helper.make_graph(nodes, "mlp_matmul_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      ["batch", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # ONNX Runtime reads up to IR 13; onnx writes newer by default
    onnx.checker.check_model(model, full_check=True)
    return model


@contextlib.contextmanager
def _own_rewrite_only(what: str):
    """Fail when the code in the block calls a graph optimizer that would do the rewrite for it: a module of
    _OPTIMIZER_MODULES, or an ONNX Runtime session that writes its optimized graph (optimized_model_filepath; sessions
    without it, as onnx-graphsurgeon's fold_constants() makes, are fine). Watched with sys.setprofile, this thread and
    threads started in the block."""
    seen: list[str] = []
    previous, previous_threads = sys.getprofile(), threading.getprofile()

    def watch(frame, event, arg):
        if event == "call" and not seen:
            module = frame.f_globals.get("__name__") or ""
            if module.startswith(_OPTIMIZER_MODULES) and frame.f_code.co_name != "<module>":  # a call, not an import
                seen.append(f"{module}.{frame.f_code.co_name}, a library's graph optimizer")
            elif frame.f_code.co_name == "_create_inference_session" and module.startswith("onnxruntime"):
                options = getattr(frame.f_locals.get("self"), "_sess_options", None)
                if options is not None and getattr(options, "optimized_model_filepath", ""):
                    seen.append("an ONNX Runtime session that saves the graph ONNX Runtime optimized "
                                "(SessionOptions.optimized_model_filepath)")
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        yield
    finally:
        sys.setprofile(previous)
        threading.setprofile(previous_threads)
        if seen:
            raise LabCheckFailed(f"{what} calls {seen[0]}: this task measures a rewrite you write yourself, with "
                                 "onnx-graphsurgeon") from None


def _run_graph(model, x, extra=()):
    """Outputs of `model` (and of the tensors named in `extra`) on x, run by ONNX Runtime with its optimizations off."""
    import onnx
    from onnx import helper

    if extra:
        model = copy.deepcopy(model)
        have = {o.name for o in model.graph.output}
        model.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                  for n in extra if n not in have)
    session = onnx_io.ort_session(model.SerializeToString(), level="disabled", threads=1)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {"x": x}), strict=True))


def _close(a, b) -> bool:
    import numpy as np

    return a.shape == b.shape and bool(np.allclose(a, b, atol=ATOL, rtol=RTOL))


def _first_difference(original, out, x) -> str:
    """Where the rewritten graph first departs from the original: the first tensor (in the original's order) that both
    graphs compute and that differs, and how it differs."""
    import numpy as np

    theirs = {o: n for n in out.graph.node for o in n.output}
    names = [o for n in original.graph.node for o in n.output if o in theirs]
    want, got = _run_graph(original, x, names), _run_graph(out, x, names)
    for name in names:
        a, b = want[name], got[name]
        if _close(a, b):
            continue
        writer = theirs[name].op_type
        if a.shape != b.shape:
            return f"tensor '{name}' (written by your {writer} node) has shape {b.shape} where the original's has {a.shape}"
        diff = b - a
        how = f"it differs by up to {float(np.abs(diff).max()):.3g}"
        if diff.ndim == 2 and diff.shape[0] > 1 and np.allclose(diff, diff[:1], atol=ATOL, rtol=RTOL):
            how += (", by the same amount in every row (one offset per column): a term that does not depend on the "
                    "input is missing or wrong there")
        return f"the first tensor that differs from the original is '{name}', written by your {writer} node: {how}"
    return "no tensor that both graphs compute differs, only the graph outputs"


def _rewritten(pass_fn, original):
    """Run the learner's pass on a copy of `original` and check the result: a valid graph, same outputs as the
    original in ONNX Runtime (optimizations off), each fusable pair fused and the two unfusable ones left alone."""
    import numpy as np
    import onnx

    depth = sum(n.op_type == "Relu" for n in original.graph.node)
    with _own_rewrite_only("fuse_matmul_add"):
        out = call(pass_fn, copy.deepcopy(original), what="fuse_matmul_add(model)")
    expect(isinstance(out, onnx.ModelProto), f"fuse_matmul_add should return an onnx.ModelProto (gs.export_onnx), "
                                             f"got {type(out).__name__}")
    before, ops, ops_before = len(original.graph.node), onnx_tools.op_histogram(out), onnx_tools.op_histogram(original)
    expect(not (len(out.graph.node) == before and ops == ops_before),
           f"fuse_matmul_add returned the graph unchanged: {before} nodes, {ops.get('MatMul', 0)} MatMul and "
           f"{ops.get('Add', 0)} Add, no Gemm; nothing was fused, so there is nothing to measure")
    expect(not any("MatMulAddFusion" in n.name for n in out.graph.node),
           "the rewritten graph carries ONNX Runtime's own fusion names (MatMulAddFusion): it was written by ONNX "
           "Runtime's optimizer, not by your pass")
    graph = out.graph
    written = ({o for n in graph.node for o in n.output} | {i.name for i in graph.initializer}
               | {i.name for i in graph.input})
    writers = {o: n.op_type for n in original.graph.node for o in n.output}
    def signature(g):
        return [(v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in g.input]

    expect(signature(graph) == signature(original.graph),
           f"the rewritten graph's inputs are {signature(graph)}, the graph given to the pass has "
           f"{signature(original.graph)}: the pass should return a rewrite of the model it is given")
    outputs = [o.name for o in graph.output]
    expect(outputs == ["y", "scores"], f"the graph outputs must stay ['y', 'scores'], they are {outputs}")
    for name in outputs:
        expect(name in written, f"the graph output '{name}' is no longer written by any node (in the original a "
                                f"{writers[name]} wrote it): your rewrite removed a tensor the graph hands out")
    for node in graph.node:
        for name in node.input:
            expect(not name or name in written,
                   f"your graph's {node.op_type} node reads '{name}', which no node writes any more (in the original "
                   f"a {writers.get(name, '?')} wrote it): your rewrite removed a tensor another node still reads")
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as exc:  # noqa: BLE001 - the checker's message is what the learner needs
        raise LabCheckFailed(f"the ONNX checker rejected the rewritten graph: {exc}") from None
    x = np.random.default_rng(1).standard_normal((5, original.graph.input[0].type.tensor_type.shape.dim[1].dim_value))
    x = x.astype(np.float32)
    try:
        got = _run_graph(out, x)
    except Exception as exc:  # noqa: BLE001 - any load failure becomes a lab message
        raise LabCheckFailed(f"ONNX Runtime cannot run the rewritten graph: {type(exc).__name__}: {exc} "
                             "(is ir_version still the original's?)") from None
    want = _run_graph(original, x)
    err = max(float(np.abs(got[k] - want[k]).max()) if got[k].shape == want[k].shape else float("inf") for k in want)
    expect(all(_close(want[k], got[k]) for k in want),
           f"the rewritten graph's outputs differ from the original's by {err:.3g} (atol {ATOL}, rtol {RTOL}); "
           f"{_first_difference(original, out, x)}")
    kept = {name: next((n.op_type for n in graph.node if name in n.output), None) for name in ("feat", "scores")}
    expect(ops.get("Gemm", 0) <= depth and ops.get("MatMul", 0) == 2 and ops.get("Add", 0) == 2 and
           all(op == "MatMul" for op in kept.values()),
           f"the two MatMul -> Add pairs whose MatMul output has another reader ('feat' also feeds the Sigmoid, "
           f"'scores' is a graph output) must stay as they are; your graph has {ops.get('MatMul', 0)} MatMul, "
           f"{ops.get('Add', 0)} Add and {ops.get('Gemm', 0)} Gemm, and writes 'feat' and 'scores' with {kept}"
           + ("; the same product is now computed twice" if ops.get("Gemm", 0) > depth else ""))
    expect(ops.get("Gemm", 0) == depth and len(graph.node) == before - depth,
           f"{depth - ops.get('Gemm', 0)} of the {depth} plain MatMul -> Add -> Relu layers were not fused "
           f"({before} nodes should become {before - depth}, your graph has {len(graph.node)}: {dict(ops)})")
    return out, err


def check_graph_pass(pass_fn) -> dict:
    """The learner's fuse_matmul_add(model), on the small graph the lab prints and on a deep one: a valid graph, every
    fusable MatMul+Add pair a Gemm, the two unfusable pairs left as they are, the same outputs in ONNX Runtime; then
    the fused deep graph timed against the original in interleaved rounds, both built here with ONNX Runtime's own
    optimizations off (ORT_DISABLE_ALL) and one thread, so the pass is the only difference. Full mode judges the gain
    against GRAPH_PASS_LINE; smoke mode prints it and judges correctness only."""
    import numpy as np
    import onnxruntime as ort

    small = graph_pass_model()
    _, err = _rewritten(pass_fn, small)
    deep = graph_pass_model(seed=1, depth=GRAPH_PASS_DEPTH, width=GRAPH_PASS_WIDTH)
    fused, err_deep = _rewritten(pass_fn, deep)
    x = np.random.default_rng(2).standard_normal((GRAPH_PASS_BATCH, GRAPH_PASS_WIDTH)).astype(np.float32)
    original_s = onnx_io.ort_session(deep.SerializeToString(), level="disabled", threads=1)
    fused_s = onnx_io.ort_session(fused.SerializeToString(), level="disabled", threads=1)
    levels = {s.get_session_options().graph_optimization_level for s in (original_s, fused_s)}
    expect(levels == {ort.GraphOptimizationLevel.ORT_DISABLE_ALL},
           f"the timed sessions run with graph optimization level {sorted(str(v) for v in levels)}, not "
           "ORT_DISABLE_ALL: something changed how this check builds its sessions, so the timing would measure ONNX "
           "Runtime's optimizer instead of your pass")
    smoke = env.smoke_default()
    res = bench.compare({"original": lambda: original_s.run(None, {"x": x}),
                         "after your pass": lambda: fused_s.run(None, {"x": x})},
                        rounds=3 if smoke else 7, min_run_time=0.05 if smoke else 0.3, items=GRAPH_PASS_BATCH,
                        quiet=True)
    ratio = res.ratio("after your pass")
    nodes = f"{len(deep.graph.node)} -> {len(fused.graph.node)} nodes"
    print(f"{GRAPH_PASS_DEPTH}-layer MLP, width {GRAPH_PASS_WIDTH}, batch {GRAPH_PASS_BATCH}, {nodes}; ONNX Runtime "
          f"with its optimizations off, 1 thread: original {res['original'].median_ms:.3f} ms, after your pass "
          f"{res['after your pass'].median_ms:.3f} ms per batch")
    line = expect_gain("after your pass", ratio, "the original graph", GRAPH_PASS_LINE,
                       "Look at what ONNX Runtime runs per layer after your pass: how many nodes, and which "
                       "intermediate tensors are still written to memory and read back?", smoke=smoke)
    passed("graph pass", f"{nodes} on the deep graph (small graph: max abs error {err:.1e}, deep: {err_deep:.1e}); "
                         f"{line}")
    figure("graph_pass_speedup", ratio.value, "x")
    return {"nodes_before": len(deep.graph.node), "nodes_after": len(fused.graph.node), "max_abs": max(err, err_deep),
            "speedup": ratio}
