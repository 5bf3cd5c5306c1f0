"""Latency under load on lesson 07's engine (lesson 07, part 4: notebooks/07_llm_tuning.ipynb).

- ``ChunkedEngine``: lesson 07's engine with prompts prefilled in chunks (``prefill_chunk``) and the time of every
  token kept (``token_times``), so inter-token latency (ITL) can be read per request.
- ``run_budgeted(engine, trace, token_budget)``: the iteration-level scheduler of part 2 under a per-step token
  budget: each step decodes every running request (one token each) and spends what is left of the budget on prompt
  chunks (chunked prefill, as in Sarathi-Serve and vLLM's ``enable_chunked_prefill``). ``token_budget=None`` prefills
  each admitted prompt whole, in one step: the baseline, through the same code.
- ``inter_token_gaps``: every gap between two consecutive tokens of a request, pooled over the trace.
- ``with_long_prompts``: a trace in which some requests carry long prompts (the ones that stall a batch).
- ``Int8KVCache``: keys and values stored as int8 with one fp32 scale per (sequence, head, position), dequantized
  when attention reads them; ``teacher_forced_logits`` runs a text through the model one token at a time on a cache.
- ``latency_p95``: TTFT p95, TPOT p95 and throughput of a served trace, the numbers a latency budget (an SLO) is
  written against (section 3 sweeps max_batch against one).
- ``predicted_tpot_quantile``: the TPOT quantile a full batch should show, from a decode step and a prefill timed
  alone and the trace's answer lengths; ``budget_side``: within, over or "at the budget" (inside the model's own
  error of it) for one size; ``budget_prediction``: whether those per-size predictions held, from the measured
  per-size budget verdicts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from utils.core import verdict
from utils.llm import Engine, KVCache, Request, TinyGPT, summarize
from utils.llm_serving import forward_positions

__all__ = ["ChunkedEngine", "run_budgeted", "inter_token_gaps", "with_long_prompts", "Int8KVCache",
           "teacher_forced_logits", "latency_p95", "predicted_tpot_quantile", "budget_side",
           "budget_prediction", "WITHIN", "OVER", "AT_BUDGET"]


class ChunkedEngine(Engine):
    """Lesson 07's Engine, with prompts prefilled in chunks and every token's time on the clock.

    ``prefill_chunk(slot, request, n)`` runs the next `n` prompt tokens of `request` into `slot` (attending to the
    chunks before them) and returns the first generated token after the prompt's last chunk, None before it. The
    slot is reserved from the first chunk on. ``token_times[request.id]`` lists the clock at each of its tokens.
    """

    def __init__(self, model: TinyGPT, max_batch: int, max_len: int | None = None):
        super().__init__(model, max_batch, max_len)
        self.progress: dict[int, tuple[Request, int]] = {}  # slot -> (request being prefilled, prompt tokens done)
        self.token_times: dict[int, list[float]] = {}

    def free_slots(self) -> list[int]:
        return [s for s in super().free_slots() if s not in self.progress]

    def prefilled(self, slot: int) -> int:
        """Prompt tokens of the request being prefilled in `slot` that are already in its cache (0 if none)."""
        return self.progress.get(slot, (None, 0))[1]

    @torch.inference_mode()
    def prefill_chunk(self, slot: int, request: Request, n: int) -> int | None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"a prefill chunk needs at least one token, got n={n!r}")
        if slot in self.progress:
            owner, done = self.progress[slot]
            if owner is not request:
                raise ValueError(f"slot {slot} is prefilling request {owner.id}, not {request.id}")
        else:
            self._check_admission(slot, request)
            total = request.prompt.numel()
            if total < 1 or total + request.max_new > self.max_len:
                raise ValueError(f"request {request.id}: prompt {total} + max_new {request.max_new} tokens must fit "
                                 f"the engine's max_len {self.max_len}, with at least one prompt token")
            done = 0
        total = request.prompt.numel()
        end = min(total, done + n)
        start = self.clock
        x = self.model.embed(request.prompt[None, done:end], done)
        # the chunk's token t sits at position done + t and sees every cached position up to its own
        visible = torch.arange(end)[None, :] <= torch.arange(done, end)[:, None]  # [chunk, end]
        for i, block in enumerate(self.model.blocks):
            q, k, v = block.project(x)
            self.k[i][slot, :, done:end] = k[0]
            self.v[i][slot, :, done:end] = v[0]
            attn = F.scaled_dot_product_attention(q, self.k[i][slot : slot + 1, :, :end],
                                                  self.v[i][slot : slot + 1, :, :end], attn_mask=visible)
            x = block.finish(x, attn)
        self.lengths[slot] = end
        if end < total:
            self.progress[slot] = (request, end)
            self.steps.append(("chunk", 1, start, self.clock))
            return None
        self.progress.pop(slot, None)
        token = self._emit_first(slot, request, int(self.model.logits(x[0, -1]).argmax()), start)
        self.token_times[request.id] = [request.t_first]
        return token

    def decode(self, slots: Sequence[int]) -> list[int]:
        before = {s: len(self.slot_request[s].output) for s in slots if s in self.slot_request}
        out = super().decode(slots)
        now = self.steps[-1][3]
        for s, count in before.items():
            request = self.slot_request[s]
            if len(request.output) > count:
                self.token_times[request.id].append(now)
        return out


def run_budgeted(engine: ChunkedEngine, trace: Sequence[Request], token_budget: int | None = None) -> list[Request]:
    """Iteration-level batching under a per-step token budget (lesson 07, part 4).

    Each step: admit arrived requests into free slots; spend the budget left after the decode tokens (one per running
    request) on prompt chunks, oldest admission first; decode every running request; release the finished ones.
    ``token_budget=None``: every admitted prompt is prefilled whole in the step it is admitted (no chunking).
    """
    if not isinstance(engine, ChunkedEngine):
        raise TypeError(f"run_budgeted needs a ChunkedEngine, got {type(engine).__name__}")
    if token_budget is not None and (not isinstance(token_budget, int) or token_budget < 1):
        raise ValueError(f"token_budget must be a positive int or None, got {token_budget!r}")
    pending = deque(sorted(trace, key=lambda r: r.arrival))
    waiting: deque[Request] = deque()
    partial: dict[int, Request] = {}  # slot -> request whose prompt is being prefilled (admission order)
    running: dict[int, Request] = {}
    while pending or waiting or partial or running:
        while pending and pending[0].arrival <= engine.clock:
            waiting.append(pending.popleft())
        if not (waiting or partial or running):
            engine.wait_until(pending[0].arrival)
            continue
        for slot in [s for s in engine.free_slots() if s not in partial]:  # a slot admitted but not started is taken
            if not waiting:
                break
            partial[slot] = waiting.popleft()
        busy = [slot for slot, request in running.items() if not request.done]
        room = math.inf if token_budget is None else max(token_budget - len(busy), 0)
        for slot, request in list(partial.items()):
            if room <= 0:
                break
            take = int(min(request.prompt.numel() - engine.prefilled(slot), room))
            room -= take
            if engine.prefill_chunk(slot, request, take) is not None:
                running[slot] = partial.pop(slot)
        busy = [slot for slot, request in running.items() if not request.done]
        if busy:
            engine.decode(busy)
        for slot in [slot for slot, request in running.items() if request.done]:
            engine.release(slot)
            del running[slot]
    return list(trace)


def inter_token_gaps(engine: ChunkedEngine, trace: Sequence[Request]) -> torch.Tensor:
    """Every gap (seconds) between consecutive tokens of every request in `trace`, pooled."""
    gaps = []
    for request in trace:
        times = engine.token_times.get(request.id)
        if times is None or len(times) != len(request.output):
            raise ValueError(f"request {request.id} has {len(request.output)} tokens but "
                             f"{0 if times is None else len(times)} token times: was it served by this engine?")
        gaps += [b - a for a, b in zip(times, times[1:], strict=False)]
    return torch.tensor(gaps, dtype=torch.float64)


def with_long_prompts(trace: Sequence[Request], text_tokens: torch.Tensor, *, every: int, length: int,
                      seed: int = 0) -> list[Request]:
    """A copy of `trace` in which every `every`-th request (from the first) gets a prompt of `length` tokens cut from
    `text_tokens`: the long prompts whose whole prefill stalls every running request."""
    if every < 1 or length < 1 or text_tokens.numel() <= length:
        raise ValueError(f"with_long_prompts needs every >= 1, length >= 1 and a text longer than length; got "
                         f"every={every}, length={length}, text of {text_tokens.numel()} tokens")
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, r in enumerate(trace):
        prompt = r.prompt
        if i % every == 0:
            start = int(torch.randint(0, text_tokens.numel() - length, (1,), generator=g))
            prompt = text_tokens[start : start + length].clone()
        out.append(Request(r.id, r.arrival, prompt, r.max_new))
    return out


class Int8KVCache(KVCache):
    """A KV cache that stores keys and values as int8, each (sequence, head, position) vector with its own fp32 scale
    (symmetric: scale = max |value| / 127), and hands attention the dequantized values (lesson 07, part 4).
    Bytes per cached token: 2 x layers x heads x (head_dim int8 + one fp32 scale)."""

    def __init__(self, cfg, batch: int, max_len: int | None = None, device="cpu"):
        self.max_len = max_len or cfg.max_len
        shape = (batch, cfg.n_heads, self.max_len, cfg.head_dim)
        scales = (batch, cfg.n_heads, self.max_len, 1)
        self.k = [torch.zeros(shape, dtype=torch.int8, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=torch.int8, device=device) for _ in range(cfg.n_layers)]
        self.k_scale = [torch.zeros(scales, device=device) for _ in range(cfg.n_layers)]
        self.v_scale = [torch.zeros(scales, device=device) for _ in range(cfg.n_layers)]
        self.length = 0

    @staticmethod
    def quantize(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 codes, fp32 scales) of t [..., head_dim], one scale per vector."""
        scale = t.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 127
        return torch.round(t / scale).clamp(-127, 127).to(torch.int8), scale

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; writing {k.shape[2]} more at {start} "
                             "would overflow it")
        for codes, scales, new in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            codes[layer][:, :, start:end], scales[layer][:, :, start:end] = self.quantize(new)
        return (self.k[layer][:, :, :end].float() * self.k_scale[layer][:, :, :end],
                self.v[layer][:, :, :end].float() * self.v_scale[layer][:, :, :end])

    @property
    def nbytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.k + self.v + self.k_scale + self.v_scale)


