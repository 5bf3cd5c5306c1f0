"""Timing on torch.utils.benchmark (lesson 00 explains it; every lesson uses it).

``measure(fn)`` warms up, then lets ``Timer.blocked_autorange`` pick the number of calls per block and returns a
``BenchResult`` with the median and the interquartile range in milliseconds. torch.utils.benchmark synchronises CUDA
around each block when a GPU is present, so GPU timings are honest without extra code.

Comparisons run *interleaved rounds* (``compare``): every round times each callable once, in turn, so slow drift of a
shared machine hits every side alike. A speedup is a ``Ratio``: the median of the per-round ratios, with the lowest
and highest per-round ratio as its interval (the course's one interval, stated in lesson 00). utils.core.verdict turns
a Ratio and a threshold into "faster / slower / within noise".

The course's one memory roof is ``copy_into_gbps``: a copy into a buffer that already exists (STREAM-style).
``clone_gbps`` (allocate + copy) is kept beside it to teach the gap: above glibc's mmap threshold every clone() maps
fresh pages and pays a first-touch fault per 4 KiB page.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["BenchResult", "Ratio", "Comparison", "measure", "compare", "first_call_ms", "geomean", "copy_into_gbps",
           "clone_gbps", "matmul_gflops", "MAX_IQR_FRACTION", "MIN_BLOCKS", "MAX_DISAGREEMENT"]

# A timing whose interquartile range exceeds this fraction of its median is too noisy to judge (verdicts say so).
MAX_IQR_FRACTION = 0.25
# the fewest timed blocks a median and IQR rest on (measure): one is a single sample, with no spread to report
MIN_BLOCKS = 3
# The two estimates of one speedup, the median of the per-round ratios and the ratio of the two sides' median times,
# agree on a steady machine; when they differ by more than this fraction the rounds disagree (a neighbour disturbed
# some of them) and the ratio counts as noisy, judged on its interval widened by the disagreement. So does a ratio
# whose two estimates point to opposite sides of 1.
MAX_DISAGREEMENT = 0.2


@dataclass(frozen=True)
class BenchResult:
    """Timing of one callable: median and IQR in milliseconds over `runs` measured calls."""

    label: str
    median_ms: float
    iqr_ms: float
    runs: int
    items: int = 1  # work items per call (e.g. the batch size), for throughput
    times_ms: tuple[float, ...] = ()  # the per-call time of every measured block

    @property
    def iqr_fraction(self) -> float:
        """IQR / median: above MAX_IQR_FRACTION the timing is too noisy to judge."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else math.inf

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
    min_blocks: int = MIN_BLOCKS,
    number: int | None = None,
) -> BenchResult:
    """Time `fn()` (no arguments: close over the inputs). Warm-up calls are not measured.

    `min_run_time` (seconds) bounds the measuring time; smoke mode passes a small value. Whatever it is, the median
    and IQR rest on at least `min_blocks` timed blocks: a call slower than `min_run_time` would otherwise be timed
    once, with an IQR of 0 that hides all spread, and one call a busy neighbour slowed would set the whole result.
    `number` fixes the calls per block and skips torch's block-size estimate (one untimed call of `fn`, however slow):
    exactly `min_blocks` blocks of `number` calls, `min_run_time` unused (smoke runs of steps that take ~0.2 s each).
    """
    import torch
    from torch.utils import benchmark

    if not callable(fn):
        raise TypeError(f"measure() needs a callable taking no arguments, got {type(fn).__name__}")
    if warmup < 0 or min_run_time <= 0:
        raise ValueError(f"warmup must be >= 0 and min_run_time > 0, got warmup={warmup}, min_run_time={min_run_time}")
    if not isinstance(min_blocks, int) or min_blocks < 1:
        raise ValueError(f"min_blocks must be a positive int, got {min_blocks!r}")
    if number is not None and (not isinstance(number, int) or number < 1):
        raise ValueError(f"number must be a positive int or None, got {number!r}")
    for _ in range(warmup):
        fn()
    timer = benchmark.Timer(
        stmt="fn()",
        globals={"fn": fn},
        label=label or getattr(fn, "__name__", "fn"),
        num_threads=num_threads or torch.get_num_threads(),
    )
    if number is None:
        parts = [timer.blocked_autorange(min_run_time=min_run_time)]
        # top up to min_blocks blocks, each a 1/min_blocks share of the first block's calls (at least one call): a
        # block of many calls still amortises the timer, and a top-up costs at most the first block's time again. Each
        # top-up block is timed as it is (Timer._timeit): Timer.timeit() first runs max(number // 100, 2) untimed
        # warm-up calls, which made a call slower than min_run_time cost 8 calls for its 3 timed blocks instead of 4
        # (blocked_autorange's block-size estimate, then the 3 blocks); these blocks follow calls of the same fn, so
        # they start warm. (torch's Measurement.merge pools the blocks' per-call times)
        number = max(1, -(-parts[0].number_per_run // min_blocks))
        missing = min_blocks - len(parts[0].times)
    else:  # the caller fixed the block size: min_blocks blocks of `number` calls, no estimate
        parts, missing = [], min_blocks
    time_block = getattr(timer, "_timeit", None)  # private; a torch without it falls back to timeit() and its warm-up
    if missing > 0 and time_block is None:
        parts += [timer.timeit(number=number) for _ in range(missing)]
    elif missing > 0:
        task_spec = parts[0].task_spec if parts else timer._task_spec
        with benchmark.utils.common.set_torch_threads(task_spec.num_threads):
            extra = [time_block(number) for _ in range(missing)]
        parts.append(benchmark.Measurement(number_per_run=number, raw_times=extra, task_spec=task_spec))
    m = benchmark.Measurement.merge(parts)[0] if len(parts) > 1 else parts[0]
    return BenchResult(
        label=label or getattr(fn, "__name__", "fn"),
        median_ms=m.median * 1e3,
        iqr_ms=m.iqr * 1e3,
        runs=sum(len(p.times) * p.number_per_run for p in parts),
        items=items,
        times_ms=tuple(t * 1e3 for t in m.times),
    )


@dataclass(frozen=True)
class Ratio:
    """A ratio measured in rounds (a speedup: baseline time / this time): ``value`` is the median of the per-round
    ratios, ``low``/``high`` the lowest and highest of them. ``noisy`` names a timing whose IQR is above
    MAX_IQR_FRACTION of its median and ``spread`` is that IQR fraction (the worst side's): the verdict then judges
    the interval widened by it on each side (``judged``), so only an effect larger than the noise gets a verdict;
    ``caveat`` says what differs when the two sides are not like for like.
    Lesson 00 introduces it; utils.core.verdict judges it; report.record stores its interval.
    """

    value: float
    low: float
    high: float
    rounds: int = 1
    noisy: str = ""
    caveat: str = ""
    spread: float = 0.0

    def __post_init__(self):
        for name in ("value", "low", "high"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"Ratio.{name} must be a positive finite number, got {v!r}")
        if not self.low <= self.value <= self.high:
            raise ValueError(f"Ratio needs low <= value <= high, got {self.low} <= {self.value} <= {self.high}")

    @classmethod
    def from_samples(cls, ratios: Sequence[float], *, noisy: str = "", caveat: str = "", spread: float = 0.0) -> Ratio:
        """A Ratio from per-round ratios (median; min and max)."""
        ratios = [float(r) for r in ratios]
        if not ratios:
            raise ValueError("Ratio.from_samples needs at least one per-round ratio")
        return cls(statistics.median(ratios), min(ratios), max(ratios), len(ratios), noisy, caveat, spread)

    @classmethod
    def from_times(cls, baseline_ms: Sequence[float], new_ms: Sequence[float], **kw) -> Ratio:
        """Speedup of `new` over `baseline` from paired per-round times (round i of each was measured together)."""
        if len(baseline_ms) != len(new_ms) or not baseline_ms:
            raise ValueError(f"from_times needs the same number (>= 1) of paired rounds, got {len(baseline_ms)} and "
                             f"{len(new_ms)}")
        return cls.from_samples([b / n for b, n in zip(baseline_ms, new_ms, strict=True)], **kw)

    @property
    def interval(self) -> tuple[float, float]:
        return (self.low, self.high)

    @property
    def judged(self) -> tuple[float, float] | None:
        """The interval a verdict reads: the rounds' own when no timing is noisy; widened by ``spread`` on each side
        when one is; None when a timing is noisy and its spread is unknown (nothing to judge against)."""
        if not self.noisy:
            return (self.low, self.high)
        if self.spread > 0:
            return (self.low / (1 + self.spread), self.high * (1 + self.spread))
        return None

    def inverse(self) -> Ratio:
        """The same measurement read the other way round (a slowdown as a speedup)."""
        return dataclasses.replace(self, value=1 / self.value, low=1 / self.high, high=1 / self.low)

    def like_for_like(self, caveat: str) -> Ratio:
        """This ratio with a note of what differs between the two sides (printed with every verdict on it)."""
        return dataclasses.replace(self, caveat=caveat)

    def __float__(self) -> float:
        return float(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec) if spec else str(self)

    def text(self, digits: int = 2) -> str:
        """'1.34x [1.28-1.41, 5 rounds]' with `digits` decimals (str() uses two)."""
        return f"{self.value:.{digits}f}x [{self.low:.{digits}f}-{self.high:.{digits}f}, {self.rounds} rounds]"

    def __str__(self) -> str:
        return self.text(2)


class Comparison(dict):
    """{name: BenchResult} of an interleaved comparison (``compare``), plus the per-round medians behind every
    ``ratio``. Each BenchResult's median and IQR are the medians of its rounds' own; its times pool every block."""

    def __init__(self, results: dict[str, BenchResult], round_ms: dict[str, list[float]], baseline: str):
        super().__init__(results)
        self.round_ms = round_ms
        self.baseline = baseline

    def ratio(self, name: str, over: str | None = None, *, caveat: str = "") -> Ratio:
        """Speedup of `name` over `over` (default: the baseline): per-round time of `over` / time of `name`."""
        over = over or self.baseline
        for key in (name, over):
            if key not in self:
                raise KeyError(f"{key!r} was not compared; the comparison has {list(self)}")
        sides = [k for k in dict.fromkeys((over, name)) if self[k].iqr_fraction > MAX_IQR_FRACTION]
        notes = [f"{k}: IQR {self[k].iqr_fraction:.0%} of the median" for k in sides]
        spread = max((self[k].iqr_fraction for k in sides), default=0.0)
        per_round = Ratio.from_times(self.round_ms[over], self.round_ms[name])
        of_medians = self[over].median_ms / self[name].median_ms
        disagreement = max(of_medians / per_round.value, per_round.value / of_medians) - 1
        # the two estimates differ by too much, or point to opposite sides of 1 (one says faster, the other slower)
        opposite = (of_medians - 1) * (per_round.value - 1) < 0
        if per_round.rounds >= 2 and (disagreement > MAX_DISAGREEMENT or opposite):
            notes.append(f"the rounds disagree: the median times give {of_medians:.2f}x, the per-round ratios "
                         f"{per_round.value:.2f}x")
            spread = max(spread, disagreement)
        return dataclasses.replace(per_round, noisy="; ".join(notes), caveat=caveat, spread=spread)


def compare(
    fns: dict[str, Callable[[], object]],
    baseline: str | None = None,
    *,
    rounds: int = 5,
    min_run_time: float = 0.12,
    warmup: int = 3,
    warmup_each_round: bool = False,
    per_fn: dict[str, dict] | None = None,
    quiet: bool = False,
    **kwargs,
) -> Comparison:
    """Measure several callables in interleaved rounds: each round times every callable once, in turn (every other
    round in reverse order).

    Returns a Comparison {name: BenchResult} whose ``ratio(name)`` is the speedup over `baseline` (default: the first
    entry) with its interval from the rounds. Prints each result and its ratio unless `quiet`. Warm-up calls run in
    the first round only (every round with `warmup_each_round`). `min_run_time` is per round. `per_fn` gives one
    callable its own measure() arguments (e.g. {"loop": {"warmup": 4, "items": 8}}), over the shared ones.
    """
    if not fns:
        raise ValueError("compare() needs at least one callable")
    if rounds < 1:
        raise ValueError(f"compare() needs rounds >= 1, got {rounds}")
    baseline = baseline or next(iter(fns))
    if baseline not in fns:
        raise KeyError(f"baseline {baseline!r} is not among {list(fns)}")
    round_ms: dict[str, list[float]] = {name: [] for name in fns}
    round_iqr: dict[str, list[float]] = {name: [] for name in fns}
    blocks: dict[str, list[float]] = {name: [] for name in fns}
    runs: dict[str, int] = dict.fromkeys(fns, 0)
    items: dict[str, int] = {}
    for r in range(rounds):
        # every other round in reverse order (A B, B A, ...): a slowdown that comes and goes does not always hit the
        # same side first
        for name, fn in (fns.items() if r % 2 == 0 else reversed(fns.items())):
            kw = {"warmup": warmup, "min_run_time": min_run_time, **kwargs, **(per_fn or {}).get(name, {})}
            if r > 0 and not warmup_each_round:
                kw["warmup"] = 0
            res = measure(fn, label=name, **kw)
            round_ms[name].append(res.median_ms)
            round_iqr[name].append(res.iqr_ms)
            blocks[name].extend(res.times_ms or (res.median_ms,))
            runs[name] += res.runs
            items[name] = res.items
    results = {}
    for name, times in blocks.items():
        # the median of the rounds' medians, like the ratios (pooled blocks would mix a disturbed round's regime into
        # an absolute number printed beside a per-round ratio); the IQR is the median of the rounds' own IQRs: the
        # noise within a round. Drift between rounds is what the per-round ratios' interval shows; it must not also
        # count as noise and void a verdict.
        results[name] = BenchResult(label=name, median_ms=statistics.median(round_ms[name]),
                                    iqr_ms=statistics.median(round_iqr[name]), runs=runs[name], items=items[name],
                                    times_ms=tuple(times))
    out = Comparison(results, round_ms, baseline)
    if not quiet:
        for name, res in out.items():
            tail = "baseline" if name == baseline else f"{out.ratio(name)} vs {baseline}"
            print(f"{res}  -> {tail}")
    return out


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


def minor_fault_us(mib: int = 32, repeats: int = 5) -> list[float]:
    """What one minor page fault costs here, in microseconds, once per repeat (lessons 03 and 04).

    Maps `mib` MiB of fresh anonymous memory (mmap, outside malloc), writes one byte per page (each write faults a
    zeroed page in), then writes the same bytes again (no faults): the difference over the page count is the fault.
    """
    if not isinstance(mib, int) or mib < 1 or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"mib and repeats must be positive ints, got {mib!r}, {repeats!r}")
    page = mmap.PAGESIZE
    out = []
    import numpy as np

    for _ in range(repeats):
        with mmap.mmap(-1, mib * 2**20) as region:
            pages = np.frombuffer(region, dtype=np.uint8)[::page]
            t0 = time.perf_counter()
            pages[:] = 1  # first touch: one minor fault per page
            t1 = time.perf_counter()
            pages[:] = 2  # the same writes, pages present
            t2 = time.perf_counter()
            del pages  # release the buffer before the mapping closes
        out.append(((t1 - t0) - (t2 - t1)) / (mib * 2**20 // page) * 1e6)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# roofline probes (lesson 00 measures them; lesson 06 re-measures copy bandwidth at its own sizes)
# ---------------------------------------------------------------------------------------------------------------------


def _elements(nbytes: int, dtype) -> tuple[int, int]:
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    if nbytes < itemsize:
        raise ValueError(f"nbytes must hold at least one {dtype} element ({itemsize} bytes), got {nbytes}")
    return nbytes // itemsize, itemsize


def copy_into_gbps(nbytes: int, *, dtype=None, device="cpu", min_run_time: float = 0.5) -> float:
    """The course's memory roof: dst.copy_(src) into a buffer that already exists (STREAM's copy), in GB/s counting
    the bytes read and the bytes written. No allocation, no first-touch page faults: only the memory system.
    Lesson 00 measures it in cache and out of cache; 06 and 07 judge their kernels against it."""
    import torch

    dtype = dtype or torch.float32
    n, itemsize = _elements(nbytes, dtype)
    src = torch.ones(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page of dst once, before timing
    res = measure(lambda: dst.copy_(src), label=f"copy into {nbytes / 1e6:.0f} MB", min_run_time=min_run_time)
    return 2 * n * itemsize / (res.median_ms / 1e3) / 1e9


def clone_gbps(nbytes: int, *, dtype=None, device="cpu", min_run_time: float = 0.5) -> float:
    """x.clone() in GB/s (read + write bytes): allocate + copy. NOT the memory roof: above glibc's mmap threshold each
    call maps fresh pages and takes a first-touch page fault per 4 KiB page (lesson 00 shows the gap)."""
    import torch

    dtype = dtype or torch.float32
    n, itemsize = _elements(nbytes, dtype)
    x = torch.ones(n, dtype=dtype, device=device)
    res = measure(x.clone, label=f"clone {nbytes / 1e6:.0f} MB", min_run_time=min_run_time)
    return 2 * n * itemsize / (res.median_ms / 1e3) / 1e9


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
