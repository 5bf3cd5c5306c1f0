"""Memory the training step gives back and takes again (lesson 03): minor page faults per step, and glibc's malloc
told to keep freed memory in the process, what jemalloc or tcmalloc do by design.

``allocator_ab`` measures the two allocators side by side: two child processes run the same loop, one with glibc's
defaults and one with GLIBC_TUNABLES set to keep freed memory, and take turns, a few steps each, round after round.
(``python -m utils.training.allocator`` is that child.)
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from utils.core import bench, env
from utils.core.data import image_data
from utils.training.loop import LoopConfig, Trainer

__all__ = ["page_faults_per_step", "keep_freed_memory", "KEEP_TUNABLES", "AllocatorAB", "allocator_ab"]

# the same settings as keep_freed_memory(), for a process that has not started yet
KEEP_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"


def page_faults_per_step(trainer: Trainer, steps: int = 3) -> tuple[float, float]:
    """(minor page faults per step, ms per step) of `steps` steps of `trainer` (lesson 03).

    A minor fault is the kernel handing the process a fresh, zeroed 4 KiB page on first touch: memory the allocator
    had just returned to the operating system and now takes back. Counted by env.page_faults() for this process
    (getrusage's minor faults; on Windows psutil's count, minor and major together).
    """

    if not isinstance(trainer, Trainer):
        raise TypeError(f"page_faults_per_step() takes a Trainer, got {type(trainer).__name__}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    faults0, t0 = env.page_faults(), time.perf_counter()
    trainer.run(steps)
    ms = (time.perf_counter() - t0) / steps * 1e3
    return (env.page_faults() - faults0) / steps, ms


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory in this process instead of returning it to the OS (lesson 03).

    By default glibc serves blocks above a threshold with their own mmap and unmaps them on free, and trims the top of
    the heap when it is free: a training step that allocates and frees the same ~100 MB every step then page-faults
    all of it back every step. mallopt(M_MMAP_MAX, 0) sends every block through the heap and
    mallopt(M_TRIM_THRESHOLD, INT_MAX) stops trimming, so the heap grows once to the step's peak and stays: what
    jemalloc or tcmalloc (preloaded by Intel's PyTorch launcher) do by design. Process-wide and not undoable; the
    same is available without code as GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647.
    Returns what it did; raises RuntimeError where the C library is not glibc (guard the call with the
    glibc_malloc capability: section 03.keep-freed-memory).
    """

    cap = env.capabilities()["glibc_malloc"]
    if not cap.available:
        raise RuntimeError(f"keep_freed_memory() needs glibc's mallopt: {cap.reason}; use jemalloc or tcmalloc, or "
                           "the platform allocator's own settings")
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        raise RuntimeError(f"keep_freed_memory() needs glibc (libc.so.6 with mallopt): {exc}") from None
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's malloc.h
    if mallopt(m_mmap_max, 0) != 1 or mallopt(m_trim_threshold, 2**31 - 1) != 1:
        raise RuntimeError("glibc's mallopt refused M_MMAP_MAX=0 / M_TRIM_THRESHOLD=INT_MAX")
    return "glibc malloc keeps freed memory: large blocks come from the heap (M_MMAP_MAX=0), the heap is never trimmed"


@dataclass(frozen=True)
class AllocatorAB:
    """What allocator_ab measured (lesson 03): per round, ms per step and minor faults per step of each allocator."""

    default_ms: tuple[float, ...]
    kept_ms: tuple[float, ...]
    default_faults: tuple[float, ...]
    kept_faults: tuple[float, ...]

    @property
    def ratio(self) -> bench.Ratio:
        """Speedup of keeping freed memory over glibc's defaults, from the paired rounds."""
        return bench.Ratio.from_times(self.default_ms, self.kept_ms)

    @property
    def faults_saved(self) -> float:
        """Minor page faults per step that keeping freed memory avoids (medians over the rounds)."""
        return statistics.median(self.default_faults) - statistics.median(self.kept_faults)

    @property
    def us_per_fault(self) -> float | None:
        """Step time saved per avoided fault, in microseconds (None when no fault was avoided)."""
        saved_ms = statistics.median(self.default_ms) - statistics.median(self.kept_ms)
        return saved_ms * 1e3 / self.faults_saved if self.faults_saved > 0 else None


