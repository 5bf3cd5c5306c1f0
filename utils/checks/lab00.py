"""Checks for labs/00_environment_lab.ipynb (lesson 00: the roofline probe)."""

from __future__ import annotations

from utils import bench
from utils.labs import LabCheckFailed, call, expect, passed


def check_bandwidth_probe(my_copy_gbps, nbytes: int = 32 * 2**20) -> float:
    """The learner's copy-bandwidth probe agrees with utils.bench's, measured side by side (within 2x either way)."""
    mine = call(my_copy_gbps, nbytes, what="my_copy_gbps(nbytes)")
    expect(isinstance(mine, int | float), f"my_copy_gbps should return a number of GB/s, got {type(mine).__name__}")
    reference = bench.copy_bandwidth_gbps(nbytes, min_run_time=0.2)
    ratio = mine / reference
    expect(
        0.5 <= ratio <= 2.0,
        f"your probe says {mine:.1f} GB/s but x.clone() measured {reference:.1f} GB/s just now ({ratio:.2f}x). "
        "Did you count both the read and the write (2 x bytes), and convert seconds and bytes to GB/s?",
    )
    passed("bandwidth probe", f"{mine:.1f} GB/s vs reference {reference:.1f} GB/s")
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
