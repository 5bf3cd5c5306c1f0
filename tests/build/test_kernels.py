"""utils.kernels (lesson 06): capability detection, the build cache, the fused softmax operator and its checks."""

import math
import re

import pytest

from utils import kernels
from utils.checks import LabCheckFailed, lab06
from utils.core import env

torch = pytest.importorskip("torch")

needs_cxx = pytest.mark.skipif(not env.has("cxx"), reason="no C++ compiler")


# ---------------------------------------------------------------------------------------------------------------------
# pure helpers (no build)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, want",
    [
        ({"sse2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, "AVX512"),
        ({"avx2", "fma", "avx512f"}, "AVX2"),  # AVX-512 F alone is not enough for ATen's AVX512 kernels
        ({"avx2", "fma", "f16c"}, "AVX2"),
        ({"avx2"}, "DEFAULT"),  # AVX2 without FMA (some VMs hide it)
        (set(), "DEFAULT"),
    ],
)
def test_cpu_capability_from_flags(flags, want):
    assert kernels.cpu_capability(flags) == want


def test_capability_cflags_match_the_capability():
    assert "-DCPU_CAPABILITY_AVX2" in kernels.capability_cflags("AVX2")
    assert "-mavx2" in kernels.capability_cflags("AVX2")
    assert "-DCPU_CAPABILITY_AVX512" in kernels.capability_cflags("AVX512")
    assert kernels.capability_cflags("DEFAULT") == []
    with pytest.raises(ValueError, match="AVX512"):
        kernels.capability_cflags("avx2")


def test_last_level_cache_is_a_size_or_unknown():
    size = env.last_level_cache_bytes()
    assert size is None or size >= 2**16


def test_source_excerpt_prints_marked_blocks():
    assert "row_three_pass" in kernels.source_excerpt("three-pass")
    assert "row_online" in kernels.source_excerpt("online")
    with pytest.raises(KeyError, match="three-pass"):
        kernels.source_excerpt("no-such-block")


def test_build_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="identifier"):
        kernels.build(name="Bad Name")
    with pytest.raises(ValueError, match="TORCH_LIBRARY"):
        kernels.build("int main() { return 0; }")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        kernels.build(tmp_path / "missing.cpp")
    with pytest.raises(TypeError, match="C\\+\\+ text"):
        kernels.build(42)
    with pytest.raises(ValueError, match="capability"):
        kernels.build(capability="SSE")


def test_compiler_errors_keep_the_error_lines():
    log = "\n".join(["[1/2] c++ ... -c x.cpp", "x.cpp:3:5: error: 'foo' was not declared", "   3 |  foo();", "ok"])
    text = kernels._compiler_errors(log)
    assert "error: 'foo' was not declared" in text and "foo();" in text


def test_ptxas_register_parsing():
    log = (
        "ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'\n"
        "ptxas info    : Used 23 registers, used 1 barriers\n"
    )
    regs = kernels._ptxas_registers(log)
    assert list(regs.values()) == [23]
    assert "kernel" in next(iter(regs))


def test_sweep_validates_input():
    from utils.kernels import sweep

    with pytest.raises(ValueError, match="at least one"):
        sweep.softmax_sweep({}, [4], 64)
    with pytest.raises(ValueError, match="row lengths"):
        sweep.softmax_sweep({"torch": torch.softmax}, [0], 64)
    with pytest.raises(ValueError, match="copy"):
        sweep.softmax_sweep({"copy": torch.clone}, [4], 64)


