"""utils.kernels.occupancy (lesson 06): ptxas's report parsed, and theoretical occupancy for an H100 by the rules of
CUDA's cuda_occupancy.h, on ptxas text captured from `nvcc -Xptxas=-v` of softmax.cu (sm_90, CUDA 13.0) and from
ptxas on Triton's PTX. The nvcc run itself is in tests/build/test_cuda_occupancy.py."""

import re

import pytest

from utils.kernels import KERNEL_DIR
from utils.kernels import occupancy as oc

# Captured: nvcc 13.0 -Xptxas=-v on an earlier utils/kernels/softmax.cu for sm_90 (three of its kernels; the names
# still follow the launcher's rules: ..._warp<...> 128 threads, ..._block<...> 256-1024)
SOFTMAX_CU_SM90 = """\
ptxas info    : 28 bytes gmem
ptxas info    : Compiling entry function '_ZN49_GLOBAL__N__f0a8f8e6_10_softmax_cu_2996dc61_1297921softmax_forward_blockIfLi4EEEvPKT_PS1_l' for 'sm_90'
ptxas info    : Function properties for _ZN49_GLOBAL__N__f0a8f8e6_10_softmax_cu_2996dc61_1297921softmax_forward_blockIfLi4EEEvPKT_PS1_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 256 bytes smem
ptxas info    : Compile time = 40.985 ms
ptxas info    : Compiling entry function '_ZN49_GLOBAL__N__f0a8f8e6_10_softmax_cu_2996dc61_1297920softmax_forward_warpIfLi4EEEvPKT_PS1_ll' for 'sm_90'
ptxas info    : Function properties for _ZN49_GLOBAL__N__f0a8f8e6_10_softmax_cu_2996dc61_1297920softmax_forward_warpIfLi4EEEvPKT_PS1_ll
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
ptxas info    : Compile time = 41.894 ms
ptxas info    : Compiling entry function '_ZN49_GLOBAL__N__f0a8f8e6_10_softmax_cu_2996dc61_1297921softmax_forward_blockIdLi2EEEvPKT_PS1_l' for 'sm_90'
ptxas info    : Function properties for _ZN49_GLOBAL__N__f0a8f8e6_10_softmax_cu_2996dc61_1297921softmax_forward_blockIdLi2EEEvPKT_PS1_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 54 registers, used 1 barriers, 512 bytes smem
ptxas info    : Compile time = 196.008 ms
"""

# Captured: nvcc 13.0 -Xptxas=-v on the current softmax.cu for sm_90: the register kernel for 513-1024 float columns
# and the shared-memory kernel (its dynamic shared memory, the row, is not in ptxas' report)
SOFTMAX_CU_SM90_ROWS = """\
ptxas info    : Compiling entry function '_ZN48_GLOBAL__N__f0a8f8e6_10_softmax_cu_ad11e9c8_521920softmax_forward_warpIfLi32ELi32EEEvPKT_PS1_ll' for 'sm_90'
ptxas info    : Function properties for _ZN48_GLOBAL__N__f0a8f8e6_10_softmax_cu_ad11e9c8_521920softmax_forward_warpIfLi32ELi32EEEvPKT_PS1_ll
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 127 registers, used 0 barriers
ptxas info    : Compile time = 45.539 ms
ptxas info    : Compiling entry function '_ZN48_GLOBAL__N__f0a8f8e6_10_softmax_cu_ad11e9c8_521920softmax_forward_smemIfLi4EEEvPKT_PS1_l' for 'sm_90'
ptxas info    : Function properties for _ZN48_GLOBAL__N__f0a8f8e6_10_softmax_cu_ad11e9c8_521920softmax_forward_smemIfLi4EEEvPKT_PS1_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 256 bytes smem
ptxas info    : Compile time = 29.386 ms
"""

# Captured: triton 3.8's ptxas -v on flash_attention_kernel compiled for sm_90a in float32 at 64 x 64 blocks
TRITON_SPILLING = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'flash_attention_kernel' for 'sm_90a'
ptxas info    : Function properties for flash_attention_kernel
    10784 bytes stack frame, 17960 bytes spill stores, 30312 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 10784 bytes cumulative stack size
