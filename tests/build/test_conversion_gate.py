"""Conversion gate: what a team runs in CI before an exported ONNX model may ship (lesson 04, section 8b).

Self-contained on purpose (torch, onnx, onnxruntime, numpy, pytest; nothing from the course's utils), so it can be
copied into a project as it is. It exports the model once, then checks:

- the artifact's opset and IR version are the pinned ones (what the serving fleet's ONNX Runtime reads);
- the ONNX checker (full check) and strict shape inference pass;
- the batch axis is dynamic;
- ONNX Runtime matches eager PyTorch on a fixed, seeded input set within stated atol/rtol;
- size and latency budgets hold. The latency budget is relative to eager PyTorch measured in the same run (machines
  differ; a ratio travels).

Every failure message names the budget that broke, the measured value and the limit. WORKBOOK_GATE_BUDGETS (JSON)
overrides budgets, e.g. WORKBOOK_GATE_BUDGETS='{"latency_vs_eager": 0.01}' to see the gate fail.
"""

import json
import os
import statistics
import time

import numpy as np
import pytest
import torch

OPSET, IR_VERSION = 17, 8
BUDGETS = {
    "parity_atol": 1e-4,  # |ort - eager| <= atol + rtol * |eager|, elementwise, on every fixed input
    "parity_rtol": 1e-3,
    "size_over_fp32_params": 1.25,  # file bytes / (4 bytes x parameter count): catches duplicated weights
    "latency_vs_eager": 1.5,  # median over interleaved pairs of ONNX Runtime latency / eager PyTorch latency, batch 8
}
BUDGETS.update(json.loads(os.environ.get("WORKBOOK_GATE_BUDGETS", "{}")))
FIXED_BATCHES = (1, 3, 8)  # the fixed input set: seeded, so every CI run checks the same numbers


def within_budget(name: str, measured: float, limit: float, unit: str = "") -> None:
    """Fail with a message naming the budget when `measured` exceeds `limit`."""
    if not np.isfinite(measured):
        raise AssertionError(f"budget {name!r} cannot be checked: measured value is {measured}")
    if measured > limit:
        raise AssertionError(f"budget {name!r} broken: measured {measured:.4g}{unit} > limit {limit:.4g}{unit}")


def build_model() -> torch.nn.Module:
    """The model under the gate (in a real project: load your checkpoint here)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import onnx

    model = build_model()
    path = tmp_path_factory.mktemp("gate") / "model.onnx"
    torch.onnx.export(model, (torch.randn(2, 3, 32, 32),), str(path), dynamo=False, opset_version=OPSET,
                      input_names=["images"], output_names=["logits"],
                      dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}})
    proto = onnx.load(str(path))
    if proto.ir_version > IR_VERSION:  # pin the IR version the fleet reads (newer onnx writes newer by default)
        proto.ir_version = IR_VERSION
        onnx.save(proto, str(path))
    return model, path


@pytest.fixture(scope="module")
def session(exported):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    return ort.InferenceSession(str(exported[1]), so, providers=["CPUExecutionProvider"])


def test_opset_and_ir_version_pinned(exported):
    import onnx

    proto = onnx.load(str(exported[1]))
    opset = {o.domain: o.version for o in proto.opset_import}.get("", None)
    assert opset == OPSET, f"pinned opset {OPSET}, the artifact declares {opset}"
    assert proto.ir_version == IR_VERSION, f"pinned IR version {IR_VERSION}, the artifact has {proto.ir_version}"


def test_checker_and_strict_shape_inference(exported):
    import onnx

    onnx.checker.check_model(str(exported[1]), full_check=True)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(exported[1])), check_type=True, strict_mode=True)
    out_dims = [d.dim_param or d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim]
    assert out_dims == ["batch", 10], f"output shape {out_dims}, expected ['batch', 10]"


def test_parity_on_fixed_inputs(exported, session):
    model = exported[0]
    worst = 0.0
    for b in FIXED_BATCHES:
        x = torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(b))
        with torch.inference_mode():
            ref = model(x).numpy()
        got = session.run(None, {"images": x.numpy()})[0]
        assert got.shape == ref.shape, f"batch {b}: ONNX Runtime returned {got.shape}, PyTorch {ref.shape}"
        excess = np.abs(got - ref) - BUDGETS["parity_rtol"] * np.abs(ref)
        worst = max(worst, float(excess.max()))
    within_budget("parity_atol", worst, BUDGETS["parity_atol"])


def test_size_budget(exported):
    params = sum(p.numel() for p in exported[0].parameters())
    within_budget("size_over_fp32_params", os.path.getsize(exported[1]) / (4 * params),
                  BUDGETS["size_over_fp32_params"], "x")


def test_latency_budget(exported, session):
    model, x = exported[0], torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    x_np = x.numpy()

    def once_s(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def eager():
        with torch.inference_mode():
            return model(x)

    def ort():
        return session.run(None, {"images": x_np})

    eager(), ort()  # warm-up
    # interleaved pairs, the order alternating: a machine that slows down for a while slows both sides of a pair, so
    # the median of the per-pair ratios measures the runtimes, not the moment each was timed
    ratios = []
    for i in range(30):
        first, second = (eager, ort) if i % 2 == 0 else (ort, eager)
        a, b = once_s(first), once_s(second)
        eager_s, ort_s = (a, b) if first is eager else (b, a)
        ratios.append(ort_s / eager_s)
    within_budget("latency_vs_eager", statistics.median(ratios), BUDGETS["latency_vs_eager"], "x")