@torch.inference_mode()
def teacher_forced_logits(model: TinyGPT, tokens: torch.Tensor, prompt_len: int, cache: KVCache) -> torch.Tensor:
    """Logits [steps, vocab] at each position from `prompt_len` - 1 on, for the 1-d `tokens`: the prompt is prefilled
    into `cache` in one call, then the text's own next tokens are fed one at a time (teacher forcing), so every step
    reads the cache and both caches see the same inputs."""
    if tokens.dim() != 1 or not 1 <= prompt_len < tokens.numel():
        raise ValueError(f"tokens must be 1-d and longer than prompt_len >= 1; got shape {tuple(tokens.shape)}, "
                         f"prompt_len={prompt_len}")
    out = [forward_positions(model, tokens[None, :prompt_len], cache)[0, -1]]
    for t in range(prompt_len, tokens.numel() - 1):
        out.append(forward_positions(model, tokens[None, t : t + 1], cache)[0, -1])
    return torch.stack(out)


def latency_p95(trace: Sequence[Request], q: float = 0.95) -> dict:
    """TTFT and TPOT at quantile `q` (seconds) and throughput (tokens/s) of a served trace (lesson 07, part 4,
    section 3). TTFT and throughput are ``llm.summarize``'s; TPOT is each request's (t_done - t_first) / (tokens - 1),
    over the requests with at least two tokens, then its quantile: the per-request number a TPOT budget bounds."""
    if not 0 < q < 1:
        raise ValueError(f"the quantile q must lie in (0, 1), got {q!r}")
    stats = summarize(trace)  # checks that every request was served to the end
    ttft = torch.tensor([r.t_first - r.arrival for r in trace], dtype=torch.float64)
    tpot = torch.tensor([(r.t_done - r.t_first) / (len(r.output) - 1) for r in trace if len(r.output) > 1],
                        dtype=torch.float64)
    return {"ttft_s": float(ttft.quantile(q)), "tpot_s": float(tpot.quantile(q)) if tpot.numel() else math.nan,
            "throughput_tok_s": stats["throughput_tok_s"]}


