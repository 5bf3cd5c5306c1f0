"""Inside LLM inference (lesson 07): a small decoder-only transformer and the machinery that serves it.

Everything here is the subject of lesson 07, and the notebook prints the parts it teaches from this file:

- ``TinyGPT``: a decoder-only transformer (token + learned position embeddings, pre-norm blocks, causal attention
  through ``F.scaled_dot_product_attention``), trained for a few seconds on the sentences bundled in
  ``utils/core/data/sentences.csv`` by ``tiny_gpt()`` (characters are the tokens; nothing is downloaded);
- ``generate()``: the reference greedy loop that recomputes the whole sequence for every new token;
- ``generate_cached()``: the same tokens with a KV cache (prefill once, then one token per step);
- ``tiled_attention()``: FlashAttention's forward pass in PyTorch, an online softmax over key tiles (the merge rule of
  lesson 06), and ``peak_live_bytes()`` to measure the memory it never materialises;
- ``Engine``, ``run_static()`` and ``run_continuous()``: one real model step over a batch of KV-cache slots, and the
  two schedulers (request-level static batching vs iteration-level continuous batching) over a simulated arrival
  trace (``make_trace``);
- ``PagedKVCache``: KV blocks and a block table (vLLM's PagedAttention bookkeeping), with the waste counted;
- ``Int8Linear`` / ``quantize_int8()``: weight-only int8 linear layers.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from utils.core import env
from utils.core.data import labeled_sentences

__all__ = [
    "GPTConfig", "CharTokenizer", "TinyGPT", "Block", "corpus_text", "train", "tiny_gpt", "generate",
    "generate_cached", "forward_cached", "KVCache", "cached_logits_max_diff", "step_times", "verify_greedy", "kv_cache_bytes_per_token", "decode_step_bytes",
    "naive_attention", "tiled_attention", "peak_live_bytes", "sdpa_backend",
    "Request", "make_trace", "fresh", "Engine", "decode_step_seconds", "run_static", "run_continuous", "summarize",
    "PagedKVCache", "reserved_slots", "Int8Linear", "quantize_int8", "linear_weight_bytes",
]

env.quiet_profiler_log()  # decode_profile runs torch.profiler: no Kineto lines on a CPU machine


# ---------------------------------------------------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a TinyGPT (lesson 07). head_dim = d_model // n_heads."""

    vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    max_len: int = 512

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class CharTokenizer:
    """Characters as tokens (lesson 07): the vocabulary is every character of the training text."""

    def __init__(self, text: str):
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to build its vocabulary")
        self.chars = sorted(set(text))
        self._index = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        unknown = sorted(set(text) - set(self._index))
        if unknown:
            raise ValueError(f"characters {unknown} are not in the vocabulary ({self.vocab_size} characters of the "
                             "training text)")
        return torch.tensor([self._index[c] for c in text], dtype=torch.long)

    def decode(self, tokens) -> str:
        tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        return "".join(self.chars[int(t)] for t in tokens)


class Block(nn.Module):
    """One pre-norm transformer block (lesson 07), split where a KV cache plugs in: project() makes q, k, v;
    the caller runs attention over whatever keys and values it holds; finish() adds the attention output and the MLP.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def project(self, x: torch.Tensor):
        """q, k, v for the tokens in x [B, T, d_model]: each [B, n_heads, T, head_dim]."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        return tuple(z.view(b, t, self.n_heads, self.head_dim).transpose(1, 2) for z in (q, k, v))

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream after this block, from x [B, T, d] and the attention output [B, H, T, head_dim]."""
        b, t, d = x.shape
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """A small decoder-only transformer (lesson 07). forward(tokens) recomputes every position: no cache."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module):
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def embed(self, tokens: torch.Tensor, positions) -> torch.Tensor:
        """Token + position embeddings. `positions`: the first position (an int) or a LongTensor like `tokens`."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a [batch, time] LongTensor, got {tuple(tokens.shape)} {tokens.dtype}")
        if isinstance(positions, int):
            positions = torch.arange(positions, positions + tokens.shape[1], device=tokens.device)
        last = int(positions.max()) if positions.numel() else -1
        if last >= self.cfg.max_len:
            raise ValueError(f"position {last} is beyond the model's max_len {self.cfg.max_len}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size}), got "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        return self.tok_emb(tokens) + self.pos_emb(positions)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] for every position of tokens [B, T], causal attention over the whole sequence."""
        x = self.embed(tokens, 0)
        for block in self.blocks:
            q, k, v = block.project(x)
            x = block.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return self.logits(x)


def corpus_text() -> str:
    """The training text: the course's sentences (utils/core/data/sentences.csv), one per line (lesson 07)."""
    texts, _, _ = labeled_sentences()
    return "".join(text.strip() + "\n" for text in texts)


