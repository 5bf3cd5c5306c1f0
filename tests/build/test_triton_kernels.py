"""utils.kernels.triton_softmax (lesson 06): the softmax in the Triton language, run by Triton's interpreter on CPU
tensors (no GPU needed), on the edge cases the C++ kernel is tested on; and lab 06's checks: the Triton task, and
the one-read-pass rule of the C++ task, which a two-pass loop used to pass because only its numbers were checked."""

from __future__ import annotations  # the kernels' `tl.constexpr` stays text: triton reads it, tl may be missing

import os
import subprocess
import sys

import pytest

from utils.checks import LabCheckFailed, lab06
from utils.core import env

torch = pytest.importorskip("torch")

try:  # module level: the interpreter looks `tl` up in a kernel's globals
    import triton.language as tl
except ImportError:
    tl = None

if env.has("triton"):  # the Triton task's checks import triton; the tests that use them need it
    from utils.checks import lab06_triton

needs_triton = pytest.mark.skipif(not env.has("triton"), reason=f"needs triton: {env.capabilities()['triton'].reason}")
needs_cxx = pytest.mark.skipif(not env.has("cxx"), reason="no C++ compiler")

INF = float("inf")


@pytest.fixture(scope="module")
def ts():
    if not env.has("triton"):
        pytest.skip(f"needs triton: {env.capabilities()['triton'].reason}")
    from utils.kernels import triton_softmax

    return triton_softmax


def _edge_rows():
    g = torch.Generator().manual_seed(27)
    one_finite = torch.full((3, 19), -INF)
    one_finite[0, 0], one_finite[1, 18], one_finite[2, 7] = 2.0, -5.0, 1e4
    mixed = torch.randn(4, 300, generator=g)
    mixed[0, :260] = -INF  # the first chunks of a looped row see only -inf
    mixed[1] = -INF  # all -inf: torch gives NaN
    mixed[2, ::3] = -INF
    return {
        "n=1": torch.randn(5, 1, generator=g),
        "odd n=7": torch.randn(9, 7, generator=g),
        "n=64 (a power of two)": torch.randn(3, 64, generator=g) * 3,
        "n=300, huge logits": torch.randn(2, 300, generator=g) * 1e3,
        "-inf but one value": one_finite,
        "-inf runs and an all -inf row": mixed,
        "1-d input": torch.randn(33, generator=g),
    }


def _check(got, x, tol=1e-6):
    want = torch.softmax(x.double(), dim=-1)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert torch.equal(torch.isnan(got), torch.isnan(want)), "NaN where torch.softmax has none, or the other way"
    return (got.double() - want).abs().nan_to_num(0).max().item()