def test_sweep_reports_gbps_for_every_implementation():
    from utils.core import bench
    from utils.kernels import sweep

    rows = sweep.softmax_sweep({"torch": lambda t: torch.softmax(t, -1)}, [4, 16], 256, min_run_time=0.01,
                               warmup=0, rounds=2, into={"torch into": lambda t, out: torch.softmax(t, -1, out=out)})
    assert [r["n"] for r in rows] == [4, 16]
    assert all(r[k] > 0 for r in rows for k in ("copy", "clone", "torch", "torch into"))
    assert all(len(r["round_ms"]["torch into"]) == 2 for r in rows)
    assert len(sweep.fraction_of_copy(rows, "torch")) == 2
    assert sweep.fraction_of_copy(rows, "torch", roof="clone")[0] == rows[0]["torch"] / rows[0]["clone"]
    ratio = sweep.ratio_over(rows, "torch into", over="copy")
    assert isinstance(ratio, bench.Ratio) and ratio.rounds == 2 and ratio.low <= ratio.value <= ratio.high
    assert sweep.roof_spread(rows) >= 1.0
    # a roof is one number per round (the median over n), so a jump of the copy at one n does not move the fraction
    copy_ms = rows[0]["round_ms"]["copy"][0]  # one copy time everywhere (the rows move the same bytes)
    steady = [dict(r, round_ms={**r["round_ms"], "copy": [copy_ms] * 2}) for r in rows]
    steady.append(dict(steady[-1], n=64))
    jumped = [dict(r, round_ms=dict(r["round_ms"])) for r in steady]
    jumped[1]["round_ms"]["copy"] = [t / 2 for t in jumped[1]["round_ms"]["copy"]]  # the copy twice as fast at one n
    assert sweep.ratio_over(jumped, "torch into", over="copy").value == pytest.approx(
        sweep.ratio_over(steady, "torch into", over="copy").value)
    with pytest.raises(KeyError, match="fused"):
        sweep.fraction_of_copy(rows, "fused")
    with pytest.raises(ValueError, match="roof"):
        sweep.fraction_of_copy(rows, "torch", roof="spec sheet")
    with pytest.raises(ValueError, match="both"):
        sweep.softmax_sweep({"a": torch.clone}, [4], 64, into={"a": torch.clone})


def test_lab_checks_fail_clearly_on_stubs_and_wrong_formulas():
    def stub():
        raise NotImplementedError("TODO: write it")

    with pytest.raises(LabCheckFailed, match="not written yet"):
        lab06.check_inner_loop(stub)
    with pytest.raises(LabCheckFailed, match="never reads x"):
        lab06.check_inner_loop(lambda: "m = 0; s = 1;")
    wrong_backward = [  # typical wrong answers, each named by its symptom, none by the formula
        (lambda g, y: y * (g - (g * y).sum()), "depends on that row alone"),  # summed over every row at once
        (lambda g, y: y * (g - (g * y).sum(-1)), "raised RuntimeError.*line up"),  # the row sums do not broadcast
        (lambda g, y: g - (g * y).sum(-1, keepdim=True), "sum to .*not 0"),  # the factor y is missing
        (lambda g, y: y * g, "sum to .*not 0"),  # the diagonal term only
    ]
    for formula, symptom in wrong_backward:
        with pytest.raises(LabCheckFailed, match=symptom) as info:
            lab06.check_backward(formula)
        assert "keepdim" not in str(info.value) and "y * (g" not in str(info.value)
    lab06.check_backward(lambda g, y: y * (g - (g * y).sum(-1, keepdim=True)))


# ---------------------------------------------------------------------------------------------------------------------
# the compiled extension and the operator
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ext():
    if not env.has("cxx"):
        pytest.skip("no C++ compiler")
    return kernels.build()


@pytest.fixture(scope="module")
def ops(ext):
    from utils.kernels import ops as module

    return module


@needs_cxx
def test_build_is_cached_and_reports_its_capability(ext):
    assert kernels.build() is ext  # same source and flags: the same loaded build
    assert ext.library.is_file()
    assert ext.namespace.startswith("wb_softmax_")
    assert f"cpu_capability={ext.capability}" in ext.build_info()


@needs_cxx
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-12), (torch.bfloat16, 2**-8)])
@pytest.mark.parametrize("algorithm", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 5, 8, 31, 64, 1000, 4099])
def test_forward_matches_torch(ext, dtype, tol, algorithm, n):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(13, n, generator=g, dtype=torch.float64) * 4).to(dtype)
    got = ext.ops.softmax_forward(x, algorithm)
    want = torch.softmax(x.double(), dim=-1)
    assert got.dtype == dtype and got.shape == x.shape
    assert (got.double() - want).abs().max().item() <= tol


