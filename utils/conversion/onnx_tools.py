"""ONNX export, ONNX Runtime sessions, parity checks, graph inspection and quantization helpers (lesson 04; lesson 05
reuses export_minilm and ort_session).

Everything here imports torch / onnx / onnxruntime inside the functions, so importing the module is free.

- export_minilm: MiniLM (BERT) -> ONNX with dynamic batch and sequence axes (signature kept stable for lesson 05)
- export_model: any torch module -> ONNX (legacy or torch.export-based exporter), quietly
- ort_session: an ONNX Runtime InferenceSession with the optimization level, threads and providers stated
- parity: eager PyTorch vs ONNX Runtime on the same inputs, max abs error, a clear error out of tolerance
- check_model, op_histogram, node_count, optimized_graph, onnx_size_bytes: graph inspection
- calibration_reader, to_fp16: static int8 calibration data; fp16 ONNX for TensorRT 11 (utils.conversion.trt)
- warmup: the instructor kit's hook (utils.course.warmup)
"""

from __future__ import annotations

import collections
import contextlib
import os
from pathlib import Path

__all__ = [
    "MINILM_INPUTS",
    "export_minilm",
    "export_model",
    "ort_session",
    "parity",
    "ParityError",
    "op_histogram",
    "node_count",
    "optimized_graph",
    "onnx_size_bytes",
    "check_model",
    "minilm_inputs",
    "calibration_reader",
    "to_fp16",
    "warmup",
]

MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

_LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",  # only in newer ORT; checked at run time
    "all": "ORT_ENABLE_ALL",
}


class ParityError(AssertionError):
    """Raised by parity() when ONNX Runtime and the reference disagree beyond atol/rtol (lesson 04)."""


def _as_path(path, what: str = "path") -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    return Path(path)


def minilm_inputs(tokenizer, texts, *, max_length: int | None = None) -> dict:
    """Tokenize `texts` for MiniLM as int64 torch tensors with the three BERT inputs (lessons 04-05)."""
    if isinstance(texts, str):
        texts = [texts]
    if not texts:
        raise ValueError("minilm_inputs needs at least one text")
    kwargs = {"padding": True, "return_tensors": "pt"}
    if max_length is not None:
        kwargs.update(truncation=True, max_length=max_length)
    enc = tokenizer(list(texts), **kwargs)
    if "token_type_ids" not in enc:
        import torch

        enc["token_type_ids"] = torch.zeros_like(enc["input_ids"])
    return {k: enc[k].long() for k in MINILM_INPUTS}


def _last_hidden(model):
    """Wrap a Hugging Face encoder so that it takes the three BERT inputs positionally and returns last_hidden_state."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out[0] if isinstance(out, tuple) else out.last_hidden_state

    return LastHidden(model).eval()


def export_minilm(path, *, opset: int = 17, dynamo: bool = False, model=None) -> Path:
    """Export MiniLM (utils.core.models.minilm, eager attention) to ONNX and return the .onnx path (lessons 04, 05).

    Inputs input_ids, attention_mask, token_type_ids (int64, shape [batch, sequence], both axes dynamic); output
    last_hidden_state [batch, sequence, 384]. dynamo=False uses the legacy TorchScript-based exporter, whose graph ONNX
    Runtime's transformer optimizer can fuse into Attention nodes; dynamo=True uses the torch.export-based exporter
    (weights go to an external <name>.onnx.data file next to the .onnx). `model` overrides the loaded encoder.
    """
    import torch

    path = _as_path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"export_minilm writes an .onnx file, got {str(path)!r}")
    if not isinstance(opset, int) or not 9 <= opset <= 23:
        raise ValueError(f"opset must be an int between 9 and 23, got {opset!r}")
    if model is None:
        from utils.core.models import minilm

        _, model = minilm(attn_implementation="eager")
    wrapped = _last_hidden(model)
    batch, seq = 2, 16
    gen = torch.Generator().manual_seed(0)
    example = (
        torch.randint(1000, 2000, (batch, seq), generator=gen, dtype=torch.int64),
        torch.ones(batch, seq, dtype=torch.int64),
        torch.zeros(batch, seq, dtype=torch.int64),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if dynamo:
        b = torch.export.Dim("batch", min=1, max=1024)
        s = torch.export.Dim("sequence", min=2, max=512)
        shapes = {name: {0: b, 1: s} for name in MINILM_INPUTS}
        kwargs = {"dynamic_shapes": shapes}
    else:
        axes = {name: {0: "batch", 1: "sequence"} for name in MINILM_INPUTS}
        axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
        kwargs = {"dynamic_axes": axes}
    export_model(wrapped, example, path, input_names=list(MINILM_INPUTS), output_names=["last_hidden_state"],
                 opset=opset, dynamo=dynamo, **kwargs)
    return path


@contextlib.contextmanager
def _fds_captured():
    """Send file descriptors 1 and 2 to a temporary file for the duration: the legacy exporter's C++ log (its "Torch
    IR graph at exception" dump, switched on by a torch bug) writes there, around Python's sys.stdout/stderr."""
    import sys
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as tmp:
        for fd in saved:
            os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            for fd, dup in saved.items():
                os.dup2(dup, fd)
                os.close(dup)


