"""Checks for labs/00_environment_lab.ipynb (lesson 00: the roofline probe, and an elementwise chain at the memory
roof)."""

from __future__ import annotations

from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from utils.checks import LabCheckFailed, call, expect, expect_gain, figure, passed
from utils.core import bench, env

# The chain task (section 4): relu(x * a + b) on an fp32 (rows, CHAIN_COLS) tensor, a and b one value per column.
CHAIN_COLS = 4096
CHAIN_ATOL = CHAIN_RTOL = 1e-5  # a fused multiply-add rounds once where x * a + b rounds twice: far inside this
CHAIN_LINE = 3.0  # your chain's speed over the naive expression's, every round of the comparison (full mode)


class _TensorOps(TorchDispatchMode):
    """Sees every tensor operation run inside it: the bytes of tensors it creates (storage none of the inputs had)
    and the bytes written by copies. How the check tells a copy into an existing buffer from one that allocates."""

    def __init__(self):
        super().__init__()
        self.new_bytes = 0
        self.copied_bytes = 0
        self.largest_new = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.new_bytes += t.untyped_storage().nbytes()
                self.largest_new = max(self.largest_new, t.untyped_storage().nbytes())
        if func.overloadpacket.__name__ == "copy_":
            self.copied_bytes += args[0].nbytes
        return out


def _not_the_course_probe(*args, **kwargs):
    raise LabCheckFailed("my_copy_gbps called one of the course's own probes (bench.copy_into_gbps or "
                         "bench.clone_gbps): the exercise is to write the probe yourself with bench.measure")


