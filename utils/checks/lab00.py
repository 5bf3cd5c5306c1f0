"""Checks for labs/00_environment_lab.ipynb (lesson 00: the roofline probe)."""

from __future__ import annotations

from utils.checks import LabCheckFailed, call, expect, passed
from utils.core import bench


def check_bandwidth_probe(my_copy_gbps, nbytes: int = 32 * 2**20) -> float:
    """The learner's copy-bandwidth formula is right (checked against a fixed timing), then measured for real.

    The formula is checked deterministically: bench.measure is replaced by one that reports a 2 ms median, so
    the right answer is exactly 2 * bytes / 2 ms. Comparing two live timings would be flaky on a busy machine.
    """
    from unittest import mock

    fake = bench.BenchResult("fixed 2 ms", median_ms=2.0, iqr_ms=0.0, runs=1)
    with mock.patch.object(bench, "measure", return_value=fake) as fake_measure:
        got = call(my_copy_gbps, nbytes, what="my_copy_gbps(nbytes)")
    expect(fake_measure.called, "my_copy_gbps should time x.clone() with bench.measure (utils.core.bench), which it did not call")
    expect(isinstance(got, int | float), f"my_copy_gbps should return a number of GB/s, got {type(got).__name__}")
    want = 2 * (nbytes // 4) * 4 / 2e-3 / 1e9
    expect(
        abs(got - want) <= 0.01 * want,
        f"with a 2 ms copy of {nbytes} bytes your probe says {got:.4g} GB/s, expected {want:.4g} GB/s. "
        "Did you count both the read and the write (2 x bytes), and convert ms to s and bytes to GB?",
    )
    mine = call(my_copy_gbps, nbytes, what="my_copy_gbps(nbytes)")
    passed("bandwidth probe", f"formula exact; measured now: {mine:.1f} GB/s for {nbytes / 2**20:.0f} MiB")
    return mine


def check_intensity(intensity_fn) -> None:
    """Arithmetic intensity (flop per byte) of an fp32 matmul and an fp32 elementwise add, exactly."""
    cases = {
        ("matmul", 1024): 2 * 1024**3 / (3 * 1024**2 * 4),
        ("add", 1024): 1024 / (3 * 1024 * 4),
    }
    for (op, n), want in cases.items():
        got = call(intensity_fn, op, n, what=f"intensity({op!r}, {n})")
        expect(
            isinstance(got, int | float) and abs(got - want) <= 1e-9 * max(1.0, want),
            f"intensity({op!r}, {n}) should be {want:.6g} flop/byte, got {got!r}",
        )
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
