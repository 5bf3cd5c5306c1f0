"""TensorRT from ONNX: build an engine, inspect its fused layers, run it; the equivalent trtexec command (lesson 04).

TensorRT comes only from NVIDIA's package index and needs an NVIDIA GPU, so lesson 04 calls these functions inside
``if sections.requires("tensorrt", section="04.tensorrt"):``. Every function that needs TensorRT imports it inside and
raises a clear error when it is missing; trtexec_command() and fusion_summary() are plain Python and run anywhere.

Written against the documented TensorRT Python API (10.x, and 11.x where strong typing is the only mode):
``Builder`` -> ``create_network`` -> ``OnnxParser.parse`` -> ``create_optimization_profile`` (min/opt/max shapes of the
dynamic batch) -> ``BuilderConfig`` (fp16 flag on 10.x; 11.x removed every precision flag and builds strongly typed
networks only, so the ONNX file itself must carry fp16 (ModelOpt AutoCast) or int8 Q/DQ pairs: see build_recipe()) ->
``build_serialized_network`` -> ``Runtime.deserialize_cuda_engine`` -> ``create_engine_inspector``. Not yet verified
on a GPU: the CPU-only machines this course was written on cannot run it.
"""

from __future__ import annotations

import collections
import json
import os
import shlex
from pathlib import Path

__all__ = [
    "TensorRTMissing",
    "require_tensorrt",
    "trtexec_command",
    "build_recipe",
    "build_engine",
    "load_engine",
    "engine_layers",
    "fusion_summary",
    "TrtRunner",
    "ort_tensorrt_providers",
]


class TensorRTMissing(RuntimeError):
    """TensorRT (or the GPU it needs) is not available here (lesson 04)."""


