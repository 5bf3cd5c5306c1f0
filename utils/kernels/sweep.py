"""Bandwidth sweeps for softmax implementations (lesson 06 and its lab).

``softmax_sweep`` runs every implementation on tensors of ``total`` elements shaped ``(total // n, n)`` for each
row length ``n``, in interleaved rounds with two copies of the same tensor:

- ``"copy"``: ``out.copy_(x)`` into a buffer that already exists, the course's memory roof (bench.copy_into_gbps);
- ``"clone"``: ``x.clone()``, allocate + copy: above glibc's mmap threshold every call maps fresh pages and pays a
  first-touch page fault per 4 KiB page. It is the fair yardstick only for an implementation that allocates too.

Softmax reads and writes every element once at best, so its effective bandwidth is ``2 * bytes / time``, the same
formula as the copy: the ratio of the two is the fraction of the roof a kernel reaches. Implementations come in two
kinds: ``impls`` return a fresh tensor, ``f(x)``; ``into`` write into a preallocated output, ``f(x, out)``, and are
the ones to hold against the copy-into roof out of cache.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from utils.core import bench

__all__ = ["softmax_sweep", "cuda_event_ms", "fraction_of_copy", "ratio_over", "roof_spread", "ROOFS"]

ROOFS = ("copy", "clone")


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
    into: dict[str, Callable] | None = None,
    dtype=None,
    device: str = "cpu",
    min_run_time: float = 0.3,
    warmup: int = 2,
    rounds: int = 2,
    progress: bool = False,
) -> list[dict]:
    """Effective GB/s of each implementation for x of shape (total // n, n), n in `ns` (lesson 06).

    `impls[name](x)` returns a fresh tensor; `into[name](x, out)` writes into `out`, preallocated (and touched) once.
    Returns one dict per n: ``{"n", "rows", "mbytes", "copy": GB/s, "clone": GB/s, name: GB/s, ..., "round_ms":
    {name: [ms per round]}, "iqr": {name: worst IQR / median}}``. GB/s is at the median of the rounds; on CUDA the
    timings use CUDA events, on the CPU utils.core.bench.measure. `progress` prints one line per row length.
    """
    import torch

    into = into or {}
    if not impls and not into:
        raise ValueError("softmax_sweep needs at least one implementation")
    clash = [name for name in (*impls, *into) if name in ROOFS]
    if clash:
        raise ValueError(f"{ROOFS} are the names softmax_sweep gives its two copies; rename {clash}")
    both = set(impls) & set(into)
    if both:
        raise ValueError(f"{sorted(both)} appear in both impls and into: give each implementation one name")
    bad = [n for n in ns if not isinstance(n, int) or n < 1 or n > total]
    if not ns or bad:
        raise ValueError(f"row lengths must be integers between 1 and total={total}, got {ns}")
    dtype = dtype or torch.float32
    device = torch.device(device)
    base = torch.randn(total, device=device).to(dtype)
    out_base = torch.empty_like(base)
    out_base.copy_(base)  # touch every page of the output once, before any timing
    itemsize = base.element_size()
    rows_out = []
    for n in ns:
        x = base[: (total // n) * n].view(-1, n)
        out = out_base[: x.numel()].view(-1, n)
        fns = {"copy": lambda x=x, out=out: out.copy_(x), "clone": x.clone,
               **{name: (lambda f=f, x=x: f(x)) for name, f in impls.items()},
               **{name: (lambda f=f, x=x, out=out: f(x, out)) for name, f in into.items()}}
        round_ms: dict[str, list[float]] = {name: [] for name in fns}
        iqr: dict[str, float] = dict.fromkeys(fns, 0.0)
        for r in range(rounds):
            for name, fn in fns.items():
                if device.type == "cuda":
                    ms = cuda_event_ms(fn, warmup=warmup if r == 0 else 0)
                else:
                    res = bench.measure(fn, label=name, warmup=warmup if r == 0 else 0, min_run_time=min_run_time)
                    ms, iqr[name] = res.median_ms, max(iqr[name], res.iqr_fraction)
                round_ms[name].append(ms)
        nbytes = 2 * x.numel() * itemsize  # read x once, write y once
        row = {"n": n, "rows": x.shape[0], "mbytes": x.numel() * itemsize / 1e6}
        row.update({name: nbytes / (statistics.median(ms) / 1e3) / 1e9 for name, ms in round_ms.items()})
        row["round_ms"], row["iqr"] = round_ms, iqr
        rows_out.append(row)
        if progress:
            print(f"  n={n}: " + ", ".join(f"{k} {row[k]:.1f}" for k in fns) + " GB/s")
    return rows_out


def _require(rows: list[dict], *names: str) -> None:
    for name in names:
        missing = [r["n"] for r in rows if name not in r]
        if missing:
            raise KeyError(f"{name!r} was not measured in this sweep (row lengths {missing}); "
                           f"names: {sorted(k for k in rows[0] if k not in ('n', 'rows', 'mbytes', 'round_ms', 'iqr'))}")


def roof_spread(rows: list[dict], roof: str = "copy") -> float:
    """Highest over lowest GB/s of a roof across a sweep's row lengths (lesson 06): the copy moves the same bytes at
    every n, so a spread well above 1 is the machine (other load, page placement), not the shape."""
    if roof not in ROOFS:
        raise ValueError(f"roof must be one of {ROOFS}, got {roof!r}")
    values = [r[roof] for r in rows]
    return max(values) / min(values)


def fraction_of_copy(rows: list[dict], name: str, roof: str = "copy") -> list[float]:
    """GB/s of `name` divided by the roof's GB/s at the same shape, for each row of a softmax_sweep (lesson 06).

    `roof` is "copy" (into an existing buffer, the course's roof) or "clone" (allocate + copy)."""
    if roof not in ROOFS:
        raise ValueError(f"roof must be one of {ROOFS}, got {roof!r}")
    _require(rows, name)
    return [r[name] / r[roof] for r in rows]


def ratio_over(rows: list[dict], name: str, over: str, *, caveat: str = "") -> bench.Ratio:
    """Speedup of `name` over `over` across a sweep, as a bench.Ratio (lesson 06).

    Each round gives one geometric mean over the row lengths of time(over) / time(name); the Ratio is the median of
    those with their min..max as its interval. With `over` a roof ("copy" or "clone"), it is the fraction of the roof
    reached: each round's geometric mean GB/s over the median over n of the roof's GB/s in that round.
    The geometric mean is too noisy to judge when the timings of more than a quarter of the row lengths are (IQR above
    bench.MAX_IQR_FRACTION of the median): it is then judged on its interval widened by the worst point's IQR
    fraction; fewer noisy points (the sweep's table shows each point's IQR) leave the verdict to the rounds.
    """
    _require(rows, name, over)
    rounds = min(len(r["round_ms"][k]) for r in rows for k in (name, over))
    if over in ROOFS:  # one roof per round: the median over the row lengths of the roof's GB/s (the copy moves the
        # same buffers at every n, so a point where it jumps is the machine, not the shape, and must not move the fraction)
        def gbps(r, k, i):
            return 2 * r["mbytes"] / r["round_ms"][k][i]  # MB / ms = GB/s, read + write
        per_round = [math.exp(statistics.fmean(math.log(gbps(r, name, i)) for r in rows))
                     / statistics.median(gbps(r, over, i) for r in rows) for i in range(rounds)]
    else:
        per_round = [math.exp(statistics.fmean(math.log(r["round_ms"][over][i] / r["round_ms"][name][i]) for r in rows))
                     for i in range(rounds)]
    noisy = [f"{k} at n={r['n']}: IQR {r['iqr'][k]:.0%} of the median" for r in rows for k in (over, name)
             if r["iqr"].get(k, 0.0) > bench.MAX_IQR_FRACTION]
    noisy_rows = {r["n"] for r in rows for k in (over, name) if r["iqr"].get(k, 0.0) > bench.MAX_IQR_FRACTION}
    text = "; ".join(noisy[:3]) + (f"; {len(noisy) - 3} more" if len(noisy) > 3 else "")
    spread = max((r["iqr"].get(k, 0.0) for r in rows for k in (over, name)), default=0.0)
    if len(noisy_rows) <= len(rows) / 4:  # the sweep's table shows each point's IQR
        text, spread = "", 0.0
    return bench.Ratio.from_samples(per_round, noisy=text, caveat=caveat, spread=spread)
