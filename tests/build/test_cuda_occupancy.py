"""softmax.cu's occupancy on an H100 from nvcc's own report (lesson 06): nvcc compiles it for sm_90 without a GPU
(utils.kernels.compile_check_cuda, cached by source hash), utils.kernels.occupancy reads registers and shared memory
per kernel and computes the occupancy at the block sizes the launcher uses."""

import pytest

from utils import kernels
from utils.core import env
from utils.kernels import occupancy as oc


@pytest.mark.skipif(not env.has("nvcc"), reason=f"needs nvcc: {env.capabilities()['nvcc'].reason}")
def test_softmax_cu_occupancy_from_nvcc():
    check = kernels.compile_check_cuda(arch="90")
    assert check.ok, check.log[-3000:]
    usage = oc.parse_ptxas(check.log)
    # per dtype (4): forward in registers (11 group x items shapes), shared memory, online (vectorized or not),
    # split-row (2 kernels); backward warp and block (vectorized or not)
    assert len(usage) == 4 * (11 + 1 + 2 + 2 + 4)
    rows = oc.softmax_cu_occupancy(check.log)
    assert {r["threads"] for r in rows} == {128, 256, 512, 1024}
    assert all(r["spill_bytes"] == 0 and r["occupancy"].blocks >= 1 for r in rows)
    by_kernel = {(r["kernel"], r["threads"]): r for r in rows}
    # the float32 forward kernels the lesson is about: registers come from ptxas, so assert what they imply
    warp = by_kernel.get(("softmax_forward_warp<float, 32, 32>", 128))
    if warp is None:
        pytest.skip("kernel names were not demangled (no c++filt here)")
    assert warp["shared_bytes"] == 0  # shuffles only
    assert by_kernel[("softmax_forward_smem<float, 4> n=8192", 256)]["shared_bytes"] >= 8192 * 4  # the row
    block = by_kernel[("softmax_forward_block<float, 4>", 1024)]
    assert block["shared_bytes"] == 2 * 32 * 4  # block_reduce's shm_m and shm_s
    for row in (warp, block):
        expected = oc.occupancy(row["registers"], row["threads"], row["shared_bytes"])
        assert row["occupancy"] == expected
