"""utils.numerics (lesson 06, part 2): summation error, low-precision accumulation, batch-invariant kernels."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from utils import llm
from utils import numerics as nm

SUMS = [nm.naive_sum, nm.kahan_sum, nm.pairwise_sum, nm.fp64_sum]


def test_every_sum_is_exact_on_small_integers():
    x = np.arange(1, 1001, dtype=np.float32)  # every partial sum is an integer below 2^24: no rounding anywhere
    for fn in SUMS:
        assert float(fn(x)) == 500500.0, fn.__name__
    assert nm.exact_sum(x) == 500500.0


def test_pairwise_pads_odd_sizes_without_changing_the_sum():
    x = np.array([1.5, 2.25, -0.75], dtype=np.float32)
    assert float(nm.pairwise_sum(x)) == 3.0
    assert float(nm.pairwise_sum(x[:1])) == 1.5


def test_kahan_beats_naive_on_the_stagnation_input():
    n = 20_001
    x = nm.stagnation_input(n)
    exact = nm.exact_sum(x)
    assert exact == 1.0 + (n - 1) * 2.0**-24
    assert float(nm.naive_sum(x)) == 1.0  # every 2^-24 rounded away: the worst case, reached
    naive, kahan = nm.ulp_error(nm.naive_sum(x), exact), nm.ulp_error(nm.kahan_sum(x), exact)
    assert naive > 1000 * max(kahan, 1e-9)
    assert kahan <= 0.5 + 1e-9  # the correctly rounded float32 answer
    assert nm.ulp_error(nm.pairwise_sum(x), exact) <= 0.5 + 1e-9
    assert nm.ulp_error(nm.fp64_sum(x), exact) <= 0.5 + 1e-9


def test_kahan_beats_naive_on_random_data_and_stays_within_its_bound():
    x = np.random.default_rng(0).random(200_000, dtype=np.float32)
    exact = nm.exact_sum(x)
    naive_err = abs(float(nm.naive_sum(x)) - exact) / exact
    kahan_err = abs(float(nm.kahan_sum(x)) - exact) / exact
    assert kahan_err <= 2 * 2.0**-24
    assert naive_err > 10 * kahan_err
    assert naive_err <= (x.size - 1) * 2.0**-24


def test_naive_sum_rounds_in_float32_not_float64():
    x = np.array([2.0**24, 1.0, 1.0], dtype=np.float32)
    assert float(nm.naive_sum(x)) == 2.0**24  # 2^24 + 1 is a tie, rounded to the even 2^24, twice
    assert float(nm.fp64_sum(x)) == 2.0**24 + 2


def test_ulp_error_counts_float32_spacings():
    assert nm.ulp_error(np.float32(1.0) + np.spacing(np.float32(1.0)), 1.0) == 1.0
    assert nm.ulp_error(1024.0, 1024.0) == 0.0
    assert math.isclose(nm.ulp_error(3.0, 3.0 + 2.0**-22), 1.0)


@pytest.mark.parametrize("bad, err, words", [
    (np.ones(4, dtype=np.float64), TypeError, "float32"),
    (torch.ones(4, dtype=torch.float16), TypeError, "float16"),
    ([1.0, 2.0], TypeError, "list"),
    (np.ones((2, 2), dtype=np.float32), ValueError, "1-D"),
    (np.array([], dtype=np.float32), ValueError, "non-empty"),
    (np.array([1.0, np.inf], dtype=np.float32), ValueError, "inf or nan"),
])
def test_sums_reject_bad_input_clearly(bad, err, words):
    for fn in (*SUMS, nm.exact_sum):
        with pytest.raises(err, match=words):
            fn(bad)


def test_sums_accept_a_float32_tensor():
    x = torch.arange(8, dtype=torch.float32)
    assert float(nm.kahan_sum(x)) == 28.0


def test_stagnation_input_rejects_too_small_n():
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        nm.stagnation_input(1)


def test_ulp_error_rejects_non_finite():
    with pytest.raises(ValueError, match="finite"):
        nm.ulp_error(float("nan"), 1.0)


def test_running_sum_stagnates_in_bf16_and_not_in_fp32():
    ones = torch.ones(2, 600)
    assert nm.running_sum(ones, torch.bfloat16).tolist() == [256.0, 256.0]  # 256 + 1 rounds back to 256 in bf16
    assert nm.running_sum(ones, torch.float16).tolist() == [600.0, 600.0]  # fp16 is exact up to 2048
    assert nm.running_sum(ones, torch.float32).tolist() == [600.0, 600.0]


def test_running_sum_rejects_bad_input():
    with pytest.raises(ValueError, match="2-D floating tensor"):
        nm.running_sum(torch.ones(5), torch.bfloat16)
    with pytest.raises(ValueError, match="dtype must be"):
        nm.running_sum(torch.ones(2, 5), torch.int32)


def test_rowwise_matmul_is_bitwise_identical_alone_and_in_any_batch():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(33, 1024, generator=g), torch.randn(1024, 256, generator=g)
    alone = nm.rowwise_matmul(x[:1], w)
    for m in (1, 2, 3, 4, 8, 33):
        assert torch.equal(nm.rowwise_matmul(x[:m], w)[:1], alone), m
    torch.testing.assert_close(nm.rowwise_matmul(x, w), x @ w, rtol=1e-4, atol=1e-3)  # and it is the same product


@pytest.mark.parametrize("x, w, words", [
    (torch.ones(3), torch.ones(3, 2), "x must be a 2-D tensor"),
    (torch.ones(2, 3), torch.ones(4, 2), "matching K"),
    (torch.ones(2, 3), torch.ones(3, 2, dtype=torch.float64), "share a dtype"),
    (torch.ones(0, 3), torch.ones(3, 2), "no rows"),
])
def test_rowwise_matmul_rejects_bad_input(x, w, words):
    with pytest.raises(ValueError, match=words):
        nm.rowwise_matmul(x, w)


def _tiny_model():
    torch.manual_seed(0)
    cfg = llm.GPTConfig(vocab_size=19, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=64)
    return llm.TinyGPT(cfg).eval()


def _decode(model, seqs, prompt_len):
    cache = llm.KVCache(model.cfg, seqs.shape[0], seqs.shape[1])
    out = [llm.forward_cached(model, seqs[:, :prompt_len], cache)]
    for t in range(prompt_len, seqs.shape[1]):
        out.append(llm.forward_cached(model, seqs[:, t : t + 1], cache))
    return torch.stack(out, dim=1)


def test_batch_invariant_model_logits_are_bitwise_identical_alone_and_in_a_batch():
    model = _tiny_model()
    seqs = torch.randint(0, 19, (5, 24), generator=torch.Generator().manual_seed(1))
    with nm.batch_invariant():
        alone = _decode(model, seqs[:1], 10)
        batched = _decode(model, seqs, 10)
    assert torch.equal(alone, batched[:1])
    torch.testing.assert_close(batched, _decode(model, seqs, 10), rtol=1e-4, atol=1e-5)  # the same model


def test_batch_invariant_restores_the_library_calls_even_after_an_error():
    linear, sdpa = F.linear, F.scaled_dot_product_attention
    with pytest.raises(RuntimeError, match="boom"), nm.batch_invariant():
        assert F.linear is not linear
        raise RuntimeError("boom")
    assert F.linear is linear and F.scaled_dot_product_attention is sdpa


def test_batch_invariant_refuses_to_nest():
    with nm.batch_invariant(), pytest.raises(RuntimeError, match="do not nest"), nm.batch_invariant():
        pass
    assert F.linear is nm._linear


def test_batch_invariant_attention_rejects_an_explicit_mask():
    q = torch.randn(2, 1, 3, 4)
    with nm.batch_invariant(), pytest.raises(NotImplementedError, match="explicit mask"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.bool))
