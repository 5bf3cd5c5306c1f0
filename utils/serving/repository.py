"""A Triton model repository built from code (lesson 05).

Every ``config.pbtxt`` is a ``ModelConfig`` protobuf message from Triton's own schema (``tritonclient``'s
``model_config_pb2``) written with ``google.protobuf.text_format``: a misspelt field or a wrong type fails here, in the
notebook, with the field's name, before the server ever sees the file.

The lesson's pipeline is three Python-backend models and an ensemble that chains them::

    TEXT --preprocess--> input_ids, attention_mask, token_type_ids --encoder--> last_hidden_state
         --postprocess(last_hidden_state, attention_mask)--> LOGITS, LABEL

- preprocess: the MiniLM tokenizer (the Rust ``tokenizers`` library that Hugging Face's fast tokenizer wraps),
  padding every text to a fixed length so requests can be batched together;
- encoder: the MiniLM ONNX model run with ONNX Runtime inside the Python backend (the tritonserver in the
  nvidia-pytriton wheel has no onnxruntime backend); ``encoder_config(platform=True)`` writes the
  ``platform: "onnxruntime_onnx"`` config that a full Triton container serves without any Python;
- postprocess: mean pooling, L2 normalisation and a linear classifier whose weights live in the version folder
  (``classifier.npz``), so version 1 and version 2 can be different classifiers served side by side.

The three programs are real files of this package (``utils/serving/models/<name>/model.py``), linted and tested like
the rest; ``model_source`` reads one, the repository gets a copy, and ``function_source`` prints a method of the copy
the server runs (the lesson shows the encoder's ``execute()`` that way).

Tensor names of the encoder are the ONNX graph's own (input_ids, attention_mask, token_type_ids, last_hidden_state),
so the ensemble is the same whichever encoder serves it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from utils.serving.models import model_file

__all__ = [
    "DTYPES",
    "HIDDEN_SIZE",
    "ENCODER_INPUTS",
    "model_source",
    "function_source",
    "tensor",
    "warmup_sample",
    "model_config",
    "ensemble_config",
    "to_pbtxt",
    "parse_pbtxt",
    "read_config",
    "write_model",
    "write_classifier",
    "preprocess_config",
    "encoder_config",
    "platform_spin_note",
    "postprocess_config",
    "pipeline_config",
    "write_encoder",
    "build_pipeline",
    "encoder_variant",
    "repository_configs",
]

HIDDEN_SIZE = 384  # MiniLM-L6's hidden size
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the ONNX graph's own input names

# short names -> Triton's DataType enum names
DTYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BF16": "TYPE_BF16",
    "STRING": "TYPE_STRING", "BYTES": "TYPE_STRING",
}


def _mc():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


# ---------------------------------------------------------------------------------------------------------------------
# configs from the schema
# ---------------------------------------------------------------------------------------------------------------------


def tensor(name: str, dtype: str, dims: Sequence[int]) -> tuple[str, str, tuple[int, ...]]:
    """One input or output: (name, dtype, dims) with dims *excluding* the batch dimension; -1 = variable (lesson 05)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tensor needs a non-empty name, got {name!r}")
    key = str(dtype).upper().removeprefix("TYPE_")
    if key not in DTYPES:
        raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    dims = tuple(dims)
    if not dims or any(not isinstance(d, int) or isinstance(d, bool) or (d < 1 and d != -1) for d in dims):
        raise ValueError(f"tensor {name!r}: dims must be a non-empty list of positive ints or -1, got {list(dims)}")
    return name, DTYPES[key], dims


def _fill_tensors(repeated, specs, what: str) -> None:
    for spec in specs:
        if not isinstance(spec, Sequence) or len(spec) != 3:
            raise ValueError(f"each {what} is (name, dtype, dims), got {spec!r}")
        name, dtype, dims = tensor(*spec)
        t = repeated.add()
        t.name = name
        t.data_type = _mc().DataType.Value(dtype)
        t.dims.extend(dims)


