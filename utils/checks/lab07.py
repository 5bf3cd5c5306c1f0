"""Checks for labs/07_llm_inference_lab.ipynb (lesson 07: a KV cache, a continuous-batching scheduler, prefix caching).

The learner writes generate_with_cache(model, prompt, n_new), the reference greedy loop with a KV cache;
schedule_continuous(engine, trace), the iteration-level scheduler loop over the provided llm.Engine; and, on part 3's
paged engine (utils.llm_serving), find_cached_blocks(alloc, tokens), the prefix-table lookup, and
prefill_with_prefix(engine, slot, tokens), a prefill that shares the cached full blocks and computes only the rest.
The checks compare tokens (and for the prefix cache the logits and every position's keys and values) with the
reference engines, and time the learner's code against the reference in the same run. Every task runs the
learner's functions under utils.checks.no_reference: an answer that calls the course's own implementation of the task
(llm.generate_cached or llm.forward_cached; llm.run_continuous or another of the course's schedulers;
BlockAllocator.lookup or PagedEngine.prefill) fails.
"""

from __future__ import annotations

import statistics

import torch

from utils import llm
from utils import llm_serving as srv
from utils import llm_tuning as tun
from utils.checks import LabCheckFailed, call, expect, expect_gain, figure, no_reference, passed
from utils.core import bench, env

MIN_KV_SPEEDUP = 1.2  # per-token, at the longest position; the lesson measures several times more
MIN_BATCHING_GAIN = 1.2  # continuous over static throughput; the lesson measures about 2x


def lab_model(smoke: bool):
    """(model, tokenizer): the lesson's TinyGPT (its cached weights when lesson 07 ran in the same mode)."""
    return llm.tiny_gpt(10 if smoke else 300)


def _prompts(tok):
    text = llm.corpus_text()
    return {
        "one prompt of 9 tokens": tok.encode(text[:9])[None],
        "a batch of 3 prompts": torch.stack([tok.encode(text[i : i + 14]) for i in (0, 200, 4000)]),
        "a one-token prompt": tok.encode(text[50:51])[None],
    }


def untrained_twin(model):
    """A TinyGPT of the same sizes with seeded random weights. Its greedy tokens change with every context, so a
    cache read at a wrong position or a wrong mask changes them; a briefly trained model (smoke mode's 10 steps)
    predicts one token everywhere and cannot tell."""
    torch.manual_seed(0)
    return llm.TinyGPT(model.cfg).eval()


