"""A ResNet training loop with one switch per performance fix (lesson 03 and its lab).

``LoopConfig()`` is the slow loop a hurried engineer writes: the DataLoader decodes and augments in the main process
(num_workers=0), every step reads the loss, the accuracy and a per-parameter gradient norm back to Python (host
syncs) and writes a log line, the batch is cloned "to be safe", a resumable checkpoint (deep copies of the model's
and the optimizer's state) is kept in memory after every step, and gradients are zeroed in place.
``LoopConfig.fast(...)`` turns the fixes on; each field is one fix, so a lesson can apply them one at a time and
measure each.

``Trainer(dataset, config, batch_size=...)`` owns the model, optimizer and loader; ``trainer.step()`` runs one
training step with every phase labelled for the profiler (utils.training.profiling.phase) and, on a GPU, NVTX ranges for
Nsight. ``trainer.losses()`` returns the loss of every step, read back with a single sync at the end when the loop
does not sync per step.

``loop_source(config)`` prints the loop as a config runs it and ``fix_diff(a, b)`` what one fix changes;
``compare_loops`` times loops side by side in interleaved rounds. ``python -m utils.training --config fast --steps 30
--nvtx`` runs the loop outside Jupyter (what nsys/ncu wrap).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from utils.core import bench, env, models
from utils.core.data import image_data
from utils.training import codeview
from utils.training.profiling import phase

__all__ = [
    "LoopConfig", "Trainer", "build_model", "amp_dtype", "loop_source", "fix_diff", "compare_loops", "synthetic_step",
]


LOG_EVERY = 10  # steps between two reads of metrics kept on the device (lesson 03's hand fix)


@dataclass(frozen=True)
class LoopConfig:
    """The switches of the training loop. The defaults are the slow loop; every field is one fix (lesson 03)."""

    # True: per step loss.item(), accuracy.item(), a norm + .item() per gradient tensor, a log line. False: only the
    # loss is kept, as a tensor on the device (no accuracy, no gradient norm, no log line): no sync, and less work
    host_syncs: bool = True
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


def amp_dtype(device):
    """The autocast dtype lesson 03's loop uses on `device`: float16 on CUDA (with loss scaling), bfloat16 on CPU."""

    return torch.float16 if torch.device(device).type == "cuda" else torch.bfloat16


def _inductor_cache_in_build() -> None:
    # Compiled kernels go under build/ like every other artefact. Inductor writes its default (/tmp/torchinductor_*)
    # into the environment the first time it looks, so replace that default, but keep a directory the user chose.
    try:  # a private module: torch 2.4 and later releases may not have it where 2.14 does
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:
        import getpass
        import tempfile

        def default_cache_dir() -> str:  # what Inductor uses when the module is not there: /tmp/torchinductor_<user>
            return os.path.join(tempfile.gettempdir(), "torchinductor_" + getpass.getuser())

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
        self.pending_metrics: list = []  # metrics kept on the device until the next flush_log()

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
                self.loss_history.append(loss.detach())  # stays on the device: no sync (and no other metric)
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

    def flush_log(self) -> None:
        """Read the metrics kept on the device back in one sync and write their log lines.

        `pending_metrics` holds (step, tensor([loss, accuracy, grad_norm])) pairs that a loop keeping its metrics on
        the device appended (lesson 03's hand fix); close() flushes what is left.
        """
        if not self.pending_metrics:
            return
        pending, self.pending_metrics = self.pending_metrics, []
        steps, rows = [s for s, _ in pending], torch.stack([m for _, m in pending]).tolist()
        if self._log is None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self._log_path, "a")  # noqa: SIM115 (closed in close())
        for step, (loss_value, accuracy, grad_norm) in zip(steps, rows, strict=True):
            print(f"step {step} loss {loss_value:.4f} acc {accuracy:.3f} grad_norm {grad_norm:.3f}", file=self._log)
        self._log.flush()

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
        if getattr(self, "pending_metrics", None):
            self.flush_log()
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

    Printed from the very methods that run (utils.training.codeview.specialize), so the listing cannot drift from the code.
    """
    if not isinstance(config, LoopConfig):
        raise TypeError(f"loop_source() takes a LoopConfig, got {type(config).__name__}")
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return "\n".join(codeview.specialize(fn, values) for fn in (Trainer.setup, Trainer.step, Trainer.train_on))


def fix_diff(before: LoopConfig, after: LoopConfig, *, context: int = 1) -> str:
    """What changing `before` into `after` changes in the loop's code: a unified diff of loop_source (lesson 03)."""
    return codeview.diff(loop_source(before), loop_source(after), before_name=before.describe(),
                         after_name=after.describe(), context=context)


def compare_loops(loops: dict, *, min_run_time: float = 1.0, rounds: int = 2, baseline: str | None = None,
                  verbose: bool = True, min_blocks: int = bench.MIN_BLOCKS,
                  number: int | None = None) -> bench.Comparison:
    """Time each loop's step side by side in interleaved rounds (lesson 03): a bench.Comparison with intervals.

    A loop is a Trainer (its .step is timed) or a callable that runs one step (e.g. lesson 03's compute-bound step).
    Every round times each loop once, in turn (bench.measure), so a burst on a shared machine hits every loop of
    that round alike. Before each round a trainer with workers first runs 2 * num_workers steps, so batches its
    workers prefetched while another loop was being timed are used up and cannot flatter it. Returns a
    bench.Comparison: {name: BenchResult} pooling every round's blocks, and ``.ratio(name, over=...)``, a bench.Ratio
    whose interval spans the per-round ratios. Prints each loop's time and its ratio over `baseline` (default: the
    first) unless `verbose` is False. `min_blocks` is bench.measure's floor of timed blocks per loop and round (one
    step each for a step slower than `min_run_time`); smoke runs lower it to save steps, and pass `number=1` (steps
    per timed block, without torch's block-size estimate: bench.measure) to save the estimate's untimed step.
    """
    if not loops:
        raise ValueError("compare_loops() needs at least one loop")
    bad = [k for k, t in loops.items() if not (isinstance(t, Trainer) or callable(t))]
    if bad:
        raise TypeError(f"compare_loops() takes Trainer objects or step callables; neither: {bad}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    baseline = baseline or next(iter(loops))
    if baseline not in loops:
        raise KeyError(f"baseline {baseline!r} is not among {list(loops)}")
    fns = {name: loop.step if isinstance(loop, Trainer) else loop for name, loop in loops.items()}
    per_fn = {name: ({"warmup": 2 * loop.config.num_workers, "items": loop.batch_size} if isinstance(loop, Trainer)
                     else {"warmup": 1}) for name, loop in loops.items()}
    out = bench.compare(fns, baseline, rounds=rounds, min_run_time=min_run_time, warmup_each_round=True,
                        per_fn=per_fn, quiet=True, min_blocks=min_blocks, number=number)
    if verbose:
        for name, res in out.items():
            tail = "baseline" if name == baseline else f"{out.ratio(name)} vs {baseline}"
            print(f"  {name:38s} {res.median_ms:9.1f} ms/step (IQR {res.iqr_ms:6.1f}, {res.runs} steps)  {tail}")
    return out


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
