"""A ResNet training loop with one switch per performance fix (lesson 03 and its lab).

``LoopConfig()`` is the slow loop a hurried engineer writes: the DataLoader decodes and augments in the main process
(num_workers=0), every step reads the loss, the accuracy and a per-parameter gradient norm back to Python (host
syncs) and writes a log line, the batch is cloned "to be safe", a resumable checkpoint (deep copies of the model's
and the optimizer's state) is kept in memory after every step, and gradients are zeroed in place.
``LoopConfig.fast(...)`` turns the fixes on; each field is one fix, so a lesson can apply them one at a time and
measure each.

``Trainer(dataset, config, batch_size=...)`` owns the model, optimizer and loader; ``trainer.step()`` runs one
training step with every phase labelled for the profiler (utils.profiling.phase) and, on a GPU, NVTX ranges for
Nsight. ``trainer.losses()`` returns the loss of every step, read back with a single sync at the end when the loop
does not sync per step.

``python -m utils.training --config fast --steps 30 --nvtx`` runs the loop outside Jupyter (what nsys/ncu wrap).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import dataclasses
import functools
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from utils import bench, codeview, env, image_data, models, profiling
from utils.profiling import phase

__all__ = [
    "build_model", "LoopConfig", "Fix", "fixes", "FixTrial", "try_fix", "Trainer", "compare_loops", "amp_dtype",
    "synthetic_step", "page_faults_per_step", "keep_freed_memory", "loop_source", "fix_diff", "main",
]


@dataclass(frozen=True)
class LoopConfig:
    """The switches of the training loop. The defaults are the slow loop; every field is one fix (lesson 03)."""

    host_syncs: bool = True  # per step: loss.item(), accuracy.item(), a .item() per parameter's grad norm, a log line
    needless_copies: bool = True  # clone the batch; deep-copy model + optimizer state after every step
    set_to_none: bool = False  # optimizer.zero_grad(set_to_none=...)
    fused_optimizer: bool = False  # SGD(fused=True): one kernel over all parameters instead of ~3 small ops per tensor
    num_workers: int = 0  # DataLoader worker processes (decode + augment off the training thread)
    pin_memory: bool = False  # page-locked host batches for faster, asynchronous host-to-GPU copies (GPU only)
    persistent_workers: bool = False  # keep workers alive between epochs
    channels_last: bool = False  # NHWC memory format for the model and the batch
    amp: bool = False  # autocast: bf16 on CPU, fp16 + GradScaler on CUDA
    cudnn_benchmark: bool = False  # let cuDNN time its algorithms and pick the fastest per shape (GPU only)
    compile_backend: str | None = None  # torch.compile(model, backend=...): "inductor", or "eager" for a cheap check

    def __post_init__(self):
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {self.num_workers!r}")
        if self.persistent_workers and self.num_workers == 0:
            raise ValueError("persistent_workers=True needs num_workers > 0 (there are no workers to keep)")
        if self.compile_backend is not None and not isinstance(self.compile_backend, str):
            raise ValueError(f"compile_backend must be a backend name such as 'inductor' or None, got {self.compile_backend!r}")

    def with_(self, **changes) -> LoopConfig:
        """A copy with some switches changed (unknown names are an error)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown LoopConfig field(s) {sorted(unknown)}; fields: {[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def diff(self, other: LoopConfig | None = None) -> dict:
        """The switches that differ from `other` (default: the slow loop), as {name: value}."""
        other = other or LoopConfig()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(other, f.name)}

    def describe(self) -> str:
        changed = self.diff()
        return "slow loop" if not changed else ", ".join(f"{k}={v}" for k, v in changed.items())

    @classmethod
    def fast(cls, *, num_workers: int = 1, channels_last: bool = False, amp: bool = False,
             compile_backend: str | None = None) -> LoopConfig:
        """The slow loop minus its waste (syncs, copies, zeroing, per-tensor SGD), plus workers and chosen trade-offs."""

        cuda = torch.cuda.is_available()
        return cls(host_syncs=False, needless_copies=False, set_to_none=True, fused_optimizer=True,
                   num_workers=num_workers,
                   pin_memory=cuda and num_workers > 0, persistent_workers=num_workers > 0,
                   channels_last=channels_last, amp=amp, cudnn_benchmark=cuda, compile_backend=compile_backend)


@dataclass(frozen=True)
class Fix:
    """One fix of lesson 03's ablation: the phases it attacks, whether it is pure waste removal, its switch settings.

    `options` holds one or more alternative settings (e.g. one per worker count); try_fix() measures them all and
    keeps the fastest.
    """

    name: str
    phases: tuple[str, ...]
    waste: bool  # pure waste removal (it cannot cost anything) vs a trade-off that has to win its measurement
    options: tuple[dict, ...]
    gpu_only: bool = False

    def __post_init__(self):
        if not self.options:
            raise ValueError(f"fix {self.name!r} needs at least one option")
        fields = {f.name for f in dataclasses.fields(LoopConfig)}
        for opt in self.options:
            if set(opt) - fields:
                raise ValueError(f"fix {self.name!r}: unknown LoopConfig field(s) {sorted(set(opt) - fields)}")


def fixes(*, worker_choices=(1, 2), compile_backend: str = "inductor") -> list[Fix]:
    """The fixes lesson 03 tries, each with the profile phase(s) it attacks."""

    cuda = torch.cuda.is_available()
    if not worker_choices or any((not isinstance(n, int)) or n < 1 for n in worker_choices):
        raise ValueError(f"worker_choices must be worker counts >= 1, got {worker_choices!r}")
    workers = tuple({"num_workers": n, "persistent_workers": True, "pin_memory": cuda} for n in worker_choices)
    return [
        Fix("remove per-step host syncs", ("logging",), True, ({"host_syncs": False},)),
        Fix("remove needless copies", ("copy",), True, ({"needless_copies": False},)),
        Fix("zero_grad(set_to_none=True)", ("zero_grad",), True, ({"set_to_none": True},)),
        Fix("fused optimizer (SGD fused=True)", ("optimizer",), False, ({"fused_optimizer": True},)),
        Fix("DataLoader workers" + (" + pin_memory" if cuda else ""), ("data", "to_device"), False, workers),
        Fix("channels_last", ("forward", "backward"), False, ({"channels_last": True},)),
        Fix("AMP autocast (" + ("fp16 + GradScaler" if cuda else "bf16") + ")", ("forward", "backward"), False,
            ({"amp": True},)),
        Fix("cudnn.benchmark", ("forward", "backward"), False, ({"cudnn_benchmark": True},), gpu_only=True),
        Fix(f"torch.compile ({compile_backend})", ("forward", "backward"), False,
            ({"compile_backend": compile_backend},)),
    ]


@dataclass
class FixTrial:
    """What try_fix() measured (lesson 03): the best candidate (a live Trainer), its speedup, every candidate's timing."""

    fix: Fix
    trainer: Trainer
    speedup: float
    current_ms: float
    candidate_ms: float
    first_step_ms: float
    timings: dict

    @property
    def label(self) -> str:
        """The fix's name, plus the chosen setting when it had several options (e.g. the worker count)."""
        varying = [k for k in self.fix.options[0] if len({repr(o.get(k)) for o in self.fix.options}) > 1]
        chosen = ", ".join(f"{k}={getattr(self.trainer.config, k)}" for k in varying)
        return f"{self.fix.name} ({chosen})" if chosen else self.fix.name


def try_fix(current: Trainer, fix: Fix, dataset, *, min_run_time: float = 1.0, rounds: int = 2,
            **trainer_kwargs) -> FixTrial:
    """Lesson 03's ablation step: build current.config + each option of `fix`, time them beside `current`, keep the best.

    The other candidates are closed; the caller decides whether to keep the returned trainer (and closes it if not).
    `trainer_kwargs` go to Trainer (batch_size, device, lr, ...).
    """

    candidates, first = {}, {}
    for i, opt in enumerate(fix.options):
        name = f"option {i}: " + ", ".join(f"{k}={v}" for k, v in opt.items())
        candidates[name] = Trainer(dataset, current.config.with_(**opt), **trainer_kwargs)
        first[name] = bench.first_call_ms(candidates[name].step)  # one-time costs (worker start, compilation)
    timings = compare_loops({"current loop": current, **candidates}, min_run_time=min_run_time, rounds=rounds)
    best = min(candidates, key=lambda k: timings[k].median_ms)
    for name, tr in candidates.items():
        if name != best:
            tr.close()
    cur_ms, best_ms = timings["current loop"].median_ms, timings[best].median_ms
    return FixTrial(fix, candidates[best], cur_ms / best_ms, cur_ms, best_ms, first[best], timings)


def amp_dtype(device):
    """The autocast dtype lesson 03's loop uses on `device`: float16 on CUDA (with loss scaling), bfloat16 on CPU."""

    return torch.float16 if torch.device(device).type == "cuda" else torch.bfloat16


def _inductor_cache_in_build() -> None:
    # Compiled kernels go under build/ like every other artefact. Inductor writes its default (/tmp/torchinductor_*)
    # into the environment the first time it looks, so replace that default, but keep a directory the user chose.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(env.build_dir() / "torchinductor")


def build_model(name: str = "resnet50", *, seed: int = 0, num_classes: int = 10, device="cpu"):
    """Lesson 03's model in train mode: seeded random weights, each residual block's last BatchNorm scaled to zero.

    Zeroing that scale (torchvision's zero_init_residual, Goyal et al. 2017) makes every residual block start as the
    identity. On 32x32 inputs ResNet-50's last stage sees 1x1 feature maps, so its BatchNorms normalize over the batch
    alone; without this, rounding differences of 1e-6 (another memory layout, another kernel) grow into loss
    differences of several percent within a few steps, and loss curves could not be compared step by step.
    """
    return copy.deepcopy(_initial_model(name, seed, num_classes)).to(device)  # a copy is ~5x faster than init


@functools.cache
def _initial_model(name: str, seed: int, num_classes: int):
    from torchvision.models.resnet import BasicBlock, Bottleneck


    net = models.vision_model(name, seed=seed, num_classes=num_classes).train()
    with torch.no_grad():
        for block in net.modules():
            if isinstance(block, Bottleneck):
                block.bn3.weight.zero_()
            elif isinstance(block, BasicBlock):
                block.bn2.weight.zero_()
    return net


class Trainer:
    """Model + optimizer + DataLoader + one training step, built from a LoopConfig (lesson 03).

    Two trainers with the same seed, dataset and batch size see the same batches in the same order and start from
    the same weights, whatever their configs: their losses can be compared step by step. ``setup`` and ``train_on``
    are written for reading: ``loop_source(config)`` prints them as a given config runs them.
    """

    def __init__(self, dataset, config: LoopConfig | None = None, *, batch_size: int, device="cpu", seed: int = 0,
                 lr: float = 0.001, model: str = "resnet50", num_classes: int = 10, log_path=None):

        self.config = config or LoopConfig()
        if not isinstance(self.config, LoopConfig):
            raise TypeError(f"config must be a LoopConfig, got {type(self.config).__name__}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("a CUDA device was asked for but none is visible; use device='cpu'")
        self.batch_size = batch_size
        self.setup(dataset, model=model, num_classes=num_classes, seed=seed, lr=lr)
        if len(self.loader) == 0:
            raise ValueError(f"the dataset ({len(dataset)} samples) is smaller than one batch of {batch_size}")
        self._iter = None
        self.loss_history: list = []  # floats, or loss tensors still on the device (read back by losses())
        self.checkpoint = None
        self.steps_done = 0
        self._log_path = log_path or env.build_dir() / "logs" / "lesson03_train.log"
        self._log = None

    def setup(self, dataset, *, model, num_classes, seed, lr):
        """The model, the optimizer and the DataLoader, as the config asks."""
        cfg = self.config
        self.net = build_model(model, seed=seed, num_classes=num_classes, device=self.device)
        if cfg.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)  # NHWC in memory: channels vary fastest
        if cfg.fused_optimizer:
            # one kernel updates every parameter tensor
            self.optimizer = torch.optim.SGD(self.net.parameters(), lr=lr, momentum=0.9, fused=True)
        else:
            # torch's default on CPU tensors: a loop over the parameter tensors, a few small ops each
            self.optimizer = torch.optim.SGD(self.net.parameters(), lr=lr, momentum=0.9)
        self.forward = self.net
        if cfg.compile_backend:
            _inductor_cache_in_build()  # compiled kernels are cached under build/
            self.forward = torch.compile(self.net, backend=cfg.compile_backend)
        if cfg.amp:
            # fp16 on a GPU needs loss scaling; bf16 on a CPU does not, so there the scaler is switched off
            self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.device.type == "cuda")
        self.loader = image_data.make_loader(dataset, self.batch_size, num_workers=cfg.num_workers,
                                             pin_memory=cfg.pin_memory, persistent_workers=cfg.persistent_workers,
                                             seed=seed)

    # -- the step -------------------------------------------------------------------------------------------------
    def next_batch(self):
        """The loader's next batch; at the end of an epoch the next epoch starts (persistent workers survive this)."""
        if self._iter is None:
            self._iter = iter(self.loader)
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = iter(self.loader)
            return next(self._iter)

    def step(self) -> None:
        """One training step: the data phase, then train_on()."""
        with phase("data"):
            images, labels = self.next_batch()
        self.train_on(images, labels)

    def train_on(self, images, labels) -> None:
        """The step after the data phase, on a batch you pass; each phase is a profiler range (profiling.phase)."""
        cfg = self.config
        if self.device.type == "cuda":  # a process-wide switch: set it for this loop's step
            torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
        if cfg.needless_copies:
            with phase("copy"):  # "to be safe": copies nobody needs
                images = images.clone().contiguous()
                labels = torch.tensor(labels.tolist())
        with phase("to_device"):
            images = images.to(self.device, non_blocking=cfg.pin_memory)
            labels = labels.to(self.device, non_blocking=cfg.pin_memory)
            if cfg.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
        with phase("zero_grad"):
            self.optimizer.zero_grad(set_to_none=cfg.set_to_none)
        with phase("forward"):
            if cfg.amp:
                # autocast: matmuls and convolutions in 16 bits; reductions, losses and the weights stay fp32
                with torch.autocast(self.device.type, dtype=amp_dtype(self.device)):
                    logits = self.forward(images)
                    loss = F.cross_entropy(logits, labels)
            else:
                logits = self.forward(images)
                loss = F.cross_entropy(logits, labels)
        with phase("backward"):
            if cfg.amp:
                self.scaler.scale(loss).backward()  # times the loss scale (1 when the scaler is off)
            else:
                loss.backward()
        with phase("optimizer"):
            if cfg.amp:
                self.scaler.step(self.optimizer)  # unscales the gradients; skips the step if one overflowed
                self.scaler.update()
            else:
                self.optimizer.step()
        with phase("logging"):
            if cfg.host_syncs:
                self.log_step(loss, logits, labels)
            else:
                self.loss_history.append(loss.detach())  # stays on the device: no sync
        if cfg.needless_copies:
            with phase("copy"):  # "keep a checkpoint we can resume from, just in case": every step, in memory
                self.checkpoint = copy.deepcopy({"model": self.net.state_dict(),
                                                 "optimizer": self.optimizer.state_dict()})
        self.steps_done += 1

    def log_step(self, loss, logits, labels) -> None:
        """The slow loop's logging: three kinds of host sync every step, and a line in the log file."""
        loss_value = loss.item()  # host sync
        accuracy = (logits.argmax(1) == labels).float().mean().item()  # host sync
        grad_norm = sum(p.grad.norm().item() ** 2 for p in self.net.parameters()) ** 0.5  # one sync per tensor
        if self._log is None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self._log_path, "a")  # noqa: SIM115 (closed in close())
        print(f"step {self.steps_done} loss {loss_value:.4f} acc {accuracy:.3f} grad_norm {grad_norm:.3f}",
              file=self._log, flush=True)
        self.loss_history.append(loss_value)

    # -- results and lifetime ------------------------------------------------------------------------------------
    def run(self, steps: int, progress: bool = False) -> list[float]:
        """Run `steps` steps; returns the losses of those steps."""
        if steps < 1:
            raise ValueError(f"steps must be positive, got {steps}")
        start = len(self.loss_history)
        it = range(steps)
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc=self.config.describe()[:40], leave=False)
        for _ in it:
            self.step()
        return self.losses()[start:]

    def losses(self) -> list[float]:
        """The loss of every step so far, as floats (one host sync for the whole list when steps did not sync)."""
        tensors = [(i, v) for i, v in enumerate(self.loss_history) if not isinstance(v, float)]
        if tensors:
            values = torch.stack([v.float() for _, v in tensors]).tolist()
            for (i, _), value in zip(tensors, values, strict=True):
                self.loss_history[i] = value
        return list(self.loss_history)

    def close(self) -> None:
        """Stop the DataLoader workers and close the log file."""
        it, self._iter = self._iter, None
        for obj in (it, getattr(getattr(self, "loader", None), "_iterator", None)):
            if obj is not None and hasattr(obj, "_shutdown_workers"):
                obj._shutdown_workers()
        if getattr(self, "_log", None) is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def loop_source(config: LoopConfig) -> str:
    """Trainer.setup, Trainer.step and Trainer.train_on as `config` runs them: the switches resolved (lesson 03).

    Printed from the very methods that run (utils.codeview.specialize), so the listing cannot drift from the code.
    """
    if not isinstance(config, LoopConfig):
        raise TypeError(f"loop_source() takes a LoopConfig, got {type(config).__name__}")
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return "\n".join(codeview.specialize(fn, values) for fn in (Trainer.setup, Trainer.step, Trainer.train_on))