def model_config(
    name: str,
    *,
    inputs: Sequence,
    outputs: Sequence,
    max_batch_size: int = 0,
    backend: str | None = "python",
    platform: str | None = None,
    dynamic_batching: bool | Mapping | None = None,
    instance_count: int = 1,
    kind: str = "KIND_CPU",
    gpus: Sequence[int] | None = None,
    version_policy: str | Sequence[int] | None = None,
    parameters: Mapping[str, object] | None = None,
    warmup: Sequence[Mapping] | None = None,
    response_cache: bool = False,
):
    """A ModelConfig message for one model (lesson 05).

    dynamic_batching: None/False = off; True = on with Triton's defaults; a mapping with preferred_batch_size (list)
    and/or max_queue_delay_microseconds. version_policy: None (Triton's default, the latest version), "all",
    "latest:N" or a list of version numbers (specific). parameters: string key/values the model reads in initialize().
    warmup: model_warmup samples (see warmup_sample) the server runs through each instance before it reports ready.
    response_cache: cache whole responses keyed by the request's inputs (the server needs --cache-config).
    """
    mc = _mc()
    if not isinstance(max_batch_size, int) or max_batch_size < 0:
        raise ValueError(f"{name}: max_batch_size must be an int >= 0 (0 = no batch dimension), got {max_batch_size!r}")
    if (backend is None) == (platform is None):
        raise ValueError(f"{name}: give exactly one of backend (e.g. 'python') or platform (e.g. 'onnxruntime_onnx')")
    if not isinstance(instance_count, int) or instance_count < 1:
        raise ValueError(f"{name}: instance_count must be a positive int, got {instance_count!r}")
    cfg = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    if backend is not None:
        cfg.backend = backend
    else:
        cfg.platform = platform
    _fill_tensors(cfg.input, inputs, "input")
    _fill_tensors(cfg.output, outputs, "output")
    if dynamic_batching:
        if max_batch_size == 0:
            raise ValueError(f"{name}: dynamic batching needs max_batch_size > 0 (requests need a batch dimension)")
        cfg.dynamic_batching.SetInParent()
        if isinstance(dynamic_batching, Mapping):
            unknown = set(dynamic_batching) - {"preferred_batch_size", "max_queue_delay_microseconds"}
            if unknown:
                raise ValueError(f"{name}: unknown dynamic_batching key(s) {sorted(unknown)}; expected "
                                 "preferred_batch_size and/or max_queue_delay_microseconds")
            preferred = list(dynamic_batching.get("preferred_batch_size", []))
            too_big = [p for p in preferred if not isinstance(p, int) or not 1 <= p <= max_batch_size]
            if too_big:
                raise ValueError(f"{name}: preferred_batch_size {too_big} must be ints in 1..max_batch_size "
                                 f"({max_batch_size})")
            cfg.dynamic_batching.preferred_batch_size.extend(preferred)
            delay = dynamic_batching.get("max_queue_delay_microseconds", 0)
            if not isinstance(delay, int) or delay < 0:
                raise ValueError(f"{name}: max_queue_delay_microseconds must be an int >= 0, got {delay!r}")
            cfg.dynamic_batching.max_queue_delay_microseconds = delay
    kinds = {"KIND_CPU", "KIND_GPU", "KIND_AUTO"}
    if kind not in kinds:
        raise ValueError(f"{name}: instance kind must be one of {sorted(kinds)}, got {kind!r}")
    group = cfg.instance_group.add()
    group.count = instance_count
    group.kind = mc.ModelInstanceGroup.Kind.Value(kind)
    if gpus is not None:
        group.gpus.extend(gpus)
    if version_policy is not None:
        _set_version_policy(cfg, version_policy)
    for key, value in (parameters or {}).items():
        cfg.parameters[key].string_value = str(value)
    _add_warmup(cfg, warmup)
    if response_cache:
        cfg.response_cache.enable = True
    return cfg