def train(model: TinyGPT, data: torch.Tensor, steps: int, *, batch: int = 16, ctx: int = 64, lr: float = 3e-3,
          seed: int = 0, progress: bool = True) -> list[float]:
    """A few AdamW steps of next-token prediction on random windows of `data` (lesson 07). Returns the losses."""
    if data.dim() != 1 or data.numel() <= ctx + 1:
        raise ValueError(f"data must be a 1-d token tensor longer than ctx + 1 = {ctx + 1}, got {tuple(data.shape)}")
    if ctx > model.cfg.max_len:
        raise ValueError(f"ctx {ctx} exceeds the model's max_len {model.cfg.max_len}")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 10)  # linear warm-up over a tenth of the steps, then a cosine decay
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: min(1.0, (i + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(i, steps) / max(steps, 1))))
    losses = []
    model.train()
    steps_iter = range(steps)
    if progress:
        from tqdm.auto import tqdm

        steps_iter = tqdm(steps_iter, desc="training TinyGPT", leave=False)
    for _ in steps_iter:
        starts = torch.randint(0, data.numel() - ctx - 1, (batch,), generator=g)
        x = torch.stack([data[s : s + ctx] for s in starts.tolist()])
        y = torch.stack([data[s + 1 : s + ctx + 1] for s in starts.tolist()])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def tiny_gpt(steps: int = 300, *, seed: int = 0, cache: bool = True, progress: bool = True, **sizes):
    """(model, tokenizer): a TinyGPT trained for `steps` steps on corpus_text() (lesson 07 and its lab), eval mode.

    The weights are cached under build/llm/ (keyed by the sizes, steps, seed and torch version) and loaded with
    torch.load(weights_only=True); `model.train_losses` holds the losses of the run that made them.
    """
    text = corpus_text()
    tok = CharTokenizer(text)
    cfg = GPTConfig(vocab_size=tok.vocab_size, **sizes)
    recipe = inspect.getsource(train)  # a change to the training code trains afresh
    key = hashlib.sha256(repr((asdict(cfg), steps, seed, torch.__version__, text, recipe)).encode()).hexdigest()[:12]
    path = env.build_dir() / "llm" / f"tinygpt_{key}.pt"
    torch.manual_seed(seed)
    model = TinyGPT(cfg)
    if cache and path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["state_dict"])
        model.train_losses = list(saved["losses"])
    else:
        model.train_losses = train(model, tok.encode(text), steps, seed=seed, progress=progress) if steps else []
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save({"state_dict": model.state_dict(), "losses": torch.tensor(model.train_losses)}, tmp)
            tmp.replace(path)
    return model.eval(), tok


def warmup() -> str:
    """`make warmup`: train lesson 07's model once (full-mode steps) so the lesson and its lab load cached weights."""
    path_before = set((env.build_dir() / "llm").glob("tinygpt_*.pt"))
    t0 = time.perf_counter()
    model, _ = tiny_gpt(300, progress=False)
    new = set((env.build_dir() / "llm").glob("tinygpt_*.pt")) - path_before
    how = "trained and cached" if new else "found in cache"
    return f"TinyGPT weights {how} ({time.perf_counter() - t0:.0f} s, final loss {model.train_losses[-1]:.2f})"


# ---------------------------------------------------------------------------------------------------------------------
# generation: the reference loop and the KV cache
# ---------------------------------------------------------------------------------------------------------------------


def _check_prompt(model: TinyGPT, prompt: torch.Tensor, n_new: int) -> None:
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.dtype != torch.long:
        raise ValueError(f"prompt must be a [batch, time] LongTensor, got "
                         f"{tuple(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__}")
    if prompt.shape[1] < 1 or n_new < 1:
        raise ValueError(f"need at least one prompt token and n_new >= 1, got prompt length {prompt.shape[1]}, "
                         f"n_new={n_new}")
    if prompt.shape[1] + n_new > model.cfg.max_len:
        raise ValueError(f"prompt length {prompt.shape[1]} + n_new {n_new} exceeds the model's max_len "
                         f"{model.cfg.max_len}")