def fix_diff(before: LoopConfig, after: LoopConfig, *, context: int = 1) -> str:
    """What changing `before` into `after` changes in the loop's code: a unified diff of loop_source (lesson 03)."""
    return codeview.diff(loop_source(before), loop_source(after), before_name=before.describe(),
                         after_name=after.describe(), context=context)


def page_faults_per_step(trainer: Trainer, steps: int = 3) -> tuple[float, float]:
    """(minor page faults per step, ms per step) of `steps` steps of `trainer` (lesson 03).

    A minor fault is the kernel handing the process a fresh, zeroed 4 KiB page on first touch: memory the allocator
    had just returned to the operating system and now takes back. Counted with getrusage for this process.
    """

    if not isinstance(trainer, Trainer):
        raise TypeError(f"page_faults_per_step() takes a Trainer, got {type(trainer).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    faults0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    trainer.run(steps)
    ms = (time.perf_counter() - t0) / steps * 1e3
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0) / steps, ms


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory in this process instead of returning it to the OS (lesson 03).

    By default glibc serves blocks above a threshold with their own mmap and unmaps them on free, and trims the top of
    the heap when it is free: a training step that allocates and frees the same ~100 MB every step then page-faults
    all of it back every step. mallopt(M_MMAP_MAX, 0) sends every block through the heap and
    mallopt(M_TRIM_THRESHOLD, INT_MAX) stops trimming, so the heap grows once to the step's peak and stays: what
    jemalloc or tcmalloc (preloaded by Intel's PyTorch launcher) do by design. Process-wide and not undoable; the
    same is available without code as GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647.
    Returns what it did; raises RuntimeError where the C library is not glibc.
    """

    if platform.system() != "Linux":
        raise RuntimeError(f"keep_freed_memory() needs Linux with glibc; this is {platform.system()}: use jemalloc or "
                           "tcmalloc, or the platform allocator's own settings")
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"keep_freed_memory() needs glibc (libc.so.6 with mallopt): {exc}") from None
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
    if mallopt(m_mmap_max, 0) != 1 or mallopt(m_trim_threshold, 2**31 - 1) != 1:
        raise RuntimeError("glibc's mallopt refused M_MMAP_MAX=0 / M_TRIM_THRESHOLD=INT_MAX")
    return "glibc malloc keeps freed memory: large blocks come from the heap (M_MMAP_MAX=0), the heap is never trimmed"


def compare_loops(loops: dict, *, min_run_time: float = 1.0, rounds: int = 2, baseline: str | None = None,
                  verbose: bool = True) -> dict:
    """Time each loop's step side by side (utils.bench.measure), round-robin `rounds` times (lesson 03).

    A loop is a Trainer (its .step is timed) or a callable that runs one step (e.g. lesson 03's compute-bound step).
    Before each round a trainer with workers first runs 2 * num_workers steps, so batches its workers prefetched while
    another loop was being timed are used up and cannot flatter it (bench.measure's block-size estimate adds one
    more untimed step). Returns {name: BenchResult}, keeping each loop's best round, and prints each one's speedup
    over `baseline` (default: the first).
    """
    if not loops:
        raise ValueError("compare_loops() needs at least one loop")
    bad = [k for k, t in loops.items() if not (isinstance(t, Trainer) or callable(t))]
    if bad:
        raise TypeError(f"compare_loops() takes Trainer objects or step callables; neither: {bad}")
    baseline = baseline or next(iter(loops))
    if baseline not in loops:
        raise KeyError(f"baseline {baseline!r} is not among {list(loops)}")
    best: dict = {}
    for _ in range(rounds):
        for name, loop in loops.items():
            if isinstance(loop, Trainer):
                res = bench.measure(loop.step, label=name, warmup=2 * loop.config.num_workers,
                                    min_run_time=min_run_time, items=loop.batch_size)
            else:
                res = bench.measure(loop, label=name, warmup=1, min_run_time=min_run_time)
            if name not in best or res.median_ms < best[name].median_ms:
                best[name] = res
    if verbose:
        base = best[baseline].median_ms
        for name, res in best.items():
            print(f"  {name:38s} {res.median_ms:9.1f} ms/step (IQR {res.iqr_ms:6.1f}, {res.runs} steps)"
                  f"  {base / res.median_ms:5.2f}x vs {baseline}")
    return best


def synthetic_step(batch_size: int, image_size: int, *, amp: bool = False, channels_last: bool = False,
                   device="cpu", model: str = "resnet50", seed: int = 0):
    """A training step on one fixed random batch (no data loading): pure compute, for lesson 03's AMP sweep."""

    dev = torch.device(device)
    torch.manual_seed(seed)
    net = build_model(model, seed=seed, num_classes=10, device=dev)
    x = torch.randn(batch_size, 3, image_size, image_size, device=dev)
    y = torch.randint(0, 10, (batch_size,), device=dev)
    if channels_last:
        net, x = net.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=dev.type == "cuda" and amp)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=amp_dtype(dev), enabled=amp):
            loss = F.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    return step


