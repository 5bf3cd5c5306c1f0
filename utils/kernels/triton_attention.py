"""FlashAttention's forward pass in the Triton language, run by Triton's interpreter on CPU tensors and compiled on a
CUDA GPU (lessons 06 and 07: the online-softmax merge of 06 applied to lesson 07's tiled attention).

``flash_attention_kernel``: one program per (query block, batch x head). It loads its ``BLOCK_M`` queries once, then
streams the keys and values past in blocks of ``BLOCK_N``, keeping per query row a running max ``m``, a running sum
``denom`` of exp(score - m) and an unnormalised output ``acc``; a new block rescales ``denom`` and ``acc`` by
exp(m_old - m_new), the (max, sum) merge rule of lesson 06. The [Tq, Tk] score matrix never leaves the program. Options:
``causal`` (key j hidden from query i when j > i, queries and keys aligned at position 0, as in
scaled_dot_product_attention(is_causal=True)) and ``kv_lens`` (per batch element, how many keys are real: a padded
batch). A row that sees no key at all (kv_lens of 0) comes out 0, which is what torch's
scaled_dot_product_attention gives on CPU for a row whose mask is all False (torch 2.14, default and math
backends alike; tests/build/test_triton_attention.py checks it; not checked on a GPU backend).

The IO-aware argument, counted: ``count_traffic(q=..., k=..., ...)`` wraps the interpreter's masked load and store
(internals of triton 3.x, as ``triton_matmul.count_loads`` does) and adds, per program and per named tensor, the
bytes of the unmasked lanes. It attributes each address to the tensor whose storage holds it, which count_loads
cannot (it sums per program only). ``naive_attention`` is the same computation the textbook way, with the same
query blocks: a scores kernel writes S = QK^T * scale to global memory, ``triton_softmax.softmax_row`` turns it into
P, a third kernel reads P and V. It loads Q, K and V exactly as the flash kernel does, plus the round trips of S and
P: what a cuBLAS-softmax-cuBLAS chain moves, before any L2 hit. ``predicted_traffic`` is that arithmetic, which the
counts must match.

Limits: head_dim and the blocks are powers of two of at least 16 (tl.arange needs a power of two, and the compiled
tl.dot needs 16 or more along each dimension); float32, float16 or bfloat16, accumulated in float32. float32 dots use
input_precision="ieee" (no TF32), for parity at float32 tolerance; the GPU's fast path is fp16/bf16.
No ``from __future__ import annotations`` here: the kernels' ``tl.constexpr`` annotations are read by triton.
"""

import collections
import contextlib
import dataclasses
import math

import torch
import triton
import triton.language as tl

from utils.kernels import occupancy
from utils.kernels.triton_softmax import _interpret_forced, interpreted, runs_in, softmax_row

__all__ = ["DTYPES", "flash_attention_kernel", "flash_attention", "naive_attention", "count_traffic",
           "traffic_by_tensor", "predicted_traffic", "GpuBuild", "compile_for_gpu"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_BLOCK = 16  # the smallest tl.dot dimension Triton compiles (M, N and K)


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, kv_lens_ptr,
                           sq_b, sq_h, sq_t, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h, so_t,
                           heads, n_q, n_k, scale,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr):
    block = tl.program_id(0)  # which BLOCK_M queries
    bh = tl.program_id(1)  # which (batch, head)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    keys = tl.arange(0, BLOCK_N)
    q_base = q_ptr + b * sq_b + h * sq_h
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h
    # the queries are loaded once and stay on chip for the whole key loop; rows past n_q are masked (ragged Tq)
    q = tl.load(q_base + rows[:, None] * sq_t + dims[None, :], mask=rows[:, None] < n_q, other=0.0)
    end = n_k  # keys at or past `end` are never loaded
    if HAS_LENS:
        end = tl.minimum(tl.load(kv_lens_ptr + b), n_k)  # a padded batch: this element has fewer real keys
    if CAUSAL:
        end = tl.minimum(end, (block + 1) * BLOCK_M)  # every later key is in the future of every query here
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)  # running max of each query row
    denom = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp(score - m)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running sum of exp(score - m) * v
    for start in range(0, end, BLOCK_N):
        cols = start + keys
        live = cols < end
        kt = tl.load(k_base + cols[None, :] * sk_t + dims[:, None], mask=live[None, :], other=0.0)  # K^T block
        s = tl.dot(q, kt, input_precision="ieee") * scale  # one [BLOCK_M, BLOCK_N] tile of scores
        visible = live[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None])
        s = tl.where(visible, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        # the merge rule; while a row has seen only masked keys, measure against 0 so denom stays 0, not NaN
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.exp(s - ref[:, None])
        alpha = tl.exp(m - ref)  # rescales what was summed against the old max
        denom = denom * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * sv_t + dims[None, :], mask=live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m = m_new
    out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]  # a row that saw no key: 0, as scaled_dot_product_attention
    o_base = o_ptr + b * so_b + h * so_h
    tl.store(o_base + rows[:, None] * so_t + dims[None, :], out.to(o_ptr.dtype.element_ty), mask=rows[:, None] < n_q)


