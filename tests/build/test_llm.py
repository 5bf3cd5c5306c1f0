"""utils.llm (lesson 07): cached decoding, tiled attention, the serving engine and schedulers, paged KV, int8."""

import math

import pytest
import torch
import torch.nn.functional as F

from utils import llm


def _model(dtype=torch.float32, seed=0, **sizes):
    """A small TinyGPT with weights large enough that greedy choices are far from ties."""
    torch.manual_seed(seed)
    cfg = llm.GPTConfig(vocab_size=23, **({"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_len": 96}
                                          | sizes))
    model = llm.TinyGPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model.to(dtype).eval()


@pytest.fixture(scope="module")
def model():
    return _model()


def test_config_and_tokenizer_reject_bad_input():
    with pytest.raises(ValueError, match="divisible"):
        llm.GPTConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="positive int"):
        llm.GPTConfig(vocab_size=0)
    tok = llm.CharTokenizer("abc")
    assert tok.decode(tok.encode("cab")) == "cab"
    with pytest.raises(ValueError, match=r"\['z'\] are not in the vocabulary"):
        tok.encode("az")
    with pytest.raises(ValueError, match="non-empty"):
        llm.CharTokenizer("")


def test_model_rejects_bad_tokens_and_positions(model):
    with pytest.raises(ValueError, match="LongTensor"):
        model(torch.zeros(4))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 23\)"):
        model(torch.tensor([[0, 99]]))
    with pytest.raises(ValueError, match="max_len 96"):
        model.embed(torch.zeros(1, 2, dtype=torch.long), 95)
    with pytest.raises(ValueError, match="exceeds the model's max_len"):
        llm.generate(model, torch.zeros(1, 90, dtype=torch.long), 10)
    with pytest.raises(ValueError, match=r"\[batch, time\] LongTensor"):
        llm.generate_cached(model, torch.zeros(5, dtype=torch.long), 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cached_generation_gives_the_reference_tokens(dtype):
    model = _model(dtype)
    prompt = torch.randint(0, 23, (3, 11), generator=torch.Generator().manual_seed(1))
    want = llm.generate(model, prompt, 40)
    got = llm.generate_cached(model, prompt, 40)
    assert got.shape == (3, 40)
    assert torch.equal(got, want)
    for row in range(3):
        assert llm.verify_greedy(model, prompt[row], got[row]) == 0


def test_forward_cached_logits_match_the_full_forward(model):
    seq = torch.randint(0, 23, (2, 30), generator=torch.Generator().manual_seed(2))
    full = model(seq)
    cache = llm.KVCache(model.cfg, 2, 30)
    with torch.inference_mode():
        first = llm.forward_cached(model, seq[:, :20], cache)  # prefill
        steps = [llm.forward_cached(model, seq[:, t : t + 1], cache) for t in range(20, 30)]  # decode
    assert cache.length == 30
    assert (first - full[:, 19]).abs().max() < 1e-5
    for t, logits in zip(range(20, 30), steps, strict=True):
        assert (logits - full[:, t]).abs().max() < 1e-5


class _ShiftedCache(llm.KVCache):
    """A deliberately wrong cache: writes each key and value one position late, leaving a stale zero row behind."""

    def update(self, layer, k, v):
        start, end = self.length + 1, self.length + 1 + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def test_logit_parity_catches_a_wrong_cache_position_when_argmax_is_constant():
    model = _model()
    with torch.no_grad():  # a model that picks token 0 whatever the context, as a barely trained one does
        model.ln_f.bias.copy_(torch.linspace(-1, 1, model.cfg.d_model))
        model.lm_head.weight[0] = 10 * model.ln_f.bias
    seq = torch.randint(0, 23, (2, 40), generator=torch.Generator().manual_seed(4))
    prompt = seq[:, :12]
    assert torch.equal(llm.generate_cached(model, prompt, 20), torch.zeros(2, 20, dtype=torch.long))
    right = llm.cached_logits_max_diff(model, seq, 12)
    wrong = llm.cached_logits_max_diff(model, seq, 12, cache=_ShiftedCache(model.cfg, 2, 41))
    scale = model(seq).abs().max().item()  # float rounding is relative to the logits' size
    assert right < 1e-5 * scale
    assert wrong > 1e-2 * scale
    with pytest.raises(ValueError, match="prompt_len"):
        llm.cached_logits_max_diff(model, seq, 40)


def test_kv_cache_bytes_with_grouped_query_attention():
    llama3_8b = llm.GPTConfig(vocab_size=128256, d_model=4096, n_heads=32, n_layers=32, d_ff=14336, max_len=8192)
    assert llm.kv_cache_bytes_per_token(llama3_8b, torch.bfloat16, n_kv_heads=8) == 128 * 1024
    assert llm.kv_cache_bytes_per_token(llama3_8b, torch.bfloat16) == 512 * 1024
    with pytest.raises(ValueError, match="divide"):
        llm.kv_cache_bytes_per_token(llama3_8b, n_kv_heads=5)


def test_kv_cache_bytes_and_overflow(model):
    cfg = model.cfg
    cache = llm.KVCache(cfg, batch=3, max_len=50)
    assert cache.nbytes == 3 * 50 * llm.kv_cache_bytes_per_token(cfg)
    assert llm.kv_cache_bytes_per_token(cfg) == 2 * cfg.n_layers * cfg.d_model * 4
    k = torch.zeros(3, cfg.n_heads, 51, cfg.head_dim)
    with pytest.raises(ValueError, match="holds 50 positions"):
        cache.update(0, k, k)
    weights = sum(p.numel() * 4 for n, p in model.named_parameters() if "_emb" not in n)
    assert llm.decode_step_bytes(model, 0) == weights + 2 * cfg.d_model * 4
    assert llm.decode_step_bytes(model, 10, batch=2) - llm.decode_step_bytes(model, 0, batch=2) == (
        2 * 10 * llm.kv_cache_bytes_per_token(cfg))


def test_verify_greedy_catches_a_wrong_token(model):
    prompt = torch.randint(0, 23, (1, 5), generator=torch.Generator().manual_seed(3))
    out = llm.generate(model, prompt, 8)[0].tolist()
    assert llm.verify_greedy(model, prompt, out) == 0
    out[4] = (out[4] + 1) % 23
    assert llm.verify_greedy(model, prompt, out) >= 1


def test_step_times_gives_one_time_per_token(model):
    prompt = torch.zeros(1, 4, dtype=torch.long)
    for fn in (llm.generate, llm.generate_cached):
        tokens, times = llm.step_times(model, lambda fn=fn: fn(model, prompt, 12))
        assert tokens.shape == (1, 12) and len(times) == 12 and all(t > 0 for t in times)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t, block_q, block_k", [(1, 64, 64), (7, 4, 3), (64, 16, 16), (100, 32, 48), (257, 64, 64)])
def test_tiled_attention_matches_sdpa(causal, t, block_q, block_k):
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(2, 3, t, 16, generator=g) * 3 for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    got = llm.tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    assert (got - want).abs().max() <= 1e-5
    assert (llm.naive_attention(q, k, v, causal=causal) - want).abs().max() <= 1e-5


def test_tiled_attention_with_more_keys_than_queries():
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(1, 2, 5, 8, generator=g), torch.randn(1, 2, 70, 8, generator=g), torch.randn(1, 2, 70, 4,
                                                                                                       generator=g)
    got = llm.tiled_attention(q, k, v, block_k=16)
    assert got.shape == (1, 2, 5, 4)
    assert (got - F.scaled_dot_product_attention(q, k, v)).abs().max() <= 1e-5


def test_attention_rejects_bad_shapes():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="shapes do not fit attention"):
        llm.tiled_attention(q, torch.randn(1, 2, 4, 7), torch.randn(1, 2, 4, 7))
    with pytest.raises(ValueError, match="floating tensor"):
        llm.tiled_attention(q, q, torch.ones(1, 2, 4, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="block sizes must be positive"):
        llm.tiled_attention(q, q, q, block_q=0)


def test_peak_live_bytes_counts_allocations_views_and_frees():
    a = torch.ones(1000)

    def chain():
        b = a * 2  # 4000 bytes
        c = b + 1  # 8000 live
        del b  # 4000
        d = c.view(10, 100)  # a view: nothing new
        del c  # d keeps the storage: still 4000
        return d * 3  # 8000

    assert llm.peak_live_bytes(chain) == 8000
    assert llm.peak_live_bytes(lambda: a.view(10, 100)) == 0
    q = torch.randn(1, 2, 512, 16)
    naive = llm.peak_live_bytes(lambda: llm.naive_attention(q, q, q, causal=True))
    tiled = llm.peak_live_bytes(lambda: llm.tiled_attention(q, q, q, causal=True))
    assert naive >= 2 * 512 * 512 * 4  # the score matrix
    assert tiled < naive / 4


def test_sdpa_backend_names_an_attention_kernel():
    q = torch.randn(1, 2, 16, 8)
    names = llm.sdpa_backend(q, q, q, is_causal=True)
    assert names and all("attention" in n for n in names)


def _trace(model, n=14, seed=0):
    tok = llm.CharTokenizer("".join(chr(97 + i) for i in range(23)))
    text = "".join(chr(97 + (i * 7) % 23) for i in range(600))
    return llm.make_trace(tok, n, rate=1e5, mean_new=8, max_new=30, prompt_len=(3, 9), seed=seed, text=text)


def test_make_trace_is_seeded_and_bounded():
    model = _model()
    a, b = _trace(model), _trace(model)
    assert [(r.arrival, r.max_new, r.prompt.tolist()) for r in a] == [(r.arrival, r.max_new, r.prompt.tolist())
                                                                      for r in b]
    assert all(1 <= r.max_new <= 30 and 3 <= r.prompt.numel() <= 9 for r in a)
    assert a[0].arrival == 0 and all(x.arrival <= y.arrival for x, y in zip(a, a[1:], strict=False))
    with pytest.raises(ValueError, match="rate > 0"):
        llm.make_trace(llm.CharTokenizer(llm.corpus_text()), 3, rate=0)
    with pytest.raises(ValueError, match="too few to cut prompts"):
        llm.make_trace(llm.CharTokenizer("abc"), 3, rate=1.0, text="abc")


@pytest.mark.parametrize("schedule", [llm.run_static, llm.run_continuous])
def test_schedulers_finish_every_request_with_the_reference_tokens(schedule):
    model = _model(torch.float64)
    trace = llm.fresh(_trace(model))
    engine = llm.Engine(model, max_batch=4, max_len=48)
    schedule(engine, trace)
    for r in trace:
        assert r.done and len(r.output) == r.max_new, r.id
        assert r.output == llm.generate_cached(model, r.prompt[None], r.max_new)[0].tolist(), r.id
        assert r.arrival <= r.t_first <= r.t_done
    stats = llm.summarize(trace, engine)
    assert stats["tokens"] == sum(r.max_new for r in trace)
    assert stats["prefill_steps"] == len(trace)
    assert sum(engine.useful) == stats["tokens"] - len(trace)  # every decode token that counted, once
    assert not engine.slot_request and stats["throughput_tok_s"] > 0
    if schedule is llm.run_continuous:
        assert engine.wasted_slot_steps == 0
    else:
        assert engine.wasted_slot_steps > 0 and stats["mean_batch"] > 1


def test_continuous_batching_takes_fewer_steps_than_static():
    model = _model()
    steps = {}
    for schedule in (llm.run_static, llm.run_continuous):
        engine = llm.Engine(model, max_batch=4, max_len=48)
        schedule(engine, llm.fresh(_trace(model, n=24, seed=3)))
        steps[schedule.__name__] = sum(1 for s in engine.steps if s[0] == "decode")
    assert steps["run_continuous"] < steps["run_static"]


def test_engine_rejects_misuse(model):
    engine = llm.Engine(model, max_batch=2, max_len=40)
    r = llm.Request(0, 0.0, torch.tensor([1, 2, 3]), 5)
    with pytest.raises(ValueError, match="holds no request"):
        engine.decode([0])
    engine.prefill(0, r)
    with pytest.raises(ValueError, match="still holds request 0"):
        engine.prefill(0, llm.Request(1, 0.0, torch.tensor([1]), 2))
    with pytest.raises(ValueError, match="slot must be an int"):
        engine.decode([5])
    with pytest.raises(ValueError, match="distinct busy slots"):
        engine.decode([0, 0])
    with pytest.raises(ValueError, match="cannot be served before it arrives"):
        engine.prefill(1, llm.Request(2, engine.clock + 100, torch.tensor([1]), 2))
    with pytest.raises(ValueError, match="must fit the engine's max_len 40"):
        engine.prefill(1, llm.Request(3, 0.0, torch.tensor([1] * 30), 20))
    with pytest.raises(ValueError, match="not served to the end"):
        llm.summarize([r])
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        llm.Engine(model, max_batch=0)
    with pytest.raises(ValueError, match=r"max_len must lie in \[1, 96\]"):
        llm.Engine(model, max_batch=1, max_len=97)
    before = engine.clock
    engine.wait_until(before + 5)
    assert engine.clock >= before + 5


def test_paged_kv_cache_round_trip_and_bookkeeping(model):
    cfg = model.cfg
    paged = llm.PagedKVCache(cfg, num_blocks=12, block_size=4)
    g = torch.Generator().manual_seed(7)
    want = {}
    for step, (seq, n) in enumerate([("a", 3), ("b", 6), ("a", 4), ("c", 1), ("b", 1), ("a", 2)]):
        k = torch.randn(cfg.n_layers, cfg.n_heads, n, cfg.head_dim, generator=g)
        v = k + step
        paged.append(seq, k, v)
        old = want.get(seq, (k[:, :, :0], v[:, :, :0]))
        want[seq] = (torch.cat([old[0], k], 2), torch.cat([old[1], v], 2))
    for seq, (k, v) in want.items():
        got_k, got_v = paged.gather(seq)
        assert torch.equal(got_k, k) and torch.equal(got_v, v), seq
    stats = paged.stats()
    assert stats["tokens"] == 9 + 7 + 1
    assert stats["blocks_used"] == 3 + 2 + 1 == sum(len(t) for t in paged.block_table.values())
    assert 0 <= stats["slots_wasted"] < 4 * stats["sequences"]
    blocks_b = set(paged.block_table["b"])
    paged.free("b")
    assert blocks_b <= set(paged.free_blocks) and "b" not in paged.block_table
    with pytest.raises(MemoryError, match="blocks of 4 positions"):
        paged.append("d", *(torch.zeros(cfg.n_layers, cfg.n_heads, 40, cfg.head_dim),) * 2)
    with pytest.raises(ValueError, match="k and v must be"):
        paged.append("e", torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(KeyError, match="no sequence 'zz'"):
        paged.gather("zz")


def test_reserved_slots():
    got = llm.reserved_slots([1, 16, 17, 0], max_len=64, block_size=16)
    assert got == {"used": 34, "contiguous": 256, "paged": 16 + 16 + 32}
    with pytest.raises(ValueError, match="max_len=64"):
        llm.reserved_slots([65], max_len=64, block_size=16)


def test_int8_linear_error_bound_and_size():
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40)
    q = llm.Int8Linear.from_linear(lin)
    x = torch.randn(5, 3, 96)
    with torch.inference_mode():
        err = (q(x) - lin(x)).abs()
    # |w - w_q| <= scale / 2 per element, so |y - y_q| <= scale / 2 * ||x||_1 per output channel
    bound = q.scale / 2 * x.abs().sum(-1, keepdim=True)
    assert (err <= bound + 1e-5).all()
    assert (q.dequantized() - lin.weight).abs().max() <= q.scale.max() / 2 + 1e-7
    assert llm.linear_weight_bytes(lin) / llm.linear_weight_bytes(q) == pytest.approx(96 * 4 / (96 + 4))
    with pytest.raises(ValueError, match="expects inputs with 96 features"):
        q(torch.randn(2, 95))
    with pytest.raises(TypeError, match="needs an nn.Linear"):
        llm.Int8Linear.from_linear(torch.nn.Conv1d(1, 1, 1))
    with pytest.raises(ValueError, match="int8 \\[out, in\\] weight"):
        llm.Int8Linear(torch.zeros(4, 4), torch.ones(4), None)


def test_int8_linear_bf16_activations_match_the_dequantized_product():
    # lesson 07 times weight-only int8 in bf16 (the activations' dtype follows the model it was quantized from)
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48).to(torch.bfloat16)
    q = llm.Int8Linear.from_linear(lin)
    assert q.scale.dtype == torch.bfloat16 and q.weight_int8.dtype == torch.int8
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = q(x)
        want = torch.nn.functional.linear(x.float(), q.dequantized().float(), lin.bias.float())
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()
    q32 = llm.quantize_int8(torch.nn.Sequential(lin.float()))[0]  # the same weights for fp32 activations
    assert q32.scale.dtype == torch.float32 and torch.equal(q32.weight_int8, q.weight_int8)


