"""utils.llm_tuning (lesson 07, part 4): chunked prefill under a token budget, inter-token gaps, an int8 KV cache."""

import pytest
import torch

from tests.build.test_llm_serving import _model  # a small TinyGPT whose greedy choices depend on the context
from utils import llm
from utils import llm_tuning as tun


@pytest.fixture(scope="module")
def model():
    return _model(max_len=128)


def _trace(n=12, seed=2, vocab=23, long_every=3, long_len=70):
    g = torch.Generator().manual_seed(seed)
    trace = [llm.Request(i, 0.0, torch.randint(0, vocab, (int(torch.randint(3, 12, (1,), generator=g)),),
                                                generator=g), int(torch.randint(1, 20, (1,), generator=g)))
             for i in range(n)]
    text = torch.randint(0, vocab, (400,), generator=g)
    return tun.with_long_prompts(trace, text, every=long_every, length=long_len)


@pytest.mark.parametrize("chunk", [1, 7, 70])
def test_chunked_prefill_fills_the_same_cache_and_first_token_as_a_whole_prefill(model, chunk):
    prompt = torch.randint(0, 23, (70,), generator=torch.Generator().manual_seed(5))
    whole, chunked = llm.Engine(model, 2, 128), tun.ChunkedEngine(model, 2, 128)
    want = whole.prefill(1, llm.Request(0, 0.0, prompt, 4))
    request = llm.Request(0, 0.0, prompt, 4)
    firsts = []
    while not request.output:
        firsts.append(chunked.prefill_chunk(1, request, chunk))
    assert firsts[:-1] == [None] * (len(firsts) - 1) and firsts[-1] == want and len(firsts) == -(-70 // chunk)
    for layer in range(model.cfg.n_layers):
        assert torch.allclose(chunked.k[layer][1, :, :70], whole.k[layer][1, :, :70], atol=1e-5)
        assert torch.allclose(chunked.v[layer][1, :, :70], whole.v[layer][1, :, :70], atol=1e-5)
    assert chunked.token_times[0] == [request.t_first]


@pytest.mark.parametrize("budget", [None, 16, 3])
def test_budgeted_scheduler_serves_every_request_with_the_greedy_tokens(model, budget):
    engine = tun.ChunkedEngine(model, 4, 128)
    requests = tun.run_budgeted(engine, llm.fresh(_trace()), budget)
    assert all(r.done for r in requests) and not engine.slot_request and not engine.progress
    wrong = {r.id: n for r in requests if (n := llm.verify_greedy(model, r.prompt, r.output))}
    assert not wrong
    gaps = tun.inter_token_gaps(engine, requests)
    assert gaps.numel() == sum(len(r.output) - 1 for r in requests) and bool((gaps >= 0).all())
    chunks = sum(kind == "chunk" for kind, *_ in engine.steps)
    assert (chunks == 0) == (budget is None)  # a 70-token prompt needs several chunks under a budget of 16 or 3


def test_budget_and_chunk_errors_are_clear(model):
    engine = tun.ChunkedEngine(model, 2, 128)
    with pytest.raises(ValueError, match="token_budget"):
        tun.run_budgeted(engine, llm.fresh(_trace()), 0)
    with pytest.raises(TypeError, match="ChunkedEngine"):
        tun.run_budgeted(llm.Engine(model, 2, 128), llm.fresh(_trace()), 4)
    a, b = (llm.Request(i, 0.0, torch.arange(10) % 23, 3) for i in (0, 1))
    with pytest.raises(ValueError, match="at least one token"):
        engine.prefill_chunk(0, a, 0)
    assert engine.prefill_chunk(0, a, 4) is None and engine.prefilled(0) == 4 and 0 not in engine.free_slots()
    with pytest.raises(ValueError, match="is prefilling request 0"):
        engine.prefill_chunk(0, b, 4)
    with pytest.raises(ValueError, match="token times"):
        tun.inter_token_gaps(engine, [b])


def test_long_prompts_replace_every_kth_prompt():
    trace = tun.with_long_prompts(_trace(long_every=100), torch.arange(300) % 23, every=4, length=50)
    assert [r.prompt.numel() == 50 for r in trace] == [i % 4 == 0 for i in range(len(trace))]
    with pytest.raises(ValueError, match="longer than length"):
        tun.with_long_prompts(trace, torch.arange(10), every=2, length=50)


def test_int8_kv_cache_bytes_and_error_bounds(model):
    cfg = model.cfg
    fp32, int8 = llm.KVCache(cfg, 1, 64), tun.Int8KVCache(cfg, 1, 64)
    assert fp32.nbytes / int8.nbytes == pytest.approx(4 * cfg.head_dim / (cfg.head_dim + 4))
    x = torch.randn(2, 4, 9, cfg.head_dim) * 3
    codes, scale = tun.Int8KVCache.quantize(x)
    assert codes.dtype == torch.int8 and bool(((codes.float() * scale - x).abs() <= scale / 2 + 1e-6).all())
    seq = torch.randint(0, 23, (60,), generator=torch.Generator().manual_seed(3))
    ref = tun.teacher_forced_logits(model, seq, 20, llm.KVCache(cfg, 1, 60))
    with torch.inference_mode():
        full = model(seq[None, :59])[0, 19:]
    assert ref.shape == full.shape and torch.allclose(ref, full, atol=1e-4)
    quant = tun.teacher_forced_logits(model, seq, 20, tun.Int8KVCache(cfg, 1, 60))
    drift = float((quant - ref).abs().max())
    assert 0 < drift < 0.05 * float(ref.abs().max())  # int8 moves the logits, by a little
    with pytest.raises(ValueError, match="prompt_len"):
        tun.teacher_forced_logits(model, seq, 60, llm.KVCache(cfg, 1, 60))


def test_latency_p95_reads_ttft_and_tpot_per_request():
    trace = [llm.Request(i, 0.1 * i, torch.arange(4), n) for i, n in enumerate((1, 3, 5))]
    for r, (first, done) in zip(trace, ((0.5, 0.5), (0.3, 0.7), (1.0, 1.8)), strict=True):
        r.output, r.t_first, r.t_done = [0] * r.max_new, first, done
    stats = tun.latency_p95(trace, q=0.5)
    assert stats["ttft_s"] == pytest.approx(0.5)  # waits 0.5, 0.2 and 0.8 s: the median
    assert stats["tpot_s"] == pytest.approx(0.2)  # 0.4 s over 2 gaps and 0.8 s over 4: the one-token request has none
    assert stats["throughput_tok_s"] == pytest.approx(9 / 1.8)
    assert tun.latency_p95(trace)["tpot_s"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="quantile"):
        tun.latency_p95(trace, q=95)
    trace[0].output = []
    with pytest.raises(ValueError, match="not served"):
        tun.latency_p95(trace)


def test_predicted_tpot_quantile_is_the_step_without_admissions_and_grows_with_short_answers():
    assert tun.predicted_tpot_quantile([10, 20], 2.0, 5.0, batch=8, mean_new=1e9) == pytest.approx(2.0)
    long_only = tun.predicted_tpot_quantile([64] * 20, 2.0, 5.0, batch=8, mean_new=24)
    with_short = tun.predicted_tpot_quantile([64] * 19 + [3], 2.0, 5.0, batch=8, mean_new=24)
    assert 2.0 + 5.0 * 8 / 24 < long_only < with_short  # the p95 sits above the mean; a short answer pushes it up
    with pytest.raises(ValueError, match="no request has two tokens"):
        tun.predicted_tpot_quantile([1, 1], 2.0, 5.0, batch=8, mean_new=24)


def test_budget_side_is_at_the_budget_inside_the_models_error():
    assert tun.budget_side(4.0, 6.3, (0.8, 1.25)) == tun.WITHIN  # 5.0 at the high end: inside
    assert tun.budget_side(8.0, 6.3, (0.8, 1.25)) == tun.OVER  # 6.4 at the low end: still over
    assert tun.budget_side(5.2, 6.3, (0.8, 1.25)) == tun.AT_BUDGET  # 6.5 at the high end: either side
    assert tun.budget_side(6.39, 6.3, (0.8, 1.25)) == tun.AT_BUDGET  # 1.4% over: a rounding of the model, not a side
    with pytest.raises(ValueError):
        tun.budget_side(5.0, 6.3, (1.1, 1.25))


IN, OUT, E = tun.WITHIN, tun.OVER, tun.AT_BUDGET


@pytest.mark.parametrize(("within", "predicted", "word"), [
    ({1: "held", 2: "held", 4: "did not hold"}, {1: IN, 2: IN, 4: OUT}, "held"),
    ({1: "held", 2: "held", 4: "held"}, {1: IN, 2: IN, 4: OUT}, "did not hold"),  # a size predicted over fits
    ({1: "held", 2: "did not hold", 4: "did not hold"}, {1: IN, 2: IN, 4: OUT}, "did not hold"),  # one predicted within does not
    ({1: "held", 2: "undecided", 4: "did not hold"}, {1: IN, 2: IN, 4: OUT}, "undecided"),
    ({1: "did not hold", 2: "undecided", 4: "held"}, {1: OUT, 2: E, 4: E}, "held"),  # sizes at the budget are not judged
    ({1: "undecided", 2: "did not hold"}, {1: E, 2: E}, "undecided"),  # nothing judged
])
def test_budget_prediction_judges_each_size_on_its_predicted_side(within, predicted, word):
    assert tun.budget_prediction(within, predicted) == word