@triton.jit
def _scores_kernel(q_ptr, k_ptr, s_ptr, sq_bh, sq_t, sk_bh, sk_t, ss_bh, ss_t, n_q, n_k, scale,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """S = Q K^T * scale, written to global memory (masked entries as -inf): the first kernel of naive attention."""
    block = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + bh * sq_bh + rows[:, None] * sq_t + dims[None, :], mask=rows[:, None] < n_q, other=0.0)
    end = n_k
    if CAUSAL:
        end = tl.minimum(end, (block + 1) * BLOCK_M)
    for start in range(0, n_k, BLOCK_N):  # every column of S is written, also the masked ones
        cols = start + tl.arange(0, BLOCK_N)
        kt = tl.load(k_ptr + bh * sk_bh + cols[None, :] * sk_t + dims[:, None], mask=cols[None, :] < end, other=0.0)
        s = tl.dot(q, kt, input_precision="ieee") * scale
        if CAUSAL:
            s = tl.where(cols[None, :] <= rows[:, None], s, -float("inf"))
        tl.store(s_ptr + bh * ss_bh + rows[:, None] * ss_t + cols[None, :], s,
                 mask=(rows[:, None] < n_q) & (cols[None, :] < n_k))


@triton.jit
def _pv_kernel(p_ptr, v_ptr, o_ptr, sp_bh, sp_t, sv_bh, sv_t, so_bh, so_t, n_q, n_k,
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """O = P V with P read back from global memory: the last kernel of naive attention."""
    block = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        p = tl.load(p_ptr + bh * sp_bh + rows[:, None] * sp_t + cols[None, :],
                    mask=(rows[:, None] < n_q) & (cols[None, :] < n_k), other=0.0)
        v = tl.load(v_ptr + bh * sv_bh + cols[:, None] * sv_t + dims[None, :], mask=cols[:, None] < n_k, other=0.0)
        acc += tl.dot(p, v, input_precision="ieee")
    tl.store(o_ptr + bh * so_bh + rows[:, None] * so_t + dims[None, :], acc, mask=rows[:, None] < n_q)


def _power_of_two(value, name: str, what: str, low: int = MIN_BLOCK, high: int = 256) -> int:
    if not isinstance(value, int) or value < low or value > high or value & (value - 1):
        raise ValueError(f"{what}: {name} must be a power of two between {low} and {high} (tl.arange needs a power "
                         f"of two, the compiled tl.dot at least {MIN_BLOCK}), got {value!r}")
    return value


def _check(q, k, v, what: str, dtypes=DTYPES):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: expected {name} a torch.Tensor [batch, heads, time, head_dim], got "
                            f"{type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{what}: expected {name} of 4 dimensions [batch, heads, time, head_dim] (the layout of "
                             f"scaled_dot_product_attention), got shape {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"{what}: expected {name} of dtype {', '.join(str(d) for d in dtypes)}, got {t.dtype}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{what}: expected {name}'s head_dim contiguous (stride 1), got strides "
                             f"{tuple(t.stride())}; pass {name}.contiguous()")
    if q.device != k.device or k.device != v.device or q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"{what}: q, k and v must share dtype and device, got {q.dtype} on {q.device}, {k.dtype} on "
                         f"{k.device}, {v.dtype} on {v.device}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: expected CPU tensors (interpreter) or CUDA tensors (compiled), got {q.device}")
    (b, h, _, d), (bk, hk, _, dk) = q.shape, k.shape
    if (b, h, d) != (bk, hk, dk) or v.shape != k.shape:
        raise ValueError(f"{what}: expected q [B, H, Tq, D], k and v [B, H, Tk, D], got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if d < MIN_BLOCK or d > 256 or d & (d - 1):
        raise ValueError(f"{what}: head_dim must be a power of two between {MIN_BLOCK} and 256 (tl.arange needs a "
                         f"power of two, the compiled tl.dot at least {MIN_BLOCK}), got {d}; pad the head dimension "
                         f"with zeros to {max(MIN_BLOCK, triton.next_power_of_2(d))}")


def _lens(kv_lens, batch: int, n_k: int, device) -> torch.Tensor | None:
    if kv_lens is None:
        return None
    kv_lens = torch.as_tensor(kv_lens)
    if kv_lens.shape != (batch,) or kv_lens.is_floating_point() or kv_lens.is_complex() or kv_lens.dtype == torch.bool:
        raise ValueError(f"flash_attention: kv_lens must be integers, one per batch element (shape ({batch},)), got "
                         f"{kv_lens.dtype} of shape {tuple(kv_lens.shape)}")
    if batch and (int(kv_lens.min()) < 0 or int(kv_lens.max()) > n_k):
        raise ValueError(f"flash_attention: kv_lens must lie between 0 and the number of keys {n_k}, got "
                         f"{kv_lens.tolist()}")
    return kv_lens.to(device=device, dtype=torch.int32)


def _out(out, q, what: str) -> torch.Tensor:
    """`out` checked against q (same shape, dtype, device, head_dim contiguous), or a new tensor like q."""
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what}: out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"{what}: out must match q: expected {tuple(q.shape)} {q.dtype} on {q.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{what}: out's head_dim must be contiguous (stride 1), got strides {tuple(out.stride())}")
    return out


