"""Memory the training step gives back and takes again (lesson 03): minor page faults per step, and glibc's malloc
told to keep freed memory in the process, what jemalloc or tcmalloc do by design.
"""

from __future__ import annotations

import ctypes
import platform
import resource
import time

from utils.training.loop import Trainer

__all__ = ["page_faults_per_step", "keep_freed_memory"]


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