def check_kv_cache(generate_with_cache, model, tok, max_len: int = 256, rounds: int = 2) -> float:
    """Same greedy tokens as llm.generate, on the lab's model and on its untrained twin (whose tokens depend on the
    context); then the per-token time at the longest position, against llm.generate."""
    for label, m in (("lab model", model), ("untrained twin", untrained_twin(model))):
        for name, prompt in _prompts(tok).items():
            for n_new in (1, 25):
                want = llm.generate(m, prompt, n_new)
                embedded = []  # positions per row the model embeds: a cached loop embeds each position once
                hook = m.tok_emb.register_forward_hook(lambda _, args, __, seen=embedded: seen.append(args[0].shape[-1]))
                try:
                    with no_reference(llm.generate_cached, llm.forward_cached, what="your generate_with_cache"):
                        got = call(generate_with_cache, m, prompt, n_new,
                                   what="generate_with_cache(model, prompt, n_new)")
                finally:
                    hook.remove()
                expect(isinstance(got, torch.Tensor),
                       f"generate_with_cache should return a tensor of new tokens, got {type(got).__name__}")
                expect(tuple(got.shape) == tuple(want.shape),
                       f"{label}, {name}, n_new={n_new}: expected new tokens of shape {tuple(want.shape)} (batch, "
                       f"n_new), got {tuple(got.shape)}. Return only the generated tokens, not the prompt.")
                if not torch.equal(got.cpu(), want):
                    step = int((got.cpu() != want).any(dim=0).nonzero()[0])
                    raise LabCheckFailed(
                        f"{label}, {name}, n_new={n_new}: your tokens differ from the reference from step {step} on. "
                        "Step 0 comes from the prompt's prefill alone; every later step reads the cache. A first "
                        "difference at step 0 points at the prefill, one at a later step at what a decode step sees: "
                        "compare its positions, the cache length and the mask with the uncached loop's at that step.")
                once = prompt.shape[1] + n_new - 1
                expect(sum(embedded) == once,
                       f"{label}, {name}, n_new={n_new}: the model embedded {sum(embedded)} positions per sequence in "
                       f"{len(embedded)} calls for a {prompt.shape[1]}-token prompt and {n_new} new tokens; with a "
                       f"cache every position goes through the model once ({once} here). Which positions does each "
                       "of your steps feed the model, and which of them has it seen before?")
    prompt = _prompts(tok)["one prompt of 9 tokens"][:, :8]
    n_steps = max_len - prompt.shape[1]
    runs = {"reference": [], "yours": []}
    for _ in range(rounds):
        for name, fn in (("reference", llm.generate), ("yours", generate_with_cache)):
            _, times = llm.step_times(model, lambda fn=fn: fn(model, prompt, n_steps))
            expect(len(times) == n_steps,
                   f"{name}: the model's output layer ran {len(times)} times for {n_steps} new tokens; each step "
                   "should call model.logits (once) on the newest position")
            runs[name].append(times)
    # per round: the median time of the last 8 steps (the longest positions), reference over yours
    last = {name: [float(torch.tensor(t[-8:]).median()) for t in r] for name, r in runs.items()}
    ratio = bench.Ratio.from_times(last["reference"], last["yours"])
    print(f"  per-token time at position ~{max_len}: reference {statistics.median(last['reference']) * 1e3:.2f} ms, "
          f"yours {statistics.median(last['yours']) * 1e3:.2f} ms (median of {rounds} rounds)")
    line = expect_gain("your cached loop per token", ratio, f"the uncached loop at position ~{max_len}", MIN_KV_SPEEDUP,
                       "What does each of your decode steps run through the model, and how does its cost grow with "
                       "the position?", smoke=env.smoke_default())
    passed("KV cache", f"identical greedy tokens on {len(_prompts(tok))} prompt sets, trained and untrained weights, "
           f"every position through the model once; {line}")
    figure("kv_cache_speedup", ratio.value, "x")
    return ratio.value


def lab_trace(model, tok, n: int, max_batch: int) -> list[llm.Request]:
    """The lab's arrival trace: faster than either scheduler can serve (rate set from a measured decode step)."""
    step_s = llm.decode_step_seconds(model, max_batch)
    capacity = max_batch / (41 * step_s)
    return llm.make_trace(tok, n, rate=2 * capacity, mean_new=40, max_new=192, seed=8)


def check_scheduler(schedule_continuous, model, tok, n_requests: int = 64, max_batch: int = 8, rounds: int = 2):
    """Every request finishes with the reference model's greedy tokens; each decode step of yours makes more tokens
    than static batching's in every round; in full mode, its throughput beats llm.run_static by MIN_BATCHING_GAIN."""
    trace = lab_trace(model, tok, n_requests, max_batch)
    stats = {"static": [], "yours": []}
    for _ in range(rounds):
        for name, schedule in (("static", llm.run_static), ("yours", schedule_continuous)):
            engine = llm.Engine(model, max_batch, max_len=256)
            requests = llm.fresh(trace)
            if name == "yours":
                with no_reference(llm.run_continuous, srv.run_paged, tun.run_budgeted, what="your schedule_continuous"):
                    call(schedule, engine, requests, what="schedule_continuous(engine, trace)")
            else:
                call(schedule, engine, requests, what="run_static(engine, trace)")
            unfinished = [r.id for r in requests if not r.done]
            expect(not unfinished, f"{name}: requests {unfinished[:8]} did not get all their tokens (each needs "
                                   "max_new); keep looping while any request is pending, waiting or running")
            expect(not engine.slot_request,
                   f"{name}: slots {sorted(engine.slot_request)} were never released: release() a slot when its "
                   "request is done")
            wrong = {r.id: n for r in requests if (n := llm.verify_greedy(model, r.prompt, r.output))}
            expect(not wrong, f"{name}: requests {list(wrong)[:8]} hold tokens that are not the model's greedy choice")
            s = llm.summarize(requests, engine)
            s["useful_per_step"] = s["mean_batch"] * (1 - s["wasted_fraction"])  # tokens a decode step keeps
            stats[name].append(s)
    for name, runs in stats.items():
        s = max(runs, key=lambda s: s["throughput_tok_s"])
        print(f"  {name:7s} {s['throughput_tok_s']:7.0f} tokens/s, TTFT p50 {s['ttft_p50_s'] * 1e3:6.1f} ms, "
              f"{s['decode_steps']} decode steps, mean batch {s['mean_batch']:.1f}, {s['wasted_fraction']:.0%} wasted "
              f"(best of {rounds} rounds)")
    look = "How full is each of your steps, and how many steps does a waiting request wait for a slot?"
    for yours, static in zip(stats["yours"], stats["static"], strict=True):
        expect(yours["useful_per_step"] > static["useful_per_step"],
               f"each of your decode steps kept {yours['useful_per_step']:.2f} tokens on average against static "
               f"batching's {static['useful_per_step']:.2f} on the same trace (max_batch {max_batch}; you ran "
               f"{yours['decode_steps']} decode steps, static {static['decode_steps']}). {look}")
    # throughput is tokens per second, so its inverse is the per-round time a Ratio compares
    ratio = bench.Ratio.from_times([1 / s["throughput_tok_s"] for s in stats["static"]],
                                   [1 / s["throughput_tok_s"] for s in stats["yours"]])
    line = expect_gain("your scheduler's throughput", ratio, "static batching", MIN_BATCHING_GAIN, look,
                       smoke=env.smoke_default())
    passed("continuous batching", f"{len(trace)} requests served with the right tokens, more tokens per decode step "
           f"than static batching in every round; {line}")
    figure("throughput_over_static", ratio.value, "x")
    return ratio.value