def flash_attention(q, k, v, *, causal: bool = False, kv_lens=None, scale: float | None = None, out=None,
                    block_m: int | None = None, block_n: int | None = None, num_warps: int = 4,
                    num_stages: int = 2) -> torch.Tensor:
    """softmax(q k^T * scale) v with ``flash_attention_kernel`` (lessons 06, 07): q [B, H, Tq, D], k and v
    [B, H, Tk, D], D a power of two; `kv_lens` (B integers) masks each batch element's padded keys; `scale` defaults
    to 1/sqrt(D); `out`, a tensor like q, receives the result. CPU tensors run in Triton's interpreter, CUDA tensors
    compiled (`num_warps`, `num_stages` apply there only). Matches F.scaled_dot_product_attention(q, k, v,
    is_causal=causal, attn_mask=<the kv_lens mask>, scale=scale).

    Blocks default to 64 x 64 for float16/bfloat16 and 32 x 32 for float32: compiled for sm_90 at D=64, the float32
    kernel (an ieee dot, no tensor cores) spills tens of KB per thread at 64 x 64 and nothing or next to nothing at
    32 x 32 (ptxas, see compile_for_gpu; the exact figures depend on the triton version)."""
    _check(q, k, v, "flash_attention")
    default_block = 32 if q.dtype == torch.float32 else 64
    block_m = default_block if block_m is None else block_m
    block_n = default_block if block_n is None else block_n
    _power_of_two(block_m, "block_m", "flash_attention")
    _power_of_two(block_n, "block_n", "flash_attention")
    (batch, heads, n_q, d), n_k = q.shape, k.shape[2]
    lens = _lens(kv_lens, batch, n_k, q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = _out(out, q, "flash_attention")
    if o.numel() == 0:
        return o
    kernel = flash_attention_kernel if runs_in(q) == "compiled" else interpreted(flash_attention_kernel)
    meta = {"num_warps": num_warps, "num_stages": num_stages} if runs_in(q) == "compiled" else {}
    kernel[(triton.cdiv(n_q, block_m), batch * heads)](
        q, k, v, o, lens if lens is not None else q,  # kv_lens_ptr is never read without HAS_LENS
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3], heads, n_q, n_k, scale,
        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal), HAS_LENS=lens is not None, **meta)
    return o