def warmup_sample(name: str, inputs: Sequence, *, batch_size: int = 1, count: int = 1) -> dict:
    """One model_warmup entry: `batch_size` rows of zeros for each (name, dtype, dims) input, run `count` times (lesson 05).

    dims are concrete (no -1): a warm-up request is a real request. Zeros are valid token ids ([PAD]) and masks, so the
    encoder runs its real code path; what warm-up buys is the first execution's one-off costs paid before serving.
    """
    if not isinstance(batch_size, int) or batch_size < 1 or not isinstance(count, int) or count < 1:
        raise ValueError(f"warm-up {name!r}: batch_size and count must be positive ints, got {batch_size!r}, {count!r}")
    specs = [tensor(*spec) for spec in inputs]
    variable = [n for n, _, dims in specs if -1 in dims]
    if variable:
        raise ValueError(f"warm-up {name!r}: inputs {variable} have a variable (-1) dimension; give concrete dims")
    return {"name": name, "batch_size": batch_size, "count": count, "inputs": specs}


def _add_warmup(cfg, samples) -> None:
    mc = _mc()
    names = {t.name for t in cfg.input}
    for sample in samples or []:
        if not isinstance(sample, Mapping) or set(sample) != {"name", "batch_size", "count", "inputs"}:
            raise ValueError(f"{cfg.name}: each warm-up is a warmup_sample(...) dict, got {sample!r}")
        if cfg.max_batch_size == 0 and sample["batch_size"] != 1:
            raise ValueError(f"{cfg.name}: warm-up batch_size must be 1 for a model without a batch dimension")
        if sample["batch_size"] > max(cfg.max_batch_size, 1):
            raise ValueError(f"{cfg.name}: warm-up batch_size {sample['batch_size']} exceeds max_batch_size "
                             f"{cfg.max_batch_size}")
        given = {n for n, _, _ in sample["inputs"]}
        if given != names:
            raise ValueError(f"{cfg.name}: warm-up {sample['name']!r} must give every input {sorted(names)}, "
                             f"got {sorted(given)}")
        w = cfg.model_warmup.add(name=sample["name"], batch_size=sample["batch_size"], count=sample["count"])
        for name, dtype, dims in sample["inputs"]:
            data = w.inputs[name]
            data.data_type = mc.DataType.Value(dtype)
            data.dims.extend(dims)
            data.zero_data = True

def _set_version_policy(cfg, policy) -> None:
    if policy == "all":
        cfg.version_policy.all.SetInParent()
    elif isinstance(policy, str) and policy.startswith("latest:") and policy[7:].isdigit() and int(policy[7:]) > 0:
        cfg.version_policy.latest.num_versions = int(policy[7:])
    elif not isinstance(policy, str) and isinstance(policy, Sequence) and policy and all(
        isinstance(v, int) and v > 0 for v in policy
    ):
        cfg.version_policy.specific.versions.extend(policy)
    else:
        raise ValueError(f"version_policy must be 'all', 'latest:N' or a list of positive version numbers, got {policy!r}")


def ensemble_config(name: str, *, inputs: Sequence, outputs: Sequence, steps: Sequence[Mapping], max_batch_size: int,
                    response_cache: bool = False):
    """A ModelConfig with platform "ensemble" (lesson 05).

    steps: [{"model": name, "version": -1, "input_map": {model_input: ensemble_tensor},
    "output_map": {model_output: ensemble_tensor}}, ...]. Every ensemble input must feed a step and every ensemble
    output must come from one; checked here with the tensor names, since Triton would only say so at load time.
    response_cache: a request whose inputs the server has seen is answered from the cache, no step runs.
    """
    mc = _mc()
    cfg = mc.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
    if response_cache:
        cfg.response_cache.enable = True
    _fill_tensors(cfg.input, inputs, "input")
    _fill_tensors(cfg.output, outputs, "output")
    if not steps:
        raise ValueError(f"{name}: an ensemble needs at least one step")
    produced = {t.name for t in cfg.input}
    for i, step in enumerate(steps):
        unknown = set(step) - {"model", "version", "input_map", "output_map"}
        if unknown or "model" not in step:
            raise ValueError(f"{name} step {i}: expected keys model, version, input_map, output_map; got {sorted(step)}")
        s = cfg.ensemble_scheduling.step.add()
        s.model_name = step["model"]
        s.model_version = int(step.get("version", -1))
        for model_tensor, ens_tensor in step.get("input_map", {}).items():
            if ens_tensor not in produced:
                raise ValueError(f"{name} step {i} ({step['model']}): input {model_tensor!r} reads {ens_tensor!r}, "
                                 f"which no earlier step or ensemble input produces (have {sorted(produced)})")
            s.input_map[model_tensor] = ens_tensor
        for model_tensor, ens_tensor in step.get("output_map", {}).items():
            s.output_map[model_tensor] = ens_tensor
            produced.add(ens_tensor)
    missing = [t.name for t in cfg.output if t.name not in produced]
    if missing:
        raise ValueError(f"{name}: ensemble output(s) {missing} are produced by no step")
    return cfg


