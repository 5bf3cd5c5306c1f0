"""Checks for part 5 of labs/06_fused_softmax_lab.ipynb: a softmax kernel in the Triton language for rows longer than
one block, run in Triton's interpreter on CPU tensors (lesson 06, part 2: notebooks/06_gpu_kernels_triton.ipynb
teaches the one-block row kernel; this task is the step after it). A module of its own because it imports triton,
which the C++ parts of the lab do not need.

The check launches the learner's kernel with a BLOCK smaller than the row (a row of 64 walked in chunks of 16, a row
of 37 whose last chunk is ragged, ...), so a kernel that handles one block per row cannot pass; it records every
address the kernel loads, so a kernel that walks the row once for the max and again for the sum (right numbers, one
read too many) cannot pass either. Every failure names the case and the symptom, never the code that fixes it.
"""

from __future__ import annotations

import collections
import contextlib
import inspect

import numpy
import torch

from utils.checks import LabCheckFailed, expect, passed
from utils.kernels import triton_matmul, triton_softmax

# ---------------------------------------------------------------------------------------------------------------------
# the Triton task: a looped (online) softmax kernel, run in Triton's interpreter on CPU tensors
# ---------------------------------------------------------------------------------------------------------------------

TRITON_PARAMS = ["x_ptr", "y_ptr", "x_row_stride", "y_row_stride", "n_cols", "BLOCK"]
# The lesson's kernels: the task is to write one, not to call one (a @triton.jit kernel can call another).
LESSON_KERNELS = ("softmax_kernel", "softmax_rows_kernel", "softmax_looped_kernel", "softmax_looped")
READS_ALLOWED = 2  # reads of each element of x: one read pass for the (max, sum), one to write y
_OUT_FILL = 7.0  # what the output buffer holds before the kernel runs: a store past a row's end or a missed row shows