def naive_attention(q, k, v, *, causal: bool = False, out=None, block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """The textbook attention as three float32 Triton kernels with the score matrix in global memory (lesson 06):
    S = Q K^T * scale, P = softmax(S) (``triton_softmax.softmax_row``), O = P V, same query blocks as the flash kernel.
    It exists to be counted against it (``count_traffic``); CPU tensors only (interpreted), contiguous for the count
    to see q, k, v and out themselves (a non-contiguous one is copied first, and its reads count as "other")."""
    _check(q, k, v, "naive_attention", dtypes=(torch.float32,))
    if q.device.type != "cpu":
        raise ValueError(f"naive_attention: a baseline for counting bytes in the interpreter, expected CPU tensors, "
                         f"got {q.device}")
    _power_of_two(block_m, "block_m", "naive_attention")
    _power_of_two(block_n, "block_n", "naive_attention")
    (batch, heads, n_q, d), n_k = q.shape, k.shape[2]
    result = _out(out, q, "naive_attention")
    if not result.is_contiguous():
        raise ValueError(f"naive_attention: out must be contiguous, got strides {tuple(result.stride())}")
    q3, k3, v3 = (t.reshape(batch * heads, t.shape[2], d) for t in (q, k, v))
    o = result.view(batch * heads, n_q, d)
    s = torch.empty(batch * heads, n_q, n_k)  # the [Tq, Tk] scores, in memory
    if o.numel() == 0 or n_k == 0:
        return result.zero_()
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    interpreted(_scores_kernel)[grid](q3, k3, s, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), s.stride(0),
                                      s.stride(1), n_q, n_k, 1.0 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m,
                                      BLOCK_N=block_n, CAUSAL=bool(causal))
    p = softmax_row(s.view(-1, n_k)).view(s.shape)  # P, also in memory
    interpreted(_pv_kernel)[grid](p, v3, o, p.stride(0), p.stride(1), v3.stride(0), v3.stride(1), o.stride(0),
                                  o.stride(1), n_q, n_k, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n)
    return result