# ---------------------------------------------------------------------------------------------------------------------
# task 3: prefix caching on the paged engine (lesson 07, part 3)
# ---------------------------------------------------------------------------------------------------------------------

PREFIX_TTFT_LINE = 1.3  # time to first token without / with the prefix cache; the lesson predicts 1.2x up to 1/(1-s)
# Logits and keys/values of the cached prefill against the engine without the cache. The cached prefill runs the
# prompt's tail as a shorter matrix (fewer rows) than the uncached one; a GEMM library may pick another kernel, and so
# another summation order, for another row count, which moves float32 results by a few ulps (~1e-7 relative; on the
# course's machines they came out bit-identical). A wrong position, mask or key moves them by 1e-3 relative and more
# (the tests measure it). So: equal to 1e-5 of the largest magnitude compared.
PREFIX_REL_TOL = 1e-5
_LOOKUP_BLOCK = 4  # block size of the lookup check's allocator: short token lists, easy to read in a message


def _prefix_reference():
    """The course's own implementation of task 3: an answer that calls it is refused (utils.checks.no_reference)."""

    return (srv.BlockAllocator.lookup, srv.PagedEngine.prefill)


def _snapshot(alloc):
    return list(alloc.refs), list(alloc.free), dict(alloc.prefix)


def check_prefix_lookup(find_cached_blocks) -> list[int]:
    """find_cached_blocks(alloc, tokens) on a BlockAllocator with one registered sequence: the cached full blocks the
    tokens start with, in order, one new reference each, the prefix table left as it was. Cases: the whole sequence,
    a prompt ending inside a block, one diverging in its second block, one whose first block differs (its later
    blocks alone must not match), one shorter than a block, cached blocks nobody holds (on the free list), and a
    sequence whose first block was evicted (a hole)."""

    bs = _LOOKUP_BLOCK
    seq = [7, 3, 9, 1, 4, 4, 8, 2, 6, 0, 5, 3, 9, 9]  # 3 full blocks of 4 and 2 tokens
    alloc = srv.BlockAllocator(8, bs)
    table = [alloc.allocate() for _ in range(4)]
    alloc.register(seq, table)
    other = [1, 1, 1, 1]
    cases = [
        ("the registered sequence itself (14 tokens: 3 full blocks and 2 more)", seq, table[:3]),
        ("its first 12 tokens (exactly 3 blocks)", seq[:12], table[:3]),
        ("its first 10 tokens (the third block only half filled)", seq[:10], table[:2]),
        ("its first block, then other tokens", seq[:4] + other + seq[8:], table[:1]),
        ("another first block followed by the sequence's tokens 4-11", other + seq[4:12], []),
        ("its first 3 tokens (shorter than a block)", seq[:3], []),
    ]

    def run(label, tokens, want, holder):
        refs, free, prefix = _snapshot(alloc)
        with no_reference(*_prefix_reference(), what="your find_cached_blocks"):
            got = call(find_cached_blocks, alloc, list(tokens), what="find_cached_blocks(alloc, tokens)")
        expect(isinstance(got, list | tuple) and all(isinstance(b, int) for b in got),
               f"find_cached_blocks should return a list of block numbers (ints), got {type(got).__name__}: {got!r}")
        got = list(got)
        expect(got == want,
               f"{label} (blocks of {bs} tokens; registered sequence {seq} in blocks {table}, the last one partial, "
               f"{holder}): expected the cached blocks {want}, got {got}. A block belongs to a prompt only if the "
               "prompt contains every token from position 0 to the block's end; the walk stops at the first block "
               "that is not cached.")
        expect(dict(alloc.prefix) == prefix,
               f"{label}: the prefix table changed during your lookup ({len(prefix)} entries before, "
               f"{len(alloc.prefix)} after): a lookup only reads it")
        for b in range(alloc.num_blocks):
            extra = alloc.refs[b] - refs[b]
            expect(extra == (b in want),
                   f"{label}: block {b} had {refs[b]} reference(s) before your lookup and {alloc.refs[b]} after; "
                   f"expected {refs[b] + (b in want)}: each block you return gains exactly one reference (the new "
                   "sequence now holds it), no other block changes")
        for b in got:
            expect(b not in alloc.free,
                   f"{label}: block {b} is returned by your lookup but still on the free list: the next allocate() "
                   "could hand it out and overwrite it while the new sequence reads it. Taking a reference to a "
                   "cached block that nobody held must also take it off the free list.")
        for b in got:  # undo: the next case starts from the same state
            alloc.release(b)
        expect(list(alloc.refs) == refs, f"{label}: the reference counts did not return to {refs} after releasing "
                                         f"the blocks you returned (they are {alloc.refs})")

    for label, tokens, want in cases:
        run(label, tokens, want, "held by one sequence")
    for b in table:
        alloc.release(b)  # nobody holds them now: free, yet still findable
    run("the registered sequence again, after its sequence was released", seq, table[:3],
        "released: its blocks are free but still cached")
    evicted = None
    while evicted != table[0]:  # hand out free blocks until the sequence's first one is reused
        evicted = alloc.allocate()
    run("the registered sequence again, after its first block was handed out to another sequence", seq, [],
        "its first block since reused, the others still cached")
    passed("prefix lookup", f"{len(cases) + 2} cases: full blocks only, the chain of keys from position 0, one "
                            "reference per block taken, free cached blocks taken off the free list, a hole ends the walk")
    return table