def export_model(model, example_inputs, path, *, input_names, output_names, opset: int = 17, dynamo: bool = False,
                 dynamic_axes: dict | None = None, dynamic_shapes=None, **export_kwargs) -> Path:
    """torch.onnx.export with the course's defaults, quiet, returning the path (lesson 04).

    dynamo=False: the legacy exporter (TorchScript tracing), dynamic axes given by `dynamic_axes` {name: {axis: label}}.
    dynamo=True: the torch.export-based exporter, dynamic axes given by `dynamic_shapes` (torch.export.Dim objects).
    It implements opset 18 and newer; a lower `opset` is raised to 18 (onnx's down-converter fails on many graphs).
    Other keyword arguments go to torch.onnx.export (e.g. custom_translation_table, do_constant_folding). The
    exporter's progress messages are captured and shown only when it writes no file.
    """
    import io
    import warnings

    import torch

    path = _as_path(path)
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in (path, path.with_name(path.name + ".data")):
        if stale.exists():
            stale.unlink()
    if dynamo:
        opset = max(opset, 18)
    kwargs = dict(input_names=list(input_names), output_names=list(output_names), opset_version=opset, dynamo=dynamo)
    if dynamo:
        if dynamic_shapes is not None:
            kwargs["dynamic_shapes"] = dynamic_shapes
        kwargs["verbose"] = False
    elif dynamic_axes is not None:
        kwargs["dynamic_axes"] = dynamic_axes
    kwargs.update(export_kwargs)
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), _fds_captured(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, example_inputs, str(path), **kwargs)
    if not path.is_file():
        raise RuntimeError(
            f"torch.onnx.export finished but wrote no file at {path}; exporter output:\n{sink.getvalue()}")
    return path


def ort_session(path, *, threads: int | None = None, level: str = "all", providers=None, optimized_path=None):
    """An onnxruntime.InferenceSession for `path` (lessons 04, 05).

    level: "disabled", "basic", "extended", "layout" or "all" (graph optimization level; "all" includes the others).
    threads: intra-op threads (None = ORT's default, one per physical core); inter-op is 1 and execution sequential.
    providers: e.g. ["CUDAExecutionProvider", "CPUExecutionProvider"]; default CPU only. optimized_path: where ORT
    writes the graph after its optimizations.
    """
    import onnxruntime as ort

    if isinstance(path, (bytes, bytearray)):
        model = bytes(path)
    else:
        p = _as_path(path)
        if not p.is_file():
            raise FileNotFoundError(f"ONNX model {p} does not exist; export it first (utils.conversion.onnx_tools.export_minilm)")
        model = str(p)
    if level not in _LEVELS or not hasattr(ort.GraphOptimizationLevel, _LEVELS[level]):
        valid = [k for k, v in _LEVELS.items() if hasattr(ort.GraphOptimizationLevel, v)]
        raise ValueError(f"level must be one of {valid}, got {level!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[level])
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    if threads is not None:
        opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    if optimized_path is not None:
        opts.optimized_model_filepath = str(optimized_path)
    if providers is None:
        providers = ["CPUExecutionProvider"]
    available = set(ort.get_available_providers())
    names = [p[0] if isinstance(p, tuple) else p for p in providers]
    missing = [n for n in names if n not in available]
    if missing:
        raise ValueError(f"execution provider(s) {missing} are not available in this onnxruntime; available: "
                         f"{sorted(available)}")
    return ort.InferenceSession(model, sess_options=opts, providers=list(providers))


def _to_numpy(x):
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    import numpy as np

    return np.asarray(x)


def _feeds(session, inputs) -> dict:
    names = [i.name for i in session.get_inputs()]
    if isinstance(inputs, dict):
        unknown = set(inputs) - set(names)
        missing = set(names) - set(inputs)
        if unknown or missing:
            raise ValueError(f"inputs do not match the ONNX graph: graph expects {names}, got {sorted(inputs)}")
        return {k: _to_numpy(v) for k, v in inputs.items()}
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    if len(inputs) != len(names):
        raise ValueError(f"the ONNX graph expects {len(names)} inputs {names}, got {len(inputs)}")
    return {n: _to_numpy(v) for n, v in zip(names, inputs, strict=True)}


def parity(torch_fn, ort_session, inputs, atol: float = 1e-4, rtol: float = 1e-3) -> float:
    """Run `torch_fn` and the ONNX Runtime session on the same inputs; return the max abs error (lessons 04, 05).

    `inputs` is one sample (a tensor, a tuple of tensors in graph-input order, or a dict by input name) or a list of
    such samples (each checked). torch_fn gets the sample as positional args (or **kwargs for a dict). Only the first
    output is compared unless torch_fn returns a tuple/list. Raises ParityError naming the worst element when any
    |ort - ref| > atol + rtol * |ref| (numpy.allclose semantics).
    """
    import numpy as np
    import torch

    if atol < 0 or rtol < 0:
        raise ValueError(f"atol and rtol must be >= 0, got atol={atol}, rtol={rtol}")
    samples = inputs if isinstance(inputs, list) else [inputs]
    if not samples:
        raise ValueError("parity needs at least one input sample")
    worst = 0.0
    for i, sample in enumerate(samples):
        feeds = _feeds(ort_session, sample)
        with torch.inference_mode():
            if isinstance(sample, dict):
                ref = torch_fn(**sample)
            elif isinstance(sample, (tuple, list)):
                ref = torch_fn(*sample)
            else:
                ref = torch_fn(sample)
        if hasattr(ref, "last_hidden_state"):
            ref = ref.last_hidden_state
        refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        outs = ort_session.run(None, feeds)
        if len(outs) < len(refs):
            raise ParityError(f"the reference returned {len(refs)} outputs but the ONNX graph has {len(outs)}")
        for j, (r, o) in enumerate(zip(refs, outs[: len(refs)], strict=True)):
            r = _to_numpy(r).astype(np.float64)
            o = np.asarray(o).astype(np.float64)
            if r.shape != o.shape:
                raise ParityError(
                    f"sample {i} output {j}: shape mismatch, reference {r.shape} vs ONNX Runtime {o.shape}")
            err = np.abs(r - o)
            excess = err - (atol + rtol * np.abs(r))
            worst = max(worst, float(err.max()) if err.size else 0.0)
            if err.size and excess.max() > 0:
                k = np.unravel_index(int(np.argmax(excess)), err.shape)
                raise ParityError(
                    f"parity failed on sample {i} output {j} (shape {tuple(r.shape)}): "
                    f"at index {tuple(int(x) for x in k)}"
                    f" reference {r[k]:.6g} vs ONNX Runtime {o[k]:.6g}, |diff| {err[k]:.3g} > atol {atol:g} + rtol "
                    f"{rtol:g} * |ref|; max abs error {err.max():.3g}. Check the export (dtype, dynamic axes, "
                    f"eval mode) or loosen the tolerance deliberately."
                )
    return worst


# ---------------------------------------------------------------------------------------------------------------------
# graph inspection
# ---------------------------------------------------------------------------------------------------------------------


def _load(model):
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    p = _as_path(model, "model")
    if not p.is_file():
        raise FileNotFoundError(f"ONNX model {p} does not exist")
    return onnx.load(str(p), load_external_data=False)


def op_histogram(model) -> collections.Counter:
    """Counter of op types in the main graph of an ONNX model or path (lesson 04). Custom domains show as domain::Op."""
    graph = _load(model).graph
    return collections.Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                               for n in graph.node)


