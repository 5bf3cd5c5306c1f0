"""Lesson 04's ONNX graph work: inspection (op histogram, node count, checker + strict shape inference), ONNX
Runtime's graph optimizations saved to a file, static int8 calibration data, fp16 conversion for TensorRT, and the
instructor kit's warm-up. Export, sessions and parity are shared with lessons 01 and 05: utils.core.onnx_io.

Everything here imports torch / onnx / onnxruntime inside the functions, so importing the module is free.
"""

from __future__ import annotations

import collections
from pathlib import Path

from utils.core.onnx_io import as_path, export_model, ort_session, parity, to_numpy

__all__ = ["load_model", "op_histogram", "node_count", "optimized_graph", "check_model", "calibration_reader", "to_fp16",
           "warmup"]

# ---------------------------------------------------------------------------------------------------------------------
# graph inspection
# ---------------------------------------------------------------------------------------------------------------------


def load_model(model):
    """An onnx.ModelProto as is, or the model at a path loaded without its external data (lesson 04)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    p = as_path(model, "model")
    if not p.is_file():
        raise FileNotFoundError(f"ONNX model {p} does not exist")
    return onnx.load(str(p), load_external_data=False)


def op_histogram(model) -> collections.Counter:
    """Counter of op types in the main graph of an ONNX model or path (lesson 04). Custom domains show as domain::Op."""
    graph = load_model(model).graph
    return collections.Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                               for n in graph.node)


def node_count(model) -> int:
    """Number of nodes in the main graph (lesson 04)."""
    return len(load_model(model).graph.node)


def optimized_graph(path, out_path, *, level: str = "all", threads: int | None = 1):
    """Let ONNX Runtime optimize `path` at `level` and save the result to out_path; returns the onnx.ModelProto
    (lesson 04). Note that level "all" includes CPU-specific layout changes (NCHWc), so the saved graph is tied to
    this machine's execution provider."""
    import onnx

    out_path = as_path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ort_session(path, threads=threads, level=level, optimized_path=out_path)
    return onnx.load(str(out_path), load_external_data=False)


def check_model(path, *, full_check: bool = True, strict: bool = True):
    """onnx.checker.check_model(full_check) plus strict shape inference; returns the inferred ModelProto (lesson 04).

    Pass the path (not a loaded proto) so models with external data over 2 GB are checked from disk.
    """
    import onnx

    p = as_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"ONNX model {p} does not exist")
    onnx.checker.check_model(str(p), full_check=full_check)
    model = onnx.load(str(p))
    return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=strict, data_prop=True)


# ---------------------------------------------------------------------------------------------------------------------
# quantization and precision
# ---------------------------------------------------------------------------------------------------------------------


def calibration_reader(input_name: str, batches):
    """An onnxruntime.quantization CalibrationDataReader over a list of numpy/torch batches (lesson 04).

    quantize_static runs these batches through the fp32 model to choose activation ranges: they should look like real
    inputs (same preprocessing), and a few hundred samples are usually enough.
    """
    from onnxruntime.quantization import CalibrationDataReader

    batches = [to_numpy(b) for b in batches]
    if not batches:
        raise ValueError("calibration needs at least one batch of inputs")

    class _Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(batches)

        def get_next(self):
            batch = next(self._it, None)
            return None if batch is None else {input_name: batch}

        def rewind(self):
            self._it = iter(batches)

    return _Reader()


def to_fp16(path, out_path, *, keep_io_types: bool = True) -> Path:
    """Convert an fp32 ONNX model to fp16 weights and compute (inputs/outputs stay fp32 by default) (lesson 04).

    Uses ONNX Runtime's float16 converter: a blanket conversion of every op, not ModelOpt AutoCast's accuracy-aware
    mixed precision (which keeps sensitive ops in fp32), the route NVIDIA documents for TensorRT 11's strongly typed
    builds. On a CPU, ONNX Runtime runs the result too (slowly: CPUs have few fp16 kernels), so its accuracy can be
    checked before a GPU is involved.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = as_path(path)
    if not src.is_file():
        raise FileNotFoundError(f"ONNX model {src} does not exist")
    model = onnx.load(str(src))
    half = convert_float_to_float16(model, keep_io_types=keep_io_types, disable_shape_infer=False)
    out = as_path(out_path, "out_path")
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(half, str(out))
    return out


def warmup() -> str:
    """Instructor-kit hook (`make warmup`, utils.course.warmup): pay the first-use costs of lesson 04 once (lesson 04).

    Imports ONNX Runtime's transformer optimizer and quantizer and runs both exporters on a tiny model, so the first
    export in the lesson does not also pay for importing onnxscript and torch.export's machinery.
    """
    import tempfile
    import time

    import torch

    t0 = time.perf_counter()
    import onnxruntime.quantization  # noqa: F401
    import onnxruntime.transformers.optimizer  # noqa: F401

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    with tempfile.TemporaryDirectory() as tmp:
        for dynamo in (False, True):
            path = export_model(model, (torch.randn(2, 4),), Path(tmp) / f"tiny_{dynamo}.onnx", input_names=["x"],
                                output_names=["y"], dynamo=dynamo)
            parity(model, ort_session(path), torch.randn(2, 4))
    return f"both exporters and ONNX Runtime's optimizer/quantizer warmed up in {time.perf_counter() - t0:.1f} s"