def _padded_rows(x: torch.Tensor, stride: int, fill: float, extra: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a view with x's values and rows `stride` apart, the whole buffer); every other element of the buffer, and
    `extra` more after the last row, hold `fill`: a read past a row's end sees it, a write past it changes it."""
    rows, n = x.shape
    buf = torch.full((rows * stride + extra,), fill, dtype=x.dtype)
    view = buf[: rows * stride].view(rows, stride)[:, :n]
    view.copy_(x)
    return view, buf


def _triton_cases() -> list[tuple[str, torch.Tensor, int, int, str]]:
    """(name, x, row stride in memory, BLOCK, what a failure there means), from the simplest case to the edge cases.
    Small on purpose: the interpreter runs every block operation of every program in Python."""
    g = torch.Generator().manual_seed(66)
    ramp = torch.arange(64.0) / 8  # increasing: every chunk brings a larger maximum
    falling = torch.randn(4, 64, generator=g)
    falling[:, 0] = 6.0  # the row's maximum in its first chunk
    late = torch.randn(3, 50, generator=g)
    late[:, :40] = float("-inf")  # a masked row: its first chunks hold nothing but -inf
    late[2, :] = float("-inf")
    late[2, 45] = 2.0  # one finite value, in the last chunk
    all_inf = torch.randn(3, 40, generator=g)
    all_inf[1] = float("-inf")
    return [
        ("rows of 16 in one chunk (BLOCK = 16)", torch.randn(4, 16, generator=g) * 3, 16, 16,
         "the core is off before any chunking: which row is each program's, its max, exp(x - max) and the division "
         "by the sum"),
        ("rows of 64 in four chunks of 16, the maximum in the first chunk", falling, 64, 16,
         "right when the row is one block, wrong when it is four: every chunk of the row counts in the max and in the "
         "sum, and every chunk of y must be written"),
        ("rows of 64 in four chunks of 16, a larger maximum in every chunk", ramp + 0.1 * torch.randn(3, 64, generator=g),
         64, 16,
         "right when the row's maximum is in its first chunk, wrong when a later chunk brings a larger value: the "
         "sum so far was measured against the old maximum; what must happen to it when the maximum grows?"),
        ("rows of 37 in chunks of 16 (the last chunk has 5 columns)", torch.randn(5, 37, generator=g), 37, 16,
         "right when n_cols is a multiple of BLOCK, wrong when it is not: the lanes of the last chunk past the row's "
         "end (cols >= n_cols) are part of the block; what must they hold, and what must happen to them, so that "
         "they change neither the max, nor the sum, nor y?"),
        ("rows of 5, fewer columns than BLOCK = 16", torch.randn(4, 5, generator=g), 5, 16,
         "a row shorter than one block is one ragged chunk: the lanes past n_cols must change neither the max, nor "
         "the sum, nor y"),
        ("rows of one column (BLOCK = 8)", torch.randn(5, 1, generator=g), 1, 8, "a row of one value has softmax 1"),
        ("the rows of 37, 48 apart in memory (a slice of a wider tensor)", torch.randn(5, 37, generator=g), 48, 16,
         "right for contiguous rows, wrong for strided ones: where does row r start in x, and in y?"),
        ("rows of 40 with logits of size ~1000", torch.randn(3, 40, generator=g) * 1000, 40, 16,
         "exp(1000) overflows float32 (its largest value is about exp(88.7)), and a chunk's values can be far above "
         "the running maximum: nothing may be exponentiated before it is measured against a maximum that bounds it"),
        ("rows whose first chunks are all -inf (a masked attention row)", late, 50, 16,
         "until a row's first finite value, its running maximum is -inf, and -inf - (-inf) is NaN: the sum must stay "
         "0 (not NaN) through those chunks"),
        ("a row that is all -inf (fully masked)", all_inf, 40, 16,
         "torch.softmax gives NaN for a row that is all -inf (its max is -inf, and -inf - (-inf) is NaN) and normal "
         "values for the other rows: match it, do not invent a value"),
        ("bfloat16 rows of 40", (torch.randn(3, 40, generator=g) * 3).to(torch.bfloat16), 40, 16,
         "bfloat16 in, bfloat16 out: do the arithmetic in float32 and round once, when you store"),
    ]


@contextlib.contextmanager
def _recorded_loads():
    """Inside the block, every address an interpreted kernel loads (its unmasked lanes) goes into the yielded list,
    one NumPy array per tl.load."""
    addresses: list = []

    def record(ptrs, mask, grid_idx):
        addresses.append(numpy.asarray(ptrs.data)[numpy.asarray(mask.data, dtype=bool)].astype(numpy.uint64))

    with triton_matmul.watch_loads(record, "the lab's read count"):
        yield addresses


def _reads_per_element(addresses: list, x_buf: torch.Tensor) -> collections.Counter:
    """How many times each element of x_buf was loaded: {element index: reads}."""
    base, size = x_buf.data_ptr(), x_buf.element_size()
    counts: collections.Counter = collections.Counter()
    for a in addresses:
        inside = a[(a >= base) & (a < base + x_buf.numel() * size)]
        counts.update(((inside - base) // size).tolist())
    return counts


def _run_triton(fn, kernel_name: str, case: str, x: torch.Tensor, stride: int, block: int):
    """Launch the interpreted kernel on x laid out `stride` apart with BLOCK = `block`: (y, whether it wrote outside
    y's rows, the most times any element of x was read)."""
    rows, n = x.shape
    x_view, x_buf = _padded_rows(x, stride, float("nan"), extra=block)  # a read past a row's end gets NaN
    y_view, y_buf = _padded_rows(torch.full_like(x, _OUT_FILL), stride, _OUT_FILL, extra=block)
    try:
        with _recorded_loads() as addresses:
            fn[(rows,)](x_view, y_view, x_view.stride(0), y_view.stride(0), n, BLOCK=block)
    except Exception as exc:  # the interpreter wraps what the kernel raised in an InterpreterError
        cause = exc.__cause__ or exc
        if isinstance(cause, NotImplementedError):
            raise LabCheckFailed(f"{kernel_name} is not written yet ({cause}). Fill in its TODO and run this cell "
                                 "again.") from None
        first = (str(cause).strip().splitlines() or [""])[-1][:300]
        raise LabCheckFailed(f"{case}: your kernel stopped with {type(cause).__name__}: {first}") from None
    inside = torch.zeros(y_buf.shape, dtype=torch.bool)
    inside[: rows * stride].view(rows, stride)[:, :n] = True
    outside = y_buf[~inside]
    wrote_outside = bool((outside != _OUT_FILL).any())
    reads = _reads_per_element(addresses, x_buf)
    return y_view.clone(), wrote_outside, max(reads.values(), default=0)


def _columns(cols: list[int]) -> str:
    return f"{cols[0]}..{cols[-1]}" if len(cols) > 1 and cols == list(range(cols[0], cols[-1] + 1)) else str(cols[:8])


def check_triton_kernel(kernel):
    """The learner's looped softmax kernel in the Triton language, run in Triton's interpreter on CPU tensors against
    torch.softmax on 11 cases (rows of several chunks, a ragged last chunk, fewer columns than BLOCK, one column,
    strided rows, huge logits, -inf chunks and rows, bfloat16), with every load recorded: each element of x may be
    read at most twice (once for the max and the sum, once to write)."""
    fn_py = getattr(kernel, "fn", kernel)
    expect(callable(fn_py), f"pass your @triton.jit kernel function, got {type(kernel).__name__}")
    name = getattr(fn_py, "__name__", "your kernel")
    params = list(inspect.signature(fn_py).parameters)
    expect(params == TRITON_PARAMS, f"{name} should take ({', '.join(TRITON_PARAMS)}), got ({', '.join(params)}): "
           "keep the signature the lab gives, the check launches it with those arguments")
    lesson = {getattr(getattr(triton_softmax, k), "fn", None) for k in LESSON_KERNELS}
    called = set(getattr(getattr(fn_py, "__code__", None), "co_names", ())) & set(LESSON_KERNELS)
    expect(fn_py not in lesson and not called, "that is (or calls) one of the lesson's kernels: write the body yourself")
    fn = triton_softmax.interpreted(kernel)
    worst, most_reads = 0.0, 0
    for case, x, stride, block, meaning in _triton_cases():
        y, wrote_outside, reads = _run_triton(fn, name, case, x, stride, block)
        rows, n = x.shape
        never = (y == _OUT_FILL).all(dim=-1)  # a softmax row never holds 7.0 throughout
        expect(not bool(never.any()), f"{case}: rows {never.nonzero().flatten().tolist()[:5]} of y were never written. "
               f"{meaning}")
        unwritten = (y == _OUT_FILL).all(dim=0).nonzero().flatten().tolist()  # columns no row wrote
        expect(not unwritten or n == 1, f"{case}: columns {_columns(unwritten)} of y were never written in any row "
               f"(n_cols = {n}, BLOCK = {block}). {meaning}")
        want = torch.softmax(x.double(), dim=-1)
        got = y.double()
        nan_got, nan_want = torch.isnan(got), torch.isnan(want)
        if not torch.equal(nan_got, nan_want):
            extra = int((nan_got & ~nan_want).sum())
            what = f"{extra} NaN where torch.softmax has none" if extra else "numbers where torch.softmax has NaN"
            raise LabCheckFailed(f"{case}: {what}. {meaning}")
        if x.dtype == torch.bfloat16:
            err = ((got - want).abs() / want.clamp_min(1e-30)).masked_fill(nan_want, 0).max().item()
            # one bfloat16 rounding of the result; triton's interpreter truncates (2**-7), a GPU rounds to nearest
            tol, kind = 2.0**-7, "relative"
        else:
            err = (got - want).abs().masked_fill(nan_want, 0).max().item()
            tol, kind = 1e-6, "absolute"  # float32 math against float64; outputs lie in [0, 1]
        expect(err <= tol, f"{case}: max {kind} error {err:.3g} against torch.softmax in float64 (tolerance {tol:g}). "
               f"{meaning}")
        expect(not wrote_outside, f"{case}: right values, but your kernel also wrote outside the rows of y (into "
               "the lanes past n_cols, or past the last row): a lane past the row's end must not be stored")
        expect(reads <= READS_ALLOWED,
               f"{case}: right values, but your kernel read some elements of x {reads} times (rows of {n}, BLOCK = "
               f"{block}). The task is an online softmax: the max and the sum come from ONE read of each chunk, and "
               "one more read writes y; a row too long for the chip pays for every extra read from DRAM")
        most_reads = max(most_reads, reads)
        if x.dtype != torch.bfloat16:
            worst = max(worst, err)
    passed("Triton looped softmax", f"{len(_triton_cases())} cases in Triton's interpreter match torch.softmax "
           f"(float32 max error {worst:.1e}), rows longer than BLOCK included; nothing written outside y's rows; each "
           f"element of x read at most {most_reads} times")
