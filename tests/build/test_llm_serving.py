"""utils.llm_serving (lesson 07, part 3): paged serving, prefix caching with copy-on-write, speculative decoding."""

import math

import pytest
import torch

from utils import llm
from utils import llm_serving as srv


def _model(seed=0, vocab=23, **sizes):
    """A small TinyGPT whose weights are large enough that greedy choices depend on the context, far from ties."""
    torch.manual_seed(seed)
    cfg = llm.GPTConfig(vocab_size=vocab, **({"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "max_len": 96}
                                             | sizes))
    model = llm.TinyGPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return _model()


def _seqs(lengths, vocab=23, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def test_forward_positions_matches_one_full_forward(model):
    seq = _seqs([40])[0][None]
    cache = llm.KVCache(model.cfg, 1, 40)
    parts = [srv.forward_positions(model, seq[:, a:b], cache) for a, b in ((0, 9), (9, 10), (10, 17), (17, 40))]
    with torch.inference_mode():
        full = model(seq)
    assert (torch.cat(parts, dim=1) - full).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="LongTensor"):
        srv.forward_positions(model, torch.zeros(1, 2), cache)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_engine_gives_the_uncached_logits_on_ragged_lengths(model, block_size):
    seqs = _seqs([30, 7, 51, 18])
    diff, engine = srv.paged_logits_max_diff(model, seqs, [5, 1, 20, 17], block_size=block_size)
    assert diff < 1e-4, diff
    # each sequence held only the blocks its positions fill
    assert engine.blocks_in_use[0] == sum(-(-(p + 1) // block_size) for p in (5, 1, 20, 17))


def test_a_wrong_block_table_read_is_caught(model):
    class Scrambled(srv.PagedEngine):
        def _gather(self, layer, tables):
            return super()._gather(layer, tables.flip(1))  # reads a sequence's blocks in reverse order

    seqs = _seqs([40, 35])
    diff, _ = srv.paged_logits_max_diff(model, seqs, [20, 9], block_size=8, engine_cls=Scrambled)
    assert diff > 1e-2, diff


def test_prefix_cache_hits_shares_blocks_and_copies_on_write(model):
    system = _seqs([24], seed=3)[0]
    a, b = _seqs([10, 6], seed=4)
    seqs = [torch.cat([system, a]), torch.cat([system, b]), torch.cat([system, a])]  # the third repeats the first
    diff, engine = srv.paged_logits_max_diff(model, seqs, [34, 30, 32], block_size=8, prefix_cache=True)
    assert diff < 1e-4, diff
    alloc = engine.alloc
    # request 1 finds the system prompt's 3 full blocks; request 2 finds those 3 and the block holding a[:8]
    assert alloc.hits == 3 + 4
    assert engine.computed_prompt_tokens == 34 + (30 - 24) + (32 - 32 + 1)  # the last prompt token always runs
    assert alloc.copies == 1  # request 2 rewrote its last prompt token into a cached block: it got a copy
    assert engine.tables[0][:3] == engine.tables[1][:3] == engine.tables[2][:3]
    assert all(alloc.refs[blk] == 3 for blk in engine.tables[0][:3])
    assert engine.tables[2][3] != engine.tables[0][3]


def test_allocator_counts_references_and_forgets_reused_blocks():
    alloc = srv.BlockAllocator(2, 4)
    b0 = alloc.allocate()
    alloc.register([1, 2, 3, 4], [b0])
    assert alloc.read_only(b0)
    alloc.release(b0)
    assert alloc.num_free == 2 and alloc.lookup([1, 2, 3, 4, 5]) == [b0]  # freed, still findable
    assert alloc.refs[b0] == 1 and alloc.num_free == 1
    alloc.release(b0)
    alloc.allocate()
    alloc.allocate()  # the cached block is handed out again: its entry is gone
    assert alloc.prefix == {}
    with pytest.raises(MemoryError, match="all 2 KV blocks"):
        alloc.allocate()
    with pytest.raises(ValueError, match="positive"):
        srv.BlockAllocator(0, 4)


def test_run_paged_preempts_and_still_serves_the_greedy_tokens(model):
    g = torch.Generator().manual_seed(5)
    trace = [llm.Request(i, 0.0, torch.randint(0, 23, (int(torch.randint(3, 20, (1,), generator=g)),),
                                                     generator=g), int(torch.randint(5, 40, (1,), generator=g)))
             for i in range(12)]
    engine = srv.PagedEngine(model, num_blocks=16, block_size=4, max_seqs=8)  # too few blocks for 8 sequences
    served = srv.run_paged(engine, llm.fresh(trace))
    assert engine.preemptions > 0
    assert 3 * engine.preemptions <= engine.recomputed_tokens  # every preempted request had its prompt (>= 3) cached
    assert all(r.done and len(r.output) == r.max_new for r in served)
    assert sum(llm.verify_greedy(model, r.prompt, r.output) for r in served) == 0
    contiguous_engine = llm.Engine(model, 4, max_len=64)
    contiguous = llm.run_continuous(contiguous_engine, llm.fresh(trace))
    assert [r.output for r in served] == [r.output for r in contiguous]
    assert engine.alloc.num_free == engine.alloc.num_blocks
    assert srv.batch_under_demand(contiguous_engine, contiguous) == 4  # every slot busy while requests wait
    assert 1 <= srv.batch_under_demand(engine, served) <= 8


def test_batch_under_demand_counts_only_steps_with_a_request_waiting():
    class Steps:
        steps = [("prefill", 1, 0.0, 1.0), ("decode", 2, 1.0, 2.0), ("decode", 3, 2.0, 3.0), ("decode", 1, 3.0, 4.0)]

    requests = [llm.Request(0, 0.0, torch.zeros(1, dtype=torch.long), 1, t_first=1.0),
                llm.Request(1, 0.5, torch.zeros(1, dtype=torch.long), 1, t_first=2.5)]  # waits from 0.5 to 2.5
    assert srv.batch_under_demand(Steps(), requests) == 2.5  # the steps starting at 1.0 and 2.0
    requests[1].t_first = 0.9
    with pytest.raises(ValueError, match="raise its arrival rate"):
        srv.batch_under_demand(Steps(), requests)


def test_paged_engine_rejects_bad_input(model):
    engine = srv.PagedEngine(model, 4, 4, max_seqs=2)
    with pytest.raises(ValueError, match="need 5 blocks"):
        engine.prefill(0, llm.Request(0, 0.0, torch.zeros(10, dtype=torch.long), 10))
    with pytest.raises(ValueError, match="holds no request"):
        engine.decode([1])
    with pytest.raises(ValueError, match="slot must be an int"):
        engine.prefill(2, llm.Request(0, 0.0, torch.zeros(3, dtype=torch.long), 1))
    with pytest.raises(ValueError, match="one prompt length per sequence"):
        srv.paged_logits_max_diff(model, _seqs([5]), [1, 2])


@pytest.mark.parametrize("k", [1, 3, 6])
def test_speculative_greedy_is_the_targets_greedy_output(model, k):
    prompt = _seqs([9])[0]
    want = llm.generate_cached(model, prompt[None], 40)[0].tolist()
    for draft in (_model(seed=7, d_model=16, n_heads=2, n_layers=1), model):  # an unrelated draft, a perfect one
        stats = {}
        assert srv.speculative_greedy(model, draft, prompt, 40, k=k, stats=stats) == want
        assert stats["proposed"] == stats["rounds"] * k and 0 <= stats["accepted"] <= stats["proposed"]
        # checked: the guesses up to and including each round's first rejection; one rejection per round that has one
        rejected = stats["checked"] - stats["accepted"]
        assert stats["accepted"] <= stats["checked"] <= stats["proposed"] and 0 <= rejected <= stats["rounds"]
    # the target as its own draft: every guess accepted, k + 1 tokens per round after the prefill's first
    assert stats["accepted"] == stats["checked"] == stats["proposed"] and stats["rounds"] == math.ceil(39 / (k + 1))
    with pytest.raises(ValueError, match="vocabulary"):
        srv.speculative_greedy(model, _model(vocab=5), prompt, 4)
    with pytest.raises(ValueError, match="k \\(tokens"):
        srv.speculative_greedy(model, model, prompt, 4, k=0)


def test_speculative_sampling_keeps_the_targets_distribution_and_a_wrong_rule_does_not():
    target = _model(seed=11, vocab=5, d_model=16, n_heads=2, n_layers=1, max_len=16)
    draft = _model(seed=12, vocab=5, d_model=16, n_heads=2, n_layers=1, max_len=16)
    prefix = torch.tensor([1, 3, 0, 2])
    joint = srv.target_joint(target, prefix)
    assert abs(joint.sum().item() - 1) < 1e-9
    right = srv.first_two_tokens(target, draft, prefix, 20000, 3, seed=0)
    wrong = srv.first_two_tokens(target, draft, prefix, 20000, 3, seed=0, resample_from="target")
    counts = [torch.bincount(s[:, 0] * 5 + s[:, 1], minlength=25) for s in (right, wrong)]
    _, p_right, df = srv.chi_square_pvalue(counts[0], joint)
    _, p_wrong, _ = srv.chi_square_pvalue(counts[1], joint)
    assert df >= 10
    assert p_right > 1e-3, p_right
    assert p_wrong < 1e-6, p_wrong


def test_chi_square_and_expected_tokens_formulas():
    stat, p, df = srv.chi_square_pvalue(torch.tensor([10, 20, 30]), torch.tensor([1.0, 1.0, 1.0]))
    assert (stat, df) == (10.0, 2) and math.isclose(p, math.exp(-5), rel_tol=1e-9)  # df 2: p = exp(-stat / 2)
    assert srv.expected_tokens_per_round(0.0, 4) == 1 and srv.expected_tokens_per_round(1.0, 4) == 5
    assert math.isclose(srv.expected_tokens_per_round(0.5, 2), 1.75)
    with pytest.raises(ValueError, match="same shape"):
        srv.chi_square_pvalue(torch.tensor([1, 2]), torch.tensor([1.0]))