@needs_cxx
@pytest.mark.parametrize("algorithm", [0, 1, 2])
def test_out_variant_writes_the_same_result_into_the_buffer(ext, algorithm):
    x = torch.randn(11, 300)
    out = torch.full_like(x, 7.0)
    assert ext.ops.softmax_forward_out(x, out, algorithm) is None
    torch.testing.assert_close(out, ext.ops.softmax_forward(x, algorithm), atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="must not be x itself"):
        ext.ops.softmax_forward_out(x, x, algorithm)


@needs_cxx
def test_accurate_exp_build_is_a_separate_op_with_the_same_parity():
    fast, accurate = kernels.build(), kernels.build(accurate_exp=True)
    assert accurate.namespace != fast.namespace and accurate.accurate_exp
    assert "1 ulp" in accurate.build_info() and "20 ulp" in fast.build_info()
    x = torch.randn(64, 4096) * 4
    want = torch.softmax(x.double(), -1)
    for e in (fast, accurate):
        assert (e.ops.softmax_forward(x, 1).double() - want).abs().max().item() <= 2e-6
    torch.testing.assert_close(accurate.ops.exp_only(x), torch.exp(x), atol=0, rtol=2e-7)


def test_build_many_needs_one_dict_per_build():
    with pytest.raises(TypeError, match="one dict"):
        kernels.build_many()
    with pytest.raises(TypeError, match="one dict"):
        kernels.build_many("AVX2")


@needs_cxx
def test_build_many_returns_the_builds_in_order(ext):
    fast, accurate = kernels.build_many({}, {"accurate_exp": True})
    assert fast is ext and accurate is kernels.build(accurate_exp=True)  # the same loaded builds, in order


@needs_cxx
def test_naive_loop_matches_torch(ext):
    x = torch.randn(9, 300)
    torch.testing.assert_close(ext.ops.softmax_naive(x), torch.softmax(x, -1), atol=2e-6, rtol=0)


@needs_cxx
def test_exp_only_matches_torch_exp_and_checks_dtype(ext):
    x = torch.cat([torch.randn(1000) * 20, torch.tensor([-math.inf, -200.0, 0.0, 80.0])])  # odd length: a scalar tail
    torch.testing.assert_close(ext.ops.exp_only(x), torch.exp(x), atol=0, rtol=5e-6)
    with pytest.raises(RuntimeError, match="expected x of dtype float32, got Double"):
        ext.ops.exp_only(x.double())


@needs_cxx
@pytest.mark.parametrize("algorithm", [1, 2])
def test_masked_nan_and_extreme_rows_match_torch(ext, algorithm):
    x = torch.randn(7, 100)
    x[0, 40:] = -math.inf  # mask at the end
    x[1, :90] = -math.inf  # mask first: the running max starts at -inf
    x[2] = -math.inf  # fully masked: torch gives NaN
    x[3, 5] = math.nan
    x[4, 6] = math.inf  # torch gives NaN for the whole row
    x[5] *= 1e4
    got = ext.ops.softmax_forward(x, algorithm)
    torch.testing.assert_close(got, torch.softmax(x, -1), atol=2e-6, rtol=0, equal_nan=True)


@needs_cxx
@pytest.mark.parametrize("shape", [(0, 8), (4, 0), (0,), (1, 1), (3, 1)])
def test_empty_and_one_element_rows(ops, shape):
    x = torch.randn(shape)
    got = ops.softmax(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, torch.softmax(x, -1))


@needs_cxx
def test_operator_handles_strides_and_other_dims(ops):
    x = torch.randn(20, 30, 6).transpose(1, 2)  # non-contiguous
    torch.testing.assert_close(ops.softmax(x), torch.softmax(x, -1), atol=2e-6, rtol=0)
    torch.testing.assert_close(ops.fused_softmax(x, dim=0), torch.softmax(x, 0), atol=2e-6, rtol=0)
    torch.testing.assert_close(ops.fused_softmax(x, dim=1), torch.softmax(x, 1), atol=2e-6, rtol=0)


