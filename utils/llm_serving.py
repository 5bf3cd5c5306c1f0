"""LLM serving techniques on lesson 07's engine (lesson 07, part 3: notebooks/07_llm_serving.ipynb).

The notebook prints the parts it teaches from this file:

- ``forward_positions()``: new tokens through a TinyGPT over a KVCache that already holds a past, the causal mask
  shifted by that past (what a cached prefill, a draft's catch-up and a verification pass all need);
- ``BlockAllocator``: physical KV blocks with reference counts, a free list, and a prefix table (a full block is
  found by every token up to its end) for prefix caching; a block in the prefix table is never written again, a write
  into it copies it first (copy-on-write);
- ``PagedEngine``: lesson 07's ``Engine`` interface (prefill, decode, release, clock) on a pool of KV blocks: every
  sequence has a block table and attention gathers its keys and values through it; memory is taken a block at a time;
- ``run_paged()``: the iteration-level scheduler of lesson 07, admitting by free blocks and preempting (by recompute)
  when they run out, as vLLM does;
- ``paged_logits_max_diff()``: teacher-forced logits of the paged engine against one uncached forward;
- speculative decoding: ``speculative_greedy()`` (a draft proposes, the target verifies; the target's greedy tokens),
  ``speculative_sample_round()`` (the accept/reject rule that keeps the target's distribution), ``first_two_tokens()``,
  ``target_joint()`` and ``chi_square_pvalue()`` to test it, ``expected_tokens_per_round()`` for the cost model.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from utils.llm import Engine, KVCache, Request, TinyGPT

__all__ = [
    "forward_positions", "BlockAllocator", "PagedEngine", "run_paged", "paged_logits_max_diff", "batch_under_demand",
    "shared_prefix_requests",
    "speculative_greedy", "speculative_sample_round", "first_two_tokens", "target_joint", "chi_square_pvalue",
    "expected_tokens_per_round",
]


def _blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


@torch.inference_mode()
def forward_positions(model: TinyGPT, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits [B, T, vocab] of the T new tokens [B, T], attending to the cache's past and causally among themselves.

    Unlike lesson 07's forward_cached (which prefills from an empty cache with is_causal=True), the mask here is
    shifted by the past: new token t (at position past + t) sees keys 0 .. past + t. SDPA's is_causal aligns the mask
    at the top left, which would hide the past from every new token but the first.
    """
    if tokens.dim() != 2 or tokens.dtype != torch.long or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be a non-empty [batch, time] LongTensor, got {tuple(tokens.shape)} {tokens.dtype}")
    past, t = cache.length, tokens.shape[1]
    x = model.embed(tokens, past)
    visible = torch.arange(past + t)[None, :] <= torch.arange(past, past + t)[:, None]  # [T, past + T]
    for i, block in enumerate(model.blocks):
        q, k, v = block.project(x)
        k_all, v_all = cache.update(i, k, v)
        x = block.finish(x, F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=visible))
    cache.length += t
    return model.logits(x)


# ---------------------------------------------------------------------------------------------------------------------
# blocks, block tables and the prefix table
# ---------------------------------------------------------------------------------------------------------------------