def to_pbtxt(cfg) -> str:
    """The config.pbtxt text of a ModelConfig (lesson 05)."""
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def parse_pbtxt(text: str):
    """Parse config.pbtxt text against Triton's ModelConfig schema (lesson 05).

    Raises ValueError naming the offending line and field when the text is not a valid ModelConfig.
    """
    from google.protobuf import text_format

    if not isinstance(text, str):
        raise TypeError(f"parse_pbtxt takes the config text as a str, got {type(text).__name__}")
    try:
        return text_format.Parse(text, _mc().ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"not a valid Triton ModelConfig: {exc}") from None


def read_config(model_dir: str | os.PathLike):
    """Parse <model_dir>/config.pbtxt (lesson 05)."""
    path = Path(model_dir) / "config.pbtxt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return parse_pbtxt(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def write_model(repo: str | os.PathLike, cfg, files: Mapping[int, Mapping[str, str | bytes | os.PathLike]] | None = None):
    """Write <repo>/<cfg.name>/config.pbtxt and each version's files; returns the model folder (lesson 05).

    files: {version: {filename: content}}; a str or bytes is written, a Path is symlinked (large ONNX files are
    shared, not copied). The folder is replaced, so a stale version from an earlier run cannot linger.
    """
    model_dir = Path(repo) / cfg.name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(to_pbtxt(cfg))
    for version, entries in (files or {}).items():
        if not isinstance(version, int) or version < 1:
            raise ValueError(f"{cfg.name}: version folders are positive ints, got {version!r}")
        vdir = model_dir / str(version)
        vdir.mkdir()
        for filename, content in entries.items():
            target = vdir / filename
            if isinstance(content, os.PathLike):
                src = Path(content).resolve()
                if not src.is_file():
                    raise FileNotFoundError(f"{cfg.name} version {version}: {filename} should link to {src}, missing")
                target.symlink_to(src)
            elif isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
    return model_dir


def write_classifier(path: str | os.PathLike, weight, bias, labels: Sequence[str]) -> Path:
    """Save a linear classifier (weight [hidden, classes], bias [classes], labels) as .npz without pickle (lesson 05)."""
    import numpy as np

    weight = np.asarray(weight, dtype=np.float32)
    bias = np.asarray(bias, dtype=np.float32)
    if weight.ndim != 2 or bias.shape != (weight.shape[1],) or len(labels) != weight.shape[1]:
        raise ValueError(f"expected weight [hidden, C], bias [C] and C labels; got weight {weight.shape}, "
                         f"bias {bias.shape}, {len(labels)} labels")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:  # np.savez would append .npz to a name without it
        np.savez(fh, weight=weight, bias=bias, labels=np.array([str(x) for x in labels]))
    return path


# ---------------------------------------------------------------------------------------------------------------------
# the lesson's pipeline
# ---------------------------------------------------------------------------------------------------------------------

def model_source(model: str) -> str:
    """The text of utils/serving/models/<model>/model.py ("preprocess", "encoder" or "postprocess") (lesson 05)."""
    return model_file(model).read_text()


def function_source(path: str | os.PathLike, qualname: str) -> str:
    """The source of one function or method (e.g. "TritonPythonModel.execute") in a Python file (lesson 05).

    Read from the file with ``ast`` rather than imported: a model.py imports triton_python_backend_utils, which exists
    only inside the server's stub, and the lesson prints the very copy the server runs.
    """
    import ast

    path = Path(path)
    text = path.read_text()
    body, found = ast.parse(text).body, None
    for part in qualname.split("."):
        found = next((n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.name == part), None)
        if found is None:
            raise ValueError(f"{path} defines no {qualname!r} (looked for {part!r})")
        body = found.body
    lines = text.splitlines()
    first = min([found.lineno, *(d.lineno for d in found.decorator_list)])
    block = lines[first - 1:found.end_lineno]
    indent = min(len(ln) - len(ln.lstrip()) for ln in block if ln.strip())
    return "\n".join(ln[indent:] for ln in block) + "\n"


