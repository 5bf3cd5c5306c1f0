"""Checks for labs/06_fused_softmax_lab.ipynb (lesson 06: an online softmax in C++ as a PyTorch operator, and the
same softmax as a kernel in the Triton language).

The learner writes three things: the C++ inner loop of the online softmax (returned as a string by a Python
function, so that the lab generator can blank it), the backward formula in PyTorch, and a Triton softmax kernel for
rows longer than one block (checked in lab06_triton). The checks put the loop into lab06_softmax.cpp, build it with
utils.kernels.build (cached by source hash: an edit rebuilds, a rerun does not), and test it; the task asks for ONE
read pass over x, and a second build (READS_TEMPLATE: the same loop reading x through an accessor that records every
index) counts the passes, because a two-pass loop gives the same numbers. The speed task times the learner's loop
against such a two-pass loop, built from the same template in the same run (check_speed).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch

from utils import kernels
from utils.checks import LabCheckFailed, call, expect, expect_target, figure, passed
from utils.core import env, verdict
from utils.kernels import ops, sweep

PLACEHOLDER = "/*@INNER_LOOP@*/"

TEMPLATE_PATH = Path(__file__).with_name("lab06_softmax.cpp")
TEMPLATE = TEMPLATE_PATH.read_text()  # the C++ around the learner's loop (a few KB, read once)

_op_counter = itertools.count()


def lab_source(inner_loop: str) -> str:
    """lab06_softmax.cpp (TEMPLATE) with the learner's loop pasted in at PLACEHOLDER."""
    if PLACEHOLDER not in TEMPLATE:
        raise RuntimeError(f"{TEMPLATE_PATH} lost its {PLACEHOLDER} marker: restore it from git")
    return TEMPLATE.replace(PLACEHOLDER, inner_loop)


def _loop_code(inner_loop_source) -> str:
    code = call(inner_loop_source, what="inner_loop_source()")
    expect(isinstance(code, str) and code.strip(),
           f"inner_loop_source() should return the C++ loop as a string, got {type(code).__name__}: {code!r:.80}")
    expect("x[" in code or "x +" in code or "*x" in code,
           "your loop never reads x: it should walk x[0] .. x[n-1] and update m and s")
    return code


def build_lab_extension(inner_loop_source) -> kernels.Extension:
    """Build (or load the cached build of) TEMPLATE with the loop `inner_loop_source()` returns."""
    code = _loop_code(inner_loop_source)
    try:
        return kernels.build(lab_source(code), name="wb_softmax_lab")
    except RuntimeError as exc:
        raise LabCheckFailed(f"your C++ does not compile. The compiler said:\n{exc}") from None


# The learner's loop once more, with x read through an accessor that records the index of every read: the read
# pass the task asks for is checked by counting, not by the numbers (a two-pass loop gives the same numbers).
READS_TEMPLATE = r"""
// Lab 06's read counter (utils/checks/lab06.py): your loop, reading x through RecordedRow.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// Stands in for `const scalar_t* x`: x[i], *x, *(x + i), x++ and ++x read through it, and each read is recorded.
template <typename scalar_t>
struct RecordedRow {
  const scalar_t* data;
  int64_t n;
  int64_t offset;
  std::vector<int64_t>* reads;
  scalar_t operator[](int64_t i) const {
    const int64_t at = offset + i;
    reads->push_back(at);
    return at >= 0 && at < n ? data[at] : std::numeric_limits<scalar_t>::quiet_NaN();  // never out of bounds
  }
  scalar_t operator*() const { return (*this)[0]; }
  RecordedRow operator+(int64_t k) const { return {data, n, offset + k, reads}; }
  RecordedRow& operator++() { ++offset; return *this; }
  RecordedRow operator++(int) { RecordedRow before = *this; ++offset; return before; }
};

template <typename scalar_t, typename X>
void online_max_sum(X x, int64_t n, scalar_t& m, scalar_t& s) {
  m = -std::numeric_limits<scalar_t>::infinity();
  s = scalar_t(0);
/*@INNER_LOOP@*/
}

// The index of every read the loop makes of the float64 row x, in order.
at::Tensor read_trace(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kDouble && x.is_contiguous() && x.device().is_cpu(),
              "read_trace: expected a contiguous 1-d float64 CPU tensor");
  std::vector<int64_t> reads;
  double m, s;
  online_max_sum<double>(RecordedRow<double>{x.const_data_ptr<double>(), x.numel(), 0, &reads}, x.numel(), m, s);
  at::Tensor out = at::empty({static_cast<int64_t>(reads.size())}, x.options().dtype(at::kLong));
  std::copy(reads.begin(), reads.end(), out.mutable_data_ptr<int64_t>());
  return out;
}

}  // namespace

TORCH_LIBRARY(WB_NAMESPACE, m) { m.def("read_trace(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(WB_NAMESPACE, CPU, m) { m.impl("read_trace", &read_trace); }
"""


