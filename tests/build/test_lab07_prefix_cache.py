"""Lab 07's prefix-caching task (task 3): the checks pass the solution and fail the typical wrong answers with a message
that names the symptom, and refuse an answer that calls the course's own implementation (BlockAllocator.lookup,
PagedEngine.prefill)."""

import re
import time

import pytest
import torch
import torch.nn.functional as F

from utils import checks, llm
from utils.checks import LabCheckFailed, lab07

# -- the solution, with switches that turn it into the typical wrong answers ----------------------------------------


def find_cached_blocks(alloc, tokens, *, keys="chain", share=True, stop_at_miss=True, free_list=True):
    found, bs = [], alloc.block_size
    if keys == "extends":  # a cached key the prompt agrees with as far as it goes: reuses a block it only partly fills
        for key, block in sorted(alloc.prefix.items(), key=lambda kv: len(kv[0])):
            if key[: len(tokens)] == tuple(tokens[: len(key)]):
                found.append(alloc.share(block))
        return found
    for end in range(bs, len(tokens) + 1, bs):
        key = tuple(tokens[:end]) if keys == "chain" else tuple(tokens[end - bs : end])  # "block": its own tokens only
        block = alloc.prefix.get(key)
        if block is None:
            if stop_at_miss:
                break
            continue
        if share and free_list:
            alloc.share(block)
        elif share:
            alloc.refs[block] += 1  # counted, but left on the free list
        found.append(block)
    return found