def preprocess_config(name: str = "preprocess", *, seq_len: int = 32, max_batch_size: int = 32, dynamic_batching=None,
                      instance_count: int = 1, max_text_bytes: int = 2048):
    """ModelConfig of the tokenizer model: TEXT (string [1]) -> three int64 [seq_len] tensors (lesson 05)."""
    if not isinstance(seq_len, int) or not 2 <= seq_len <= 512:
        raise ValueError(f"seq_len must be an int in 2..512 (MiniLM's position limit), got {seq_len!r}")
    return model_config(
        name, max_batch_size=max_batch_size, dynamic_batching=dynamic_batching, instance_count=instance_count,
        inputs=[("TEXT", "STRING", [1])],
        outputs=[(n, "INT64", [seq_len]) for n in ("input_ids", "attention_mask", "token_type_ids")],
        parameters={"seq_len": seq_len, "max_text_bytes": max_text_bytes},
    )


def encoder_config(name: str = "encoder", *, max_batch_size: int = 32, dynamic_batching=None, instance_count: int = 1,
                   intra_op_threads: int = 0, allow_spinning: bool = True, kind: str = "KIND_CPU", gpus=None,
                   platform: bool = False, warmup_batch_sizes: Sequence[int] = (), seq_len: int | None = None):
    """ModelConfig of the MiniLM encoder (lesson 05).

    platform=False: the Python backend running ONNX Runtime (what this course's server can load). platform=True: the
    same tensors with platform "onnxruntime_onnx", which a full Triton container serves from model.onnx directly.
    intra_op_threads (0 = ONNX Runtime's default, one per physical core) and allow_spinning (False: idle pool threads
    sleep rather than spin, which matters when other processes share the cores) go to model.py as parameters.
    For platform=True the same thread choice goes to the C++ onnxruntime backend under its own keys
    (``intra_op_thread_count``, and ``inter_op_thread_count`` 1 as model.py sets; the backend's README, "Model Config
    Options"), so the container runs the thread layout that was measured. Spinning is not among the keys that README
    lists: with 1 intra-op thread ORT starts no pool threads, so nothing spins; with more, the container's pool spins
    before sleeping, ONNX Runtime's default (see ``platform_spin_note``).
    warmup_batch_sizes: one model_warmup sample of zeros per batch size, at sequence length `seq_len`.
    """
    if not isinstance(intra_op_threads, int) or isinstance(intra_op_threads, bool) or intra_op_threads < 0:
        raise ValueError(f"{name}: intra_op_threads must be an int >= 0 (0 = ONNX Runtime's default), "
                         f"got {intra_op_threads!r}")
    warmup = []
    if warmup_batch_sizes:
        if not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"{name}: warm-up needs the sequence length (seq_len=...), got {seq_len!r}")
        warmup = [warmup_sample(f"zeros_batch_{b}", [(n, "INT64", [seq_len]) for n in ENCODER_INPUTS], batch_size=b)
                  for b in warmup_batch_sizes]
    kwargs = dict(
        max_batch_size=max_batch_size, dynamic_batching=dynamic_batching, instance_count=instance_count, kind=kind,
        gpus=gpus, warmup=warmup,
        inputs=[(n, "INT64", [-1]) for n in ENCODER_INPUTS],
        outputs=[("last_hidden_state", "FP32", [-1, HIDDEN_SIZE])],
    )
    if platform:
        # the onnxruntime backend's keys; 0 is its default (ORT picks), so only a chosen count is written
        params = {"intra_op_thread_count": intra_op_threads, "inter_op_thread_count": 1} if intra_op_threads else {}
        return model_config(name, backend=None, platform="onnxruntime_onnx", parameters=params, **kwargs)
    params = {"intra_op_threads": intra_op_threads}
    if not allow_spinning:
        params["allow_spinning"] = 0
    return model_config(name, parameters=params, **kwargs)