def read_passes(trace: list[int]) -> int:
    """How many times a loop walked a row, from the indices it read in order: the most times any element
    was read, counting back-to-back reads of one element once (``v = x[i]; ... x[i]`` is still one pass)."""
    counts: dict[int, int] = {}
    previous = None
    for i in trace:
        if i != previous:
            counts[i] = counts.get(i, 0) + 1
        previous = i
    return max(counts.values(), default=0)


def check_one_pass(inner_loop_source, n: int = 37) -> int:
    """The learner's loop reads every element of a row of `n` once, in one pass (the task's rule). Returns the passes."""
    code = _loop_code(inner_loop_source)
    try:
        ext = kernels.build(READS_TEMPLATE.replace(PLACEHOLDER, code), name="wb_softmax_lab_reads")
    except RuntimeError as exc:
        raise LabCheckFailed("your loop compiles on a raw pointer but not on the read counter, which stands in for x "
                             "and supports x[i], *x, *(x + i) and x++: read x only through those. The compiler "
                             f"said:\n{exc}") from None
    row = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(37))
    trace = ext.ops.read_trace(row).tolist()
    outside = sorted({i for i in trace if not 0 <= i < n})
    expect(not outside, f"your loop read x at {outside[:5]} on a row of {n}: outside x[0] .. x[{n - 1}]")
    missed = sorted(set(range(n)) - set(trace))
    expect(not missed, f"your loop never read x[i] for i in {missed[:5]} on a row of {n}: every element counts in the "
           "max and the sum")
    passes = read_passes(trace)
    expect(passes == 1,
           f"your loop reads each element of x up to {passes} times ({len(trace)} reads on a row of {n}): it walks "
           f"the row {passes} times. The task is ONE read pass: by the time x[i] has been read, m and s must already "
           "include it, with no going back.")
    return passes


def _parity_cases():
    g = torch.Generator().manual_seed(6)
    masked = torch.randn(6, 40, generator=g)
    masked[0, 10:] = float("-inf")  # a causal-style mask: -inf at the end
    masked[1, :25] = float("-inf")  # -inf first: the running max starts at -inf
    masked[2, ::2] = float("-inf")
    return {
        "random rows of 1000": torch.randn(64, 1000, generator=g),
        "odd row length 7": torch.randn(9, 7, generator=g),
        "increasing rows (the max keeps moving)": torch.arange(200.0).repeat(3, 1) / 10,
        "decreasing rows": torch.arange(200.0, 0, -1).repeat(3, 1) / 10,
        "large magnitudes (x 1000)": torch.randn(8, 300, generator=g) * 1000,
        "rows with -inf entries": masked,
        "one-element rows": torch.randn(5, 1, generator=g),
        "float64": torch.randn(7, 129, generator=g, dtype=torch.float64),
        "3-d input": torch.randn(2, 3, 50, generator=g),
        "empty (0 rows)": torch.randn(0, 16, generator=g),
    }