VARIANTS = {
    "row": lambda ts, x: ts.softmax_row(x),
    "rows (4 per program)": lambda ts, x: ts.softmax_rows(x, rows_per_program=4),
    "looped (block 16)": lambda ts, x: ts.softmax_looped(x, block=16),
    "looped (default block)": lambda ts, x: ts.softmax_looped(x),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_matches_torch_on_the_edge_cases(ts, variant):
    for name, x in _edge_rows().items():
        assert ts.runs_in(x) == "interpreter"
        err = _check(VARIANTS[variant](ts, x), x)
        assert err <= 1e-6, f"{variant}, {name}: max error {err:.3g}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_in_float32_math_rounds_once(ts, dtype):
    dtype = getattr(torch, dtype)
    x = (torch.randn(6, 45, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    x[0, 3:] = -INF
    want = torch.softmax(x.double(), -1)
    for y in (ts.softmax_row(x), ts.softmax_rows(x, rows_per_program=2), ts.softmax_looped(x, block=8)):
        assert y.dtype == dtype
        tiny = torch.finfo(dtype).tiny  # below it float16 has subnormals: judge those by absolute error
        diff = (y.double() - want).abs()
        rel = (diff / want).masked_fill(want < tiny, 0).max().item()
        # the interpreter converts float32 to bfloat16 by truncation (the GPU rounds to nearest): one truncation,
        # 2**-7 relative; float16 goes through NumPy, which rounds to nearest: 2**-11
        tol = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-11
        assert rel <= tol, f"{dtype}: max relative error {rel:.3g} > {tol:.3g}"
        assert diff.masked_fill(want >= tiny, 0).max().item() <= tiny


def test_long_rows_need_the_looped_kernel(ts):
    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(3))
    y = ts.softmax_looped(x, block=128)  # 8 chunks, the last one ragged
    assert _check(y, x) <= 1e-6
    with pytest.raises(ValueError, match="softmax_looped"):
        ts.softmax_row(torch.empty(1, ts.MAX_ROW_BLOCK + 1))


def test_strided_rows_are_handled_and_strided_columns_rejected(ts):
    wide = torch.randn(6, 50, generator=torch.Generator().manual_seed(4))
    x = wide[::2, 5:40]  # rows 100 apart, each row contiguous
    assert x.stride() == (100, 1)
    for fn in (ts.softmax_row, ts.softmax_rows, ts.softmax_looped):
        assert _check(fn(x), x) <= 1e-6
    buffer = torch.full((6, 60), 9.0)
    out = buffer[:, :50]  # out with strided rows: written in place, the gaps untouched
    assert ts.softmax_row(wide, out=out) is out
    assert _check(out, wide) <= 1e-6 and bool((buffer[:, 50:] == 9.0).all())
    with pytest.raises(ValueError, match="stride 1 along the last dimension"):
        ts.softmax_row(torch.randn(8, 6).t())


def test_bad_input_says_what_was_expected(ts):
    cases = [
        (lambda: ts.softmax_row(torch.ones(2, 3, dtype=torch.int32)), TypeError, "float32, float16 or bfloat16.*int32"),
        (lambda: ts.softmax_row(torch.ones(2, 3, dtype=torch.float64)), TypeError, "got torch.float64"),
        (lambda: ts.softmax_rows(torch.ones(2, 3, 4)), ValueError, r"got shape \(2, 3, 4\)"),
        (lambda: ts.softmax_row([1.0, 2.0]), TypeError, "expected a torch.Tensor, got list"),
        (lambda: ts.softmax_row(torch.ones(2, 3), out=torch.empty(3, 2)), ValueError, r"expected \(2, 3\).*got \(3, 2\)"),
        (lambda: ts.softmax_rows(torch.ones(2, 3), rows_per_program=3), ValueError, "power of two"),
        (lambda: ts.softmax_looped(torch.ones(2, 3), block=12), ValueError, "power of two"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


def test_empty_inputs_launch_nothing(ts):
    for shape in [(0, 8), (4, 0)]:
        for fn in (ts.softmax_row, ts.softmax_rows, ts.softmax_looped):
            assert fn(torch.empty(shape)).shape == shape


def test_the_compiled_path_compiles_for_a_gpu_without_one(ts):
    """What the interpreter cannot check, Triton's compiler can, with no GPU: the three kernels type-check, lower to
    PTX and pass ptxas for sm_90, in fp32 and bf16 (the loop-carried (m, s) of the looped kernel included)."""
    import triton

    if not os.path.isfile(triton.knobs.nvidia.ptxas.path):
        pytest.skip("triton ships no ptxas here (its NVIDIA backend is needed to compile for a GPU)")
    for variant, block in (("row", 1024), ("rows", 64), ("looped", 256)):
        for dtype in (torch.float32, torch.bfloat16):
            result = ts.compile_for_gpu(variant, block=block, dtype=dtype)
            assert result.target.startswith("sm_90") and result.registers and result.spill_bytes == 0, str(result)
    assert "cvt.rn.bf16" in ts.compile_for_gpu("row", block=64, dtype=torch.bfloat16).ptx  # rounds to nearest on a GPU
    with pytest.raises(ValueError, match="variant"):
        ts.compile_for_gpu("tiled")


def test_interpreted_kernels_leave_triton_language_as_it_was(ts):
    import triton.language.core as core
    from triton.runtime import jit

    before = (jit.JITFunction.__call__, core.load, core.reduce, tl.load, tl.max)
    ts.softmax_row(torch.randn(3, 5))
    assert (jit.JITFunction.__call__, core.load, core.reduce, tl.load, tl.max) == before


def test_triton_interpret_set_before_import_is_honoured(ts):
    code = ("import torch; from utils.kernels import triton_softmax as ts; x = torch.randn(4, 50); "
            "x[0, :30] = float('-inf'); print(type(ts.softmax_kernel).__name__, max((f(x) - torch.softmax(x, -1))"
            ".abs().max().item() for f in (ts.softmax_row, ts.softmax_rows, lambda t: ts.softmax_looped(t, block=16))))")
    run = subprocess.run([sys.executable, "-c", code], env={**env.child_environ(), "TRITON_INTERPRET": "1"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    kind, err = run.stdout.split()[-2:]
    assert kind == "InterpretedFunction" and float(err) < 1e-6


def test_interpreted_wraps_the_same_function_once(ts):
    first = ts.interpreted(ts.softmax_kernel)
    assert first is ts.interpreted(ts.softmax_kernel) and first.fn is ts.softmax_kernel.fn
    assert ts.interpreted(first) is first
    with pytest.raises(TypeError, match="triton.jit kernel"):
        ts.interpreted(42)


def test_tiled_matmul_counts_the_bytes_its_arithmetic_predicts(ts):
    from triton.runtime import interpreter

    from utils.kernels import triton_matmul as tmm

    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, 8, generator=g)
    loaded = {}
    for tile in (1, 4, 8):
        with tmm.count_loads() as counts:
            c = tmm.matmul(a, b, tile=tile, block_k=8)
        assert (c.double() - a.double() @ b.double()).abs().max().item() < 1e-4
        assert len(counts) == (8 // tile) ** 2
        loaded[tile] = sum(counts.values())
        assert loaded[tile] == tmm.predicted_load_bytes(8, 8, 16, tile)
    assert loaded[1] / loaded[8] == 8  # untiled / tiled = the tile size
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)  # the count is undone
    ragged = tmm.matmul(torch.randn(5, 7, generator=g), torch.randn(7, 3, generator=g), tile=4, block_k=4)
    assert ragged.shape == (5, 3)
    with pytest.raises(TypeError, match="2-d float32"):
        tmm.matmul(torch.ones(2, 2, dtype=torch.float64), torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"\(M, K\) @ \(K, N\)"):
        tmm.matmul(torch.ones(2, 3), torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------------------------------
# lab 06: the Triton task, a looped (online) softmax for rows longer than one block (plain functions stand for the
# learner's kernels; the check interprets them, with a BLOCK smaller than most of its rows)
# ---------------------------------------------------------------------------------------------------------------------


def kernel_correct(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m) / s
        tl.store(y_ptr + row * y_row_stride + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_one_block(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    # the lesson's row kernel: right when the row fits one block, blind to the columns past BLOCK
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * y_row_stride + cols, e / tl.sum(e, axis=0), mask=mask)


def kernel_no_rescale(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m == -float("inf"), 0.0, m)
        s = s + tl.sum(tl.exp(x - ref), axis=0)  # the sum so far stays measured against the old maximum
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * y_row_stride + start + cols, tl.exp(x - m) / s, mask=mask)


def kernel_three_reads(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    # right numbers, not online: one walk for the max, one for the sum, one to write
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        m = tl.maximum(m, tl.max(x.to(tl.float32), axis=0))
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        s = s + tl.sum(tl.exp(x.to(tl.float32) - m), axis=0)
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * y_row_stride + start + cols, (tl.exp(x - m) / s).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_no_guard(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)  # exp(-inf - (-inf)) while all is -inf
        m = m_new
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * y_row_stride + start + cols, (tl.exp(x - m) / s).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_pads_with_zero(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=0.0).to(tl.float32)  # counts 0s
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * y_row_stride + start + cols, (tl.exp(x - m) / s).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_unmasked_store(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        x = tl.load(x_ptr + row * x_row_stride + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        tl.store(y_ptr + row * y_row_stride + start + cols, (tl.exp(x.to(tl.float32) - m) / s).to(y_ptr.dtype.element_ty))


def kernel_ignores_stride(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = -float("inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * n_cols + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_ptr + row * n_cols + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * n_cols + start + cols, (tl.exp(x - m) / s).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_todo(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    raise NotImplementedError("TODO: write the kernel")


def kernel_calls_the_lesson(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    from utils.kernels import triton_softmax

    triton_softmax.softmax_looped_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK)


@needs_triton
def test_lab_triton_check_passes_a_looped_kernel_and_refuses_the_lessons(ts, capsys):
    lab06_triton.check_triton_kernel(kernel_correct)
    out = capsys.readouterr().out
    assert "PASSED Triton looped softmax" in out and "read at most 2 times" in out
    for lesson in (ts.softmax_looped_kernel, ts.softmax_kernel, kernel_calls_the_lesson):
        with pytest.raises(LabCheckFailed, match="lesson's kernels"):
            lab06_triton.check_triton_kernel(lesson)


@needs_triton
@pytest.mark.parametrize("kernel, symptom", [
    (kernel_todo, "not written yet"),
    (kernel_one_block, "four chunks of 16.*columns 16..63 of y were never written.*every chunk"),
    (kernel_no_rescale, "a larger maximum in every chunk.*the maximum grows"),
    (kernel_three_reads, "read some elements of x 3 times.*ONE read of each chunk"),
    (kernel_no_guard, "first chunks are all -inf.*NaN where torch.softmax has none"),
    (kernel_pads_with_zero, "rows of 37 in chunks of 16.*wrong when it is not"),
    (kernel_unmasked_store, "wrote outside the rows of y"),
    (kernel_ignores_stride, "48 apart in memory.*where does row r start"),
])
def test_lab_triton_check_names_the_symptom(ts, kernel, symptom):
    with pytest.raises(LabCheckFailed, match=symptom) as info:
        lab06_triton.check_triton_kernel(kernel)
    for answer in ("tl.", "other=", "exp(m", "s * ", "where("):  # symptoms, never the answer's code
        assert answer not in str(info.value), f"the message gives the answer away ({answer!r}): {info.value}"


@needs_triton
def test_lab_triton_check_wants_the_lab_signature(ts):
    def wrong(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
        pass

    with pytest.raises(LabCheckFailed, match="should take"):
        lab06_triton.check_triton_kernel(wrong)


# ---------------------------------------------------------------------------------------------------------------------
# lab 06: the C++ task's one read pass, counted (a two-pass loop gives the right numbers)
# ---------------------------------------------------------------------------------------------------------------------

ONE_PASS = r"""
  for (int64_t i = 0; i < n; ++i) {
    const scalar_t v = x[i];
    if (v > m) {
      s = s * std::exp(m - v) + scalar_t(1);
      m = v;
    } else if (v != -std::numeric_limits<scalar_t>::infinity()) {
      s += std::exp(v - m);
    }
  }
"""

TWO_PASSES = r"""
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (m != -std::numeric_limits<scalar_t>::infinity())
    for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
"""


def test_read_passes_counts_walks_not_reads():
    assert lab06.read_passes([0, 0, 1, 1, 2, 2]) == 1  # x[i] read twice in one iteration: one pass
    assert lab06.read_passes([2, 1, 0]) == 1  # backwards is still one pass
    assert lab06.read_passes([0, 1, 2, 0, 1, 2]) == 2
    assert lab06.read_passes([]) == 0


@needs_cxx
def test_two_pass_loop_is_caught_although_its_numbers_are_right():
    assert lab06.check_one_pass(lambda: ONE_PASS) == 1
    ext = lab06.build_lab_extension(lambda: TWO_PASSES)
    x = torch.randn(8, 50, dtype=torch.float64)
    assert torch.allclose(ext.ops.softmax_forward(x), torch.softmax(x, -1))  # numerically it is a softmax...
    with pytest.raises(LabCheckFailed, match="up to 2 times.*ONE read pass"):  # ...that walks the row twice
        lab06.check_inner_loop(lambda: TWO_PASSES)
    with pytest.raises(LabCheckFailed, match="never read x"):
        lab06.check_one_pass(lambda: "for (int64_t i = 1; i < n; ++i) { m = std::max(m, x[i]); s += 1; }")
