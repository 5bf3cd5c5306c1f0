"""Timing on torch.utils.benchmark (lesson 00 explains it; every lesson uses it).

``measure(fn)`` warms up, then lets ``Timer.blocked_autorange`` pick the number of calls per block and returns a
``BenchResult`` with the median and the interquartile range in milliseconds. torch.utils.benchmark synchronises CUDA
around each block when a GPU is present, so GPU timings are honest without extra code. Compare configurations
*side by side in one run* (``compare``): the machines are shared and noisy, ratios measured together are what count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BenchResult", "measure", "compare", "first_call_ms", "geomean", "copy_bandwidth_gbps", "matmul_gflops"]


@dataclass(frozen=True)
class BenchResult:
    """Timing of one callable: median and IQR in milliseconds over `runs` measured calls."""

    label: str
    median_ms: float
    iqr_ms: float
    runs: int
    items: int = 1  # work items per call (e.g. the batch size), for throughput

    @property
    def throughput(self) -> float:
        """Items per second at the median."""
        return self.items / (self.median_ms / 1e3)

    def __str__(self) -> str:
        per = f", {self.throughput:,.1f} items/s" if self.items != 1 else ""
        return f"{self.label}: median {self.median_ms:.3f} ms (IQR {self.iqr_ms:.3f} ms, {self.runs} runs){per}"


def measure(
    fn: Callable[[], object],
    label: str = "",
    *,
    warmup: int = 3,
    min_run_time: float = 0.5,
    items: int = 1,
    num_threads: int | None = None,
) -> BenchResult:
    """Time `fn()` (no arguments: close over the inputs). Warm-up calls are not measured.

    `min_run_time` (seconds) bounds the measuring time; smoke mode passes a small value.
    """
    import torch
    from torch.utils import benchmark

    if not callable(fn):
        raise TypeError(f"measure() needs a callable taking no arguments, got {type(fn).__name__}")
    if warmup < 0 or min_run_time <= 0:
        raise ValueError(f"warmup must be >= 0 and min_run_time > 0, got warmup={warmup}, min_run_time={min_run_time}")
    for _ in range(warmup):
        fn()
    timer = benchmark.Timer(
        stmt="fn()",
        globals={"fn": fn},
        label=label or getattr(fn, "__name__", "fn"),
        num_threads=num_threads or torch.get_num_threads(),
    )
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return BenchResult(
        label=label or getattr(fn, "__name__", "fn"),
        median_ms=m.median * 1e3,
        iqr_ms=m.iqr * 1e3,
        runs=len(m.times) * m.number_per_run,
        items=items,
    )


def compare(fns: dict[str, Callable[[], object]], baseline: str | None = None, **kwargs) -> dict[str, BenchResult]:
    """Measure several callables in one run, interleaved round-robin twice to spread machine noise.

    Prints each result and its speedup over `baseline` (default: the first entry). Returns {name: BenchResult}
    keeping the faster of the two rounds for each.
    """
    if not fns:
        raise ValueError("compare() needs at least one callable")
    baseline = baseline or next(iter(fns))
    if baseline not in fns:
        raise KeyError(f"baseline {baseline!r} is not among {list(fns)}")
    kwargs.setdefault("min_run_time", 0.3)
    best: dict[str, BenchResult] = {}
    for _ in range(2):
        for name, fn in fns.items():
            res = measure(fn, label=name, **kwargs)
            if name not in best or res.median_ms < best[name].median_ms:
                best[name] = res
    base = best[baseline].median_ms
    for res in best.values():
        print(f"{res}  -> {base / res.median_ms:.2f}x vs {baseline}")
    return best


def first_call_ms(fn: Callable[[], object]) -> float:
    """Wall time of a single call in milliseconds (for first-call vs steady-state comparisons)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def geomean(values) -> float:
    """Geometric mean of positive numbers (for speedups over a sweep)."""
    values = list(values)
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"geomean needs positive values, got {values}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


# ---------------------------------------------------------------------------------------------------------------------
# roofline probes (lesson 00 measures them; lesson 06 re-measures copy bandwidth at its own sizes)
# ---------------------------------------------------------------------------------------------------------------------


def copy_bandwidth_gbps(nbytes: int, *, dtype=None, device="cpu", min_run_time: float = 0.5) -> float:
    """Memory bandwidth of x.clone() on a tensor of `nbytes` bytes: (read + write) bytes / median time, in GB/s."""
    import torch

    dtype = dtype or torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    if nbytes < itemsize:
        raise ValueError(f"nbytes must hold at least one {dtype} element ({itemsize} bytes), got {nbytes}")
    x = torch.ones(nbytes // itemsize, dtype=dtype, device=device)
    res = measure(x.clone, label=f"clone {nbytes / 1e6:.0f} MB", min_run_time=min_run_time)
    return 2 * x.numel() * itemsize / (res.median_ms / 1e3) / 1e9


def matmul_gflops(n: int, *, dtype=None, device="cpu", min_run_time: float = 0.5) -> float:
    """Dense n x n @ n x n throughput in GFLOP/s (2 n^3 flops per product) at the median time."""
    import torch

    dtype = dtype or torch.float32
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    res = measure(lambda: a @ b, label=f"matmul {n} {dtype}", min_run_time=min_run_time)
    return 2 * n**3 / (res.median_ms / 1e3) / 1e9
