"""ONNX interchange the lessons share (lessons 01, 04, 05): export a torch model to ONNX, open an ONNX Runtime session
with its options stated, check parity against eager PyTorch, and count an ONNX file's bytes with its external data.

Everything imports torch / onnx / onnxruntime inside the functions, so importing the module is free. Lesson 04's own
subject (graph optimization, quantization, surgery, TensorRT) is utils.conversion.

- export_minilm: MiniLM (BERT) -> ONNX with dynamic batch and sequence axes (signature kept stable for lesson 05)
- export_model: any torch module -> ONNX (legacy or torch.export-based exporter), quietly
- ort_session: an ONNX Runtime InferenceSession with the optimization level, threads and providers stated
- parity: eager PyTorch vs ONNX Runtime on the same inputs, max abs error, a clear error out of tolerance
- onnx_size_bytes: bytes on disk including external data files
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from utils.core import env
from utils.core.models import minilm

__all__ = [
    "MINILM_INPUTS", "LEVELS", "ParityError", "minilm_inputs", "export_minilm", "export_model", "ort_session", "parity",
    "onnx_size_bytes", "as_path", "to_numpy",
]

MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",  # only in newer ORT; checked at run time
    "all": "ORT_ENABLE_ALL",
}


class ParityError(AssertionError):
    """Raised by parity() when ONNX Runtime and the reference disagree beyond atol/rtol (lesson 04)."""


def as_path(path, what: str = "path") -> Path:
    """`path` as a Path, or a TypeError that names what was expected (a str or os.PathLike)."""
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

    path = as_path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"export_minilm writes an .onnx file, got {str(path)!r}")
    if not isinstance(opset, int) or not 9 <= opset <= 23:
        raise ValueError(f"opset must be an int between 9 and 23, got {opset!r}")
    if model is None:
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
def native_logs_silenced():
    """Hide what C++ libraries write straight to file descriptors 1 and 2 while the block runs (lessons 01 and 04):
    TensorFlow's import-time CUDA probe (an E-level "failed call to cuInit" on machines without a GPU) and oneDNN
    notice, the TFLite converter's log. Python exceptions still propagate."""
    with _fds_captured():
        yield


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

    path = as_path(path)
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
    providers: e.g. ["CUDAExecutionProvider", "CPUExecutionProvider"]; default CPU only; "auto": those of
    CUDA and CPU that this onnxruntime lists (ort.get_available_providers()), CUDA only where a GPU is visible too.
    optimized_path: where ORT writes the graph after its optimizations.
    """
    import onnxruntime as ort

    if isinstance(path, (bytes, bytearray)):
        model = bytes(path)
    else:
        p = as_path(path)
        if not p.is_file():
            raise FileNotFoundError(f"ONNX model {p} does not exist; export it first (onnx_io.export_minilm or export_model)")
        model = str(p)
    if level not in LEVELS or not hasattr(ort.GraphOptimizationLevel, LEVELS[level]):
        valid = [k for k, v in LEVELS.items() if hasattr(ort.GraphOptimizationLevel, v)]
        raise ValueError(f"level must be one of {valid}, got {level!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    if threads is not None:
        opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    if optimized_path is not None:
        opts.optimized_model_filepath = str(optimized_path)
    available = set(ort.get_available_providers())
    if providers is None:
        providers = ["CPUExecutionProvider"]
    elif providers == "auto":
        providers = [*(["CUDAExecutionProvider"] if env.has("ort_cuda") else []), "CPUExecutionProvider"]
    names = [p[0] if isinstance(p, tuple) else p for p in providers]
    missing = [n for n in names if n not in available]
    if missing:
        hint = " (CUDAExecutionProvider comes with onnxruntime-gpu, installed in place of onnxruntime)" \
            if "CUDAExecutionProvider" in missing else ""
        raise ValueError(f"execution provider(s) {missing} are not available in this onnxruntime; available: "
                         f"{sorted(available)}{hint}")
    return ort.InferenceSession(model, sess_options=opts, providers=list(providers))


def to_numpy(x):
    """A tensor (any device) or array-like as a numpy array."""
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
        return {k: to_numpy(v) for k, v in inputs.items()}
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    if len(inputs) != len(names):
        raise ValueError(f"the ONNX graph expects {len(names)} inputs {names}, got {len(inputs)}")
    return {n: to_numpy(v) for n, v in zip(names, inputs, strict=True)}


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
            r = to_numpy(r).astype(np.float64)
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


def onnx_size_bytes(path) -> int:
    """Bytes on disk of an ONNX model including its external data file(s) (lesson 04)."""
    import onnx

    p = as_path(path)
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