def predicted_tpot_quantile(lengths: Sequence[int], t_step_ms: float, t_prefill_ms: float, batch: int,
                            mean_new: float, q: float = 0.95, draws: int = 200, seed: int = 0) -> float:
    """The TPOT quantile `q` (ms) of a full batch of `batch` requests, predicted before serving (lesson 07, part 4).

    A request of n tokens waits n - 1 decode steps of ``t_step_ms``, plus the prefill (``t_prefill_ms`` each) of
    every request admitted beside it meanwhile. In a full batch, ``batch / mean_new`` requests finish per step and as
    many are admitted, so the admissions during its n - 1 steps are Poisson with mean (n - 1) * batch / mean_new,
    and its TPOT is ``t_step_ms + t_prefill_ms * K / (n - 1)``: the mean does not depend on n, the spread does (a short
    answer that meets two admissions pays them over few tokens). The quantile is taken over `draws` draws of K for
    each of `lengths` (requests of one token have no TPOT and are left out, as ``latency_p95`` leaves them out).
    """
    if batch < 1 or mean_new <= 0 or not 0 < q < 1 or t_step_ms <= 0 or t_prefill_ms < 0:
        raise ValueError(f"needs batch >= 1, mean_new > 0, 0 < q < 1, t_step_ms > 0, t_prefill_ms >= 0; got "
                         f"batch={batch}, mean_new={mean_new}, q={q}, t_step_ms={t_step_ms}, t_prefill_ms={t_prefill_ms}")
    gaps = torch.tensor([n - 1 for n in lengths if n > 1], dtype=torch.float64)
    if not gaps.numel():
        raise ValueError("no request has two tokens or more: TPOT is not defined for this trace")
    g = torch.Generator().manual_seed(seed)
    rates = (gaps * batch / mean_new).repeat(draws)
    admitted = torch.poisson(rates, generator=g)
    tpot = t_step_ms + t_prefill_ms * admitted / gaps.repeat(draws)
    return float(tpot.quantile(q))