@needs_cxx
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: torch.arange(6, dtype=torch.int32), "expected x of dtype float32, float64 or bfloat16, got Int"),
        (lambda: torch.ones(2, 3, dtype=torch.float16), "got Half"),
        (lambda: torch.tensor(1.0), "at least 1 dimension"),
    ],
)
def test_bad_input_errors_say_what_was_expected(ops, make, message):
    with pytest.raises(RuntimeError, match=message):
        ops.softmax(make())


@needs_cxx
def test_raw_kernel_errors(ext, ops):
    # In a child process (kernels.raw_errors): a C++ error that fails to cross back into Python fails this test
    # with "crashed: SIGSEGV ..." instead of killing the test run (seen on one GPU machine).
    errors = kernels.raw_errors(ext)
    assert set(errors) == set(kernels.RAW_BAD_INPUTS)
    assert re.match(r"RuntimeError: .*expected a contiguous x.*call .contiguous", errors["strided x to the raw kernel"])
    assert re.match(r"RuntimeError: .*algorithm must be 0", errors["unknown algorithm"])
    assert re.match(r"RuntimeError: .*out must have x's shape", errors["out of the wrong shape"])
    assert re.match(r"RuntimeError: .*same shape", errors["backward shape mismatch"])
    assert re.match(r"RuntimeError: .*same dtype", errors["backward dtype mismatch"])
    with pytest.raises(ValueError, match="0-d"):
        ops.fused_softmax(torch.tensor(2.0))
    with pytest.raises(TypeError, match="torch.Tensor"):
        ops.fused_softmax([1.0, 2.0])


@needs_cxx
def test_raw_errors_reports_a_crash_and_goes_on(ext):
    calls = {"kills its process": "__import__('os').kill(__import__('os').getpid(), 11)",
             "after the crash": "ops.softmax_forward(torch.ones(2, 3), 9)", "fine": "ops.softmax_forward(torch.ones(2, 3), 0)"}
    errors = kernels.raw_errors(ext, calls)
    assert list(errors) == list(calls)
    assert errors["kills its process"].startswith("crashed: signal SIGSEGV")
    assert errors["kills its process"].endswith("Fatal Python error: Segmentation fault")  # faulthandler's line
    assert errors["after the crash"].startswith("RuntimeError: fused softmax: algorithm must be 0")
    assert errors["fine"] == "no error"


@needs_cxx
def test_error_probe_says_whether_cpp_errors_reach_python():
    ok, detail = kernels.error_probe()
    assert ok, detail  # on this machine they do; where they do not, `make doctor` warns with this detail
    assert "RuntimeError" in detail and torch.__version__ in detail
    assert f"built by {kernels.torch_build_compiler()}" in detail


def test_torch_build_compiler_names_a_compiler_and_version():
    assert re.fullmatch(r"(GCC|clang|Clang|MSVC) \d+(\.\d+)*", kernels.torch_build_compiler())


