"""Activation ranges chosen by ONNX Runtime's calibrators (lesson 04, part 3, section 2).

Static quantization must fix each activation's range before it sees real traffic: it runs calibration batches through
the float model and summarises every tensor's values. MinMax keeps the extremes; Percentile cuts a share of the
histogram's tails; Entropy picks the threshold whose quantized histogram stays closest (KL divergence) to the float one
(TensorRT's method: a 2048-bin histogram folded into 128 quantized bins). These helpers call onnxruntime.quantization,
hand the ranges to quantize_static through its calibration cache, and quiet its progress prints.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import numpy as np
import torch

from utils.conversion.onnx_tools import calibration_reader

__all__ = ["METHODS", "OPTIONS", "tensors_data", "ranges", "quantize_static_with", "with_glitches"]

METHODS = ("MinMax", "Percentile", "Entropy")
# ORT's Entropy default (128 bins folded into 128 quantized bins) leaves a single candidate threshold, the full range,
# so it cannot clip anything; TensorRT's histogram has 2048 bins.
OPTIONS = {"MinMax": {}, "Percentile": {"percentile": 99.9, "num_bins": 2048},
           "Entropy": {"num_bins": 2048, "num_quantized_bins": 128}}


def _method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    if name not in METHODS:
        raise ValueError(f"unknown calibration method {name!r}; expected one of {METHODS}")
    return CalibrationMethod[name]


@contextlib.contextmanager
def _quiet():
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)  # the quantizer's "consider pre-processing" advice and per-tensor notes
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def tensors_data(model_path: Path, input_name: str, batches, method: str, *, workdir: Path, **options):
    """ONNX Runtime's TensorsData: the range `method` picks for every float tensor of the model from `batches`.
    `options` override OPTIONS[method] (e.g. percentile=99.99, num_bins=128)."""
    from onnxruntime.quantization.calibrate import create_calibrator

    calibrate_method = _method(method)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with _quiet():
        cal = create_calibrator(Path(model_path), None, augmented_model_path=str(workdir / f"augmented_{method}.onnx"),
                                calibrate_method=calibrate_method,
                                extra_options={"symmetric": False, **OPTIONS[method], **options})
        cal.collect_data(calibration_reader(input_name, batches))
        return cal.compute_data()


def ranges(data) -> dict[str, tuple[float, float]]:
    """{tensor name: (low, high)} from a TensorsData (tensors_data)."""
    def scalar(v) -> float:  # ORT returns 0-d or one-element arrays depending on the version
        return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])

    return {name: (scalar(t.range_value[0]), scalar(t.range_value[1])) for name, t in data.items()}


def quantize_static_with(model_path: Path, out_path: Path, data, *, workdir: Path, reduce_range: bool = False) -> Path:
    """ONNX Runtime static int8 (QDQ; weights int8 per channel, activations uint8) with the ranges in `data` (a
    TensorsData from tensors_data), handed to quantize_static as its calibration cache. reduce_range=True quantizes
    the weights to 7 bits, which ONNX Runtime advises on x86 CPUs without VNNI: its u8 x s8 kernel there sums pairs of
    products in saturating int16 (lesson 04 part 3 reads the CPU's flags to decide)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import save_tensors_data

    method = data.calibration_method
    cache = Path(workdir) / f"ranges_{method.name}.json"
    cache.unlink(missing_ok=True)
    save_tensors_data(data, cache)
    with _quiet():
        quantize_static(str(model_path), str(out_path), None, quant_format=QuantFormat.QDQ, per_channel=True,
                        weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8, calibrate_method=method,
                        calibration_cache_path=cache, reduce_range=reduce_range)
    return Path(out_path)


def with_glitches(X: torch.Tensor, n: int, value: float, seed: int = 0) -> torch.Tensor:
    """A copy of X with `n` single values (random rows and features) set to `value`: a sensor glitch, a corrupted
    record, the rare outlier a calibration set picks up."""
    if n < 0 or n > X.numel():
        raise ValueError(f"n must be in [0, {X.numel()}], got {n}")
    out = X.clone()
    gen = torch.Generator().manual_seed(seed)
    out.view(-1)[torch.randperm(X.numel(), generator=gen)[:n]] = value
    return out
