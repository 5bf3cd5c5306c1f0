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

Tensor names of the encoder are the ONNX graph's own (input_ids, attention_mask, token_type_ids, last_hidden_state),
so the ensemble is the same whichever encoder serves it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "DTYPES",
    "HIDDEN_SIZE",
    "PREPROCESS_PY",
    "ENCODER_PY",
    "POSTPROCESS_PY",
    "tensor",
    "model_config",
    "ensemble_config",
    "to_pbtxt",
    "parse_pbtxt",
    "read_config",
    "write_model",
    "write_classifier",
    "preprocess_config",
    "encoder_config",
    "postprocess_config",
    "pipeline_config",
    "write_encoder",
    "build_pipeline",
    "repository_configs",
]

HIDDEN_SIZE = 384  # MiniLM-L6's hidden size

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
):
    """A ModelConfig message for one model (lesson 05).

    dynamic_batching: None/False = off; True = on with Triton's defaults; a mapping with preferred_batch_size (list)
    and/or max_queue_delay_microseconds. version_policy: None (Triton's default, the latest version), "all",
    "latest:N" or a list of version numbers (specific). parameters: string key/values the model reads in initialize().
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
    return cfg


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


def ensemble_config(name: str, *, inputs: Sequence, outputs: Sequence, steps: Sequence[Mapping], max_batch_size: int):
    """A ModelConfig with platform "ensemble" (lesson 05).

    steps: [{"model": name, "version": -1, "input_map": {model_input: ensemble_tensor},
    "output_map": {model_output: ensemble_tensor}}, ...]. Every ensemble input must feed a step and every ensemble
    output must come from one; checked here with the tensor names, since Triton would only say so at load time.
    """
    mc = _mc()
    cfg = mc.ModelConfig(name=name, platform="ensemble", max_batch_size=max_batch_size)
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

PREPROCESS_PY = '''\
"""preprocess: UTF-8 text -> MiniLM token ids, padded to a fixed length (generated by utils.triton_repo)."""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.seq_len = int(params["seq_len"])
        self.max_text_bytes = int(params["max_text_bytes"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=self.seq_len)
        self.tokenizer.enable_padding(length=self.seq_len, pad_id=0, pad_token="[PAD]")

    def _texts(self, request):
        raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
        texts = []
        for item in raw:
            data = item if isinstance(item, bytes) else str(item).encode()
            if len(data) > self.max_text_bytes:
                raise ValueError(f"TEXT is {len(data)} bytes; this model accepts at most {self.max_text_bytes}")
            texts.append(data.decode("utf-8"))  # invalid UTF-8 raises UnicodeDecodeError: a clear client error
        return texts

    def execute(self, requests):
        # one tokenizer call for every text of every request Triton batched into this execute()
        texts, spans, responses = [], [], [None] * len(requests)
        for i, request in enumerate(requests):
            try:
                mine = self._texts(request)
            except (ValueError, UnicodeDecodeError) as exc:
                error = pb_utils.TritonError(f"preprocess: {exc}", pb_utils.TritonError.INVALID_ARG)  # HTTP 400
                responses[i] = pb_utils.InferenceResponse(error=error)
                continue
            spans.append((i, len(texts), len(texts) + len(mine)))
            texts.extend(mine)
        if texts:
            encoded = self.tokenizer.encode_batch(texts)
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            types = np.zeros_like(ids)
            for i, a, b in spans:
                responses[i] = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("input_ids", ids[a:b]),
                    pb_utils.Tensor("attention_mask", mask[a:b]),
                    pb_utils.Tensor("token_type_ids", types[a:b]),
                ])
        return responses
'''

ENCODER_PY = '''\
"""encoder: MiniLM (ONNX) with ONNX Runtime inside the Python backend (generated by utils.triton_repo)."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

NAMES = ("input_ids", "attention_mask", "token_type_ids")


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_threads", "0"))
        options.inter_op_num_threads = 1
        if params.get("allow_spinning", "1") == "0":  # idle pool threads sleep instead of spinning on a core
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        if args["model_instance_kind"] == "GPU":
            device = int(args["model_instance_device_id"])
            providers = [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=providers)

    def execute(self, requests):
        # requests Triton batched together have the same shape; concatenate them into one ONNX Runtime call
        feeds = {n: [pb_utils.get_input_tensor_by_name(r, n).as_numpy() for r in requests] for n in NAMES}
        sizes = [a.shape[0] for a in feeds["input_ids"]]
        if len({a.shape[1] for a in feeds["input_ids"]}) == 1:
            batch = {n: np.concatenate(v) for n, v in feeds.items()}
            hidden = self.session.run(["last_hidden_state"], batch)[0]
            parts = np.split(hidden, np.cumsum(sizes)[:-1])
        else:  # different sequence lengths: one call per request
            parts = [self.session.run(["last_hidden_state"], {n: feeds[n][i] for n in NAMES})[0]
                     for i in range(len(requests))]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("last_hidden_state", p)]) for p in parts]