def _prefix_sizes(smoke: bool) -> tuple[int, int]:
    """(requests, system-prompt tokens) of the TTFT trace: lesson 07 part 3's experiment, smoke and full."""
    return (6, 64) if smoke else (24, 160)


def prefix_trace(tok, smoke: bool) -> list:
    """The TTFT trace (lesson 07, part 3's experiment): requests sharing one system prompt (the corpus's start), each
    followed by its own question (a corpus line, 24 tokens), one output token each: the time to first token is the
    prefill."""

    n, sys_len = _prefix_sizes(smoke)
    questions = [tok.encode(s.strip())[:24] for s in llm.corpus_text().splitlines()[1 : n + 1]]
    return srv.shared_prefix_requests(tok.encode(llm.corpus_text()[:sys_len]), questions, max_new=1)


def _serve(engine, requests):
    """Prefill each request into its own slot, in order."""
    for slot, r in enumerate(requests):
        engine.prefill(slot, r)
    return engine


def _prefix_engine(model, num_blocks: int, block_size: int, max_seqs: int, prefill_fn, audit=None):
    """Lesson 07's PagedEngine whose prefill runs the learner's prefill_with_prefix(engine, slot, tokens) (the
    library's own prefix cache off), then the bookkeeping the task leaves out: registering the prompt's full blocks in
    the prefix table, the sequence length, the first token. With `audit` (a callable), each call runs under
    no_reference and is audited right after it returns, before the bookkeeping."""

    class LabPrefixEngine(srv.PagedEngine):
        @torch.inference_mode()
        def prefill(self, slot, request):
            self._check_admission(slot, request)
            if not self.can_admit(request):
                raise MemoryError(f"request {request.id}: the check's pool is too small (a bug in the check)")
            tokens, start_clock = request.prompt, self.clock
            if audit is None:
                logits = prefill_fn(self, slot, tokens)
            else:
                state = {"refs": list(self.alloc.refs), "prefix": dict(self.alloc.prefix), "embedded": 0}
                state["read_only"] = [b for b in range(self.alloc.num_blocks) if self.alloc.read_only(b)]
                state["pools"] = [p[state["read_only"]].clone() for p in self.k + self.v]

                def count(module, args, out):
                    state["embedded"] += args[0].numel()

                hook = self.model.pos_emb.register_forward_hook(count)
                try:
                    with no_reference(*_prefix_reference(), what="your prefill_with_prefix"):
                        logits = call(prefill_fn, self, slot, tokens, what="prefill_with_prefix(engine, slot, tokens)")
                finally:
                    hook.remove()
                audit(self, slot, request, logits, state)
            logits = logits.reshape(-1)
            if self.keep_logits:
                self.logits_log.append(("prefill", [slot], logits.clone()))
            self.alloc.register(tokens.tolist(), self.tables[slot])
            self.prompt_tokens += tokens.numel()
            self.lengths[slot] = tokens.numel()
            return self._emit_first(slot, request, int(logits.argmax()), start_clock)

    return LabPrefixEngine(model, num_blocks, block_size, max_seqs, prefix_cache=False, keep_logits=audit is not None)