def test_quantize_int8_replaces_every_linear(model):
    q = llm.quantize_int8(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in q.modules())
    assert any(isinstance(m, llm.Int8Linear) for m in q.modules())
    assert any(isinstance(m, torch.nn.Linear) for m in model.modules())  # the original is untouched
    ratio = llm.linear_weight_bytes(model) / llm.linear_weight_bytes(q)
    assert 3.5 < ratio < 4.0
    seq = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        a, b = model(seq), q(seq)
    assert (a - b).abs().max() / a.abs().max() < 0.05
    assert math.isfinite(float(b.sum()))


def test_tiny_gpt_trains_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    model, tok = llm.tiny_gpt(6, progress=False, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=80)
    assert len(model.train_losses) == 6 and model.train_losses[-1] < model.train_losses[0]
    assert not model.training and model.cfg.vocab_size == tok.vocab_size
    again, _ = llm.tiny_gpt(6, progress=False, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=80)
    assert list((tmp_path / "llm").glob("tinygpt_*.pt"))
    for p, p2 in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(p, p2)


def test_lab07_checks_explain_wrong_answers(tmp_path, monkeypatch):
    from utils.checks import LabCheckFailed, lab07

    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    model, tok = llm.tiny_gpt(0, progress=False, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=256)

    def off_by_one(model, prompt, n_new):
        return (llm.generate(model, prompt, n_new) + 1) % model.cfg.vocab_size

    with pytest.raises(LabCheckFailed, match="differ from the reference from step 0"):
        lab07.check_kv_cache(off_by_one, model, tok, max_len=40, rounds=1)
    with pytest.raises(LabCheckFailed, match="of shape"):
        lab07.check_kv_cache(lambda m, p, n: llm.generate(m, p, n)[0], model, tok, max_len=40, rounds=1)

    def uncached(model, prompt, n_new):  # the right tokens, but the whole sequence through the model every step
        return llm.generate(model, prompt, n_new)

    with pytest.raises(LabCheckFailed, match=r"with a cache every position goes through the model once"):
        lab07.check_kv_cache(uncached, model, tok, max_len=40, rounds=1)

    with pytest.raises(LabCheckFailed, match="llm.generate_cached, the course's reference implementation"):
        lab07.check_kv_cache(llm.generate_cached, model, tok, max_len=40, rounds=1)
    with pytest.raises(LabCheckFailed, match="run_continuous, the course's reference implementation"):
        lab07.check_scheduler(llm.run_continuous, model, tok, n_requests=6, max_batch=2, rounds=1)

    def never_releases(engine, trace):
        for slot, request in zip(engine.free_slots(), sorted(trace, key=lambda r: r.arrival), strict=False):
            engine.wait_until(request.arrival)
            engine.prefill(slot, request)
        return trace

    with pytest.raises(LabCheckFailed, match="did not get all their tokens"):
        lab07.check_scheduler(never_releases, model, tok, n_requests=6, max_batch=2, rounds=1)

    def one_at_a_time(engine, trace):  # right tokens, every slot released, but one request in flight at a time
        for request in sorted(trace, key=lambda r: r.arrival):
            engine.wait_until(request.arrival)
            slot = engine.free_slots()[0]
            engine.prefill(slot, request)
            while not request.done:
                engine.decode([slot])
            engine.release(slot)
        return trace

    with pytest.raises(LabCheckFailed, match="decode steps kept .* tokens on average against static"):
        lab07.check_scheduler(one_at_a_time, model, tok, n_requests=6, max_batch=2, rounds=1)


