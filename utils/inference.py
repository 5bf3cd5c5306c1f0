"""Inference helpers: a correct predict and the measurements behind it (lesson 01; its lab checks against them).

- predict: eval mode, torch.inference_mode, device placement, batches of at most max_batch, input validation
- validate_images, model_device, check_same_device: boundary checks whose errors say what was expected, what came
  and how to fix it
- autograd_saved_bytes: the memory an autograd graph keeps alive (the tensors saved for backward), counted exactly
- heap_bytes_held_by: what a call leaves allocated while its result lives, read from glibc's malloc (gradient
  checkpointing keeps tensors alive outside the saved-tensor hooks, so it is measured this way)
- throughput_sweep: latency and throughput per batch size in interleaved rounds (a Sweep: gain per batch with its
  interval, drops flagged); activation_sizes: the activations one forward pass writes
- cold_start: first call vs steady state in a fresh Python process (nothing cached, nothing warmed)
- path_size_bytes, size_table, savedmodel_variable_bytes: what saved models weigh on disk
- pickle_globals: the Python names a torch.save file must import to load (why a state_dict survives code moves)
- tiny_cnn: a small seeded conv net with BatchNorm and Dropout for demos and the lab

torch is imported inside the functions, so importing this module is free.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import itertools
import json
import os
import pickletools
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from utils.core import bench, env, onnx_io, verdict
from utils.core import env as _env
from utils.core.models import vision_model

__all__ = [
    "DeviceMismatchError",
    "model_device",
    "check_same_device",
    "validate_images",
    "predict",
    "autograd_saved_bytes",
    "heap_source",
    "heap_bytes_held_by",
    "Sweep",
    "throughput_sweep",
    "activation_sizes",
    "cold_start",
    "path_size_bytes",
    "size_table",
    "savedmodel_variable_bytes",
    "pickle_globals",
    "tiny_cnn",
]


class DeviceMismatchError(RuntimeError):
    """A model and its input (or the model's own tensors) live on different devices (lesson 01)."""


# ---------------------------------------------------------------------------------------------------------------------
# boundary checks
# ---------------------------------------------------------------------------------------------------------------------


def model_device(model):
    """The one device holding all of `model`'s parameters and buffers (lesson 01).

    Raises ValueError for a model without tensors and DeviceMismatchError when they are spread over several devices.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    devices = {t.device for t in itertools.chain(model.parameters(), model.buffers())}
    if not devices:
        raise ValueError(f"{type(model).__name__} has no parameters or buffers, so it has no device: pass device=")
    if len(devices) > 1:
        names = sorted(str(d) for d in devices)
        raise DeviceMismatchError(
            f"{type(model).__name__} has tensors on several devices {names}: move all of it with model.to(device)"
        )
    return devices.pop()


def check_same_device(model, *tensors, names: Sequence[str] | None = None):
    """Raise DeviceMismatchError unless every tensor is on the model's device; return that device (lesson 01).

    The message names the input, both devices and the one-line fix, instead of the error from deep inside a layer.
    """
    import torch

    device = model_device(model)
    names = list(names) if names is not None else [f"input {i}" for i in range(len(tensors))]
    if len(names) != len(tensors):
        raise ValueError(f"got {len(tensors)} tensors but {len(names)} names")
    for name, t in zip(names, tensors, strict=True):
        if not torch.is_tensor(t):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != device:
            raise DeviceMismatchError(
                f"{name} is on {t.device} but the model's parameters are on {device}: move the input with "
                f"x.to({str(device)!r}) (or the model with model.to(x.device)) before calling the model"
            )
    return device


def validate_images(x, *, channels: int | None = 3, min_size: int = 1, name: str = "x"):
    """Check that `x` is a float image batch (N, C, H, W) with `channels` channels; return it unchanged (lesson 01).

    TypeError for a non-tensor or a non-float dtype, ValueError for a wrong shape; each message shows what came and
    suggests the usual fix (unsqueeze(0) for a single image, permute for channels-last data, float() for uint8 pixels).
    """
    import torch

    if not torch.is_tensor(x):
        shape = f" with shape {tuple(x.shape)}" if hasattr(x, "shape") else ""
        raise TypeError(
            f"{name} must be a torch.Tensor, got {type(x).__module__}.{type(x).__name__}{shape}: "
            "convert it with torch.as_tensor(x)"
        )
    shape = tuple(x.shape)
    if x.dim() == 3:
        raise ValueError(
            f"{name} must be a 4-D batch (N, C, H, W), got a 3-D tensor of shape {shape}: "
            f"add the batch dimension with {name}.unsqueeze(0)"
        )
    if x.dim() != 4:
        raise ValueError(f"{name} must be a 4-D batch (N, C, H, W), got a {x.dim()}-D tensor of shape {shape}")
    if shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (shape {shape}): nothing to predict")
    if channels is not None and shape[1] != channels:
        hint = f": it looks channels-last, use {name}.permute(0, 3, 1, 2)" if shape[3] == channels else ""
        raise ValueError(f"{name} must have {channels} channels in dim 1 (N, C, H, W), got shape {shape}{hint}")
    if min(shape[2], shape[3]) < min_size:
        raise ValueError(f"{name} images must be at least {min_size}x{min_size} pixels, got shape {shape}")
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (the model's weights are), got {x.dtype}: "
            f"use {name}.float() (and scale 0-255 pixels to the range the model was trained on)"
        )
    return x


# ---------------------------------------------------------------------------------------------------------------------
# predict
# ---------------------------------------------------------------------------------------------------------------------


def predict(model, x, *, max_batch: int = 32, device=None, channels: int | None = 3):
    """Correct, fast inference on an image batch; returns the model's outputs on the CPU (lesson 01).

    - validates `x` (validate_images) before anything runs;
    - puts the model in eval mode (it stays there) and runs under torch.inference_mode(): no autograd graph;
    - moves the model to `device` when given, else uses the model's own device; moves each input chunk there
      (non_blocking when the input is in pinned memory);
    - runs at most `max_batch` images per call, so memory stays bounded whatever N is.

    The result is an inference tensor: use it freely, but clone() it before feeding it to autograd.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive int, got {max_batch!r}")
    validate_images(x, channels=channels)
    if device is not None:
        model.to(device)
    target = model_device(model)
    model.eval()
    outputs = []
    with torch.inference_mode():
        for chunk in x.split(max_batch):
            out = model(chunk.to(target, non_blocking=chunk.is_pinned()))
            if not torch.is_tensor(out):
                raise TypeError(f"predict() handles models returning one tensor, {type(model).__name__} returned "
                                f"{type(out).__name__}")
            outputs.append(out.to("cpu"))
    return torch.cat(outputs)


# ---------------------------------------------------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------------------------------------------------


def autograd_saved_bytes(fn: Callable[[], object], *, exclude: Iterable = ()) -> tuple[int, object]:
    """Run fn() and count the bytes of the tensors autograd saves for backward; return (bytes, fn's result) (lesson 01).

    This is the memory the autograd graph keeps alive for as long as the output lives: the activations. Storages are
    counted once; tensors in `exclude` (pass model.parameters()) are not counted, since they exist anyway. Under
    torch.no_grad() or torch.inference_mode() nothing is saved and the count is 0.
    """
    import torch

    if not callable(fn):
        raise TypeError(f"autograd_saved_bytes() needs a callable taking no arguments, got {type(fn).__name__}")
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip:
            seen[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return sum(seen.values()), result


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back: small blocks in the arenas plus mmapped large blocks."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"heap_bytes_held_by() reads glibc's mallinfo2 (glibc >= 2.33 on Linux): {exc}") from None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def heap_source() -> str:
    """What heap_bytes_held_by() reads here (lesson 01): glibc's mallinfo2 where the glibc_malloc capability is
    present, else torch's profiler (every OS)."""
    if env.has("glibc_malloc"):
        return "glibc's mallinfo2 (every malloc in the process)"
    return "torch.profiler's memory events (PyTorch's CPU allocations only): " + env.capabilities()["glibc_malloc"].reason


def _profiled_bytes_held(fn: Callable[[], object]) -> tuple[int, object]:
    from torch.profiler import ProfilerActivity, profile

    env.quiet_profiler_log()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    # each op's self memory is what it allocated minus what it freed: their sum is what is still held at the end
    held = sum(e.self_cpu_memory_usage for e in prof.key_averages())
    return int(held), result


def heap_bytes_held_by(fn: Callable[[], object]) -> tuple[int, object]:
    """Run fn() and return (bytes still allocated afterwards, fn's result) (lesson 01, gradient checkpointing).

    The difference of glibc's in-use heap (mallinfo2) before and after the call, with the result alive: for a
    training forward pass that is the output plus every activation the autograd graph keeps for backward, however
    it keeps them (torch.utils.checkpoint holds its segment inputs outside the saved-tensor hooks that
    autograd_saved_bytes counts). PyTorch's CPU tensors come from malloc, so they are all in the count.
    Where there is no glibc (macOS, Windows, musl, glibc < 2.33) the same difference is read from torch.profiler's
    memory events, which count PyTorch's CPU allocations on every OS (within a few percent of mallinfo2 on a
    ResNet-18 forward here); heap_source() says which one this machine uses.
    """
    if not callable(fn):
        raise TypeError(f"heap_bytes_held_by() needs a callable taking no arguments, got {type(fn).__name__}")
    gc.collect()
    if not env.has("glibc_malloc"):
        return _profiled_bytes_held(fn)
    before = _heap_in_use()
    result = fn()
    return _heap_in_use() - before, result


@dataclass(frozen=True)
class Sweep:
    """Latency and throughput per batch size, timed in interleaved rounds (lesson 01; throughput_sweep).

    ``results[bs]`` pools every round's blocks (items = bs, so ``.throughput`` is images per second);
    ``round_ms[bs]`` holds each round's median time per call, round i of every batch size timed together.
    """

    results: dict[int, bench.BenchResult]
    round_ms: dict[int, list[float]]

    def gain(self, bs: int, over: int | None = None) -> bench.Ratio:
        """Throughput of batch `bs` over batch `over` (default: the smallest), per round: a Ratio with its interval."""
        over = min(self.results) if over is None else over
        for key in (bs, over):
            if key not in self.results:
                raise KeyError(f"batch {key} was not swept; the sweep has {sorted(self.results)}")
        per_round = [(bs / b_ms) / (over / o_ms) for b_ms, o_ms in zip(self.round_ms[bs], self.round_ms[over],
                                                                        strict=True)]
        sides = [k for k in dict.fromkeys((over, bs)) if self.results[k].iqr_fraction > bench.MAX_IQR_FRACTION]
        noisy = "; ".join(f"batch {k}: IQR {self.results[k].iqr_fraction:.0%} of the median" for k in sides)
        spread = max((self.results[k].iqr_fraction for k in sides), default=0.0)
        return bench.Ratio.from_samples(per_round, noisy=noisy, spread=spread)

    def drops(self, threshold: float = 1.05) -> list[tuple[int, int, bench.Ratio]]:
        """(smaller, larger, gain) for each step up in batch size whose throughput fell: the verdict on the larger
        batch's gain over the smaller one is "slower" (a drop the rounds agree on, not noise)."""
        sizes = sorted(self.results)
        steps = [(a, b, self.gain(b, over=a)) for a, b in zip(sizes, sizes[1:], strict=False)]
        return [(a, b, g) for a, b, g in steps if verdict.speed(g, threshold) == verdict.SLOWER]


def throughput_sweep(model, batch_sizes: Sequence[int], make_input: Callable[[int], object], *, rounds: int = 3,
                     min_run_time: float = 0.5, warmup: int = 2) -> Sweep:
    """Time model(make_input(bs)) under torch.inference_mode() for each batch size, interleaved (lesson 01).

    Every round times each batch size once, in turn (bench.compare: warm-up calls in the first round only), so a busy
    neighbour or a slow drift hits all batch sizes alike; `min_run_time` is per batch size and round. Returns a Sweep.
    """
    import torch

    sizes = list(batch_sizes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch_sizes must be positive ints, got {sizes!r}")
    if len(set(sizes)) != len(sizes) or rounds < 1:
        raise ValueError(f"batch_sizes must be distinct and rounds >= 1, got {sizes!r} and rounds={rounds}")
    inputs = {bs: make_input(bs) for bs in sizes}

    def run(x):
        with torch.inference_mode():
            return model(x)

    labels = {bs: f"batch {bs}" for bs in sizes}
    cmp = bench.compare({labels[bs]: functools.partial(run, inputs[bs]) for bs in sizes}, rounds=rounds,
                        min_run_time=min_run_time, warmup=warmup, per_fn={labels[bs]: {"items": bs} for bs in sizes},
                        quiet=True)
    results = {bs: cmp[labels[bs]] for bs in sizes}
    round_ms = {bs: cmp.round_ms[labels[bs]] for bs in sizes}
    return Sweep(results, round_ms)


def activation_sizes(model, x) -> list[int]:
    """Bytes of every buffer the leaf modules allocate for their outputs in one forward pass of `x`, in call order
    (lesson 01). An output that shares its input's storage (an in-place ReLU) allocates nothing and is not counted.

    Under inference mode a buffer is freed once the next layers have used it, so the sum is what the pass allocates,
    not what is live at once; the buffers above glibc's largest mmap threshold are fresh mappings on every call, and
    every 4 KiB page of them faults in on first touch.
    """
    import torch

    sizes: list[int] = []

    def hook(module, args, out):
        if not torch.is_tensor(out):
            return
        shares_input = any(torch.is_tensor(a) and a.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
                           for a in args)
        if not shares_input:
            sizes.append(out.numel() * out.element_size())

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        with torch.inference_mode():
            model(x)
    finally:
        for h in handles:
            h.remove()
    if not sizes:
        raise ValueError(f"{type(model).__name__} has no leaf module returning a tensor: nothing to count")
    return sizes


def cold_start(model: str = "resnet18", *, batch: int = 1, image_size: int = 224, device: str = "cpu",
               steady_min_run_time: float = 0.5, timeout: float = 300) -> dict:
    """First call vs steady state of a torchvision model in a fresh Python process (lesson 01).

    Returns seconds for import_s, build_s (and to_device_s), and milliseconds for first_ms, second_ms and steady_ms
    (the median after warm-up), all measured in a child process where nothing was imported or warmed before.
    """
    if batch < 1 or image_size < 16:
        raise ValueError(f"batch must be >= 1 and image_size >= 16, got batch={batch}, image_size={image_size}")
    cmd = [sys.executable, "-m", "utils.inference", "cold-start", model, str(batch), str(image_size), device,
           str(steady_min_run_time)]
    child = _env.child_environ({**os.environ, "PYTHONWARNINGS": "ignore"})
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"cold-start child process failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def _cold_start_child(model: str, batch: int, image_size: int, device: str, min_run_time: float) -> dict:
    import time

    t0 = time.perf_counter()
    import torch


    out = {"import_s": time.perf_counter() - t0}
    t0 = time.perf_counter()
    net = vision_model(model)
    out["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    net = net.to(device)
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    out["to_device_s"] = time.perf_counter() - t0
    with torch.inference_mode():
        out["first_ms"] = bench.first_call_ms(lambda: net(x))
        out["second_ms"] = bench.first_call_ms(lambda: net(x))
        out["steady_ms"] = bench.measure(lambda: net(x), warmup=3, min_run_time=min_run_time).median_ms
    return out


# ---------------------------------------------------------------------------------------------------------------------
# sizes on disk
# ---------------------------------------------------------------------------------------------------------------------


def path_size_bytes(path) -> int:
    """Bytes on disk of a saved model: a file, a folder (SavedModel: every file in it), or an .onnx file together with
    its external data files (lesson 01)."""
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist: save the model there first")
    if p.suffix == ".onnx":

        return onnx_io.onnx_size_bytes(p)
    return p.stat().st_size


def size_table(entries: Iterable[tuple[str, str, object]], *, baseline: str = "state_dict") -> list[dict]:
    """Rows {model, format, mb, vs_baseline} from (model, format, path or byte count) entries (lesson 01).

    vs_baseline is the size over the same model's `baseline` format (None where the model has no such row).
    """
    rows = []
    for model, fmt, where in entries:
        nbytes = where if isinstance(where, int) else path_size_bytes(where)
        rows.append({"model": model, "format": fmt, "mb": nbytes / 1e6})
    base = {r["model"]: r["mb"] for r in rows if r["format"] == baseline}
    for r in rows:
        r["vs_baseline"] = r["mb"] / base[r["model"]] if r["model"] in base else None
    return rows


def savedmodel_variable_bytes(path) -> dict[str, int]:
    """Bytes of the variables in a SavedModel, grouped by the first part of their checkpoint key (lesson 01).

    Shows what the variables file holds, e.g. a Keras export that tracks every weight under two names.
    """
    import numpy as np
    import tensorflow as tf

    prefix = Path(path) / "variables" / "variables"
    if not prefix.with_suffix(".index").is_file():
        raise FileNotFoundError(f"{path} is not a SavedModel folder (no variables/variables.index)")
    reader = tf.train.load_checkpoint(str(prefix))
    dtypes = reader.get_variable_to_dtype_map()
    groups: dict[str, int] = {}
    for key, shape in reader.get_variable_to_shape_map().items():
        dtype = dtypes[key]
        if dtype == tf.string:
            continue
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.size
        group = key.split("/")[0]
        groups[group] = groups.get(group, 0) + nbytes
    return groups


# ---------------------------------------------------------------------------------------------------------------------
# what a checkpoint's pickle imports
# ---------------------------------------------------------------------------------------------------------------------

_STRING_OPS = {"UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING", "SHORT_BINSTRING"}


def pickle_globals(path) -> list[str]:
    """The "module.name" globals the pickle of a torch.save file references, sorted, each once (lesson 01).

    Reads the pickle opcodes with pickletools (nothing is unpickled, nothing imported): every name listed must be
    importable, unchanged, when the file is loaded. Accepts the zip archive torch.save writes (its `*/data.pkl`) or a
    plain pickle file.
    """
    import zipfile

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist: save a checkpoint there first (torch.save(obj, path))")
    if zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as zf:
            pkl = [n for n in zf.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
            if len(pkl) != 1:
                raise ValueError(f"{p} is a zip file but not a torch.save archive: expected one '<name>/data.pkl' "
                                 f"member, found {pkl or 'none'} (a .keras file or another zip?)")
            data = zf.read(pkl[0])
    else:
        data = p.read_bytes()
    names: set[str] = set()
    pushed: list = []  # values pushed so far (strings, else None): STACK_GLOBAL takes its two names from here
    memo: dict = {}
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":  # protocols 0-3: "module name" in the opcode's argument
                module, name = arg.split(" ", 1)
                names.add(f"{module}.{name}")
                pushed.append(None)
            elif op.name == "STACK_GLOBAL":  # protocol 4+: module and name were pushed as two strings
                module, name = pushed[-2:] if len(pushed) >= 2 else (None, None)
                if not (isinstance(module, str) and isinstance(name, str)):
                    raise ValueError(f"{p}: STACK_GLOBAL without two string operands; cannot name the global")
                names.add(f"{module}.{name}")
                pushed.append(None)
            elif op.name in _STRING_OPS:
                pushed.append(arg)
            elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = pushed[-1] if pushed else None
            elif op.name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(arg))
            else:
                pushed.append(None)
    except ValueError as exc:
        if "STACK_GLOBAL" in str(exc):
            raise
        raise ValueError(f"{p} does not hold a readable pickle ({exc}): is it a torch.save file?") from exc
    return sorted(names)


# ---------------------------------------------------------------------------------------------------------------------
# a small model
# ---------------------------------------------------------------------------------------------------------------------


def tiny_cnn(num_classes: int = 10, *, channels: int = 3, width: int = 16, dropout: float = 0.5, seed: int = 0):
    """A small conv net with BatchNorm and Dropout (the two layers eval() changes), seeded, in train mode (lesson 01)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(2 * width, num_classes),
    )


if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "cold-start":
        _, _, name, bs, size, dev, mrt = sys.argv
        print(json.dumps(_cold_start_child(name, int(bs), int(size), dev, float(mrt))))
        sys.exit(0)
    print("usage: python -m utils.inference cold-start MODEL BATCH IMAGE_SIZE DEVICE MIN_RUN_TIME", file=sys.stderr)
    sys.exit(2)
