"""utils.kernels.triton_attention (lessons 06, 07): FlashAttention's forward in the Triton language, run by Triton's
interpreter on CPU tensors against torch's scaled_dot_product_attention; the bytes its programs move counted against
the textbook attention that writes the score matrix to memory; and the kernel compiled for an H100 without one."""

import os

import pytest

from utils.core import env

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.skipif(not env.has("triton"), reason=f"needs triton: {env.capabilities()['triton'].reason}")


@pytest.fixture(scope="module")
def ta():
    from utils.kernels import triton_attention

    return triton_attention


def _qkv(b, h, n_q, n_k, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g)
    k, v = torch.randn(b, h, n_k, d, generator=g), torch.randn(b, h, n_k, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _sdpa(q, k, v, **kwargs):
    """torch's answer in float64, the reference every error here is measured against."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kwargs)


# (Tq, Tk): one query and one key; odd lengths inside one block; longer than a block, ragged last block; fewer
# queries than keys (decode-like) and more queries than keys (causal: the last queries see every key)
SHAPES = [(1, 1), (13, 13), (40, 40), (7, 29), (29, 7)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_sdpa_on_ragged_lengths(ta, causal):
    worst = 0.0
    for i, (n_q, n_k) in enumerate(SHAPES):
        q, k, v = _qkv(2, 2, n_q, n_k, 16, seed=i)
        got = ta.flash_attention(q, k, v, causal=causal, block_m=16, block_n=16)
        assert got.shape == q.shape and got.dtype == torch.float32
        err = (got.double() - _sdpa(q, k, v, is_causal=causal)).abs().max().item()
        assert err <= 1e-5, f"Tq={n_q} Tk={n_k} causal={causal}: max error {err:.3g}"
        worst = max(worst, err)
    assert worst > 0  # float32 against float64: a zero would mean the comparison compared nothing


def test_default_blocks_and_scale_and_strided_heads(ta):
    g = torch.Generator().manual_seed(7)
    # [batch, time, heads, dim] as a projection produces it, viewed as [batch, heads, time, dim]: strided, no copy
    q, k, v = (torch.randn(1, 70, 2, 32, generator=g).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    got = ta.flash_attention(q, k, v, causal=True, scale=0.3)
    err = (got.double() - _sdpa(q, k, v, is_causal=True, scale=0.3)).abs().max().item()
    assert err <= 1e-5, f"max error {err:.3g}"


def test_padded_keys_and_a_row_with_no_key(ta):
    q, k, v = _qkv(3, 2, 20, 37, 16, seed=11)
    lens = torch.tensor([37, 0, 5])  # the second batch element has no real key at all
    padding = (torch.arange(37) < lens[:, None])[:, None, None, :]
    for causal in (False, True):
        mask = padding & torch.ones(20, 37, dtype=torch.bool).tril() if causal else padding
        want = _sdpa(q, k, v, attn_mask=mask)
        assert torch.equal(want[1], torch.zeros_like(want[1]))  # what torch does with an all-False row: 0, not NaN
        got = ta.flash_attention(q, k, v, causal=causal, kv_lens=lens, block_m=16, block_n=16)
        assert not got.isnan().any()
        err = (got.double() - want).abs().max().item()
        assert err <= 1e-5, f"kv_lens, causal={causal}: max error {err:.3g}"


def test_float16_accumulates_in_float32(ta):
    q, k, v = _qkv(1, 2, 33, 33, 16, seed=3, dtype=torch.float16)
    got = ta.flash_attention(q, k, v, causal=True, block_m=16, block_n=16)
    assert got.dtype == torch.float16
    err = (got.double() - _sdpa(q, k, v, is_causal=True)).abs().max().item()
    # p is rounded to float16 before the P V dot (as on a GPU), the output once more: a few float16 ulps of |v| ~ 1
    assert err <= 4e-3, f"float16: max error {err:.3g}"


def test_out_and_empty_inputs(ta):
    q, k, v = _qkv(1, 1, 5, 9, 16, seed=4)
    out = torch.full_like(q, 7.0)
    assert ta.flash_attention(q, k, v, out=out, block_m=16, block_n=16) is out
    assert (out.double() - _sdpa(q, k, v)).abs().max().item() <= 1e-5
    assert ta.flash_attention(*_qkv(2, 2, 0, 4, 16, seed=5)).shape == (2, 2, 0, 16)


def test_bad_input_says_what_was_expected(ta):
    q, k, v = _qkv(1, 2, 4, 4, 16, seed=6)
    cases = [
        (lambda: ta.flash_attention(*_qkv(1, 1, 4, 4, 24, seed=0)), ValueError, "power of two.*got 24.*pad"),
        (lambda: ta.flash_attention(q[0], k[0], v[0]), ValueError, r"4 dimensions.*got shape \(2, 4, 16\)"),
        (lambda: ta.flash_attention(q.double(), k.double(), v.double()), TypeError, "got torch.float64"),
        (lambda: ta.flash_attention(q, k[:, :1], v[:, :1]), ValueError, r"k \(1, 1, 4, 16\)"),
        (lambda: ta.flash_attention(q, k, v.half()), ValueError, "share dtype and device"),
        (lambda: ta.flash_attention(q, k, v, block_m=8), ValueError, "block_m must be a power of two"),
        (lambda: ta.flash_attention(q, k, v, block_n=0), ValueError, "block_n must be a power of two.*got 0"),
        (lambda: ta.flash_attention(q, k, v, kv_lens=torch.tensor([True])), ValueError, "must be integers"),
        (lambda: ta.flash_attention(q, k, v, out=torch.empty(1, 2, 16, 4).transpose(2, 3)), ValueError,
         "head_dim must be contiguous"),
        (lambda: ta.naive_attention(q, k, v, out=torch.empty(1, 4, 2, 16).transpose(1, 2)), ValueError,
         "out must be contiguous"),
        (lambda: ta.flash_attention(q, k, v, kv_lens=[4, 4]), ValueError, r"one per batch element \(shape \(1,\)\)"),
        (lambda: ta.flash_attention(q, k, v, kv_lens=[5]), ValueError, "between 0 and the number of keys 4"),
        (lambda: ta.flash_attention(q, k, v, out=torch.empty(1, 2, 4, 8)), ValueError, "out must match q"),
        (lambda: ta.flash_attention([1.0], k, v), TypeError, "got list"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bytes_moved_match_the_arithmetic_and_flash_moves_fewer(ta, causal):
    """The IO-aware argument, counted per tensor in the interpreter: same Q, K, V reads as the textbook attention
    with the same query blocks, minus the 4 x Tq x Tk values of S and P that flash never writes or reads back."""
    from triton.runtime import interpreter

    bh, n, d, block = 2, 40, 16, 16
    q, k, v = _qkv(1, bh, n, n, d, seed=8)
    flash_out, naive_out = torch.empty_like(q), torch.empty_like(q)
    with ta.count_traffic(q=q, k=k, v=v, o=flash_out) as flash:
        ta.flash_attention(q, k, v, causal=causal, out=flash_out, block_m=block, block_n=block)
    with ta.count_traffic(q=q, k=k, v=v, o=naive_out) as naive:
        ta.naive_attention(q, k, v, causal=causal, out=naive_out, block_m=block, block_n=block)
    want = _sdpa(q, k, v, is_causal=causal)
    for out in (flash_out, naive_out):
        assert (out.double() - want).abs().max().item() <= 1e-5
    predicted = ta.predicted_traffic(bh, n, n, d, block_m=block, causal=causal)
    assert ta.traffic_by_tensor(flash) == predicted["flash"]
    assert ta.traffic_by_tensor(naive) == predicted["naive"]
    # per program: its BLOCK_M queries once (the last block is ragged: 40 = 16 + 16 + 8 rows)
    programs = sorted({program for program, _, _ in flash})
    assert len(programs) == 3 * bh
    q_bytes = {program[0]: n_bytes for (program, name, kind), n_bytes in flash.items() if name == "q"}
    assert q_bytes == {0: block * d * 4, 1: block * d * 4, 2: (n - 2 * block) * d * 4}
    ratio = sum(naive.values()) / sum(flash.values())
    assert ratio == sum(predicted["naive"].values()) / sum(predicted["flash"].values()) and ratio > 2
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)  # the count is undone
    with pytest.raises(ValueError, match="CPU tensor"), ta.count_traffic(q=[1.0]):
        pass


def test_a_second_count_inside_the_first_is_refused(ta):
    with ta.count_traffic(), pytest.raises(RuntimeError, match="already running"), ta.count_traffic():
        pass


def test_the_kernel_compiles_for_an_h100_without_one(ta):
    """Triton's compiler and ptxas need no GPU: registers, spills and shared memory for sm_90, and the occupancy they
    allow (utils.kernels.occupancy), for the 16-bit kernel and the padded-batch variant."""
    import triton

    from utils.kernels import occupancy

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set in this process: compiling needs a process without it")
    if not os.path.isfile(triton.knobs.nvidia.ptxas.path):
        pytest.skip("triton ships no ptxas here (its NVIDIA backend is needed to compile for a GPU)")
    for dtype, kv_lens in ((torch.bfloat16, False), (torch.float16, True)):
        built = ta.compile_for_gpu(dtype=dtype, kv_lens=kv_lens, causal=True)
        assert built.registers and built.spill_bytes == 0 and built.shared_bytes > 0, str(built)
        assert "mma" in built.ptx  # the dots run on tensor cores
        occ = occupancy.triton_occupancy(built)
        assert occ == occupancy.occupancy(built.registers, 32 * built.num_warps, built.shared_bytes)
        assert 0 < occ.fraction <= 1 and occ.blocks >= 1
    # flash_attention's float32 default is 32 x 32 because 64 x 64 spills (an ieee fp32 dot is not a tensor-core op)
    small = ta.compile_for_gpu(dtype=torch.float32, block_m=32, block_n=32)
    large = ta.compile_for_gpu(dtype=torch.float32, block_m=64, block_n=64)
    assert small.spill_bytes < large.spill_bytes, f"{small}\n{large}"
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        ta.compile_for_gpu(head_dim=48)


@pytest.mark.skipif(not env.has("cuda"), reason="needs a CUDA GPU: the compiled kernel")
def test_compiled_on_a_gpu_matches_sdpa(ta):
    from utils.kernels.triton_softmax import runs_in

    # absolute, against float64: tl.exp is the GPU's approximate exp; p is rounded to the input dtype before P V
    for dtype, tol in ((torch.float32, 2e-5), (torch.float16, 4e-3), (torch.bfloat16, 2e-2)):
        for causal in (False, True):
            for n_q, n_k in ((1, 1), (77, 77), (200, 333), (333, 200)):
                q, k, v = (t.cuda() for t in _qkv(2, 3, n_q, n_k, 64, seed=n_q, dtype=dtype))
                assert runs_in(q) == "compiled"
                err = (ta.flash_attention(q, k, v, causal=causal).double()
                       - _sdpa(q, k, v, is_causal=causal)).abs().max().item()
                assert err <= tol, f"compiled {dtype} Tq={n_q} Tk={n_k} causal={causal}: max error {err:.3g}"
    q, k, v = (t.cuda() for t in _qkv(3, 2, 50, 90, 64, seed=1, dtype=torch.float16))
    lens = torch.tensor([90, 0, 17], device="cuda")
    mask = (torch.arange(90, device="cuda") < lens[:, None])[:, None, None, :]
    got = ta.flash_attention(q, k, v, kv_lens=lens)
    assert not got.isnan().any() and torch.equal(got[1], torch.zeros_like(got[1]))
    err = (got.double() - F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask))
    assert err.abs().max().item() <= 4e-3
