"""Bandwidth sweeps for softmax implementations (lesson 06 and its lab).

``softmax_sweep`` runs every implementation on tensors of ``total`` elements shaped ``(total // n, n)`` for each
row length ``n``, next to ``x.clone()`` on the same tensor (the copy-bandwidth roof, re-measured at that very size),
interleaved round-robin so that machine noise hits all of them alike. Softmax reads and writes every element once at
best, so its effective bandwidth is ``2 * bytes / time``, the same formula as the copy: the ratio of the two is the
fraction of the roof a kernel reaches.
"""

from __future__ import annotations

from collections.abc import Callable

from utils.core import bench

__all__ = ["softmax_sweep", "cuda_event_ms", "fraction_of_copy"]


def cuda_event_ms(fn: Callable[[], object], *, warmup: int = 3, iters: int = 20, repeats: int = 5) -> float:
    """Median milliseconds per call of `fn` on the current CUDA stream, timed with CUDA events (lesson 06)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("cuda_event_ms needs a CUDA GPU; on the CPU use utils.core.bench.measure")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / iters)
    return sorted(times)[len(times) // 2]


def softmax_sweep(
    impls: dict[str, Callable],
    ns: list[int],
    total: int,
    *,
    dtype=None,
    device: str = "cpu",
    min_run_time: float = 0.3,
    warmup: int = 2,
    rounds: int = 2,
    progress: bool = True,
) -> list[dict]:
    """Effective GB/s of each implementation `impls[name](x)` for x of shape (total // n, n), n in `ns` (lesson 06).

    Returns one dict per n: ``{"n", "rows", "mbytes", "copy": GB/s, name: GB/s, ...}``; "copy" is x.clone() on the
    same tensor. On CUDA the timings use CUDA events, on the CPU utils.core.bench.measure; each implementation keeps the
    best of `rounds` interleaved measurements.
    """
    import torch

    if not impls:
        raise ValueError("softmax_sweep needs at least one implementation")
    if "copy" in impls:
        raise ValueError("'copy' is the name softmax_sweep gives x.clone(); rename that implementation")
    bad = [n for n in ns if not isinstance(n, int) or n < 1 or n > total]
    if not ns or bad:
        raise ValueError(f"row lengths must be integers between 1 and total={total}, got {ns}")
    dtype = dtype or torch.float32
    device = torch.device(device)
    base = torch.randn(total, device=device).to(dtype)
    itemsize = base.element_size()
    rows_out = []
    iterator = ns
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(ns, desc=f"sweep {total * itemsize / 1e6:.0f} MB on {device.type}", leave=False)
    for n in iterator:
        x = base[: (total // n) * n].view(-1, n)
        fns = {"copy": x.clone, **{name: (lambda f=f, x=x: f(x)) for name, f in impls.items()}}
        best: dict[str, float] = {}
        for _round in range(rounds):
            for name, fn in fns.items():
                if device.type == "cuda":
                    ms = cuda_event_ms(fn, warmup=warmup)
                else:
                    ms = bench.measure(fn, label=name, warmup=warmup, min_run_time=min_run_time).median_ms
                best[name] = min(best.get(name, float("inf")), ms)
        nbytes = 2 * x.numel() * itemsize  # read x once, write y once
        row = {"n": n, "rows": x.shape[0], "mbytes": x.numel() * itemsize / 1e6}
        row.update({name: nbytes / (ms / 1e3) / 1e9 for name, ms in best.items()})
        rows_out.append(row)
    return rows_out


def fraction_of_copy(rows: list[dict], name: str) -> list[float]:
    """GB/s of `name` divided by the copy's GB/s at the same shape, for each row of a softmax_sweep (lesson 06)."""
    missing = [r["n"] for r in rows if name not in r]
    if missing:
        raise KeyError(f"{name!r} was not measured in this sweep (row lengths {missing}); names: {sorted(rows[0])}")
    return [r[name] / r["copy"] for r in rows]