@torch.inference_mode()
def generate(model: TinyGPT, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy decoding, the reference way: every new token reruns the model over the whole sequence so far."""
    _check_prompt(model, prompt, n_new)
    tokens = prompt
    for _ in range(n_new):
        logits = model(tokens)  # [B, T, vocab]: all T positions recomputed, only the last one used
        next_token = logits[:, -1].argmax(dim=-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
    return tokens[:, prompt.shape[1] :]


class KVCache:
    """Preallocated keys and values for every layer (lesson 07): [n_layers] x [B, n_heads, max_len, head_dim]."""

    def __init__(self, cfg: GPTConfig, batch: int, max_len: int | None = None, dtype=torch.float32, device="cpu"):
        self.max_len = max_len or cfg.max_len
        shape = (batch, cfg.n_heads, self.max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.n_layers)]
        self.length = 0  # positions filled so far

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k, v [B, H, T, Dh] at positions length .. length+T-1 of `layer`; return all keys and values so far."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"the KV cache holds {self.max_len} positions; writing {k.shape[2]} more at {start} "
                             "would overflow it")
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    @property
    def nbytes(self) -> int:
        """Bytes the cache's tensors actually hold (their storages)."""
        return sum(t.untyped_storage().nbytes() for t in self.k + self.v)


@torch.inference_mode()
def forward_cached(model: TinyGPT, new_tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run only the new tokens [B, T] through the model, attending to everything in the cache; advance the cache.
    Returns the logits of the last new position [B, vocab]."""
    x = model.embed(new_tokens, cache.length)
    for i, block in enumerate(model.blocks):
        q, k, v = block.project(x)  # q, k, v of the new tokens only
        k_all, v_all = cache.update(i, k, v)  # the cache update: write them, then attend over everything so far
        # prefill: the T new tokens attend causally; decode: the one new token attends to every cached position
        x = block.finish(x, F.scaled_dot_product_attention(q, k_all, v_all, is_causal=q.shape[2] > 1))
    cache.length += new_tokens.shape[1]
    return model.logits(x[:, -1])


@torch.inference_mode()
def generate_cached(model: TinyGPT, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy decoding with a KV cache: the prompt is processed once (prefill), then one token per step (decode)."""
    _check_prompt(model, prompt, n_new)
    cache = KVCache(model.cfg, prompt.shape[0], prompt.shape[1] + n_new, dtype=model.tok_emb.weight.dtype,
                    device=prompt.device)
    new_tokens, out = prompt, []  # the first step feeds the whole prompt (prefill)
    for _ in range(n_new):
        new_tokens = forward_cached(model, new_tokens, cache).argmax(dim=-1, keepdim=True)  # [B, 1]
        out.append(new_tokens)
    return torch.cat(out, dim=1)


@torch.inference_mode()
def cached_logits_max_diff(model: TinyGPT, seq: torch.Tensor, prompt_len: int, cache: KVCache | None = None) -> float:
    """Max |logits of cached decoding - logits of one uncached forward| over EVERY position from prompt_len - 1 on.

    The cached path prefills seq[:, :prompt_len], then feeds one token per step; each step's full logit vector is
    compared with the reference forward over the whole of `seq` at the same position. Unlike comparing greedy tokens,
    this fails for a wrong cache position or mask even when a barely trained model picks the same token everywhere
    (lesson 07; tests/build/test_llm.py feeds it a cache that writes one position off). `cache`: the cache to use
    (default a fresh KVCache).
    """
    if seq.dim() != 2 or not 1 <= prompt_len < seq.shape[1]:
        raise ValueError(f"seq must be [batch, time] with 1 <= prompt_len < time, got {tuple(seq.shape)}, "
                         f"prompt_len={prompt_len}")
    cache = cache if cache is not None else KVCache(model.cfg, seq.shape[0], seq.shape[1])
    full = model(seq)
    worst = (forward_cached(model, seq[:, :prompt_len], cache) - full[:, prompt_len - 1]).abs().max().item()
    for t in range(prompt_len, seq.shape[1]):
        step = forward_cached(model, seq[:, t : t + 1], cache)
        worst = max(worst, (step - full[:, t]).abs().max().item())
    return worst


def step_times(model: TinyGPT, fn: Callable[[], object]) -> tuple[object, list[float]]:
    """Run fn() and time each generation step: a forward hook on model.lm_head marks the end of every step.

    Returns (fn's result, [seconds per step]). Works for any loop that calls model.lm_head once per new token
    (lesson 07 and its lab time the reference and the cached loop this way).
    """
    marks: list[float] = []
    handle = model.lm_head.register_forward_hook(lambda *_: marks.append(time.perf_counter()))
    try:
        start = time.perf_counter()
        result = fn()
    finally:
        handle.remove()
    stamps = [start, *marks]
    return result, [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


@torch.inference_mode()
def verify_greedy(model: TinyGPT, prompt: torch.Tensor, output, *, tol: float = 1e-4) -> int:
    """How many tokens of `output` are NOT the greedy choice of the reference model given the tokens before them.

    One full (uncached) forward over prompt + output gives the reference logits at every position; a token counts as
    right when its logit is within `tol` of the largest (float rounding may reorder exact near-ties). Lesson 07.
    """
    prompt = prompt.reshape(-1)
    output = torch.as_tensor(list(output) if not isinstance(output, torch.Tensor) else output, dtype=torch.long)
    if output.numel() == 0:
        return 0
    seq = torch.cat([prompt, output.reshape(-1)])[None, :-1]
    logits = model(seq)[0, prompt.numel() - 1 :]  # the logits that chose each output token
    chosen = logits.gather(1, output.reshape(-1, 1))[:, 0]
    return int((chosen < logits.max(dim=1).values - tol).sum())


def kv_cache_bytes_per_token(cfg: GPTConfig, dtype=torch.float32, n_kv_heads: int | None = None) -> int:
    """Bytes of KV cache one token adds: 2 (k and v) x layers x n_kv_heads x head_dim x bytes per element (lesson 07).

    `n_kv_heads` defaults to cfg.n_heads (multi-head attention, where n_kv_heads x head_dim = d_model); grouped-query
    attention shares each key/value head among several query heads, so fewer are stored (Llama-3-8B: 8 of 32).
    """
    kv_heads = cfg.n_heads if n_kv_heads is None else n_kv_heads
    if not 1 <= kv_heads <= cfg.n_heads or cfg.n_heads % kv_heads:
        raise ValueError(f"n_kv_heads must divide n_heads = {cfg.n_heads}, got {kv_heads}")
    return 2 * cfg.n_layers * kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


def decode_step_bytes(model: TinyGPT, position: int, batch: int = 1) -> int:
    """Bytes one decode step must read (lesson 07's memory-bound prediction): every weight once, whatever the batch,
    plus each sequence's KV cache up to `position`. Embedding tables count only the rows looked up.
    """
    if position < 0 or batch < 1:
        raise ValueError(f"position must be >= 0 and batch >= 1, got position={position}, batch={batch}")
    cfg = model.cfg
    dense = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "_emb" not in n)
    dense += sum(b.numel() * b.element_size() for b in model.buffers())
    rows = 2 * batch * cfg.d_model * model.tok_emb.weight.element_size()
    return dense + rows + batch * position * kv_cache_bytes_per_token(cfg, model.tok_emb.weight.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# attention as an online softmax
# ---------------------------------------------------------------------------------------------------------------------


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor [..., time, dim], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or q.shape[:-2] != k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"shapes do not fit attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
                         "expected q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] with the same leading dims")


def naive_attention(q, k, v, *, causal: bool = False):
    """softmax(q k^T / sqrt(d)) v the textbook way: the full [Tq, Tk] score matrix is materialised (lesson 07)."""
    _check_qkv(q, k, v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def tiled_attention(q, k, v, *, causal: bool = False, block_q: int = 64, block_k: int = 64):
    """FlashAttention's forward pass in PyTorch (lesson 07): one [block_q, block_k] tile of scores at a time.

    For each block of queries, the key/value tiles stream past while a running max m, a running sum denom and an
    unnormalised output acc are kept; a new tile rescales the old denom and acc by exp(m_old - m_new), the merge rule of
    lesson 06's online softmax. The [Tq, Tk] score matrix never exists. `causal` masks key j > query i (queries and
    keys aligned at position 0, as in scaled_dot_product_attention(is_causal=True)).
    """
    _check_qkv(q, k, v)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = q.new_empty(*q.shape[:-1], v.shape[-1])
    for i0 in range(0, n_q, block_q):
        qi = q[..., i0 : i0 + block_q, :] * scale
        rows = qi.shape[-2]
        m = q.new_full((*qi.shape[:-1], 1), float("-inf"))  # running max of each query row
        denom = q.new_zeros((*qi.shape[:-1], 1))  # running sum of exp(score - m)
        acc = q.new_zeros((*qi.shape[:-1], v.shape[-1]))  # running sum of exp(score - m) * v
        for j0 in range(0, n_k, block_k):
            if causal and j0 > i0 + rows - 1:
                break  # every key from here on is in the future of every query in this block
            s = qi @ k[..., j0 : j0 + block_k, :].transpose(-2, -1)  # one tile of scores
            if causal and j0 + s.shape[-1] - 1 > i0:
                future = torch.arange(j0, j0 + s.shape[-1], device=q.device) > torch.arange(
                    i0, i0 + rows, device=q.device)[:, None]
                s = s.masked_fill(future, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)  # rescales what was summed against the old max
            denom = denom * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ v[..., j0 : j0 + block_k, :]
            m = m_new
        out[..., i0 : i0 + rows, :] = acc / denom
    return out


class _LiveBytes(TorchDispatchMode):
    """Counts the bytes of the storages operators allocate while they are alive, and the peak of that count."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._refs: dict[int, int] = {}
        self._size: dict[int, int] = {}

    def _drop(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.live -= self._size.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._refs:  # a view of (or in-place result on) a storage already counted
                self._refs[key] += 1
            elif key in inputs or storage.nbytes() == 0:  # a view of a tensor made outside the measurement
                continue
            else:
                self._refs[key], self._size[key] = 1, storage.nbytes()
                self.live += storage.nbytes()
                self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._drop, key)
        return out


def peak_live_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes held by tensors that operators allocated while fn() ran, its result included (lesson 07).

    Counted at the dispatcher: every operator's fresh output adds its storage's bytes until the last tensor using it
    is freed. Scratch buffers a fused kernel allocates inside itself are not operator outputs and are not seen.
    """
    mode = _LiveBytes()
    with mode:
        result = fn()
    del result
    return mode.peak


def sdpa_backend(q, k, v, **kwargs) -> list[str]:
    """The aten kernels F.scaled_dot_product_attention dispatched to for these inputs (profiled; lesson 07)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    names = [e.key for e in prof.key_averages()]
    return [n for n in names if "attention" in n and n != "aten::scaled_dot_product_attention"]


# ---------------------------------------------------------------------------------------------------------------------
# serving: a trace of requests, one engine step, two schedulers
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Request:
    """One generation request (lesson 07): what arrives, and what the engine fills in as it is served."""

    id: int
    arrival: float  # seconds after the trace starts
    prompt: torch.Tensor  # 1-d LongTensor
    max_new: int  # tokens to generate
    output: list[int] = field(default_factory=list)
    t_first: float | None = None  # clock when the first token came out (end of its prefill)
    t_done: float | None = None  # clock when the last token came out

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new


def make_trace(tok: CharTokenizer, n: int, *, rate: float, mean_new: float = 40, max_new: int = 192,
               prompt_len: tuple[int, int] = (8, 48), seed: int = 0, text: str | None = None) -> list[Request]:
    """A simulated arrival trace (lesson 07): Poisson arrivals at `rate` requests/s, prompts cut from `text` (default
    the corpus), output lengths geometric with mean `mean_new` (many short answers, a long tail), clipped to
    [1, max_new].
    """
    if n < 1 or rate <= 0 or not 1 <= mean_new <= max_new or not 1 <= prompt_len[0] <= prompt_len[1]:
        raise ValueError(f"make_trace needs n >= 1, rate > 0, 1 <= mean_new <= max_new and 1 <= prompt_len[0] <= "
                         f"prompt_len[1]; got n={n}, rate={rate}, mean_new={mean_new}, max_new={max_new}, "
                         f"prompt_len={prompt_len}")
    g = torch.Generator().manual_seed(seed)
    data = tok.encode(corpus_text() if text is None else text)
    if data.numel() <= prompt_len[1]:
        raise ValueError(f"the text has {data.numel()} tokens: too few to cut prompts of up to {prompt_len[1]}")
    gaps = torch.empty(n).exponential_(1.0, generator=g) / rate
    arrivals = (gaps.cumsum(0) - gaps[0]).tolist()
    p = 1.0 / mean_new  # geometric: P(len = k) = (1 - p)^(k - 1) p
    u = torch.rand(n, generator=g).clamp_min(1e-12)
    lengths = (torch.log(u) / math.log1p(-p)).ceil().clamp(1, max_new).long().tolist() if p < 1 else [1] * n
    trace = []
    for i in range(n):
        plen = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (1,), generator=g))
        start = int(torch.randint(0, data.numel() - plen, (1,), generator=g))
        trace.append(Request(i, arrivals[i], data[start : start + plen].clone(), int(lengths[i])))
    return trace


def fresh(trace: Sequence[Request]) -> list[Request]:
    """Unserved copies of a trace's requests (each scheduler runs on its own copy)."""
    return [Request(r.id, r.arrival, r.prompt, r.max_new) for r in trace]


class Engine:
    """Real model steps over `max_batch` KV-cache slots, and a clock (lesson 07).

    prefill(slot, request) runs the prompt through the model into that slot and emits the first token;
    decode(slots) runs ONE step for a batch of slots at once (each at its own position) and emits one token for each
    slot whose request is unfinished; a finished request still in the batch is computed and wasted (counted in
    `wasted_slot_steps`, the padding of static batching). release(slot) frees a slot. The clock is wall time, except
    that wait_until(t) jumps over idle time to the next arrival instead of sleeping.
    """

    def __init__(self, model: TinyGPT, max_batch: int, max_len: int | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model, self.max_batch = model, max_batch
        cfg = model.cfg
        self.max_len = max_len or cfg.max_len
        if not 1 <= self.max_len <= cfg.max_len:
            raise ValueError(f"the engine's max_len must lie in [1, {cfg.max_len}] (the model's positions), got {max_len}")
        dtype = model.tok_emb.weight.dtype
        shape = (max_batch, cfg.n_heads, self.max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layers)]
        self.lengths = torch.zeros(max_batch, dtype=torch.long)  # positions filled in each slot
        self.last = torch.zeros(max_batch, dtype=torch.long)  # the last token of each slot (the next step's input)
        self.slot_request: dict[int, Request] = {}
        self.steps: list[tuple[str, int, float, float]] = []  # (kind, slots, start, end) on the clock
        self.occupancy: list[list[int]] = []  # at each decode step: the length of every busy slot's sequence
        self.useful: list[int] = []  # at each decode step: how many slots produced a token someone wanted
        self.wasted_slot_steps = 0
        self._t0 = time.perf_counter()
        self._skipped = 0.0

    @property
    def clock(self) -> float:
        """Seconds since the engine started, plus the idle time wait_until() skipped."""
        return time.perf_counter() - self._t0 + self._skipped

    def wait_until(self, t: float) -> None:
        """Nothing to do until `t`: move the clock there without sleeping."""
        self._skipped += max(0.0, t - self.clock)

    def free_slots(self) -> list[int]:
        return [s for s in range(self.max_batch) if s not in self.slot_request]

    def _check_slot(self, slot) -> int:
        if not isinstance(slot, int) or not 0 <= slot < self.max_batch:
            raise ValueError(f"slot must be an int in [0, {self.max_batch}), got {slot!r}")
        return slot

    def _check_admission(self, slot: int, request: Request) -> None:
        """prefill()'s checks on the slot and the request's arrival (subclasses with other caches share them)."""
        self._check_slot(slot)
        if slot in self.slot_request:
            raise ValueError(f"slot {slot} still holds request {self.slot_request[slot].id}: release() it first")
        if request.arrival > self.clock + 1e-9:
            raise ValueError(f"request {request.id} arrives at {request.arrival:.4f} s; the clock is at "
                             f"{self.clock:.4f} s: it cannot be served before it arrives")

    def _emit_first(self, slot: int, request: Request, token: int, start: float) -> int:
        """After a prefill: `token` is the slot's next input and the request's first output; the step is logged."""
        self.last[slot] = token
        self.slot_request[slot] = request
        request.output.append(token)
        request.t_first = self.clock
        if request.done:
            request.t_done = request.t_first
        self.steps.append(("prefill", 1, start, self.clock))
        return token

    def _check_decode(self, slots: list[int]) -> None:
        """decode()'s checks: distinct slots, each holding a request."""
        if not slots or len(set(slots)) != len(slots):
            raise ValueError(f"decode() needs distinct busy slots, got {slots}")
        for s in slots:
            self._check_slot(s)
            if s not in self.slot_request:
                raise ValueError(f"slot {s} holds no request: prefill() one into it first")

    def _emit_step(self, slots: list[int], idx: torch.Tensor, tokens: torch.Tensor, start: float) -> list[int]:
        """After a decode step: advance the slots, hand each unfinished request its token, log the step."""
        self.lengths[idx] += 1
        self.last[idx] = tokens
        now = self.clock
        out = tokens.tolist()
        self.useful.append(sum(not self.slot_request[s].done for s in slots))
        for s, t in zip(slots, out, strict=True):
            request = self.slot_request[s]
            if request.done:
                self.wasted_slot_steps += 1  # a finished sequence kept in a fixed batch: computed, thrown away
                continue
            request.output.append(t)
            if request.done:
                request.t_done = now
        self.steps.append(("decode", len(slots), start, now))
        self.occupancy.append(self.lengths[sorted(self.slot_request)].tolist())
        return out

    @torch.inference_mode()
    def prefill(self, slot: int, request: Request) -> int:
        """Process request.prompt into `slot`; append the first generated token to request.output and return it."""
        self._check_admission(slot, request)
        n = request.prompt.numel()
        if n < 1 or n + request.max_new > self.max_len:
            raise ValueError(f"request {request.id}: prompt {n} + max_new {request.max_new} tokens must fit the "
                             f"engine's max_len {self.max_len}, with at least one prompt token")
        start = self.clock
        x = self.model.embed(request.prompt[None], 0)
        for i, block in enumerate(self.model.blocks):
            q, k, v = block.project(x)
            self.k[i][slot, :, :n] = k[0]
            self.v[i][slot, :, :n] = v[0]
            x = block.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        self.lengths[slot] = n
        return self._emit_first(slot, request, int(self.model.logits(x[0, -1]).argmax()), start)

    @torch.inference_mode()
    def decode(self, slots: Sequence[int]) -> list[int]:
        """One decode step for these slots together (each at its own position). Returns the token of each slot."""
        slots = list(slots)
        self._check_decode(slots)
        idx = torch.tensor(slots)
        pos = self.lengths[idx]  # where each slot's new token goes
        if int(pos.max()) >= self.max_len:
            raise ValueError(f"a slot is full ({self.max_len} positions): release it")
        start = self.clock
        span = int(pos.max()) + 1
        visible = (torch.arange(span)[None, :] <= pos[:, None])[:, None, None, :]  # [n, 1, 1, span]: own positions
        x = self.model.embed(self.last[idx][:, None], pos[:, None])
        for i, block in enumerate(self.model.blocks):
            q, k, v = block.project(x)  # [n, H, 1, Dh]
            self.k[i][idx, :, pos] = k[:, :, 0]  # each slot writes at its own position
            self.v[i][idx, :, pos] = v[:, :, 0]
            attn = F.scaled_dot_product_attention(q, self.k[i][idx, :, :span], self.v[i][idx, :, :span],
                                                  attn_mask=visible)
            x = block.finish(x, attn)
        return self._emit_step(slots, idx, self.model.logits(x[:, 0]).argmax(dim=-1), start)

    def release(self, slot: int) -> Request:
        """Free `slot` (its request should be done) and return the request it held."""
        self._check_slot(slot)
        if slot not in self.slot_request:
            raise ValueError(f"slot {slot} holds no request")
        self.lengths[slot] = 0
        return self.slot_request.pop(slot)


def decode_step_seconds(model: TinyGPT, max_batch: int, *, prompt_len: int = 16, steps: int = 32) -> float:
    """Median seconds of one engine decode step with every slot busy (sets a trace's arrival rate; lesson 07)."""
    engine = Engine(model, max_batch, max_len=min(model.cfg.max_len, prompt_len + steps + 2))
    for slot in range(max_batch):
        engine.prefill(slot, Request(slot, 0.0, torch.zeros(prompt_len, dtype=torch.long), steps + 2))
    for _ in range(steps):
        engine.decode(list(range(max_batch)))
    return float(torch.tensor([end - start for kind, _, start, end in engine.steps if kind == "decode"]).median())


def run_static(engine: Engine, trace: Sequence[Request]) -> list[Request]:
    """Request-level (static) batching: form a batch of up to max_batch requests, run it until its LAST request is
    done (finished rows stay in the fixed-shape batch), then form the next. Lesson 07's baseline.
    """
    pending = deque(sorted(trace, key=lambda r: r.arrival))
    while pending:
        batch = [pending.popleft() for _ in range(min(engine.max_batch, len(pending)))]
        engine.wait_until(batch[-1].arrival)  # a static batch waits until it is full (or the trace has run out)
        for slot, request in enumerate(batch):
            engine.prefill(slot, request)
        slots = list(range(len(batch)))
        while not all(r.done for r in batch):
            engine.decode(slots)  # every row of the batch, done or not
        for slot in slots:
            engine.release(slot)
    return list(trace)


def run_continuous(engine: Engine, trace: Sequence[Request]) -> list[Request]:
    """Iteration-level (continuous) batching, as in Orca and vLLM: before every decode step, admit waiting requests
    into free slots (prefill), and retire each request the moment it is done, so its slot is reused at once.
    """
    pending = deque(sorted(trace, key=lambda r: r.arrival))  # not arrived yet
    waiting: deque[Request] = deque()  # arrived, no slot yet
    running: dict[int, Request] = {}  # slot -> request
    while pending or waiting or running:
        while pending and pending[0].arrival <= engine.clock:
            waiting.append(pending.popleft())
        if not waiting and not running:
            engine.wait_until(pending[0].arrival)  # idle: jump to the next arrival
            continue
        for slot in engine.free_slots():
            if not waiting:
                break
            request = waiting.popleft()
            engine.prefill(slot, request)
            running[slot] = request
        busy = [slot for slot, request in running.items() if not request.done]
        if busy:
            engine.decode(busy)  # one step for every unfinished request, whatever its position
        for slot in [slot for slot, request in running.items() if request.done]:
            engine.release(slot)
            del running[slot]
    return list(trace)


def summarize(trace: Sequence[Request], engine: Engine | None = None) -> dict:
    """Throughput, time to first token and time per output token of a served trace (lesson 07)."""
    if not trace:
        raise ValueError("summarize() needs a non-empty trace")
    unfinished = [r.id for r in trace if not r.done or r.t_done is None or r.t_first is None]
    if unfinished:
        raise ValueError(f"requests {unfinished[:10]} were not served to the end (each needs max_new tokens)")
    tokens = sum(len(r.output) for r in trace)
    span = max(r.t_done for r in trace) - min(r.arrival for r in trace)
    ttft = torch.tensor([r.t_first - r.arrival for r in trace])
    tpot = torch.tensor([(r.t_done - r.t_first) / (len(r.output) - 1) for r in trace if len(r.output) > 1])
    out = {
        "requests": len(trace), "tokens": tokens, "span_s": span, "throughput_tok_s": tokens / span,
        "ttft_p50_s": float(ttft.median()), "ttft_p95_s": float(torch.quantile(ttft, 0.95)),
        "tpot_p50_s": float(tpot.median()) if tpot.numel() else float("nan"),
    }
    if engine is not None:
        decode = [s for s in engine.steps if s[0] == "decode"]
        slot_steps = sum(s[1] for s in decode)
        out.update(decode_steps=len(decode), prefill_steps=len(engine.steps) - len(decode),
                   mean_batch=slot_steps / max(len(decode), 1),
                   wasted_fraction=engine.wasted_slot_steps / max(slot_steps, 1))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# paged KV cache
# ---------------------------------------------------------------------------------------------------------------------


class PagedKVCache:
    """KV cache in fixed-size blocks with a block table per sequence (vLLM's PagedAttention bookkeeping; lesson 07).

    The pools hold [n_layers, num_blocks, n_heads, block_size, head_dim] keys and values. append(seq, k, v) writes
    new positions (allocating a block only when the last one is full); gather(seq) reads a sequence back as
    contiguous [n_layers, n_heads, length, head_dim] tensors; free(seq) returns its blocks to the free list.
    """

    def __init__(self, cfg: GPTConfig, num_blocks: int, block_size: int = 16, dtype=torch.float32):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.cfg, self.num_blocks, self.block_size = cfg, num_blocks, block_size
        shape = (cfg.n_layers, num_blocks, cfg.n_heads, block_size, cfg.head_dim)
        self.k, self.v = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.block_table: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}

    def append(self, seq, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append T positions to `seq` (created on first use): k, v of shape [n_layers, n_heads, T, head_dim]."""
        want = (self.cfg.n_layers, self.cfg.n_heads, self.cfg.head_dim)
        if k.shape != v.shape or k.dim() != 4 or (k.shape[0], k.shape[1], k.shape[3]) != want:
            raise ValueError(f"k and v must be [n_layers={want[0]}, n_heads={want[1]}, T, head_dim={want[2]}], got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        table = self.block_table.setdefault(seq, [])
        length = self.lengths.get(seq, 0)
        new = k.shape[2]
        need = -(-(length + new) // self.block_size) - len(table)
        if need > len(self.free_blocks):
            raise MemoryError(f"sequence {seq!r} needs {need} more blocks of {self.block_size} positions; "
                              f"{len(self.free_blocks)} of {self.num_blocks} are free: free a finished sequence")
        table.extend(self.free_blocks.pop() for _ in range(need))
        for t in range(new):
            block, offset = divmod(length + t, self.block_size)
            self.k[:, table[block], :, offset] = k[:, :, t]
            self.v[:, table[block], :, offset] = v[:, :, t]
        self.lengths[seq] = length + new

    def gather(self, seq) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `seq`, contiguous: [n_layers, n_heads, length, head_dim] each."""
        if seq not in self.block_table:
            raise KeyError(f"no sequence {seq!r} in the paged cache (known: {list(self.block_table)[:10]})")
        blocks = torch.tensor(self.block_table[seq], dtype=torch.long)
        n = self.lengths[seq]

        def read(pool):
            x = pool[:, blocks]  # [L, nb, H, bs, Dh]
            return x.permute(0, 2, 1, 3, 4).reshape(x.shape[0], x.shape[2], -1, x.shape[4])[:, :, :n]

        return read(self.k), read(self.v)

    def free(self, seq) -> None:
        if seq not in self.block_table:
            raise KeyError(f"no sequence {seq!r} in the paged cache")
        self.free_blocks.extend(reversed(self.block_table.pop(seq)))
        del self.lengths[seq]

    def stats(self) -> dict:
        """Blocks in use, positions stored, and the slots allocated but unused (only ever in a sequence's last block)."""
        used = self.num_blocks - len(self.free_blocks)
        tokens = sum(self.lengths.values())
        return {"sequences": len(self.lengths), "blocks_used": used, "tokens": tokens,
                "slots_allocated": used * self.block_size, "slots_wasted": used * self.block_size - tokens}


def reserved_slots(lengths: Sequence[int], *, max_len: int, block_size: int) -> dict:
    """KV slots reserved for sequences of these current lengths: contiguous (max_len each, the engine's slots) vs
    paged (whole blocks of block_size). Lesson 07 counts the waste of both over a served trace.
    """
    if any(n < 0 or n > max_len for n in lengths):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {list(lengths)[:10]}")
    used = sum(lengths)
    contiguous = max_len * len(lengths)
    paged = block_size * sum(-(-n // block_size) for n in lengths)
    return {"used": used, "contiguous": contiguous, "paged": paged}


# ---------------------------------------------------------------------------------------------------------------------
# weight-only int8
# ---------------------------------------------------------------------------------------------------------------------


class Int8Linear(nn.Module):
    """A Linear layer whose weights are stored as int8 with one fp scale per output channel (lesson 07).

    w ~= w_int8 * scale[:, None], scale = max|w_row| / 127; the scale has the dtype of the layer it came from (quantize
    a bf16 model for bf16 activations). On the CPU the matmul reads the int8 weights directly through aten's
    _weight_int8pack_mm where this torch has it and the activations have the scale's dtype; elsewhere the weights are
    dequantized first. On x86 that kernel is vectorized (AVX-512/AVX2) for bf16 activations only: fp32 or fp16
    activations take a scalar loop, several times slower (lesson 07 measures both).
    """

    def __init__(self, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        if weight_int8.dtype != torch.int8 or weight_int8.dim() != 2 or scale.shape != weight_int8.shape[:1]:
            raise ValueError(f"Int8Linear needs an int8 [out, in] weight and a [out] scale, got "
                             f"{weight_int8.dtype} {tuple(weight_int8.shape)} and {tuple(scale.shape)}")
        self.register_buffer("weight_int8", weight_int8.contiguous())
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = weight_int8.shape[1], weight_int8.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Int8Linear.from_linear needs an nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale.to(linear.weight.dtype), bias)

    def dequantized(self) -> torch.Tensor:
        return self.weight_int8.to(self.scale.dtype) * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Int8Linear expects inputs with {self.in_features} features, got {tuple(x.shape)}")
        if x.device.type == "cpu" and x.dtype == self.scale.dtype and hasattr(torch.ops.aten, "_weight_int8pack_mm"):
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features).contiguous(), self.weight_int8,
                                                   self.scale).reshape(*x.shape[:-1], self.out_features)
        else:
            y = F.linear(x, self.dequantized().to(x.dtype))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` with every nn.Linear replaced by an Int8Linear (embeddings and norms stay fp)."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear.from_linear(child))
    return model


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of the linear layers' weights (and int8 scales): what weight-only quantization shrinks."""
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
        elif isinstance(module, Int8Linear):
            total += module.weight_int8.numel() + module.scale.numel() * module.scale.element_size()
    return total
