"""Checks for labs/00_environment_lab.ipynb (lesson 00: the roofline probe)."""

from __future__ import annotations

from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from utils.checks import LabCheckFailed, call, expect, passed
from utils.core import bench


class _TensorOps(TorchDispatchMode):
    """Sees every tensor operation run inside it: the bytes of tensors it creates (storage none of the inputs had)
    and the bytes written by copies. How the check tells a copy into an existing buffer from one that allocates."""

    def __init__(self):
        super().__init__()
        self.new_bytes = 0
        self.copied_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.new_bytes += t.untyped_storage().nbytes()
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