def require_tensorrt():
    """Import and return the tensorrt module, or raise TensorRTMissing saying how to get it (lesson 04)."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise TensorRTMissing(
            "TensorRT is not installed: it comes from NVIDIA's index (pip install --extra-index-url "
            "https://pypi.nvidia.com tensorrt) and needs an NVIDIA GPU; lesson 04 skips its TensorRT section here"
        ) from exc
    return trt


def _shape_text(shape) -> str:
    return "x".join(str(int(d)) for d in shape)


def trtexec_command(onnx_path, engine_path, *, input_name: str, sample_shape, min_batch: int = 1, opt_batch: int = 8,
                    max_batch: int = 32, fp16: bool = True, verbose: bool = False, trt_major: int = 10,
                    strongly_typed: bool = False) -> str:
    """The trtexec command line that builds the same engine as build_engine() (lesson 04).

    sample_shape is one sample's shape without the batch axis, e.g. (3, 224, 224). On TensorRT 10.x (`trt_major`
    10) fp16 adds --fp16 (weak typing: TensorRT may pick fp16 kernels) and strongly_typed adds --stronglyTyped (the
    file's own types decide, e.g. a QDQ int8 file). TensorRT 11.x removed every precision flag (--fp16, --int8,
    --best) and always builds strongly typed: the precision must already be in the ONNX file (build_recipe()).
    """
    if trt_major not in (10, 11):
        raise ValueError(f"trt_major is the TensorRT major version the command is for, 10 or 11; got {trt_major}")
    if not (1 <= min_batch <= opt_batch <= max_batch):
        raise ValueError(f"need 1 <= min_batch <= opt_batch <= max_batch, got {min_batch}, {opt_batch}, {max_batch}")
    if not input_name:
        raise ValueError("input_name is the ONNX graph input to give the optimization profile, e.g. 'images'")
    dims = [int(d) for d in sample_shape]
    if not dims or any(d < 1 for d in dims):
        raise ValueError(
            f"sample_shape must be positive dims without the batch axis, e.g. (3, 224, 224); got {sample_shape}")

    def shp(b):
        return f"{input_name}:{_shape_text([b, *dims])}"

    parts = [
        "trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}",
        f"--minShapes={shp(min_batch)}", f"--optShapes={shp(opt_batch)}", f"--maxShapes={shp(max_batch)}",
        "--profilingVerbosity=detailed", f"--exportLayerInfo={Path(str(engine_path)).with_suffix('.layers.json')}",
    ]
    if trt_major == 10 and fp16:
        parts.append("--fp16")
    if trt_major == 10 and strongly_typed:
        parts.append("--stronglyTyped")
    if verbose:
        parts.append("--verbose")
    return " ".join(shlex.quote(p) for p in parts)


def build_recipe(onnx_path, engine_path, *, precision: str, trt_major: int, input_name: str, sample_shape,
                 **shapes) -> list[str]:
    """The shell commands that build a `precision` ("fp32", "fp16" or "int8") engine on TensorRT `trt_major` (lesson 04).

    - fp16 on 10.x: trtexec --fp16. On 11.x the flag is gone: ModelOpt AutoCast writes a mixed-precision ONNX file
      first (`python -m modelopt.onnx.autocast`), then a plain (always strongly typed) build.
    - int8 on both: explicit quantization. The ONNX file must carry QuantizeLinear/DequantizeLinear pairs (ModelOpt's
      `python -m modelopt.onnx.quantization --quantize_mode int8`, or ONNX Runtime's quantize_static with QDQ format);
      10.x builds it with --stronglyTyped, 11.x as is. The implicit-calibration path (--int8 --calib) is gone in 11.x.
    `shapes`: min_batch / opt_batch / max_batch, as for trtexec_command().
    """
    if precision not in ("fp32", "fp16", "int8"):
        raise ValueError(f"precision is 'fp32', 'fp16' or 'int8', got {precision!r}")
    onnx_path, engine_path = Path(str(onnx_path)), Path(str(engine_path))
    steps, source = [], onnx_path
    if precision == "fp16" and trt_major >= 11:
        source = onnx_path.with_name(onnx_path.stem + "_fp16.onnx")
        steps.append(" ".join(shlex.quote(p) for p in ("python", "-m", "modelopt.onnx.autocast",
                                                          f"--onnx_path={onnx_path}", f"--output_path={source}")))
    elif precision == "int8":
        source = onnx_path.with_name(onnx_path.stem + "_int8_qdq.onnx")
        steps.append(" ".join(shlex.quote(p) for p in (
            "python", "-m", "modelopt.onnx.quantization", f"--onnx_path={onnx_path}", "--quantize_mode=int8",
            "--calibration_data=calib.npy", "--calibration_method=max", f"--output_path={source}")))
    steps.append(trtexec_command(source, engine_path, input_name=input_name, sample_shape=sample_shape,
                                 fp16=precision == "fp16", strongly_typed=precision == "int8",
                                 trt_major=min(trt_major, 11), **shapes))
    return steps


def build_engine(onnx_path, engine_path, *, input_name: str, sample_shape, min_batch: int = 1, opt_batch: int = 8,
                 max_batch: int = 32, fp16: bool = True, workspace_gib: float = 2.0) -> Path:
    """Parse an ONNX file and build a serialized TensorRT engine with one optimization profile (lesson 04).

    The profile covers batch sizes min_batch..max_batch and is tuned for opt_batch. fp16 enables half-precision kernels
    (BuilderFlag.FP16 on TensorRT 10.x; on 11.x the flag no longer exists: give it an fp16 ONNX file, from ModelOpt
    AutoCast in production or utils.conversion.onnx_tools.to_fp16 for a quick blanket conversion). Builds with detailed profiling verbosity so the engine inspector can show fused layers.
    """
    trt = require_tensorrt()
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"ONNX file {onnx_path} does not exist")
    if not (1 <= min_batch <= opt_batch <= max_batch):
        raise ValueError(f"need 1 <= min_batch <= opt_batch <= max_batch, got {min_batch}, {opt_batch}, {max_batch}")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode since TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser rejected {onnx_path}:\n{errors}")
    inputs = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    if input_name not in inputs:
        raise ValueError(f"the network has inputs {sorted(inputs)}, not {input_name!r}")
    dims = [int(d) for d in sample_shape]
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * 2**30))
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if fp16 and hasattr(trt.BuilderFlag, "FP16"):
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    profile.set_shape(input_name, [min_batch, *dims], [opt_batch, *dims], [max_batch, *dims])
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT could not build an engine from {onnx_path}; rerun with trtexec --verbose")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    engine_path.write_bytes(bytes(serialized))
    return engine_path


def load_engine(engine_path):
    """Deserialize an engine file (lesson 04)."""
    trt = require_tensorrt()
    engine_path = Path(engine_path)
    if not engine_path.is_file():
        raise FileNotFoundError(f"engine file {engine_path} does not exist; build it with build_engine()")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise RuntimeError(f"{engine_path} does not deserialize: built by another TensorRT version or GPU?")
    return engine


def engine_layers(engine) -> list[dict]:
    """The engine's layers from the engine inspector as dicts with at least 'Name' (lesson 04)."""
    trt = require_tensorrt()
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    layers = info.get("Layers", [])
    return [layer if isinstance(layer, dict) else {"Name": str(layer)} for layer in layers]


def fusion_summary(layers) -> dict:
    """Count layer types and the layers TensorRT fused from several ONNX nodes (names joined by ' + ') (lesson 04).

    Takes the dicts from engine_layers() or trtexec's --exportLayerInfo JSON "Layers" list.
    """
    if isinstance(layers, dict):
        layers = layers.get("Layers", [])
    layers = [x if isinstance(x, dict) else {"Name": str(x)} for x in layers]
    types = collections.Counter(str(x.get("LayerType", "unknown")) for x in layers)
    fused = [x["Name"] for x in layers if " + " in str(x.get("Name", ""))]
    return {"layers": len(layers), "types": dict(types), "fused_layers": len(fused), "fused_examples": fused[:5]}


class TrtRunner:
    """Run a TensorRT engine on torch CUDA tensors with the name-based tensor API (TensorRT 10+, lesson 04)."""

    def __init__(self, engine):
        trt = require_tensorrt()
        import torch

        if not torch.cuda.is_available():
            raise TensorRTMissing("running a TensorRT engine needs a CUDA GPU; torch sees none")
        self.trt, self.torch, self.engine = trt, torch, engine
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]

    def _torch_dtype(self, name):
        import numpy as np

        np_dtype = np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name)))
        return {np.dtype("float32"): self.torch.float32, np.dtype("float16"): self.torch.float16,
                np.dtype("int32"): self.torch.int32, np.dtype("int64"): self.torch.int64,
                np.dtype("int8"): self.torch.int8, np.dtype("bool"): self.torch.bool}[np_dtype]

    def __call__(self, **feeds):
        torch = self.torch
        if set(feeds) != set(self.inputs):
            raise ValueError(f"the engine expects inputs {self.inputs}, got {sorted(feeds)}")
        keep = []
        for name, value in feeds.items():
            t = torch.as_tensor(value).to("cuda", self._torch_dtype(name)).contiguous()
            keep.append(t)
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        outs = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            outs[name] = torch.empty(shape, dtype=self._torch_dtype(name), device="cuda")
            self.context.set_tensor_address(name, outs[name].data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log above)")
        stream.synchronize()
        return outs


def ort_tensorrt_providers(cache_dir, *, fp16: bool = True) -> list:
    """Providers for ONNX Runtime's TensorRT execution provider with engine caching, CUDA and CPU fallback (lesson 04).

    Nodes TensorRT cannot take fall back to CUDA, then CPU: the same graph partitioning Triton's ONNX backend does.
    """
    cache_dir = Path(cache_dir)
    os.makedirs(cache_dir, exist_ok=True)
    return [
        ("TensorrtExecutionProvider", {
            "trt_fp16_enable": bool(fp16),
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache_dir),
        }),
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