@needs_cxx
def test_backward_kernel_matches_autograd(ext):
    x = torch.randn(6, 77, dtype=torch.float64, requires_grad=True)
    g = torch.randn(6, 77, dtype=torch.float64)
    y = torch.softmax(x, -1)
    (want,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(ext.ops.softmax_backward(g, y.detach()), want)


@needs_cxx
def test_opcheck_passes(ops):
    for x in (torch.randn(8, 33, requires_grad=True), torch.randn(3, 8, 5).transpose(1, 2),
              torch.randn(2, 4, 9, dtype=torch.float64, requires_grad=True)):
        result = torch.library.opcheck(ops.softmax, (x,))
        assert all(v == "SUCCESS" for v in result.values()), result


@needs_cxx
def test_gradcheck_float64(ext, ops):
    x = torch.randn(4, 13, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ops.softmax, (x,))
    assert torch.autograd.gradcheck(ops.autograd_function(ext).apply, (x,))


@needs_cxx
def test_raw_op_needs_a_fake_kernel_for_fullgraph_compile(ext, ops):
    x = torch.randn(4, 16)
    fn = torch.compile(lambda t: ops.softmax(t * 2), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x), torch.softmax(x * 2, -1), atol=2e-6, rtol=0)
    raw = ext  # no other test registers a fake kernel for the raw ops
    legacy = ops.autograd_function(raw)
    strict = torch.compile(lambda t: legacy.apply(t * 2), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="fake tensors"):
        strict(x)
    # The autograd.Function was never the problem: a fake kernel on the raw C++ op is the whole fix.
    torch.library.register_fake(f"{raw.namespace}::softmax_forward")(lambda t, algorithm=0: t.new_empty(t.shape))
    torch._dynamo.reset()
    fixed = torch.compile(lambda t: legacy.apply(t * 2), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fixed(x), torch.softmax(x * 2, -1), atol=2e-6, rtol=0)


@needs_cxx
def test_export_keeps_the_operator(ops):
    class M(torch.nn.Module):
        def forward(self, x):
            return ops.softmax(x)

    ep = torch.export.export(M(), (torch.randn(3, 8),))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets == ["workbook.softmax.default"]


# ---------------------------------------------------------------------------------------------------------------------
# CUDA: compile check where nvcc exists, the kernel where a GPU does
# ---------------------------------------------------------------------------------------------------------------------


def test_compile_check_rejects_bad_arch():
    if not env.has("nvcc"):
        pytest.skip("no nvcc")
    with pytest.raises(ValueError, match="compute capability"):
        kernels.compile_check_cuda(arch="sm_90")


@pytest.mark.skipif(not env.has("nvcc"), reason="no nvcc")
def test_cuda_source_compiles_with_nvcc():
    result = kernels.compile_check_cuda()
    assert result.ok, result.log[-3000:]
    assert any("softmax_forward_warp<float, 32, 32>" in k for k in result.registers), sorted(result.registers)


# (rows, n, offset) reaching every path of softmax.cu's forward on any GPU with fewer than 200 SMs: registers (tiny
# rows packed several to a warp, then one warp per row), shared memory, online two-pass (200 rows fill the GPU),
# split-row (fewer rows than SMs); offset 1 starts x one element past a 16-byte boundary, so y (fresh, aligned) and x
# differ in alignment and the scalar kernels run.
CUDA_SHAPES = [(65, 1, 0), (65, 7, 0), (65, 33, 0), (65, 256, 0), (65, 1000, 0), (65, 1024, 0), (65, 1025, 0),
               (65, 4099, 0), (65, 4099, 1), (200, 32768, 0), (200, 32768, 1), (65, 32768, 0), (8, 131072, 0),
               (4, 262144, 0)]


@pytest.mark.skipif(not (env.has("cuda") and env.has("nvcc")), reason="needs a CUDA GPU and nvcc")
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2**-10), (torch.bfloat16, 2**-7)])
@pytest.mark.parametrize("rows, n, offset", CUDA_SHAPES)
def test_cuda_kernel_matches_torch(dtype, tol, rows, n, offset):
    from utils.kernels import ops

    flat = (torch.randn(rows * n + offset, device="cuda") * 4).to(dtype)
    x = flat[offset:].view(rows, n)
    x[0, : n // 2] = -math.inf
    x[1] = -math.inf
    x[2, n // 3] = math.nan  # the whole row becomes NaN, as in torch
    got = ops.softmax(x)
    want = torch.softmax(x.double(), -1)
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=0, equal_nan=True)
    g = torch.randn_like(x)
    y = want.to(dtype)
    torch.testing.assert_close(ops.softmax_backward(g, y).double(),
                               (y.double() * (g.double() - (g.double() * y.double()).sum(-1, keepdim=True))),
                               atol=tol * 4, rtol=tol * 4, equal_nan=True)