def check_bandwidth_probe(my_copy_gbps, nbytes: int = 64 * 2**20, calls: int = 3) -> float:
    """The learner's probe measures the memory roof: a copy into a buffer that exists before timing, in GB/s.

    Deterministic: bench.measure is replaced by a stand-in that keeps the function it was asked to time and reports
    a 2 ms median, so the right answer is exactly 2 * bytes / 2 ms (two live timings would be flaky on a busy
    machine). The kept function is then called a few times under a dispatch mode that sees every tensor operation:
    it must copy `nbytes` per call and create no new tensor of that size (x.clone() would: allocate + copy).
    """
    from unittest import mock

    timed = []

    def fixed_measure(fn, *args, **kwargs):
        timed.append(fn)
        return bench.BenchResult("fixed 2 ms", median_ms=2.0, iqr_ms=0.0, runs=1)

    with (mock.patch.object(bench, "measure", side_effect=fixed_measure),
          mock.patch.object(bench, "copy_into_gbps", side_effect=_not_the_course_probe),
          mock.patch.object(bench, "clone_gbps", side_effect=_not_the_course_probe)):
        got = call(my_copy_gbps, nbytes, what="my_copy_gbps(nbytes)")
    expect(bool(timed), "my_copy_gbps returned without timing anything: bench.measure (utils.core.bench) was never "
                        "called")
    expect(isinstance(got, int | float) and not isinstance(got, bool),
           f"my_copy_gbps should return a number of GB/s, got {type(got).__name__}")
    watch = _TensorOps()
    with watch:
        for _ in range(calls):
            timed[-1]()
    size = (nbytes // 4) * 4
    mib = 2**20
    expect(watch.new_bytes < calls * size / 2,
           f"each call of the timed function creates {watch.new_bytes / calls / mib:.0f} MiB of new tensors: it times "
           "allocating an output (and, above glibc's mmap threshold, a page fault per 4 KiB page) as well as the copy, "
           "which is lesson 00's 'allocate + copy' row, not the memory roof")
    expect(abs(watch.copied_bytes / calls - size) <= 0.01 * size,
           f"each call of the timed function copies {watch.copied_bytes / calls / mib:.1f} MiB, but the probe was asked "
           f"for {size / mib:.1f} MiB: the timed call should copy one buffer of nbytes into another")
    want = 2 * size / 2e-3 / 1e9
    expect(
        abs(got - want) <= 0.01 * want,
        f"with a 2 ms copy of {nbytes} bytes your probe says {got:.4g} GB/s, expected {want:.4g} GB/s. "
        "Did you count every byte the copy moves (it reads the source and writes the destination), and convert "
        "ms to s and bytes to GB?",
    )
    mine = call(my_copy_gbps, nbytes, what="my_copy_gbps(nbytes)")
    passed("bandwidth probe", f"copies into an existing buffer, formula exact; measured now: {mine:.1f} GB/s for "
                              f"{nbytes / mib:.0f} MiB")
    return mine


def check_intensity(intensity_fn) -> None:
    """Arithmetic intensity (flop per byte) of an fp32 matmul and an fp32 elementwise add, exactly."""
    cases = {
        ("matmul", 1024): 2 * 1024**3 / (3 * 1024**2 * 4),
        ("add", 1024): 1024 / (3 * 1024 * 4),
    }
    for (op, n), want in cases.items():
        got = call(intensity_fn, op, n, what=f"intensity({op!r}, {n})")
        expect(isinstance(got, int | float) and not isinstance(got, bool) and got > 0,
               f"intensity({op!r}, {n}) should be a positive number of flop per byte, got {got!r}")
        # the factor it is off by names the miscount (flops x2, bytes per value x4, tensors moved x1.5, ...)
        expect(abs(got - want) <= 1e-9 * max(1.0, want),
               f"intensity({op!r}, {n}) is off by a factor of {got / want:.4g} (yours / the right value): count the "
               "flops and the bytes separately. Is a multiply-add two flops? Is every tensor the op reads or writes "
               "counted once, at 4 bytes per fp32 value?")
    try:
        intensity_fn("conv", 3)
    except ValueError as exc:
        expect("conv" in str(exc), f"the ValueError for an unknown op should name it, got: {exc}")
    except NotImplementedError:
        raise LabCheckFailed("intensity() is not written yet. Fill in its TODO and run this cell again.") from None
    else:
        raise LabCheckFailed("intensity('conv', 3) should raise ValueError naming the unknown op, it returned a value")
    passed("arithmetic intensity", "matmul and add exact; unknown op rejected")


def check_classify(classify_fn, ridge: float) -> None:
    """Memory- vs compute-bound, decided against the measured ridge point."""
    for intensity in (ridge / 10, ridge * 10):
        want = "memory-bound" if intensity < ridge else "compute-bound"
        got = call(classify_fn, intensity, ridge, what="classify(intensity, ridge)")
        expect(got == want, f"classify({intensity:.3g}, ridge={ridge:.3g}) should be {want!r}, got {got!r}")
    passed("classify", f"ridge {ridge:.2f} flop/byte")


# -- section 4: an elementwise chain at the memory roof -------------------------------------------------------------


def chain_mib(smoke: bool | None = None) -> int:
    """The size lesson 00 measures its out-of-cache roof at: at least 256 MiB and four last-level caches (smoke: 64
    MiB and two), so the chain streams from DRAM."""
    smoke = env.smoke_default() if smoke is None else smoke
    llc_mb = (env.last_level_cache_bytes() or 32 * 2**20) // 2**20  # 32 MiB where sysfs cannot say
    return max(64, 2 * llc_mb) if smoke else max(256, 4 * llc_mb)


def chain_inputs(rows: int, seed: int = 0):
    """x (rows, CHAIN_COLS) fp32 and a, b (CHAIN_COLS,): one scale and one shift per column, seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, CHAIN_COLS, generator=g)
    return x, torch.randn(CHAIN_COLS, generator=g), torch.randn(CHAIN_COLS, generator=g)


def naive_chain(x, a, b):
    """The chain as one writes it first: three passes, each into a freshly allocated tensor of x's size."""
    import torch

    return torch.relu(x * a + b)


def _chain_call(chain_into, x, a, b, out, what):
    """One call of the learner's function into `out` (prefilled with NaN here), checked against the naive chain."""
    import torch

    out.fill_(float("nan"))
    got = call(chain_into, x, a, b, out, what=what)
    want = naive_chain(x, a, b)
    written = ~torch.isnan(out).any(dim=1)
    rows = out.shape[0]
    if not written.any():
        extra = ""
        if isinstance(got, Tensor) and got.data_ptr() != out.data_ptr() and got.shape == want.shape:
            extra = (": it returned a new tensor instead (the result has to land in the buffer it is given, with "
                     "no output allocated per call)")
        raise LabCheckFailed(f"{what} with x of shape {tuple(x.shape)} left out untouched{extra}")
    if not bool(written.all()):
        raise LabCheckFailed(f"{what} wrote only {int(written.sum())} of the {rows} rows of out (the first row left "
                             f"unwritten is row {int((~written).nonzero()[0, 0])}): every element of x needs its result")
    close = torch.isclose(out, want, atol=CHAIN_ATOL, rtol=CHAIN_RTOL)
    if not bool(close.all()):
        err = float((out - want).abs().max())
        bad = int((~close).sum())
        raise LabCheckFailed(f"{what}: {bad} of {out.numel()} elements differ from relu(x * a + b) by up to {err:.3g} "
                             f"(atol {CHAIN_ATOL}, rtol {CHAIN_RTOL})")
    return want


def check_chain(chain_into, mib: int | None = None, *, smoke: bool | None = None) -> dict:
    """The learner's chain_into(x, a, b, out): relu(x * a + b) written into `out`, a and b one value per column.

    Correctness first, on fresh inputs each time: a small tensor whose row count is prime, a second set of inputs
    (a result kept from an earlier call fails), the same x changed in place (a result kept per tensor fails), then
    the timed size. One call runs under a dispatch mode that sees every tensor created: none may be half of x's size
    or larger (each would be a fresh mapping whose pages fault in: lesson 00's allocate + copy row). Then the learner's
    function and the naive expression in interleaved rounds at lesson 00's out-of-cache size (full mode judges the
    gain against CHAIN_LINE, smoke mode reports it), and the learner's GB/s as a fraction of bench.copy_into_gbps at
    the same size, measured in the same run (the faster of a run before the rounds and one after)."""
    import torch

    smoke = env.smoke_default() if smoke is None else smoke
    mib = mib or chain_mib(smoke)
    rows = mib * 2**20 // (4 * CHAIN_COLS)
    what = "chain_into(x, a, b, out)"
    x, a, b = chain_inputs(37, seed=11)  # a prime number of rows: no chunk size divides it
    first = _chain_call(chain_into, x, a, b, torch.empty_like(x), what)
    x2, a2, b2 = chain_inputs(37, seed=12)
    out = torch.empty_like(x2)
    out.fill_(float("nan"))
    call(chain_into, x2, a2, b2, out, what=what)
    expect(not torch.allclose(out, first, atol=CHAIN_ATOL, rtol=CHAIN_RTOL),
           f"{what} given new inputs wrote the result of the first call's inputs again: it hands back a result it "
           "computed before instead of computing this one")
    _chain_call(chain_into, x2, a2, b2, out, what + " on a second set of inputs")
    x2.mul_(-1.5).add_(0.25)  # the same tensor, new values
    _chain_call(chain_into, x2, a2, b2, out, what + " after x changed in place")
    x, a, b = chain_inputs(rows, seed=13)
    out = torch.empty_like(x)
    want = _chain_call(chain_into, x, a, b, out, what + f" on {mib} MiB")
    watch = _TensorOps()
    with watch:
        call(chain_into, x, a, b, out, what=what)
    mb = 2**20
    expect(watch.largest_new < x.nbytes / 2,
           f"each call of {what} creates a new tensor of {watch.largest_new / mb:.0f} MiB (x is {x.nbytes / mb:.0f} "
           f"MiB; {watch.new_bytes / mb:.0f} MiB of new tensors in all): above glibc's mmap threshold each such "
           "tensor is a fresh mapping whose pages fault in on first touch, lesson 00's allocate + copy row")
    roof_s = 0.1 if smoke else 0.5
    roofs = [bench.copy_into_gbps(x.nbytes, min_run_time=roof_s)]
    poke = [0]

    def timed():  # one element of out spoiled before each timed call: a call that skips its work leaves it spoiled
        out.view(-1)[poke[0] % out.numel()] = float("nan")
        poke[0] += 1_000_003
        chain_into(x, a, b, out)

    res = bench.compare({"relu(x * a + b)": lambda: naive_chain(x, a, b), "your chain_into": timed},
                        rounds=3 if smoke else 7, min_run_time=0.05 if smoke else 0.3, quiet=True)
    expect(bool(torch.isclose(out, want, atol=CHAIN_ATOL, rtol=CHAIN_RTOL).all()),
           f"after the timed calls out is not relu(x * a + b): {what} skipped its work when called again on the same "
           "tensors (each timed call found one element of out spoiled and has to write it)")
    _chain_call(chain_into, x, a, b, out, what + " after the timing")  # it still computes, not only the first time
    roofs.append(bench.copy_into_gbps(x.nbytes, min_run_time=roof_s))
    roof = max(roofs)  # lesson 00's roof: the fastest of the runs (a busy neighbour can only slow a copy down)
    moved = 2 * x.nbytes  # read x, write out: what a copy of x moves (a and b stay in cache)
    gbps = {name: moved / (r.median_ms / 1e3) / 1e9 for name, r in res.items()}
    for name, r in res.items():
        print(f"  {name:18s} {r.median_ms:8.2f} ms  {gbps[name]:6.1f} GB/s  ({gbps[name] / roof:.0%} of the copy roof)")
    print(f"  {'copy into a buffer':18s} {moved / roof / 1e6:8.2f} ms  {roof:6.1f} GB/s  (the roof: bench.copy_into_gbps "
          f"at {mib} MiB, the faster of two runs in this check: {roofs[0]:.1f} before the rounds, {roofs[1]:.1f} after)")
    ratio = res.ratio("your chain_into")
    line = expect_gain("your chain_into", ratio, "relu(x * a + b)", CHAIN_LINE,
                       "How many times does each element travel between DRAM and the cores in your version, and how "
                       "many fresh pages does each call touch?", smoke=smoke)
    fraction = gbps["your chain_into"] / roof
    passed("chain at the memory roof", f"correct on fresh inputs (atol {CHAIN_ATOL}, rtol {CHAIN_RTOL}), written into "
                                       f"out, no tensor of x's size created; {line}; {fraction:.0%} of the copy roof")
    figure("chain_speedup_over_naive", ratio.value, "x")
    figure("chain_fraction_of_copy_roof", fraction, "x")
    return {"speedup": ratio, "fraction_of_roof": fraction, "gbps": gbps["your chain_into"], "roof_gbps": roof}
