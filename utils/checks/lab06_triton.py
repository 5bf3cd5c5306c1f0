"""Checks for part 5 of labs/06_fused_softmax_lab.ipynb: a row softmax kernel in the Triton language, run in
Triton's interpreter on CPU tensors (lesson 06, part 2: notebooks/06_gpu_kernels_triton.ipynb). A module of its own
because it imports triton, which the C++ parts of the lab do not need."""

from __future__ import annotations

import inspect

import torch

from utils.checks import LabCheckFailed, expect, passed
from utils.kernels import triton_softmax

# ---------------------------------------------------------------------------------------------------------------------
# the Triton task: a row softmax kernel, run in Triton's interpreter on CPU tensors
# ---------------------------------------------------------------------------------------------------------------------

TRITON_PARAMS = ["x_ptr", "y_ptr", "x_row_stride", "y_row_stride", "n_cols", "BLOCK"]
_OUT_FILL = 7.0  # what the output buffer holds before the kernel runs: a store past a row's end or a missed row shows


def _padded_rows(x: torch.Tensor, stride: int, fill: float, extra: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a view with x's values and rows `stride` apart, the whole buffer); every other element of the buffer, and
    `extra` more after the last row, hold `fill`: a read past a row's end sees it, a write past it changes it."""
    rows, n = x.shape
    buf = torch.full((rows * stride + extra,), fill, dtype=x.dtype)
    view = buf[: rows * stride].view(rows, stride)[:, :n]
    view.copy_(x)
    return view, buf


def _triton_cases() -> list[tuple[str, torch.Tensor, int, str]]:
    """(name, x, row stride in memory, what a failure there means) from the simplest case to the edge cases."""
    g = torch.Generator().manual_seed(66)
    one_finite = torch.full((4, 20), float("-inf"))
    for r, (c, v) in enumerate([(5, 1.0), (19, -3.0), (0, 50.0), (11, -1e4)]):
        one_finite[r, c] = v
    all_inf = torch.randn(4, 12, generator=g)
    all_inf[2] = float("-inf")
    pow2 = torch.randn(6, 64, generator=g) * 3
    return [
        ("rows of 64, contiguous (BLOCK = 64: no padded lanes)", pow2, 64,
         "the core is off before any edge case: which row is each program's, its max, exp(x - max) and the division "
         "by the sum"),
        ("the same rows of 64, 80 apart in memory (a slice of a wider tensor)", pow2, 80,
         "right for contiguous rows, wrong for strided ones: where does row r start in x, and in y?"),
        ("37 rows of 7 (BLOCK = 8: one padded lane per row)", torch.randn(37, 7, generator=g), 7,
         "right for n = 64 but wrong for n = 7: the lane past the row's end (cols >= n_cols) is part of the block; "
         "what must it hold, and what must happen to it, so that it changes neither the max, nor the sum, nor y?"),
        ("rows of 1 (BLOCK = 1)", torch.randn(5, 1, generator=g), 1, "a row of one value has softmax 1"),
        ("rows of 100 with logits of size ~1000", torch.randn(3, 100, generator=g) * 1000, 100,
         "exp(1000) overflows float32 (its largest value is about exp(88.7)); softmax is unchanged when a constant "
         "is subtracted from a whole row"),
        ("rows that are -inf but for one value (a masked attention row)", one_finite, 20,
         "a row that is -inf everywhere but one place must give 1 there and 0 elsewhere"),
        ("a row that is all -inf (fully masked)", all_inf, 12,
         "torch.softmax gives NaN for a row that is all -inf (its max is -inf, and -inf - (-inf) is NaN) and normal "
         "values for the other rows: match it, do not invent a value"),
        ("bfloat16 rows of 33", (torch.randn(9, 33, generator=g) * 3).to(torch.bfloat16), 40,
         "bfloat16 in, bfloat16 out: do the arithmetic in float32 and round once, when you store"),
    ]


def _run_triton(fn, kernel_name: str, case: str, x: torch.Tensor, stride: int) -> tuple[torch.Tensor, bool]:
    """Launch the interpreted kernel on x laid out `stride` apart: (y, whether it wrote outside y's rows)."""
    rows, n = x.shape
    block = 1 << max(n - 1, 0).bit_length()  # the next power of two >= n
    x_view, _ = _padded_rows(x, stride, float("nan"), extra=block)  # a read past a row's end gets NaN
    y_view, y_buf = _padded_rows(torch.full_like(x, _OUT_FILL), stride, _OUT_FILL, extra=block)
    try:
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
    return y_view.clone(), wrote_outside


def check_triton_kernel(kernel):
    """The learner's row softmax kernel in the Triton language, run in Triton's interpreter on CPU tensors against
    torch.softmax on 8 cases (padded and strided rows, n = 1, huge logits, -inf rows, bfloat16)."""
    fn_py = getattr(kernel, "fn", kernel)
    expect(callable(fn_py), f"pass your @triton.jit kernel function, got {type(kernel).__name__}")
    name = getattr(fn_py, "__name__", "your kernel")
    params = list(inspect.signature(fn_py).parameters)
    expect(params == TRITON_PARAMS, f"{name} should take ({', '.join(TRITON_PARAMS)}), got ({', '.join(params)}): "
           "keep the signature the lab gives, the check launches it with those arguments")
    expect(fn_py is not triton_softmax.softmax_kernel.fn, "that is the lesson's kernel: write the body yourself")
    fn = triton_softmax.interpreted(kernel)
    worst = 0.0
    for case, x, stride, meaning in _triton_cases():
        y, wrote_outside = _run_triton(fn, name, case, x, stride)
        never = (y == _OUT_FILL).all(dim=-1)  # a softmax row never holds 7.0 throughout
        expect(not bool(never.any()), f"{case}: rows {never.nonzero().flatten().tolist()[:5]} of y were never written. "
               f"{meaning}")
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
        if x.dtype != torch.bfloat16:
            worst = max(worst, err)
    passed("Triton row softmax", f"{len(_triton_cases())} cases in Triton's interpreter match torch.softmax "
           f"(float32 max error {worst:.1e}), nothing written outside y's rows")