def _kv(engine, table: list[int], n: int, layer: int):
    k, v = engine._gather(layer, torch.tensor(table)[None])
    return k[0, :, :n], v[0, :, :n]


def _close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float, float]:
    scale, err = float(want.abs().max()), float((got - want).abs().max())
    return err <= PREFIX_REL_TOL * scale, err, scale


def _auditor(reference, label: str, want_hits: dict[int, int]):
    """The audit of one prefill_with_prefix call against `reference`, the same requests on the engine without a
    prefix cache (prefilled into the same slots beforehand)."""

    def audit(engine, slot, request, logits, state):
        bs, ids = engine.block_size, request.prompt.tolist()
        n, vocab = len(ids), engine.model.cfg.vocab_size
        what = f"{label}, request {request.id} ({n} prompt tokens, blocks of {bs})"
        expect(isinstance(logits, torch.Tensor) and logits.numel() == vocab,
               f"prefill_with_prefix should return the logits of the prompt's last position, a tensor of {vocab} "
               f"values (the vocabulary), got "
               f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
        table = engine.tables.get(slot)
        expect(isinstance(table, list) and len(table) == -(-n // bs),
               f"{what}: after your prefill, engine.tables[{slot}] should list the {-(-n // bs)} physical blocks that "
               f"hold the prompt's positions, in order; got {table!r}")
        table, prefix, refs = list(table), state["prefix"], state["refs"]
        hits = 0  # full leading blocks cached before this prefill (the chain of keys from position 0)
        while (hits + 1) * bs <= n and tuple(ids[: (hits + 1) * bs]) in prefix:
            hits += 1
        expect(hits == want_hits[request.id], f"{what}: the check expected {want_hits[request.id]} cached blocks for "
                                              f"this prompt, the prefix table held {hits} (a bug in the check)")
        start = min(hits * bs, n - 1)  # the last prompt token always runs: its logits choose the first output token
        kept = start // bs  # blocks the new sequence shares as they are
        cached = [prefix[tuple(ids[: (j + 1) * bs])] for j in range(hits)]
        expect(table[:kept] == cached[:kept],
               f"{what}: {hits} of its leading full blocks were cached before this prefill (an earlier request with "
               f"the same tokens from position 0 filled them: blocks {cached}), so its block table should start with "
               f"{cached[:kept]}; it starts with {table[:kept]}. Cached full blocks are shared, not recomputed.")
        written = table[kept:]
        for b in written:
            expect(engine.alloc.refs[b] == 1 and b not in engine.alloc.key_of and b not in cached,
                   f"{what}: your prefill computes positions {start}-{n - 1}, held by blocks {written}; block {b} has "
                   f"{engine.alloc.refs[b]} reference(s) and is {'' if b in engine.alloc.key_of else 'not '}in the "
                   f"prefix table{' (it is a cached block of this prompt)' if b in cached else ''}. A block that "
                   "other sequences read, or may find later, must never be written: write only into blocks this "
                   "sequence holds alone.")
        for j, b in enumerate(state["read_only"]):
            now = torch.stack([p[b] for p in engine.k + engine.v])
            was = torch.stack([p[j] for p in state["pools"]])
            expect(torch.equal(now, was), f"{what}: block {b} was shared or in the prefix table before your prefill, "
                                          "and its keys or values changed during it: a shared block must never be "
                                          "written")
        expect(state["embedded"] == n - start,
               f"{what}: {hits * bs} of its positions are in cached full blocks, so the prefill should run "
               f"{n - start} position(s) through the model (what is not cached, and at least the last token); yours "
               f"embedded {state['embedded']}")
        for b in range(engine.alloc.num_blocks):
            want = 1 if b in written else refs[b] + (b in cached[:kept])
            expect(engine.alloc.refs[b] == want,
                   f"{what}: block {b} had {refs[b]} reference(s) before your prefill and {engine.alloc.refs[b]} "
                   f"after; expected {want}: one more for each cached block the new sequence shares, 1 for each block "
                   "it holds alone, no change for any other block")
        want_logits = next(e[2] for e in reference.logits_log if e[0] == "prefill" and e[1] == [slot])
        ok, err, scale = _close(logits.reshape(-1), want_logits)
        expect(ok, f"{what}: the logits of its last position differ from the engine without a prefix cache by up to "
                   f"{err:.3g} (largest logit {scale:.3g}; allowed {PREFIX_REL_TOL:g} of it). Check each computed "
                   "token's position, which keys it may see (every earlier position, cached or not, and itself), and "
                   "which block and offset each position is read from and written to.")
        for layer in range(len(engine.k)):
            for name, x, ref in zip(("keys", "values"), _kv(engine, table, n, layer),
                                    _kv(reference, reference.tables[slot], n, layer), strict=True):
                diff = (x - ref).abs().amax(dim=(0, 2))  # per position
                bad = (diff > PREFIX_REL_TOL * float(ref.abs().max())).nonzero()
                expect(not bad.numel(),
                       f"{what}: layer {layer}'s {name}, read through its block table, differ from the engine "
                       f"without a prefix cache at {bad.numel()} of its {n} positions, the first at position "
                       f"{int(bad[0]) if bad.numel() else ''} (by {float(diff.max()):.3g}): each position's key and "
                       "value belong at that position's offset in that position's block")
        state["hits"] = hits

    return audit


def _expected_hits(prompts: list[list[int]], bs: int) -> list[int]:
    """Leading full blocks of each prompt that an earlier prompt filled with the same tokens from position 0 (the
    check's pool is large enough that nothing cached is evicted)."""
    seen, hits = set(), []
    for p in prompts:
        keys = [tuple(p[:end]) for end in range(bs, len(p) + 1, bs)]
        k = 0
        while k < len(keys) and keys[k] in seen:
            k += 1
        hits.append(k)
        seen.update(keys)
    return hits


def prefix_correctness_requests(tok, smoke: bool, bs: int) -> list:
    """The trace's requests, then a prompt that is exactly the system prompt's full blocks (all cached: its last token
    runs again, into a copy of its block) and one that leaves the system prompt in the middle of a block."""
    trace = prefix_trace(tok, smoke)
    system = tok.encode(llm.corpus_text()[: _prefix_sizes(smoke)[1]])
    whole = system[: (system.numel() // bs) * bs]
    split = torch.cat([whole[: -(bs // 2)], tok.encode(llm.corpus_text()[3000:3020])])
    return [*trace, llm.Request(len(trace), 0.0, whole, 1), llm.Request(len(trace) + 1, 0.0, split, 1)]


def _pool_for(requests, bs: int) -> int:
    return sum(-(-(r.prompt.numel() + 4) // bs) for r in requests) + 4


def check_prefix_cache(prefill_with_prefix, model, tok, smoke: bool | None = None, block_size: int = 16) -> dict:
    """prefill_with_prefix(engine, slot, tokens) on the paged engine, against the same engine without a prefix cache:
    on the trained model and its untrained twin, requests sharing a system prompt (and one fully cached prompt, one
    leaving the system prompt inside a block) are prefilled into their own slots; each call is audited (the cached
    blocks shared, only the rest computed, no write into a shared block, reference counts, the logits and every
    position's keys and values equal to PREFIX_REL_TOL), then all decode two steps (the same logits again). Then the
    time to first token of the shared-system-prompt trace, served one request at a time with and without the cache in
    interleaved rounds: full mode judges it against PREFIX_TTFT_LINE; smoke mode reports it and judges correctness
    only."""

    smoke = env.smoke_default() if smoke is None else smoke
    bs = block_size
    requests = prefix_correctness_requests(tok, smoke, bs)
    want_hits = _expected_hits([r.prompt.tolist() for r in requests], bs)
    n_blocks = _pool_for(requests, bs)
    for label, m in (("lab model", model), ("untrained twin", untrained_twin(model))):
        reference = _serve(srv.PagedEngine(m, n_blocks, bs, len(requests), keep_logits=True), llm.fresh(requests))
        engine = _prefix_engine(m, n_blocks, bs, len(requests), prefill_with_prefix,
                                audit=_auditor(reference, label, dict(enumerate(want_hits))))
        _serve(engine, llm.fresh(requests))
        for _ in range(2):  # both decode two steps: decode reads what the prefills left in the blocks
            for e in (engine, reference):
                e.decode(list(range(len(requests))))
        for (_, _, got), (_, _, want) in zip(engine.logits_log[len(requests):],
                                             reference.logits_log[len(requests):], strict=True):
            ok, err, scale = _close(got, want)
            expect(ok, f"{label}: after your prefills, a decode step's logits differ from the engine without a prefix "
                       f"cache by up to {err:.3g} (largest {scale:.3g}): the block tables your prefill left behind do "
                       "not hold the prompt's keys and values where decode reads them")
        holders = [0] * n_blocks
        for table in engine.tables.values():
            for b in table:
                holders[b] += 1
        for b in range(n_blocks):
            expect(engine.alloc.refs[b] == holders[b],
                   f"{label}: after every prefill, block {b} has {engine.alloc.refs[b]} reference(s) but "
                   f"{holders[b]} block table(s) hold it: a block's count is the number of sequences reading it, or "
                   "releasing one sequence frees a block another still reads")
    hits, lookups = sum(want_hits), sum(r.prompt.numel() // bs for r in requests)

    trace = prefix_trace(tok, smoke)
    rounds = 2 if smoke else 5
    pool = _pool_for(trace, bs)
    ttft: dict[str, list[float]] = {"no cache": [], "yours": []}
    for _ in range(rounds):  # each round serves the trace on a fresh pair of engines, request by request alternating
        engines = {"no cache": srv.PagedEngine(model, pool, bs, 1),
                   "yours": _prefix_engine(model, pool, bs, 1, prefill_with_prefix)}
        for r in trace:
            for engine in engines.values():
                engine.prefill(0, llm.fresh([r])[0])
                engine.release(0)
        for name, engine in engines.items():
            ttft[name].append(statistics.mean(end - start for kind, _, start, end in engine.steps if kind == "prefill"))
    ratio = bench.Ratio.from_times(ttft["no cache"], ttft["yours"])
    trace_hits = sum(_expected_hits([r.prompt.tolist() for r in trace], bs))
    skipped = trace_hits * bs / sum(r.prompt.numel() for r in trace)
    print(f"  {len(trace)} requests sharing a {_prefix_sizes(smoke)[1]}-token system prompt, served one at a time: "
          f"{trace_hits} cached blocks, {skipped:.0%} of the prompt tokens skipped; mean time to first token "
          f"{statistics.median(ttft['no cache']) * 1e3:.2f} ms without the cache, "
          f"{statistics.median(ttft['yours']) * 1e3:.2f} ms with yours (median of {rounds} rounds)")
    line = expect_gain("time to first token with your prefix cache", ratio, "without", PREFIX_TTFT_LINE,
                       "How many positions does your prefill run through the model, and what else does each call do "
                       "that the engine without a cache does not?", smoke=smoke)
    passed("prefix cache", f"{len(requests)} prompts on the trained and an untrained model: {hits} cached blocks of "
                           f"{lookups} full ones shared, only the rest computed, no shared block written, the same "
                           f"logits and keys/values as without the cache; {line}")
    figure("prefix_cache_ttft_speedup", ratio.value, "x")
    return {"hits": hits, "full_blocks": lookups, "speedup": ratio}
