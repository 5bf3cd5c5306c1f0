"""Checks for labs/04_onnx_tensorrt_lab.ipynb (lesson 04: export, parity, optimization, int8, a latency budget).

Every check calls the learner's functions itself (through utils.checks.call), so each one fails with a clear
LabCheckFailed on an untouched lab and none depends on a variable an earlier, failing check would have produced.
"""

from __future__ import annotations

from pathlib import Path

from utils.checks import LabCheckFailed, call, expect, expect_target, figure, passed
from utils.conversion import onnx_tools
from utils.core import bench, onnx_io, verdict

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
                                                   f"{[i.name for i in inputs]}: pass input_names=['images']")
    batch_dim = inputs[0].shape[0]
    expect(isinstance(batch_dim, str), f"the batch axis of 'images' is fixed at {batch_dim}: declare it dynamic "
                                       "(dynamic_axes={'images': {0: 'batch'}, ...} with the legacy exporter)")
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
    expect(after < before, f"the optimized graph has {after} nodes, the export {before}: save the graph ONNX Runtime "
                           "actually runs (SessionOptions.optimized_model_filepath) at level 'extended' or 'all'")
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
    expect(agree >= 0.9, f"int8 and fp32 agree on the top class for only {agree:.0%} of 32 inputs: calibrate with "
                         "inputs like the ones you serve, and use per_channel=True")
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


def graph_pass_model(seed: int = 0):
    """The graph the graph-pass task rewrites (lesson 04, section 3e): three MatMul(x, W) -> Add(b) pairs with Relu
    between them, plus a fourth pair whose MatMul output is also a graph output (so it must stay as it is)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    dims = [16, 32, 32, 8]
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array(rng.standard_normal((dims[i], dims[i + 1])).astype(np.float32), f"W{i}"),
                  numpy_helper.from_array(rng.standard_normal(dims[i + 1]).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"mm{i}"]), helper.make_node("Add", [f"mm{i}", f"b{i}"],
                                                                                        [f"lin{i}"])]
        if i < 2:
            nodes.append(helper.make_node("Relu", [f"lin{i}"], [f"h{i}"]))
        x = f"h{i}" if i < 2 else "lin2"
    inits += [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W3"),
              numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b3")]
    nodes += [helper.make_node("MatMul", ["lin2", "W3"], ["scores"]), helper.make_node("Add", ["scores", "b3"], ["y"])]
    graph = helper.make_graph(nodes, "mlp_matmul_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                      ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # ONNX Runtime reads up to IR 13; onnx writes newer by default
    onnx.checker.check_model(model, full_check=True)
    return model


def check_graph_pass(pass_fn) -> dict:
    """The learner's fuse_matmul_add(model) returns a valid graph with the three fusable MatMul+Add pairs as Gemm,
    the fourth (whose MatMul output is a graph output) untouched, the graph outputs kept, and the same outputs
    (checked in ONNX Runtime with its own optimizations off)."""
    import copy

    import numpy as np
    import onnx

    original = graph_pass_model()
    out = call(pass_fn, copy.deepcopy(original), what="fuse_matmul_add(model)")
    expect(isinstance(out, onnx.ModelProto), f"fuse_matmul_add should return an onnx.ModelProto (gs.export_onnx), "
                                             f"got {type(out).__name__}")
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception as exc:  # noqa: BLE001 - the checker's message is what the learner needs
        raise LabCheckFailed(f"the ONNX checker rejected the rewritten graph: {exc}") from None
    ops = onnx_tools.op_histogram(out)
    before = onnx_tools.node_count(original)
    expect(ops.get("Gemm", 0) == 3, f"expected 3 Gemm nodes (one per fusable MatMul+Add pair), found "
                                    f"{ops.get('Gemm', 0)}; ops now: {dict(ops)}")
    expect(ops.get("MatMul", 0) == 1 and ops.get("Add", 0) == 1,
           f"the last MatMul feeds a graph output ('scores') as well as its Add: it must stay a MatMul + Add "
           f"(found {ops.get('MatMul', 0)} MatMul and {ops.get('Add', 0)} Add)")
    expect(len(out.graph.node) == before - 3, f"{before} nodes should become {before - 3}, got {len(out.graph.node)}:"
                                              " remove each fused Add (graph.cleanup())")
    outputs = [o.name for o in out.graph.output]
    expect(outputs == ["y", "scores"], f"the graph outputs must stay ['y', 'scores'], they are {outputs}")
    x = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    try:
        got = onnx_io.ort_session(out.SerializeToString(), level="disabled").run(None, {"x": x})
    except Exception as exc:  # noqa: BLE001 - any load failure becomes a lab message
        raise LabCheckFailed(f"ONNX Runtime cannot run the rewritten graph: {type(exc).__name__}: {exc} "
                             "(did you keep the IR version? out.ir_version = model.ir_version)") from None
    want = onnx_io.ort_session(original.SerializeToString(), level="disabled").run(None, {"x": x})
    err = max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True))
    expect(err <= ATOL, f"the rewritten graph's outputs differ from the original by {err:.3g} (atol {ATOL})")
    passed("graph pass", f"{before} -> {len(out.graph.node)} nodes (3 MatMul+Add -> Gemm), max abs error {err:.2e}")
    return {"nodes_before": before, "nodes_after": len(out.graph.node), "max_abs": err}