ptxas info    : Compile time = 1715.979 ms
"""


def test_parse_ptxas_reads_registers_shared_memory_and_spills():
    usage = oc.parse_ptxas(SOFTMAX_CU_SM90)
    assert len(usage) == 3
    block = next(u for name, u in usage.items() if "softmax_forward_blockIfLi4" in name)
    assert (block.registers, block.shared_bytes, block.barriers, block.spill_bytes) == (24, 256, 1, 0)
    warp = next(u for name, u in usage.items() if "softmax_forward_warpIfLi4" in name)
    assert (warp.registers, warp.shared_bytes, warp.barriers) == (32, 0, 0)
    spilled = oc.parse_ptxas(TRITON_SPILLING)["flash_attention_kernel"]
    assert (spilled.registers, spilled.spill_stores, spilled.spill_loads, spilled.stack_bytes) == (32, 17960, 30312,
                                                                                                   10784)
    assert oc.parse_ptxas("nvcc fatal : Unsupported gpu architecture 'compute_10'") == {}
    with pytest.raises(TypeError, match="ptxas's report as text"):
        oc.parse_ptxas(None)


@pytest.mark.parametrize("registers, threads, shared, blocks, warps, limiter", [
    (32, 128, 0, 16, 64, "warps"),  # softmax.cu's warp kernel: 32 x 32 = 1024 registers per warp, 64 warps fit
    (24, 1024, 256, 2, 64, "warps"),
    (48, 256, 512, 5, 40, "registers"),  # 1536 per warp: 10 warps per 16K sub-partition = 40 per SM, 5 blocks of 8
    (54, 256, 512, 4, 32, "registers"),  # 1728 rounds up to 1792 per warp: 9 per sub-partition, 36 per SM, 4 blocks
    (64, 1024, 0, 1, 32, "registers"),
    (40, 128, 48 * 1024, 4, 16, "shared memory"),  # 48 KiB + 1 KiB reserved per block, out of 228 KiB
    (0, 32, 0, 32, 32, "blocks"),  # one-warp blocks: the 32-block limit binds first
    (201, 128, 16384, 2, 8, "registers"),  # a Triton attention kernel in fp16
])
def test_occupancy_follows_cuda_occupancy_h(registers, threads, shared, blocks, warps, limiter):
    occ = oc.occupancy(registers, threads, shared)
    assert (occ.blocks, occ.warps, occ.limiter) == (blocks, warps, limiter), str(occ)
    assert occ.fraction == warps / 64 and occ.limits[limiter] == blocks
    assert f"{blocks} blocks" in str(occ) and limiter in str(occ)


def test_occupancy_refuses_launches_that_cannot_happen():
    cases = [
        (lambda: oc.occupancy(32, 0), "threads per block must be 1..1024"),
        (lambda: oc.occupancy(32, 2048), "threads per block must be 1..1024"),
        (lambda: oc.occupancy(256, 128), "more than H100 \\(sm_90\\) allows \\(255\\)"),
        (lambda: oc.occupancy(32, 128, 228 * 1024), "launch would fail"),
        (lambda: oc.occupancy(255, 1024), "do not fit one block's 65536 registers"),
        (lambda: oc.occupancy(32.5, 128), "registers must be a non-negative int, got 32.5"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()


def test_block_threads_mirrors_the_launcher_in_softmax_cu():
    source = (KERNEL_DIR / "softmax.cu").read_text()
    body = re.search(r"int block_threads\(int64_t n, int vec\) \{(.*?)\n\}", source, re.S)
    assert body, "softmax.cu's block_threads(n, vec) moved or changed signature: update occupancy.softmax_cu_block_threads"
    assert re.sub(r"\s+", " ", body.group(1)).strip() == (
        "const int64_t per_thread_work = (n + vec - 1) / vec; int threads = 256; while (threads < 1024 && "
        "per_thread_work > int64_t(threads) * 8) threads *= 2; // >= ~8 vectors per thread return threads;")
    assert "kWarpRowsPerBlock = 4;" in source and "kWarpMaxCols = 1024;" in source  # 32 x 4 threads per warp block
    assert [oc.softmax_cu_block_threads(n, 4) for n in (1025, 8192, 8196, 16384, 16388, 262144)] == [
        256, 256, 512, 512, 1024, 1024]
    assert {oc.softmax_cu_block_threads(n, 4) for n in range(1025, 40000, 97)} == set(oc.softmax_cu_launches(
        "softmax_forward_block<float, 4>"))


def test_softmax_cu_occupancy_rows(monkeypatch):
    from utils import kernels

    # demangled as c++filt would; the test does not depend on binutils being installed
    monkeypatch.setattr(kernels, "_demangle", lambda symbols: {
        s: ("softmax_forward_block<float, 4>" if "blockIfLi4" in s else "softmax_forward_warp<float, 4>"
            if "warpIfLi4" in s else "softmax_forward_block<double, 2>") for s in symbols})
    rows = oc.softmax_cu_occupancy(SOFTMAX_CU_SM90)
    got = {(r["kernel"], r["threads"]): (r["registers"], r["occupancy"].blocks, r["occupancy"].fraction) for r in rows}
    assert got == {
        ("softmax_forward_block<double, 2>", 256): (54, 4, 0.5),
        ("softmax_forward_block<double, 2>", 512): (54, 2, 0.5),
        ("softmax_forward_block<double, 2>", 1024): (54, 1, 0.5),
        ("softmax_forward_block<float, 4>", 256): (24, 8, 1.0),
        ("softmax_forward_block<float, 4>", 512): (24, 4, 1.0),
        ("softmax_forward_block<float, 4>", 1024): (24, 2, 1.0),
        ("softmax_forward_warp<float, 4>", 128): (32, 16, 1.0),
    }
    with pytest.raises(ValueError, match="softmax.cu kernel"):
        oc.softmax_cu_launches("flash_attention_kernel")
    assert oc.softmax_cu_launches("softmax_split_stats<float, 4>") == [512]


def test_softmax_cu_occupancy_counts_the_row_in_shared_memory(monkeypatch):
    from utils import kernels

    monkeypatch.setattr(kernels, "_demangle", lambda symbols: {
        s: "softmax_forward_smem<float, 4>" if "smem" in s else "softmax_forward_warp<float, 32, 32>" for s in symbols})
    got = {r["kernel"]: (r["threads"], r["shared_bytes"], r["occupancy"].fraction)
           for r in oc.softmax_cu_occupancy(SOFTMAX_CU_SM90_ROWS)}
    # 127 registers x 32 lanes, rounded to 4,096 per warp: 16 warps of the 64 an SM holds
    assert got["softmax_forward_warp<float, 32, 32>"] == (128, 0, 0.25)
    # the row as float plus 256 B of reduction scratch (and 1 KiB the driver reserves per block): 2048 floats at 256
    # threads fit 8 blocks (64 warps); 8192 at 256 threads, 6 blocks of 33.3 KiB in 228 KiB; 16384 at 512 threads, 3
    assert got["softmax_forward_smem<float, 4> n=2048"] == (256, 2048 * 4 + 256, 1.0)
    assert got["softmax_forward_smem<float, 4> n=8192"] == (256, 8192 * 4 + 256, 0.75)
    assert got["softmax_forward_smem<float, 4> n=16384"] == (512, 16384 * 4 + 256, 0.75)


def test_ptxas_usage_wants_ptx():
    with pytest.raises(ValueError, match=r"\.target sm_XX"):
        oc.ptxas_usage("not ptx at all")
    with pytest.raises(RuntimeError, match="needs ptxas; none at /nonexistent"):
        oc.ptxas_usage(".version 8.0\n.target sm_90\n", ptxas="/nonexistent/ptxas")


def test_ptxas_usage_runs_ptxas_on_a_tiny_kernel():
    triton = pytest.importorskip("triton")
    ptxas = triton.knobs.nvidia.ptxas.path
    if not ptxas or not __import__("os").path.isfile(ptxas):
        pytest.skip("triton ships no ptxas here (its NVIDIA backend is needed to compile for a GPU)")
    ptx = """.version 8.0