'''

POSTPROCESS_PY = '''\
"""postprocess: mean pooling + L2 norm + a linear classifier from classifier.npz (generated by utils.triton_repo)."""
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        with np.load(os.path.join(folder, "classifier.npz"), allow_pickle=False) as data:
            self.weight = data["weight"].astype(np.float32)
            self.bias = data["bias"].astype(np.float32)
            self.labels = np.array([s.encode() for s in data["labels"].tolist()], dtype=object)

    def _classify(self, hidden, mask):
        mask = mask.astype(np.float32)[:, :, None]
        pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        emb = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        logits = (emb @ self.weight + self.bias).astype(np.float32)
        return logits, self.labels[logits.argmax(axis=1)].reshape(-1, 1)

    def execute(self, requests):
        hidden = [pb_utils.get_input_tensor_by_name(r, "last_hidden_state").as_numpy() for r in requests]
        masks = [pb_utils.get_input_tensor_by_name(r, "attention_mask").as_numpy() for r in requests]
        if len({h.shape[1:] for h in hidden}) == 1:  # one vectorised pass over every request in this batch
            logits, labels = self._classify(np.concatenate(hidden), np.concatenate(masks))
            cuts = np.cumsum([h.shape[0] for h in hidden])[:-1]
            parts = zip(np.split(logits, cuts), np.split(labels, cuts))
        else:
            parts = [self._classify(h, m) for h, m in zip(hidden, masks)]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LOGITS", lg), pb_utils.Tensor("LABEL", lb)])
                for lg, lb in parts]
'''


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
                   platform: bool = False):
    """ModelConfig of the MiniLM encoder (lesson 05).

    platform=False: the Python backend running ONNX Runtime (what this course's server can load). platform=True: the
    same tensors with platform "onnxruntime_onnx", which a full Triton container serves from model.onnx directly.
    intra_op_threads (0 = ONNX Runtime's default, one per physical core) and allow_spinning (False: idle pool threads
    sleep rather than spin, which matters when other processes share the cores) go to model.py as parameters.
    """
    kwargs = dict(
        max_batch_size=max_batch_size, dynamic_batching=dynamic_batching, instance_count=instance_count, kind=kind,
        gpus=gpus,
        inputs=[(n, "INT64", [-1]) for n in ("input_ids", "attention_mask", "token_type_ids")],
        outputs=[("last_hidden_state", "FP32", [-1, HIDDEN_SIZE])],
    )
    if platform:
        return model_config(name, backend=None, platform="onnxruntime_onnx", **kwargs)
    params = {"intra_op_threads": intra_op_threads}
    if not allow_spinning:
        params["allow_spinning"] = 0
    return model_config(name, parameters=params, **kwargs)


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
                    encoder: str | None = None, postprocess_version: int = -1):
    """The ensemble: TEXT -> preprocess -> encoder -> postprocess -> LOGITS, LABEL (lesson 05).

    Members are named preprocess<suffix>, encoder<suffix>, postprocess<suffix>; `encoder` names a different encoder
    (e.g. a tuned variant sharing the same preprocess and postprocess). postprocess_version -1 = the latest loaded.
    """
    ids = {"input_ids": "input_ids", "attention_mask": "attention_mask", "token_type_ids": "token_type_ids"}
    return ensemble_config(
        name, max_batch_size=max_batch_size,
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
    """Write an encoder model folder (config + model.py + a link to the ONNX file) for an encoder_config() (lesson 05)."""
    files = {"model.onnx": Path(onnx_path)}
    if cfg.backend == "python":
        files["model.py"] = ENCODER_PY
    return write_model(repo, cfg, {1: files})


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
    encoder_instances: int = 1,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    version_policy=None,
    encoder_platform: bool = False,
    kind: str = "KIND_CPU",
) -> dict[str, Path]:
    """Write preprocess, encoder, postprocess and the ensemble (all named with `suffix`) into `repo` (lesson 05).

    dynamic_batching applies to the three member models (the ensemble itself has no queue). classifiers:
    {version: classifier.npz} for postprocess. Returns {model name: folder}.
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
    folders[cfg.name] = write_model(repo, cfg, {1: {"model.py": PREPROCESS_PY, "tokenizer.json": Path(tokenizer_json)}})
    cfg = encoder_config(f"encoder{suffix}", instance_count=encoder_instances, intra_op_threads=intra_op_threads,
                         allow_spinning=allow_spinning, platform=encoder_platform, kind=kind, **common)
    folders[cfg.name] = write_encoder(repo, cfg, onnx_path)
    cfg = postprocess_config(f"postprocess{suffix}", num_classes=num_classes, version_policy=version_policy, **common)
    folders[cfg.name] = write_model(
        repo, cfg, {v: {"model.py": POSTPROCESS_PY, "classifier.npz": Path(p)} for v, p in classifiers.items()})
    cfg = pipeline_config(f"ensemble{suffix}", num_classes=num_classes, max_batch_size=max_batch_size, suffix=suffix)
    folders[cfg.name] = write_model(repo, cfg, {1: {}})
    return folders


def repository_configs(repo: str | os.PathLike) -> dict:
    """{model name: ModelConfig} for every model folder in `repo`, each parsed through the schema (lesson 05)."""
    repo = Path(repo)
    if not repo.is_dir():
        raise FileNotFoundError(f"model repository {repo} is not a folder")
    return {d.name: read_config(d) for d in sorted(repo.iterdir()) if (d / "config.pbtxt").is_file()}