def platform_spin_note(cfg) -> str:
    """What an ``onnxruntime_onnx`` encoder config does with idle ONNX Runtime threads, in one line (lesson 05)."""
    if cfg.platform != "onnxruntime_onnx":
        raise ValueError(f"{cfg.name}: platform_spin_note reads an onnxruntime_onnx config, got "
                         f"{cfg.platform or cfg.backend!r}")
    threads = cfg.parameters["intra_op_thread_count"].string_value if "intra_op_thread_count" in cfg.parameters else ""
    if threads == "1":
        return "1 intra-op thread per instance: ONNX Runtime starts no pool threads, so none can spin"
    shown = f"{threads} intra-op threads" if threads else "ONNX Runtime's default intra-op pool (one per core)"
    return (f"{shown} per instance: spinning is not among the model-config keys the onnxruntime backend documents, "
            "so idle pool threads spin a while before they sleep (ORT's default); measure it in the container")


def postprocess_config(name: str = "postprocess", *, num_classes: int, max_batch_size: int = 32,
                       dynamic_batching=None, instance_count: int = 1, version_policy=None):
    """ModelConfig of the pooling + classifier model: LOGITS (fp32 [C]) and LABEL (string [1]) (lesson 05)."""
    return model_config(
        name, max_batch_size=max_batch_size, dynamic_batching=dynamic_batching, instance_count=instance_count,
        version_policy=version_policy,
        inputs=[("last_hidden_state", "FP32", [-1, HIDDEN_SIZE]), ("attention_mask", "INT64", [-1])],
        outputs=[("LOGITS", "FP32", [num_classes]), ("LABEL", "STRING", [1])],
    )


def pipeline_config(name: str = "ensemble", *, num_classes: int, max_batch_size: int = 32, suffix: str = "",
                    encoder: str | None = None, postprocess_version: int = -1, response_cache: bool = False):
    """The ensemble: TEXT -> preprocess -> encoder -> postprocess -> LOGITS, LABEL (lesson 05).

    Members are named preprocess<suffix>, encoder<suffix>, postprocess<suffix>; `encoder` names a different encoder
    (e.g. a tuned variant sharing the same preprocess and postprocess). postprocess_version -1 = the latest loaded.
    response_cache: the ensemble answers a repeated request from the server's response cache.
    """
    ids = {n: n for n in ENCODER_INPUTS}
    return ensemble_config(
        name, max_batch_size=max_batch_size, response_cache=response_cache,
        inputs=[("TEXT", "STRING", [1])],
        outputs=[("LOGITS", "FP32", [num_classes]), ("LABEL", "STRING", [1])],
        steps=[
            {"model": f"preprocess{suffix}", "input_map": {"TEXT": "TEXT"}, "output_map": ids},
            {"model": encoder or f"encoder{suffix}", "input_map": ids, "output_map": {"last_hidden_state": "hidden"}},
            {"model": f"postprocess{suffix}", "version": postprocess_version,
             "input_map": {"last_hidden_state": "hidden", "attention_mask": "attention_mask"},
             "output_map": {"LOGITS": "LOGITS", "LABEL": "LABEL"}},
        ],
    )


def write_encoder(repo: str | os.PathLike, cfg, onnx_path: str | os.PathLike) -> Path:
    """Write an encoder model folder (config + a copy of model.py + a link to the ONNX file) for an encoder_config()
    (lesson 05)."""
    files = {"model.onnx": Path(onnx_path)}
    if cfg.backend == "python":
        files["model.py"] = model_source("encoder")
    return write_model(repo, cfg, {1: files})


_SAME = object()  # encoder_batching's default: whatever dynamic_batching says