def _start_child(args: dict, tunables: str | None, stderr) -> subprocess.Popen:
    child_env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        child_env["GLIBC_TUNABLES"] = tunables
    root = str(env.repo_root())
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-m", "utils.training.allocator", json.dumps(args)], cwd=root,
                            env=child_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)


def _ask(child: subprocess.Popen, line: str, log) -> dict:
    child.stdin.write(line + "\n")
    child.stdin.flush()
    answer = child.stdout.readline()
    if not answer:
        log.seek(0)
        raise RuntimeError(f"the allocator child process exited ({child.poll()}): {log.read()[-2000:]}")
    return json.loads(answer)


def allocator_ab(*, n_images: int, image_size: int, batch_size: int, steps: int = 3, rounds: int = 3,
                 warmup: int = 2, model: str = "resnet50", config: LoopConfig | None = None) -> AllocatorAB:
    """glibc's default malloc vs malloc keeping freed memory (KEEP_TUNABLES), interleaved (lesson 03).

    Two child processes build the same Trainer (`config`, default the slow loop) on the synthetic dataset, run
    `warmup` steps, then take turns: each round runs `steps` steps in one, then in the other (the order alternates
    from round to round). Each child counts its own minor page faults. Linux with glibc only.
    """
    cap = env.capabilities()["glibc_malloc"]
    if not cap.available:
        raise RuntimeError(f"allocator_ab() needs glibc (GLIBC_TUNABLES): {cap.reason}")
    for name, v in (("steps", steps), ("rounds", rounds), ("n_images", n_images)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    config = config or LoopConfig()
    args = dict(n_images=n_images, image_size=image_size, batch_size=batch_size, warmup=warmup, model=model,
                config={k: v for k, v in config.diff().items()})
    ms: dict = {"default": [], "kept": []}
    faults: dict = {"default": [], "kept": []}
    with tempfile.TemporaryFile("w+") as log_default, tempfile.TemporaryFile("w+") as log_kept:
        logs = {"default": log_default, "kept": log_kept}
        children = {"default": _start_child(args, None, log_default), "kept": _start_child(args, KEEP_TUNABLES, log_kept)}
        try:
            for name, child in children.items():
                _ask(child, "ready?", logs[name])
            for r in range(rounds):
                for name in (("default", "kept") if r % 2 == 0 else ("kept", "default")):
                    got = _ask(children[name], str(steps), logs[name])
                    ms[name].append(got["ms"])
                    faults[name].append(got["faults"])
        finally:
            live = [child for child in children.values() if child.poll() is None]
            for child in live:  # both told to finish first: they shut down side by side, not one after the other
                child.stdin.close()
            for child in live:
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    return AllocatorAB(tuple(ms["default"]), tuple(ms["kept"]), tuple(faults["default"]), tuple(faults["kept"]))


def _child(args: dict) -> None:
    """allocator_ab's child: build the loop, then answer each line on stdin (a step count) with one JSON line."""
    dataset = image_data.AugmentedImages(image_data.synthetic_cifar(args["n_images"]), image_size=args["image_size"])
    with Trainer(dataset, LoopConfig(**args["config"]), batch_size=args["batch_size"], model=args["model"]) as tr:
        if args["warmup"]:
            tr.run(args["warmup"])
        for line in sys.stdin:
            line = line.strip()
            if line == "ready?":
                print(json.dumps({"ready": True}), flush=True)
                continue
            faults, ms = page_faults_per_step(tr, steps=int(line))
            print(json.dumps({"ms": ms, "faults": faults}), flush=True)


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