# What a wrong number in a parity case points at (symptoms and questions, never the update itself).
_PARITY_HINT = ("Compare the increasing and the decreasing rows: if only the rows whose maximum keeps moving are off, "
                "look at what happens to the terms already in s when a larger value arrives.")
_PARITY_HINTS = {
    "increasing rows (the max keeps moving)": "Here every value is a new maximum, so every step rescales: the terms "
    "already in s were measured against the old maximum; are they measured against the new one afterwards?",
    "decreasing rows": "Here the maximum is the first value and never moves, so no rescale ever happens: the error is "
    "in how an ordinary value adds its term, or in the first step from m = -inf.",
    "large magnitudes (x 1000)": "exp of a value near 1000 overflows: every exp your loop computes must be of a "
    "difference that is at most 0.",
}


def _max_err(got, want) -> float:
    if got.numel() == 0:
        return 0.0
    both_nan = torch.isnan(got) & torch.isnan(want)
    return (got - want).abs().masked_fill(both_nan, 0).max().item()


def check_inner_loop(inner_loop_source):
    """Build the learner's online loop, compare with torch.softmax on edge cases, and count its passes over x (one).
    Returns the extension."""
    ext = build_lab_extension(inner_loop_source)
    worst = 0.0
    for name, x in _parity_cases().items():
        got = ext.ops.softmax_forward(x)
        want = torch.softmax(x, dim=-1)
        expect(got.shape == want.shape, f"{name}: output shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        nan_got, nan_want = torch.isnan(got), torch.isnan(want)
        expect(bool((nan_got == nan_want).all()),
               f"{name}: {int(nan_got.sum())} NaN outputs where torch.softmax has {int(nan_want.sum())}. A row whose "
               "running max is still -inf must not add exp(-inf - (-inf)) = exp(NaN) to s.")
        err = _max_err(got, want)
        tol = 1e-12 if x.dtype == torch.float64 else 2e-6  # absolute: softmax outputs lie in [0, 1]
        expect(err <= tol, f"{name}: max |yours - torch.softmax| = {err:.3g} (tolerance {tol:g}). "
               + _PARITY_HINTS.get(name, _PARITY_HINT))
        worst = max(worst, err)
    check_one_pass(inner_loop_source)
    passed("online inner loop", f"{len(_parity_cases())} cases match torch.softmax, max error {worst:.2e}; one read "
           "pass over x (every read counted)")
    return ext


def check_backward(softmax_backward_formula):
    """The learner's backward formula against autograd through torch.softmax, in float64."""
    g = torch.Generator().manual_seed(60)
    for shape in [(4, 9), (2, 3, 17), (5, 1)]:
        x = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
        grad_y = torch.randn(*shape, generator=g, dtype=torch.float64)
        y = torch.softmax(x, dim=-1)
        (want,) = torch.autograd.grad(y, x, grad_y)
        try:
            got = call(softmax_backward_formula, grad_y, y.detach(), what="softmax_backward_formula(grad_y, y)")
        except LabCheckFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - a shape error from broadcasting is the usual one: name the input
            raise LabCheckFailed(f"shape {tuple(shape)}: softmax_backward_formula raised {type(exc).__name__}: "
                                 f"{(str(exc).splitlines() or [''])[0][:200]}. Do the shapes of your intermediate "
                                 "results still line up with grad_y's, row by row?") from None
        expect(isinstance(got, torch.Tensor), f"softmax_backward_formula should return a tensor, got {type(got).__name__}")
        expect(got.shape == want.shape, f"shape {tuple(shape)}: your gradient has shape {tuple(got.shape)}")
        err = (got - want).abs().max().item()
        if err >= 1e-10:
            row_sums = got.sum(-1).abs().max().item()
            other = grad_y.clone()
            other[..., 1:, :] += 1.0  # every row but the first (each shape here has several rows)
            leaks = not torch.allclose(
                call(softmax_backward_formula, other, y.detach(), what="softmax_backward_formula(grad_y, y)")[..., 0, :],
                got[..., 0, :], rtol=0, atol=1e-12)
            symptom = ("your gradient for the first row changes when only the other rows' grad_y changes: a row's "
                       "gradient depends on that row alone. Which dimension does your reduction run over, and what "
                       "shape does it leave?" if leaks else
                       f"the entries of a row of your gradient sum to {row_sums:.3g}, not 0, and they must: softmax's "
                       "outputs sum to 1 whatever x is, so no change of x changes their sum" if row_sums > 1e-10 else
                       "each row sums to 0 and depends on its own row only, but the values differ: work "
                       "sum_i g_i * y_i * (delta_ij - y_j) out again by hand")
            raise LabCheckFailed(f"shape {tuple(shape)}: max |yours - autograd| = {err:.3g}: {symptom}.")
    passed("backward formula", "matches autograd through torch.softmax in float64")


def register_operator(ext: kernels.Extension, softmax_backward_formula):
    """A torch.library.custom_op around the lab kernel, with a fake kernel and the learner's backward formula.

    Each call registers a fresh name (workbook_lab::softmax_<build>_<k>): a lab cell can be run again.
    """
    qualname = f"workbook_lab::softmax_{ext.namespace.rsplit('_', 1)[-1]}_{next(_op_counter)}"
    raw = ext.ops

    @torch.library.custom_op(qualname, mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return raw.softmax_forward(x.contiguous())

    @op.register_fake
    def _(x):
        return x.new_empty(x.shape)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        return softmax_backward_formula(grad_y, y)

    op.register_autograd(backward, setup_context=setup_context)
    return op


def check_operator(inner_loop_source, softmax_backward_formula):
    """Register the learner's kernel as an operator; torch.library.opcheck and gradcheck (float64) must pass."""
    from torch.autograd.gradcheck import GradcheckError

    ext = build_lab_extension(inner_loop_source)
    call(softmax_backward_formula, torch.ones(1, 2), torch.ones(1, 2) / 2, what="softmax_backward_formula(grad_y, y)")
    op = register_operator(ext, softmax_backward_formula)
    g = torch.Generator().manual_seed(61)
    samples = [
        torch.randn(4, 33, generator=g, requires_grad=True),
        torch.randn(3, 8, 5, generator=g).transpose(1, 2),  # non-contiguous
    ]
    for x in samples:
        result = torch.library.opcheck(op, (x,), raise_exception=False)
        failed = {k: str(v).splitlines()[0] for k, v in result.items() if v != "SUCCESS"}
        expect(not failed, f"torch.library.opcheck failed for input {tuple(x.shape)}: {failed}")
    x64 = torch.randn(3, 11, generator=g, dtype=torch.float64, requires_grad=True)
    try:
        ok = torch.autograd.gradcheck(op, (x64,), eps=1e-6, atol=1e-5)
    except GradcheckError as exc:
        raise LabCheckFailed(f"gradcheck in float64 failed: {str(exc).splitlines()[0]}") from None
    expect(ok, "gradcheck in float64 returned False")
    passed("operator", f"{op._qualname}: opcheck (schema, autograd registration, fake tensor, AOT dispatch) and "
           "gradcheck pass")
    return op


# The speed task's baseline: the same template with the plain two-pass loop (the max, then the sum), built in the
# same run. Both loops call the same scalar exp, so the ratio of their speeds does not depend on the machine's vector
# width. Measured on the 2-core AVX2 EPYC (rows of 1024 floats, 2 MiB and 16 MiB, 3-5 interleaved rounds): the lab's
# solution (one exp per element, a rescale only on a new maximum) at 1.02x [1.02-1.06] and 1.02x [0.92-1.19] of it;
# an online loop that computes two exps per element at 0.82x [0.76-0.83] and 0.78x [0.76-0.80]. The target sits
# between the two, nearer the slow loop, so that a correct loop written differently still clears it.
TWO_PASS_LOOP = r"""
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (m != -std::numeric_limits<scalar_t>::infinity())
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
"""
SPEED_TARGET = 0.85  # your loop's speed over the two-pass loop's, with every round of the comparison


def check_speed(inner_loop_source, rows: int = 2048, n: int = 1024, min_run_time: float = 0.2, *,
                smoke: bool | None = None):
    """The learner's loop against the two-pass loop (TWO_PASS_LOOP in the same template, built in the same run) in
    interleaved rounds: in full mode every round must reach SPEED_TARGET of its speed (speed targets enforced as
    utils.checks says); smoke mode reports the ratio without judging it. Also prints torch.softmax, the lesson's
    fused kernel and the copy roof next to it (reported, not judged). Returns the GB/s of every implementation."""
    smoke = env.smoke_default() if smoke is None else smoke
    ext = build_lab_extension(inner_loop_source)
    check_one_pass(inner_loop_source)  # the time of a two-pass loop is not the task's
    x = torch.randn(rows, n)
    err = _max_err(ext.ops.softmax_forward(x), torch.softmax(x, -1))
    expect(err < 1e-5, f"your kernel's output differs from torch.softmax by {err:.3g}: run the parity check first")
    try:
        baseline = kernels.build(lab_source(TWO_PASS_LOOP), name="wb_softmax_lab_two_pass")
    except RuntimeError as exc:  # the course's own source: a broken toolchain, not the learner's loop
        raise LabCheckFailed(f"the two-pass baseline does not compile here:\n{exc}") from None
    impls = {
        "your loop": ext.ops.softmax_forward,
        "two-pass loop": baseline.ops.softmax_forward,
        "torch.softmax": lambda t: torch.softmax(t, -1),
        "lesson 06 fused kernel": ops.softmax,
    }
    rounds = 2 if smoke else 5
    (row,) = sweep.softmax_sweep(impls, [n], rows * n, min_run_time=min_run_time, rounds=rounds, progress=False)
    for name in ("copy", *impls):
        label = "copy into a buffer (the roof)" if name == "copy" else name
        print(f"  {label:30s} {row[name]:7.2f} GB/s")
    expect(math.isfinite(row["your loop"]) and row["your loop"] > 0,
           f"could not time your kernel (got {row['your loop']!r} GB/s)")
    ratio = sweep.ratio_over([row], "your loop", "two-pass loop")
    line = verdict.prediction_line("your loop / the two-pass loop, speed (target)", ratio, SPEED_TARGET)
    look = ("How many exps does your loop compute per element of x, and how many does the two-pass loop? The row is "
            "in cache here, so the read you saved is cheap and the exps decide.")
    met = verdict.prediction(ratio, SPEED_TARGET) == verdict.HELD
    if smoke:
        print(f"SMOKE MODE: the speed is reported, not judged (too few rounds to judge); correctness is judged. {line}")
    else:
        judged = ratio.judged
        expect_target(met,
                      judged is not None and judged[1] >= SPEED_TARGET,
                      f"undecided: {line}. The rounds disagree, as they do when other programs keep this machine's "
                      f"cores busy: run the check again. The target wants every round at {SPEED_TARGET:.2f}x or "
                      f"above. {look}",
                      f"too slow: {line}; the target wants every round at {SPEED_TARGET:.2f}x or above. {look}")
    passed("speed" if met or smoke else "speed's parity (speed target recorded above, not enforced)", f"{line}; {rows} x {n} fp32, {rounds} interleaved rounds; your loop at "
           f"{row['your loop'] / row['lesson 06 fused kernel']:.2f}x the lesson's vectorized kernel and "
           f"{row['your loop'] / row['copy']:.0%} of the copy roof (reported, not judged)")
    figure("fraction_of_copy_roof", row["your loop"] / row["copy"], "x")
    figure("speed_over_two_pass_loop", ratio.value, "x")
    return row