WITHIN, OVER, AT_BUDGET = "within", "over", "at the budget"  # a size's predicted side of a latency budget


def budget_side(predicted_ms: float, budget_ms: float, model_range: tuple[float, float]) -> str:
    """Which side of `budget_ms` a predicted p95 puts a size on, given the model's own error `model_range` (measured /
    predicted, e.g. (0.8, 1.25)): ``WITHIN`` when even the model's high end stays within the budget, ``OVER`` when even
    its low end is above it, ``AT_BUDGET`` otherwise (the model cannot tell which side the measurement will fall)."""
    low, high = model_range
    if not 0 < low <= 1 <= high or predicted_ms <= 0 or budget_ms <= 0:
        raise ValueError(f"needs 0 < low <= 1 <= high and positive times; got {model_range}, {predicted_ms}, {budget_ms}")
    if predicted_ms * high <= budget_ms:
        return WITHIN
    if predicted_ms * low > budget_ms:
        return OVER
    return AT_BUDGET


def budget_prediction(within: dict[int, str], predicted: dict[int, str]) -> str:
    """Did the per-size prediction of a latency budget hold? `predicted[b]` is ``WITHIN``, ``OVER`` or ``AT_BUDGET``
    (``budget_side``); `within[b]` is the measured verdict (``verdict.HELD``: within the budget in every round;
    ``NOT_HELD``: over it in every round; else undecided). Sizes predicted at the budget are not judged: the model
    said it cannot place them. Did not hold when a size predicted within is over in every round, or one predicted over
    is within in every round; held when every judged size landed on its predicted side; undecided otherwise (also when
    no size was judged)."""
    if set(within) != set(predicted):
        raise ValueError(f"measured sizes {sorted(within)} and predicted sizes {sorted(predicted)} differ")
    if any(p not in (WITHIN, OVER, AT_BUDGET) for p in predicted.values()):
        raise ValueError(f"predicted sides must be {WITHIN!r}, {OVER!r} or {AT_BUDGET!r}, got {predicted}")
    want = {WITHIN: verdict.HELD, OVER: verdict.NOT_HELD}
    judged = {b: (want[p], within[b]) for b, p in predicted.items() if p in want}
    if any(got == {verdict.HELD: verdict.NOT_HELD, verdict.NOT_HELD: verdict.HELD}[w] for w, got in judged.values()):
        return verdict.NOT_HELD
    if judged and all(w == got for w, got in judged.values()):
        return verdict.HELD
    return verdict.UNDECIDED