@contextlib.contextmanager
def count_traffic(**tensors):
    """Inside the block, count the bytes each interpreted ``tl.load`` and ``tl.store`` moves (unmasked lanes x element
    size), by program and by tensor: yields a Counter {(program, name, "load" | "store"): bytes}, `name` being the
    keyword its storage was given under, or "other" for any other address (lessons 06, 07).

    Give the tensors whose traffic you want named: ``count_traffic(q=q, k=k, v=v, o=out)``. CPU tensors only (the
    interpreter then reads them in place, so their addresses are the ones the kernel sees). Tensors a function
    allocates inside the block (naive_attention's S and P) count as "other".
    """
    import numpy
    from triton.runtime import interpreter

    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise ValueError(f"count_traffic: {name} must be a CPU tensor, got "
                             f"{t.device if isinstance(t, torch.Tensor) else type(t).__name__}")
    builder = getattr(interpreter, "interpreter_builder", None)
    load, store = getattr(builder, "create_masked_load", None), getattr(builder, "create_masked_store", None)
    if load is None or store is None or "create_masked_load" in vars(builder) or "create_masked_store" in vars(builder):
        raise RuntimeError(f"count_traffic needs triton 3.x's interpreter (interpreter_builder.create_masked_load and "
                           f"create_masked_store); triton {triton.__version__} has none, or a count is already running")
    spans = [(name, t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for name, t in tensors.items()]
    counts: collections.Counter = collections.Counter()

    def add(kind, ptrs, mask):
        itemsize = ptrs.get_element_ty().primitive_bitwidth // 8
        addresses = numpy.asarray(ptrs.data).astype(numpy.uint64)
        live = numpy.broadcast_to(numpy.asarray(mask.data, dtype=bool), addresses.shape)
        left = live.copy()
        for name, start, size in spans:
            inside = left & (addresses >= start) & (addresses < start + size)
            if inside.any():
                counts[builder.grid_idx, name, kind] += int(inside.sum()) * itemsize
                left &= ~inside
        if left.any():
            counts[builder.grid_idx, "other", kind] += int(left.sum()) * itemsize

    def counting_load(ptrs, mask, other, *args, **kwargs):
        add("load", ptrs, mask)
        return load(ptrs, mask, other, *args, **kwargs)

    def counting_store(ptrs, value, mask, *args, **kwargs):
        add("store", ptrs, mask)
        return store(ptrs, value, mask, *args, **kwargs)

    builder.create_masked_load, builder.create_masked_store = counting_load, counting_store  # instance attributes
    try:
        yield counts
    finally:
        del builder.create_masked_load, builder.create_masked_store


def traffic_by_tensor(counts) -> dict:
    """{(name, kind): bytes} summed over the programs of a ``count_traffic`` Counter."""
    out: collections.Counter = collections.Counter()
    for (_program, name, kind), n in counts.items():
        out[name, kind] += n
    return dict(out)


def predicted_traffic(batch_heads: int, n_q: int, n_k: int, head_dim: int, *, block_m: int = 64,
                      causal: bool = False, itemsize: int = 4) -> dict:
    """Bytes moved by ``flash_attention`` and ``naive_attention`` at these sizes, by the arithmetic of their loops
    (the count_traffic tests check the kernels against it): {"flash": {(name, kind): bytes}, "naive": {...}}.

    Flash: Q read once, K and V once per query block (causal: only the keys up to the block's last query), O written
    once. Naive: the same Q, K and V reads, plus S written by the scores kernel, read and P written by the softmax,
    P read by the P V kernel: 4 x Tq x Tk values that flash keeps on chip.
    """
    d, blocks = head_dim, -(-n_q // block_m) if n_q else 0
    keys = sum(min(n_k, (i + 1) * block_m) if causal else n_k for i in range(blocks))  # keys each block loads
    reads = {("q", "load"): n_q * d, ("k", "load"): keys * d, ("v", "load"): keys * d,
             ("o", "store"): n_q * d}
    flash = {key: batch_heads * n * itemsize for key, n in reads.items()}
    scores = batch_heads * n_q * n_k * itemsize
    naive = {**flash, ("v", "load"): batch_heads * blocks * n_k * d * itemsize,  # P V reads every key, masked or not
             ("other", "store"): 2 * scores, ("other", "load"): 2 * scores}
    return {"flash": flash, "naive": naive}


@dataclasses.dataclass
class GpuBuild:
    """What Triton's compiler and ptxas made of ``flash_attention_kernel`` for an NVIDIA GPU (lesson 06)."""

    arch: int
    head_dim: int
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    dtype: str
    registers: int | None  # per thread, from ptxas -v
    spill_bytes: int | None
    shared_bytes: int  # dynamic shared memory per program, from Triton's metadata (ptxas sees none of it)
    ptx: str

    def __str__(self) -> str:
        return (f"flash_attention_kernel D={self.head_dim} {self.block_m}x{self.block_n} {self.dtype}, "
                f"{self.num_warps} warps, {self.num_stages} stages, sm_{self.arch}: {self.registers} registers per "
                f"thread, {self.shared_bytes} B shared memory, {self.spill_bytes} B spilled")


def compile_for_gpu(*, head_dim: int = 64, block_m: int = 64, block_n: int = 64, dtype: torch.dtype = torch.float16,
                    causal: bool = True, kv_lens: bool = False, num_warps: int = 4, num_stages: int = 2,
                    arch: int = 90) -> GpuBuild:
    """Compile ``flash_attention_kernel`` for compute capability `arch` with Triton's compiler, no GPU needed, and read
    its registers (ptxas -v, utils.kernels.occupancy.ptxas_usage) and shared memory (Triton's metadata): the inputs
    of an occupancy calculation (lesson 06). Must run in a process without TRITON_INTERPRET=1."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpret_forced():
        raise RuntimeError("TRITON_INTERPRET=1 is set: this process runs triton.language in its interpreter; compile "
                           "in a process started without it")
    if dtype not in DTYPES:
        raise TypeError(f"compile_for_gpu: dtype must be one of {DTYPES}, got {dtype}")
    for name, value in (("head_dim", head_dim), ("block_m", block_m), ("block_n", block_n)):
        _power_of_two(value, name, "compile_for_gpu")
    element = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    constexprs = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": bool(causal),
                  "HAS_LENS": bool(kv_lens)}
    signature = {p.name: "constexpr" if p.name in constexprs else "i32" for p in flash_attention_kernel.params}
    signature.update(q_ptr=f"*{element}", k_ptr=f"*{element}", v_ptr=f"*{element}", o_ptr=f"*{element}",
                     kv_lens_ptr="*i32", scale="fp32")
    compiled = triton.compile(ASTSource(flash_attention_kernel, signature, constexprs=constexprs),
                              target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    ptx = compiled.asm["ptx"]
    usage = occupancy.ptxas_usage(ptx)
    return GpuBuild(arch, head_dim, block_m, block_n, num_warps, num_stages, element, usage.registers,
                    usage.spill_bytes, int(compiled.metadata.shared), ptx)