def build_pipeline(
    repo: str | os.PathLike,
    *,
    onnx_path: str | os.PathLike,
    tokenizer_json: str | os.PathLike,
    classifiers: Mapping[int, str | os.PathLike],
    num_classes: int,
    suffix: str = "",
    seq_len: int = 32,
    max_batch_size: int = 32,
    dynamic_batching=None,
    encoder_batching=_SAME,
    encoder_instances: int = 1,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    version_policy=None,
    encoder_platform: bool = False,
    kind: str = "KIND_CPU",
    encoder_warmup: Sequence[int] = (),
    with_encoder: bool = True,
) -> dict[str, Path]:
    """Write preprocess, encoder, postprocess and the ensemble (all named with `suffix`) into `repo` (lesson 05).

    dynamic_batching applies to the three member models (the ensemble itself has no queue); encoder_batching, when
    given, replaces it for the encoder (e.g. a preferred batch size and a queue delay chosen by measurement).
    classifiers: {version: classifier.npz} for postprocess. encoder_warmup: warm-up batch sizes for the encoder.
    with_encoder=False writes only preprocess and postprocess, for encoder_variant() ensembles to share.
    Each model.py is copied from utils/triton_models. Returns {model name: folder}.
    """
    repo = Path(repo)
    for what, path in (("onnx_path", onnx_path), ("tokenizer_json", tokenizer_json), *(
            (f"classifier version {v}", p) for v, p in classifiers.items())):
        if not Path(path).is_file():
            raise FileNotFoundError(f"build_pipeline: {what} {path} does not exist")
    repo.mkdir(parents=True, exist_ok=True)
    common = dict(max_batch_size=max_batch_size, dynamic_batching=dynamic_batching)
    folders = {}
    cfg = preprocess_config(f"preprocess{suffix}", seq_len=seq_len, **common)
    folders[cfg.name] = write_model(repo, cfg, {1: {"model.py": model_source("preprocess"),
                                                    "tokenizer.json": Path(tokenizer_json)}})
    cfg = postprocess_config(f"postprocess{suffix}", num_classes=num_classes, version_policy=version_policy, **common)
    folders[cfg.name] = write_model(
        repo, cfg, {v: {"model.py": model_source("postprocess"), "classifier.npz": Path(p)}
                    for v, p in classifiers.items()})
    if with_encoder:
        cfg = encoder_config(f"encoder{suffix}", instance_count=encoder_instances, intra_op_threads=intra_op_threads,
                             allow_spinning=allow_spinning, platform=encoder_platform, kind=kind,
                             max_batch_size=max_batch_size, warmup_batch_sizes=encoder_warmup, seq_len=seq_len,
                             dynamic_batching=dynamic_batching if encoder_batching is _SAME else encoder_batching)
        folders[cfg.name] = write_encoder(repo, cfg, onnx_path)
        cfg = pipeline_config(f"ensemble{suffix}", num_classes=num_classes, max_batch_size=max_batch_size,
                              suffix=suffix)
        folders[cfg.name] = write_model(repo, cfg, {1: {}})
    return folders


def encoder_variant(repo: str | os.PathLike, tag: str, *, onnx_path: str | os.PathLike, num_classes: int,
                    max_batch_size: int = 32, **encoder_kwargs) -> str:
    """Write encoder_<tag> (an encoder_config(**encoder_kwargs)) and ensemble_<tag>, which runs it between the
    repository's shared preprocess and postprocess; returns the ensemble's name (lesson 05: one per sweep point)."""
    if not isinstance(tag, str) or not tag.replace("_", "").isalnum():
        raise ValueError(f"tag must be letters, digits and underscores (it names models), got {tag!r}")
    repo = Path(repo)
    missing = [m for m in ("preprocess", "postprocess") if not (repo / m / "config.pbtxt").is_file()]
    if missing:
        raise FileNotFoundError(f"{repo} has no {missing}: write them first (build_pipeline(..., with_encoder=False))")
    cfg = encoder_config(f"encoder_{tag}", max_batch_size=max_batch_size, **encoder_kwargs)
    write_encoder(repo, cfg, onnx_path)
    ens = pipeline_config(f"ensemble_{tag}", num_classes=num_classes, max_batch_size=max_batch_size,
                          encoder=cfg.name)
    write_model(repo, ens, {1: {}})
    return ens.name


def repository_configs(repo: str | os.PathLike) -> dict:
    """{model name: ModelConfig} for every model folder in `repo`, each parsed through the schema (lesson 05)."""
    repo = Path(repo)
    if not repo.is_dir():
        raise FileNotFoundError(f"model repository {repo} is not a folder")
    return {d.name: read_config(d) for d in sorted(repo.iterdir()) if (d / "config.pbtxt").is_file()}