def test_lab07_kv_check_catches_a_wrong_position_when_the_lab_model_repeats_one_token(tmp_path, monkeypatch):
    """Smoke mode's briefly trained model predicts the same token everywhere, so token parity on it alone passes a
    cache that embeds every new token at position 0; the untrained twin's tokens depend on the context."""
    from utils.checks import LabCheckFailed, lab07

    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(tmp_path))
    model, tok = lab07.lab_model(smoke=True)  # 10 training steps, as the lab in smoke mode

    def position_zero(model, prompt, n_new):
        keys, values, new, out = [None] * len(model.blocks), [None] * len(model.blocks), prompt, []
        with torch.inference_mode():
            for _ in range(n_new):
                x = model.embed(new, 0)  # the bug: every step's token embedded at position 0
                for i, block in enumerate(model.blocks):
                    q, k, v = block.project(x)
                    keys[i] = k if keys[i] is None else torch.cat([keys[i], k], dim=2)
                    values[i] = v if values[i] is None else torch.cat([values[i], v], dim=2)
                    x = block.finish(x, F.scaled_dot_product_attention(q, keys[i], values[i], is_causal=q.shape[2] > 1))
                new = model.logits(x[:, -1:]).argmax(dim=-1)
                out.append(new)
        return torch.cat(out, dim=1)

    for prompt in lab07._prompts(tok).values():  # the premise: on the lab's model alone the bug goes unseen
        assert torch.equal(position_zero(model, prompt, 25), llm.generate(model, prompt, 25))
    with pytest.raises(LabCheckFailed, match="untrained twin"):
        lab07.check_kv_cache(position_zero, model, tok, max_len=40, rounds=1)


@pytest.mark.parametrize("steps", [1, 2, 10])
def test_train_runs_any_number_of_steps(steps):
    model = _model()
    data = torch.randint(0, 23, (200,), generator=torch.Generator().manual_seed(0))
    losses = llm.train(model, data, steps, batch=2, ctx=16, progress=False)
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    with pytest.raises(ValueError, match="longer than ctx"):
        llm.train(model, data[:10], 1, ctx=16, progress=False)