def main(argv=None) -> int:
    """Run the loop outside Jupyter, e.g. under `nsys profile` (lesson 03's Nsight section)."""
    parser = argparse.ArgumentParser(prog="python -m utils.training", description="lesson 03 training loop")
    parser.add_argument("--config", choices=["slow", "fast"], default="fast")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--nvtx", action="store_true", help="emit NVTX ranges per phase (and per op via emit_nvtx)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)



    device = env.choose_device(args.device)
    config = LoopConfig() if args.config == "slow" else LoopConfig.fast(num_workers=args.num_workers, amp=args.amp)
    profiling.set_nvtx(args.nvtx)
    images = image_data.synthetic_cifar(1024)
    dataset = image_data.AugmentedImages(images, image_size=args.image_size, length=args.steps * args.batch_size)
    with Trainer(dataset, config, batch_size=args.batch_size, device=device) as trainer:
        trainer.run(min(3, args.steps))  # warm-up outside the capture range
        nvtx_ctx = torch.autograd.profiler.emit_nvtx() if args.nvtx and device.type == "cuda" else contextlib.nullcontext()
        capture = torch.cuda.profiler.profile() if device.type == "cuda" else contextlib.nullcontext()
        t0 = time.perf_counter()
        with capture, nvtx_ctx:
            trainer.run(max(1, args.steps - 3))
            if device.type == "cuda":
                torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        losses = trainer.losses()
    print(f"{config.describe()}: {seconds / max(1, args.steps - 3) * 1e3:.1f} ms/step, last loss {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