def node_count(model) -> int:
    """Number of nodes in the main graph (lesson 04)."""
    return len(_load(model).graph.node)


def optimized_graph(path, out_path, *, level: str = "all", threads: int | None = 1):
    """Let ONNX Runtime optimize `path` at `level` and save the result to out_path; returns the onnx.ModelProto
    (lesson 04). Note that level "all" includes CPU-specific layout changes (NCHWc), so the saved graph is tied to
    this machine's execution provider."""
    import onnx

    out_path = _as_path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ort_session(path, threads=threads, level=level, optimized_path=out_path)
    return onnx.load(str(out_path), load_external_data=False)


def onnx_size_bytes(path) -> int:
    """Bytes on disk of an ONNX model including its external data file(s) (lesson 04)."""
    import onnx

    p = _as_path(path)
    if not p.is_file():
        raise FileNotFoundError(f"ONNX model {p} does not exist")
    total = p.stat().st_size
    model = onnx.load(str(p), load_external_data=False)
    locations = set()
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for entry in t.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    for loc in locations:
        f = p.parent / loc
        if f.is_file():
            total += f.stat().st_size
    return total


def check_model(path, *, full_check: bool = True, strict: bool = True):
    """onnx.checker.check_model(full_check) plus strict shape inference; returns the inferred ModelProto (lesson 04).

    Pass the path (not a loaded proto) so models with external data over 2 GB are checked from disk.
    """
    import onnx

    p = _as_path(path)
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

    batches = [_to_numpy(b) for b in batches]
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

    Uses ONNX Runtime's float16 converter. TensorRT 11 builds strongly typed networks only, so its fp16 engines start
    from such a file; on a CPU, ONNX Runtime runs it too (slowly: CPUs have few fp16 kernels), which lets you check
    its accuracy here.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    src = _as_path(path)
    if not src.is_file():
        raise FileNotFoundError(f"ONNX model {src} does not exist")
    model = onnx.load(str(src))
    half = convert_float_to_float16(model, keep_io_types=keep_io_types, disable_shape_infer=False)
    out = _as_path(out_path, "out_path")
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