.target sm_90
.address_size 64
.visible .entry ones(.param .u64 p)
{
    .reg .b64 %rd<3>;
    .reg .f32 %f<2>;
    ld.param.u64 %rd1, [p];
    cvta.to.global.u64 %rd2, %rd1;
    mov.f32 %f1, 0f3F800000;
    st.global.f32 [%rd2], %f1;
    ret;
}
"""
    usage = oc.ptxas_usage(ptx)
    assert usage.name == "ones" and 0 < usage.registers <= 16 and usage.spill_bytes == 0


def test_triton_occupancy_reads_a_compiled_kernel():
    from types import SimpleNamespace

    attention = SimpleNamespace(registers=201, num_warps=4, shared_bytes=16384)  # like triton_attention.GpuBuild
    assert oc.triton_occupancy(attention) == oc.occupancy(201, 128, 16384)
    softmax = SimpleNamespace(registers=40, num_warps=16)  # like triton_softmax.GpuCompile: no shared memory figure
    occ = oc.triton_occupancy(softmax)
    assert (occ.threads, occ.shared_bytes, occ.blocks, occ.limiter) == (512, 0, 3, "registers")
    with pytest.raises(ValueError, match="registers and num_warps"):
        oc.triton_occupancy(SimpleNamespace(registers=None, num_warps=4))  # ptxas printed no register count