def prefill_with_prefix(engine, slot, tokens, *, lookup=find_cached_blocks, reuse=True, always_copy=True,
                        clamp_positions=True, mask="<=", full_forward=False, sleep=0.0):
    bs, n = engine.block_size, tokens.numel()
    table = lookup(engine.alloc, tokens.tolist()) if reuse else []
    start = min(len(table) * bs, n - 1)
    engine.tables[slot] = table
    for pos in range(start, n):
        if pos % bs == 0 or (always_copy and pos == start):
            engine._writable(slot, pos)
        elif pos == start and len(table) <= pos // bs:
            engine._writable(slot, pos)
    blocks, pos = torch.tensor(table), torch.arange(start, n)
    keys = torch.arange(len(table) * bs)[None, :]
    visible = keys <= pos[:, None] if mask == "<=" else keys < pos[:, None]
    if full_forward:  # recomputes the cached part too (keeps only the tail's keys and values)
        x = engine.model.embed(tokens[None], 0)
        for block in engine.model.blocks:
            q, k, v = block.project(x)
            x = block.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        logits = engine.model.logits(x[0, -1])
    x = engine.model.embed(tokens[None, start:], start if clamp_positions else len(table) * bs)
    for i, block in enumerate(engine.model.blocks):
        q, k, v = block.project(x)
        engine.k[i][blocks[pos // bs], :, pos % bs] = k[0].transpose(0, 1)
        engine.v[i][blocks[pos // bs], :, pos % bs] = v[0].transpose(0, 1)
        k_all, v_all = engine._gather(i, blocks[None])
        x = block.finish(x, F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=visible))
    time.sleep(sleep)
    return logits if full_forward else engine.model.logits(x[0, -1])


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A seeded, untrained 1-layer TinyGPT (its tokens depend on the context): the checks in seconds."""
    mp = pytest.MonkeyPatch()
    mp.setenv("WORKBOOK_BUILD_DIR", str(tmp_path_factory.mktemp("build")))
    try:
        yield llm.tiny_gpt(0, progress=False, d_model=32, n_heads=2, n_layers=1, d_ff=64, max_len=256)
    finally:
        mp.undo()


@pytest.fixture(autouse=True)
def _record_speed(monkeypatch):
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")  # a missed gain is printed here, not a test failure


def test_the_solution_passes_and_smoke_mode_says_the_gain_is_not_judged(small, capsys):
    model, tok = small
    assert lab07.check_prefix_lookup(find_cached_blocks)
    result = lab07.check_prefix_cache(prefill_with_prefix, model, tok, smoke=True)
    out = capsys.readouterr().out
    assert "PASSED prefix lookup" in out and "PASSED prefix cache" in out
    assert "SMOKE MODE: the gain is reported, not judged" in out and "correctness is judged" in out
    assert re.search(r"^FIGURE prefix_cache_ttft_speedup: \S+ x \(higher is better\)$", out, re.MULTILINE)
    assert result["hits"] == 5 * 4 + 4 + 3  # 5 later trace requests x 4 system blocks; the whole prompt; the split one


def test_expected_hits_follow_the_chain_of_keys():
    a, b = [1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 0]
    assert lab07._expected_hits([a, b, a[:8], [9, 2, 3, 4, 5, 6, 7, 8]], 4) == [0, 1, 2, 0]


@pytest.mark.parametrize("wrong, symptom", [
    (dict(keys="block"), "expected the cached blocks [0, 1, 2], got [0]"),
    (dict(keys="extends"), "its first 10 tokens (the third block only half filled) (blocks of 4"),
    (dict(share=False), "had 1 reference(s) before your lookup and 1 after; expected 2"),
    (dict(free_list=False), "but still on the free list"),
    (dict(stop_at_miss=False), "after its first block was handed out to another sequence"),
])
def test_wrong_lookups_fail_with_their_symptom(wrong, symptom):
    with pytest.raises(LabCheckFailed, match=re.escape(symptom)):
        lab07.check_prefix_lookup(lambda alloc, tokens: find_cached_blocks(alloc, tokens, **wrong))


def test_a_lookup_that_calls_the_course_implementation_is_refused():
    with pytest.raises(LabCheckFailed, match=r"calls utils\.llm_serving\.BlockAllocator\.lookup, the course's "
                                             r"reference implementation"):
        lab07.check_prefix_lookup(lambda alloc, tokens: alloc.lookup(tokens))


def test_the_untouched_stubs_fail_clearly(small):
    def stub(*args):
        raise NotImplementedError("TODO: walk the prompt")

    with pytest.raises(LabCheckFailed, match=re.escape("find_cached_blocks(alloc, tokens) is not written yet")):
        lab07.check_prefix_lookup(stub)
    with pytest.raises(LabCheckFailed, match=re.escape("prefill_with_prefix(engine, slot, tokens) is not written")):
        lab07.check_prefix_cache(stub, *small, smoke=True)


@pytest.mark.parametrize("wrong, symptom", [
    (dict(reuse=False), "so its block table should start with [0, 1, 2, 3]; it starts with ["),  # recompute all
    (dict(always_copy=False), "must never be written"),  # the last token of a fully cached prompt, into its block
    (dict(clamp_positions=False), "the logits of its last position differ from the engine without a prefix cache"),
    (dict(mask="<"), "the logits of its last position differ from the engine without a prefix cache"),
    (dict(full_forward=True), "run 88 position(s) through the model (what is not cached, and at least the last token); yours embedded 176"),
    (dict(lookup=lambda alloc, tokens: find_cached_blocks(alloc, tokens, share=False)), "expected 2: one more for"),
    (dict(lookup=lambda alloc, tokens: alloc.lookup(tokens)),
     "calls utils.llm_serving.BlockAllocator.lookup, the course's reference implementation of this task"),
])
def test_wrong_prefills_fail_with_their_symptom(small, wrong, symptom):
    with pytest.raises(LabCheckFailed, match=re.escape(symptom)):
        lab07.check_prefix_cache(lambda e, s, t: prefill_with_prefix(e, s, t, **wrong), *small, smoke=True)


def test_a_prefill_through_the_librarys_engine_is_refused(small):
    from utils import llm_serving as srv

    def library(engine, slot, tokens):
        own = srv.PagedEngine(engine.model, 64, engine.block_size, 1, prefix_cache=True, keep_logits=True)
        own.prefill(0, llm.Request(0, 0.0, tokens, 1))
        return own.logits_log[-1][2]

    with pytest.raises(LabCheckFailed, match=re.escape("calls utils.llm_serving.PagedEngine.prefill")):
        lab07.check_prefix_cache(library, *small, smoke=True)


def test_full_mode_judges_the_gain_and_a_slow_prefill_misses_the_line(small, monkeypatch, capsys):
    monkeypatch.setattr(lab07, "_prefix_sizes", lambda smoke: (6, 64))  # full mode's 5 rounds on the smoke trace
    lab07.check_prefix_cache(prefill_with_prefix, *small, smoke=False)
    out = capsys.readouterr().out
    assert "SMOKE MODE" not in out and "PASSED prefix cache" in out and re.search(r"\(line 1\.300?x either way\)", out)
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "enforce")  # a correct prefill that sleeps 0.2 s: slower, whatever the load
    with pytest.raises(LabCheckFailed, match="no gain beyond the line: time to first token with your prefix cache"):
        lab07.check_prefix_cache(lambda e, s, t: prefill_with_prefix(e, s, t, sleep=0.2), *small, smoke=False)