class BlockAllocator:
    """Physical KV blocks (lesson 07, part 3): reference counts, a free list and a prefix table.

    allocate() hands out a free block (oldest freed first, so a cached block is evicted as late as possible);
    release() drops one reference and frees the block at zero. A full block holding a prompt's tokens can be entered
    in the prefix table under every token from the start of the sequence to the end of that block (register): the
    same key means the same keys and values, so a later prompt that starts with those tokens takes the block
    (lookup) instead of recomputing it. A freed block stays findable until it is handed out again.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.prefix: dict[tuple[int, ...], int] = {}  # tokens from position 0 to the end of a full block -> block
        self.key_of: dict[int, tuple[int, ...]] = {}  # block -> its key in the prefix table
        self.hits = self.lookups = self.copies = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        if not self.free:
            raise MemoryError(f"all {self.num_blocks} KV blocks are in use: free a sequence (or preempt one)")
        block = self.free.popleft()
        key = self.key_of.pop(block, None)
        if key is not None:  # its cached contents are about to be overwritten: forget them
            del self.prefix[key]
        self.refs[block] = 1
        return block

    def share(self, block: int) -> int:
        """One more reference to `block` (a cached block taken out of the free list if nobody held it)."""
        if self.refs[block] == 0:
            self.free.remove(block)
        self.refs[block] += 1
        return block

    def release(self, block: int) -> None:
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is not in use")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)

    def lookup(self, tokens: Sequence[int]) -> list[int]:
        """The cached blocks holding the longest run of full blocks that `tokens` starts with (one reference each)."""
        found, bs = [], self.block_size
        for end in range(bs, len(tokens) + 1, bs):
            self.lookups += 1
            block = self.prefix.get(tuple(tokens[:end]))
            if block is None:
                break
            self.hits += 1
            found.append(self.share(block))
        return found

    def register(self, tokens: Sequence[int], table: Sequence[int]) -> None:
        """Enter the full blocks of `table` (holding `tokens` from position 0) in the prefix table; it makes them
        read-only: the next write into one of them copies it (PagedEngine._writable)."""
        bs = self.block_size
        for j in range(len(tokens) // bs):
            key = tuple(tokens[: (j + 1) * bs])
            if key not in self.prefix and table[j] not in self.key_of:
                self.prefix[key], self.key_of[table[j]] = table[j], key

    def read_only(self, block: int) -> bool:
        return self.refs[block] > 1 or block in self.key_of


class PagedEngine(Engine):
    """Lesson 07's Engine on a paged KV cache (lesson 07, part 3): ``num_blocks`` blocks of ``block_size`` positions
    per layer, shared by up to ``max_seqs`` sequences, each with a block table (its logical blocks -> physical blocks).

    prefill(slot, request), decode(slots), release(slot), free_slots(), clock and wait_until() behave as in
    utils.llm.Engine, so lesson 07's bookkeeping (steps, occupancy, useful, summarize) applies. What differs: a
    sequence holds only the blocks its positions fill; attention reads its keys and values through its block table;
    with ``prefix_cache`` a prompt's leading full blocks come from the prefix table instead of being recomputed.
    ``keep_logits`` keeps every step's logits in ``logits_log`` (for parity checks). The clock, wait_until(),
    free_slots() and the slot checks are Engine's; __init__ does not call Engine's, which would allocate the
    contiguous slots this engine replaces.
    """

    def __init__(self, model: TinyGPT, num_blocks: int, block_size: int = 16, max_seqs: int = 32, *,
                 prefix_cache: bool = False, keep_logits: bool = False):
        if max_seqs < 1:
            raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
        self.model, self.block_size, self.max_batch = model, block_size, max_seqs
        self.alloc = BlockAllocator(num_blocks, block_size)
        cfg = model.cfg
        self.max_len = cfg.max_len
        dtype = model.tok_emb.weight.dtype
        shape = (num_blocks, cfg.n_heads, block_size, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        self.tables: dict[int, list[int]] = {}  # slot -> physical blocks, in position order
        self.lengths = torch.zeros(max_seqs, dtype=torch.long)
        self.last = torch.zeros(max_seqs, dtype=torch.long)
        self.slot_request: dict[int, Request] = {}
        self.prefix_cache, self.keep_logits = prefix_cache, keep_logits
        self.logits_log: list[tuple[str, list[int], torch.Tensor]] = []
        self.steps: list[tuple[str, int, float, float]] = []
        self.occupancy: list[list[int]] = []
        self.useful: list[int] = []
        self.blocks_in_use: list[int] = []  # at each decode step
        self.wasted_slot_steps = self.preemptions = 0
        self.recomputed_tokens = 0  # positions a preemption threw away, computed again when the request returns
        self.prompt_tokens = self.computed_prompt_tokens = 0
        self._t0, self._skipped = time.perf_counter(), 0.0

    # -- blocks -------------------------------------------------------------------------------------------------------
    def blocks_to_admit(self, request: Request) -> int:
        """Blocks a request needs now: its prompt (and the tokens it already generated, if it was preempted) plus the
        next position, minus nothing (cache hits are not counted in advance)."""
        return _blocks_for(request.prompt.numel() + max(len(request.output), 1), self.block_size)

    def can_admit(self, request: Request) -> bool:
        need_all = _blocks_for(request.prompt.numel() + request.max_new, self.block_size)
        if need_all > self.alloc.num_blocks or request.prompt.numel() + request.max_new > self.max_len:
            raise ValueError(f"request {request.id}: prompt {request.prompt.numel()} + max_new {request.max_new} "
                             f"positions need {need_all} blocks of {self.block_size} (the pool has "
                             f"{self.alloc.num_blocks}) and must fit the model's max_len {self.max_len}")
        return self.blocks_to_admit(request) <= self.alloc.num_free

    def blocks_needed(self, slots: Sequence[int]) -> int:
        """New blocks the next decode step of these slots takes: one for each sequence whose next position starts a
        block (a read-only block to be copied counts too)."""
        need = 0
        for s in slots:
            pos, table = int(self.lengths[s]), self.tables[s]
            j = pos // self.block_size
            need += j >= len(table) or self.alloc.read_only(table[j])
        return need

    def _writable(self, slot: int, pos: int) -> int:
        """The physical block position `pos` of `slot` is written to: a new block when pos starts one; a private copy
        when the block is shared or in the prefix table (copy-on-write)."""
        table, j = self.tables[slot], pos // self.block_size
        if j == len(table):
            table.append(self.alloc.allocate())
        elif self.alloc.read_only(table[j]):
            old, new = table[j], self.alloc.allocate()
            for pool in self.k + self.v:
                pool[new] = pool[old]  # copy, then write into the copy
            self.alloc.release(old)
            self.alloc.copies += 1
            table[j] = new
        return table[j]

    def _gather(self, layer: int, tables: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of sequences through their block tables [n, blocks]: [n, n_heads, blocks x block_size, Dh]."""
        n, nb = tables.shape

        def read(pool):
            x = pool[tables]  # [n, blocks, H, block_size, Dh]: one gather through the block table
            return x.permute(0, 2, 1, 3, 4).reshape(n, x.shape[2], nb * self.block_size, x.shape[4])

        return read(self.k[layer]), read(self.v[layer])

    # -- the model steps ----------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slot: int, request: Request) -> int:
        """Process the prompt into `slot` (after the cached prefix, with prefix_cache) and emit the first token. A
        preempted request (with output already) recomputes prompt + output but the last token and emits nothing new."""
        self._check_admission(slot, request)
        if request.prompt.numel() < 1 or request.prompt.dim() != 1:
            raise ValueError(f"request {request.id}: the prompt must be a 1-d tensor of at least one token")
        if not self.can_admit(request):
            raise MemoryError(f"request {request.id} needs {self.blocks_to_admit(request)} blocks, "
                              f"{self.alloc.num_free} are free: check can_admit() first")
        start_clock = self.clock
        resumed = bool(request.output)
        tokens = torch.cat([request.prompt, torch.tensor(request.output[:-1], dtype=torch.long)]) if resumed \
            else request.prompt
        n, ids = tokens.numel(), tokens.tolist()
        table = self.alloc.lookup(ids) if self.prefix_cache else []  # shared blocks of the cached prefix
        start = min(len(table) * self.block_size, n - 1)  # the last token always runs: its logits pick the next one
        self.tables[slot] = table
        for pos in range(start, n):
            if pos % self.block_size == 0 or pos == start:
                self._writable(slot, pos)
        blocks = torch.tensor(table)
        x = self.model.embed(tokens[None, start:], start)
        visible = torch.arange(len(table) * self.block_size)[None, :] <= torch.arange(start, n)[:, None]
        pos = torch.arange(start, n)
        for i, block in enumerate(self.model.blocks):
            q, k, v = block.project(x)  # [1, H, n - start, Dh]
            self.k[i][blocks[pos // self.block_size], :, pos % self.block_size] = k[0].transpose(0, 1)
            self.v[i][blocks[pos // self.block_size], :, pos % self.block_size] = v[0].transpose(0, 1)
            keys, values = self._gather(i, blocks[None])
            x = block.finish(x, F.scaled_dot_product_attention(q, keys, values, attn_mask=visible))
        logits = self.model.logits(x[0, -1])
        if self.keep_logits:
            self.logits_log.append(("prefill", [slot], logits.clone()))
        if self.prefix_cache:
            self.alloc.register(ids, table)
        self.prompt_tokens += n
        self.computed_prompt_tokens += n - start
        self.lengths[slot] = n
        self.slot_request[slot] = request
        if resumed:
            self.last[slot] = request.output[-1]
            self.steps.append(("prefill", 1, start_clock, self.clock))
            return request.output[-1]
        return self._emit_first(slot, request, int(logits.argmax()), start_clock)

    @torch.inference_mode()
    def decode(self, slots: Sequence[int]) -> list[int]:
        """One decode step for these slots together, each at its own position, keys and values read through the
        block tables. Returns the token of each slot."""
        slots = list(slots)
        self._check_decode(slots)
        for s in slots:
            if int(self.lengths[s]) >= self.max_len:
                raise ValueError(f"slot {s} is full ({self.max_len} positions): release it")
        if self.blocks_needed(slots) > self.alloc.num_free:
            raise MemoryError(f"this step needs {self.blocks_needed(slots)} new blocks, {self.alloc.num_free} are "
                              "free: preempt a sequence first (run_paged does)")
        start = self.clock
        idx = torch.tensor(slots)
        pos = self.lengths[idx]  # where each slot's new token goes
        for s, p in zip(slots, pos.tolist(), strict=True):
            self._writable(s, p)  # a new block when p starts one; a private copy of a shared one
        width = max(len(self.tables[s]) for s in slots)
        tables = torch.tensor([self.tables[s] + [0] * (width - len(self.tables[s])) for s in slots])  # [n, width]
        write_block = tables[torch.arange(len(slots)), pos // self.block_size]
        offset = pos % self.block_size
        visible = (torch.arange(width * self.block_size)[None, :] <= pos[:, None])[:, None, None, :]  # own positions
        x = self.model.embed(self.last[idx][:, None], pos[:, None])
        for i, block in enumerate(self.model.blocks):
            q, k, v = block.project(x)  # [n, H, 1, Dh]
            self.k[i][write_block, :, offset] = k[:, :, 0]  # each sequence writes into its own block
            self.v[i][write_block, :, offset] = v[:, :, 0]
            keys, values = self._gather(i, tables)  # attention reads through the block tables
            x = block.finish(x, F.scaled_dot_product_attention(q, keys, values, attn_mask=visible))
        logits = self.model.logits(x[:, 0])
        if self.keep_logits:
            self.logits_log.append(("decode", slots, logits.clone()))
        out = self._emit_step(slots, idx, logits.argmax(dim=-1), start)
        self.blocks_in_use.append(self.alloc.num_blocks - self.alloc.num_free)
        return out

    def release(self, slot: int) -> Request:
        """Free `slot`: its blocks go back to the pool (a block shared with another sequence stays with it)."""
        self._check_slot(slot)
        if slot not in self.slot_request:
            raise ValueError(f"slot {slot} holds no request")
        for block in self.tables.pop(slot):
            self.alloc.release(block)
        self.lengths[slot] = 0
        return self.slot_request.pop(slot)

    def preempt(self, slot: int) -> Request:
        """Take an unfinished request off the engine, freeing its blocks; prefill() recomputes it later (vLLM's
        preemption by recompute)."""
        self.preemptions += 1
        self.recomputed_tokens += int(self.lengths[slot])
        return self.release(slot)


def run_paged(engine: PagedEngine, trace: Sequence[Request]) -> list[Request]:
    """Iteration-level scheduling (lesson 07's run_continuous) on a paged engine: a waiting request is admitted when
    a sequence slot is free AND the pool has blocks for its prompt; before each decode step, if the running sequences
    need more new blocks than are free, the most recently admitted one is preempted (its blocks freed, its request
    put back at the head of the queue, recomputed when it returns).
    """
    pending = deque(sorted(trace, key=lambda r: r.arrival))  # not arrived yet
    waiting: deque[Request] = deque()  # arrived, not running
    running: dict[int, Request] = {}  # slot -> request, in order of admission
    while pending or waiting or running:
        while pending and pending[0].arrival <= engine.clock:
            waiting.append(pending.popleft())
        if not waiting and not running:
            engine.wait_until(pending[0].arrival)  # idle: jump to the next arrival
            continue
        while waiting and engine.free_slots() and engine.can_admit(waiting[0]):  # admit by memory, not by slot alone
            request = waiting.popleft()
            slot = engine.free_slots()[0]
            engine.prefill(slot, request)
            running[slot] = request
        busy = [slot for slot, request in running.items() if not request.done]
        while busy and engine.blocks_needed(busy) > engine.alloc.num_free:  # out of blocks: preempt the newest
            victim = busy.pop()
            waiting.appendleft(engine.preempt(victim))
            del running[victim]
        if busy:
            engine.decode(busy)
        for slot in [slot for slot, request in running.items() if request.done]:
            engine.release(slot)
            del running[slot]
    return list(trace)


@torch.inference_mode()
def paged_logits_max_diff(model: TinyGPT, seqs: Sequence[torch.Tensor], prompt_lens: Sequence[int], *,
                          block_size: int = 16, prefix_cache: bool = False, num_blocks: int | None = None,
                          engine_cls: type[PagedEngine] | None = None):
    """Max |logits of the paged engine - logits of one uncached forward| over every position from each prompt's end.

    Sequence i is prefilled with seqs[i][:prompt_lens[i]] into slot i (in order: with prefix_cache a later one can
    hit the blocks of an earlier one), then all sequences are decoded together, teacher-forced with their own tokens
    (ragged lengths: a sequence leaves the batch at its end). Returns (max abs diff, the engine) (lesson 07, part 3).
    `engine_cls`: a PagedEngine subclass to check instead (the tests feed it one that reads its blocks out of order).
    """
    if len(seqs) != len(prompt_lens) or not seqs:
        raise ValueError(f"need one prompt length per sequence, got {len(seqs)} sequences, {len(prompt_lens)} lengths")
    for s, p in zip(seqs, prompt_lens, strict=True):
        if s.dim() != 1 or not 1 <= p <= s.numel():
            raise ValueError(f"each sequence must be 1-d with 1 <= prompt length <= its length, got {tuple(s.shape)}, {p}")
    need = sum(_blocks_for(s.numel(), block_size) for s in seqs)
    engine = (engine_cls or PagedEngine)(model, num_blocks or need + len(seqs), block_size, max_seqs=len(seqs),
                                         prefix_cache=prefix_cache, keep_logits=True)
    refs = [model(s[None])[0] for s in seqs]  # [T, vocab] each
    worst = 0.0
    for i, (s, p) in enumerate(zip(seqs, prompt_lens, strict=True)):
        engine.prefill(i, Request(i, 0.0, s[:p], s.numel() - p + 1))
        worst = max(worst, (engine.logits_log[-1][2] - refs[i][p - 1]).abs().max().item())
    while True:
        slots = [i for i, s in enumerate(seqs) if int(engine.lengths[i]) < s.numel()]
        if not slots:
            return worst, engine
        pos = engine.lengths[slots]
        engine.last[slots] = torch.stack([seqs[i][int(p)] for i, p in zip(slots, pos, strict=True)])  # teacher forcing
        engine.decode(slots)
        logits = engine.logits_log[-1][2]
        for row, (i, p) in enumerate(zip(slots, pos.tolist(), strict=True)):
            worst = max(worst, (logits[row] - refs[i][p]).abs().max().item())


def batch_under_demand(engine, requests: Sequence[Request]) -> float:
    """Mean sequences per decode step over the steps taken while some request had arrived but not yet started (no
    first token yet): the batch an engine forms when demand exceeds what it holds, its capacity (lesson 07, part 3).
    Works for utils.llm.Engine and PagedEngine alike (a preempted request waiting again is not counted)."""
    spans = [(r.arrival, r.t_first) for r in requests if r.t_first is not None]
    sizes = [n for kind, n, start, _ in engine.steps
             if kind == "decode" and any(a <= start < first for a, first in spans)]
    if not sizes:
        raise ValueError("no decode step ran while a request was waiting: the trace never exceeded the engine's "
                         "capacity (raise its arrival rate)")
    return sum(sizes) / len(sizes)


def shared_prefix_requests(system: torch.Tensor, questions: Sequence[torch.Tensor], max_new: int) -> list[Request]:
    """Requests that all start with the same system prompt, each followed by its own question (arriving at 0)."""
    if system.dim() != 1 or not questions or any(q.dim() != 1 or q.numel() < 1 for q in questions):
        raise ValueError("system must be a 1-d token tensor and questions a non-empty list of non-empty 1-d tensors")
    return [Request(i, 0.0, torch.cat([system, q]), max_new) for i, q in enumerate(questions)]


# ---------------------------------------------------------------------------------------------------------------------
# speculative decoding
# ---------------------------------------------------------------------------------------------------------------------


def _check_pair(target: TinyGPT, draft: TinyGPT, k: int) -> None:
    if target.cfg.vocab_size != draft.cfg.vocab_size:
        raise ValueError(f"the draft must share the target's vocabulary: {draft.cfg.vocab_size} tokens vs "
                         f"{target.cfg.vocab_size}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k (tokens the draft proposes per round) must be an int >= 1, got {k!r}")


@torch.inference_mode()
def speculative_greedy(target: TinyGPT, draft: TinyGPT, prompt: torch.Tensor, n_new: int, k: int = 4,
                       stats: dict | None = None) -> list[int]:
    """Greedy speculative decoding (lesson 07, part 3): the draft proposes k tokens one cheap step at a time, the
    target scores all of them in ONE pass, the longest run that matches the target's own choices is kept, plus the
    target's token after it. Every kept token is the target's greedy choice, so the output is the target's greedy
    output. `stats` (a dict) receives rounds, proposed, accepted and checked counts: a round checks its guesses up to
    and including the first rejection (all k when none is rejected), so accepted / checked is the per-guess acceptance
    probability alpha of Leviathan et al.'s (1 - alpha^(k+1)) / (1 - alpha); accepted / proposed is lower, because the
    guesses after a rejection are never checked.
    """
    _check_pair(target, draft, k)
    if prompt.dim() != 1 or prompt.numel() < 1 or n_new < 1:
        raise ValueError(f"prompt must be a non-empty 1-d token tensor and n_new >= 1, got {tuple(prompt.shape)}, {n_new}")
    total = prompt.numel() + n_new + k + 1
    if total > min(target.cfg.max_len, draft.cfg.max_len):
        raise ValueError(f"prompt {prompt.numel()} + n_new {n_new} + k {k} + 1 positions exceed the models' max_len")
    tc, dc = KVCache(target.cfg, 1, total), KVCache(draft.cfg, 1, total)
    seq = prompt.tolist()
    seq.append(int(forward_positions(target, prompt[None], tc)[0, -1].argmax()))  # the prefill's token
    rounds = accepted = checked = 0
    while len(seq) - prompt.numel() < n_new:
        guess = []
        for _ in range(k):  # 1. the draft proposes k tokens (first catching up on any token it has not seen)
            ctx = seq + guess
            guess.append(int(forward_positions(draft, torch.tensor([ctx[dc.length :]]), dc)[0, -1].argmax()))
        ctx = seq + guess  # 2. the target scores the last token and the k guesses in one pass
        want = forward_positions(target, torch.tensor([ctx[tc.length :]]), tc)[0, -(k + 1) :].argmax(-1).tolist()
        n = 0  # 3. keep guesses while they are what the target would have chosen
        while n < k and guess[n] == want[n]:
            n += 1
        old = len(seq)
        seq += guess[:n] + [want[n]]  # the target's own token after the kept run: a correction, or a bonus
        tc.length = min(tc.length, old + n)  # 4. roll both caches back to the positions whose tokens stand
        dc.length = min(dc.length, old + n)
        rounds, accepted, checked = rounds + 1, accepted + n, checked + min(n + 1, k)
    if stats is not None:
        stats.update(rounds=rounds, proposed=rounds * k, accepted=accepted, checked=checked)
    return seq[prompt.numel() : prompt.numel() + n_new]


@torch.inference_mode()
def speculative_sample_round(target: TinyGPT, draft: TinyGPT, prefix: torch.Tensor, k: int,
                             generator: torch.Generator, *, resample_from: str = "residual"):
    """One round of speculative sampling for N rows at once (lesson 07, part 3; Leviathan et al. 2023, Chen et al.
    2023). prefix [N, T]. Returns (tokens [N, k + 1], counts [N]): row r emitted tokens[r, :counts[r]].

    The draft samples x_i ~ q_i; the target gives p_i after each prefix in one pass. Guess i is accepted with
    probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the token is drawn from the residual
    max(0, p_i - q_i), renormalised; after k acceptances one more is drawn from p_{k+1}. The emitted tokens are then
    distributed exactly as the target's own samples. `resample_from="target"` draws the replacement from p_i instead
    (a plausible-looking mistake, kept to show that the test below catches it).
    """
    _check_pair(target, draft, k)
    if resample_from not in ("residual", "target"):
        raise ValueError(f"resample_from must be 'residual' or 'target', got {resample_from!r}")
    n_rows = prefix.shape[0]
    ctx, qs, guesses = prefix, [], []
    for _ in range(k):  # the draft samples its k guesses
        q = torch.softmax(draft(ctx)[:, -1].double(), dim=-1)
        x = torch.multinomial(q, 1, generator=generator)
        qs.append(q)
        guesses.append(x)
        ctx = torch.cat([ctx, x], dim=1)
    p = torch.softmax(target(ctx)[:, -(k + 1) :].double(), dim=-1)  # [N, k + 1, V]: one target pass
    q, x = torch.stack(qs, dim=1), torch.cat(guesses, dim=1)  # [N, k, V], [N, k]
    p_x, q_x = p[:, :k].gather(2, x[..., None])[..., 0], q.gather(2, x[..., None])[..., 0]
    accept = torch.rand(n_rows, k, generator=generator, dtype=torch.float64) < p_x / q_x  # prob. min(1, p/q)
    n = accept.long().cumprod(dim=1).sum(dim=1)  # guesses accepted before the first rejection
    fix = (p[:, :k] - q).clamp_min(0) if resample_from == "residual" else p[:, :k]
    final = torch.cat([fix, p[:, k:]], dim=1)  # [N, k + 1, V]: where the one extra token is drawn from
    pick = final[torch.arange(n_rows), n]
    extra = torch.multinomial(pick / pick.sum(dim=-1, keepdim=True), 1, generator=generator)
    tokens = torch.cat([x, extra], dim=1)
    tokens[torch.arange(n_rows), n] = extra[:, 0]
    tokens[torch.arange(k + 1)[None, :] > n[:, None]] = -1  # not emitted
    return tokens, n + 1


@torch.inference_mode()
def first_two_tokens(target: TinyGPT, draft: TinyGPT, prefix: torch.Tensor, n_samples: int, k: int, *,
                     seed: int = 0, resample_from: str = "residual") -> torch.Tensor:
    """[n_samples, 2]: the first two tokens speculative sampling emits after `prefix` (1-d), from independent runs
    (batched; a row that emitted one token in its first round runs a second)."""
    if prefix.dim() != 1 or n_samples < 1:
        raise ValueError(f"prefix must be 1-d and n_samples >= 1, got {tuple(prefix.shape)}, {n_samples}")
    g = torch.Generator().manual_seed(seed)
    rows = prefix.repeat(n_samples, 1)
    tokens, counts = speculative_sample_round(target, draft, rows, k, g, resample_from=resample_from)
    out = tokens[:, :2].clone()
    short = (counts == 1).nonzero()[:, 0]
    if short.numel():
        more, _ = speculative_sample_round(target, draft, torch.cat([rows[short], out[short, :1]], dim=1), k, g,
                                           resample_from=resample_from)
        out[short, 1] = more[:, 0]
    return out


@torch.inference_mode()
def target_joint(target: TinyGPT, prefix: torch.Tensor) -> torch.Tensor:
    """[V, V]: the target's exact probability of the first two tokens after `prefix` (1-d), p(a) p(b | a)."""
    v = target.cfg.vocab_size
    p1 = torch.softmax(target(prefix[None])[0, -1].double(), dim=-1)
    both = torch.cat([prefix.repeat(v, 1), torch.arange(v)[:, None]], dim=1)
    p2 = torch.softmax(target(both)[:, -1].double(), dim=-1)
    return p1[:, None] * p2


def chi_square_pvalue(observed: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Pearson's chi-square goodness-of-fit test: (statistic, p-value, degrees of freedom) of counts against
    probabilities. Cells expected fewer than `min_expected` times are pooled into one; p = Q(df/2, stat/2), the
    regularised upper incomplete gamma function (the chi-square survival function)."""
    observed, probs = observed.reshape(-1).double(), probs.reshape(-1).double()
    if observed.shape != probs.shape or observed.sum() <= 0 or (probs < 0).any():
        raise ValueError(f"need counts and probabilities of the same shape, got {tuple(observed.shape)} and "
                         f"{tuple(probs.shape)}")
    expected = probs / probs.sum() * observed.sum()
    small = expected < min_expected
    obs = torch.cat([observed[~small], observed[small].sum()[None]]) if small.any() else observed
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    keep = exp > 0
    if (obs[~keep] > 0).any():
        return float("inf"), 0.0, int(keep.sum()) - 1  # a count where the model says impossible
    obs, exp = obs[keep], exp[keep]
    df = obs.numel() - 1
    if df < 1:
        raise ValueError("fewer than two cells with enough expected counts: draw more samples")
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                               torch.tensor(stat / 2, dtype=torch.float64))), df


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens one speculative round yields when each guess is accepted with probability alpha independently:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023)."""
    if not 0 <= alpha <= 1 or k < 1:
        raise ValueError(f"alpha must lie in [0, 1] and k >= 1, got {alpha}, {k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
