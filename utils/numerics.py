"""Floating-point numerics of inference (lesson 06, part 3: notebooks/06_numerics.ipynb).

The notebook prints the parts it teaches from this file:

- ``naive_sum()``, ``kahan_sum()``, ``pairwise_sum()``, ``fp64_sum()``: four ways to add float32 numbers, each one
  loop or one tree the notebook shows; ``exact_sum()`` is the reference (``math.fsum``: the exact sum rounded once to
  float64, far finer than any float32 error) and ``ulp_error()`` measures a result in float32 ulps of that reference;
- ``stagnation_input()``: the input where a running float32 sum loses everything it adds (its error reaches the
  worst-case bound) while the other methods stay exact;
- ``running_sum()``: a running sum rounded to a given dtype after every add (bf16 or fp16 accumulation, vectorised
  over rows), against the fp32 accumulation that matmul kernels use;
- ``rowwise_matmul()`` and ``batch_invariant()``: a matmul, and the linear and attention calls of a model, computed
  one row (one sequence) at a time, so every output comes from the same call whatever the batch: bitwise identical
  alone and in a batch.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["as_float32", "naive_sum", "kahan_sum", "pairwise_sum", "fp64_sum", "exact_sum", "ulp_error",
           "stagnation_input", "running_sum", "rowwise_matmul", "batch_invariant"]


def as_float32(x) -> np.ndarray:
    """x as a 1-D float32 NumPy array (a torch tensor or a NumPy array of float32), with a clear error otherwise."""
    if isinstance(x, torch.Tensor):
        if x.dtype != torch.float32:
            raise TypeError(f"expected float32 values, got a torch tensor of {x.dtype}: convert with .float() first")
        x = x.detach().cpu().numpy()
    if not isinstance(x, np.ndarray):
        raise TypeError(f"expected a 1-D float32 NumPy array or torch tensor, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"expected float32 values, got {x.dtype}: the lesson measures float32 error, convert with "
                        ".astype(np.float32)")
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"expected a non-empty 1-D array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("the values contain inf or nan: an error in ulps is not defined for them")
    return x


def naive_sum(x) -> np.float32:
    """Add the values one after another into one float32 accumulator (what a plain loop does)."""
    s = np.float32(0)
    for v in as_float32(x):
        s = s + v  # float32 + float32: rounded to float32 after every add
    return s


def kahan_sum(x) -> np.float32:
    """Kahan's compensated sum in float32: `c` carries the low-order bits each add rounded away."""
    s = np.float32(0)
    c = np.float32(0)  # the running compensation: what the last add lost, negated
    for v in as_float32(x):
        y = v - c  # the next value, corrected by what was lost so far
        t = s + y  # the big add: low-order bits of y are rounded away here...
        c = (t - s) - y  # ...and recovered here, exactly: (t - s) is what was really added
        s = t
    return s


def pairwise_sum(x) -> np.float32:
    """Pairwise (tree) summation in float32: add neighbours, halve, repeat; every value goes through ~log2(n) adds."""
    level = as_float32(x)
    if level.size & (level.size - 1):  # pad to a power of two with zeros (adding 0 is exact)
        level = np.concatenate([level, np.zeros((1 << level.size.bit_length()) - level.size, np.float32)])
    while level.size > 1:
        level = level[0::2] + level[1::2]  # one level of the tree: float32 adds, each rounded once
    return level[0]


def fp64_sum(x) -> np.float32:
    """A running sum in a float64 accumulator, rounded to float32 once at the end."""
    return np.float32(np.add.accumulate(as_float32(x), dtype=np.float64)[-1])


def exact_sum(x) -> float:
    """The reference: math.fsum is exact and rounds once to float64 (error ~1e-16 relative, ~1e-9 float32 ulps)."""
    return math.fsum(as_float32(x).astype(np.float64).tolist())


def ulp_error(value, exact: float) -> float:
    """|value - exact| in float32 ulps at `exact` (the spacing of float32 numbers there)."""
    if not math.isfinite(float(value)) or not math.isfinite(exact):
        raise ValueError(f"ulp_error needs finite numbers, got value={value!r}, exact={exact!r}")
    return abs(float(value) - exact) / float(np.spacing(np.float32(abs(exact))))


def stagnation_input(n: int) -> np.ndarray:
    """1.0 followed by n - 1 copies of 2**-24 (half a float32 ulp at 1.0): a running float32 sum rounds every one of
    them away (1 + 2**-24 is a tie, rounded to the even 1.0), so its error is the whole tail, (n - 1) * 2**-24."""
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 (one 1.0 and at least one small value), got {n!r}")
    x = np.full(n, 2.0**-24, dtype=np.float32)
    x[0] = 1.0
    return x


def running_sum(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Sum each row of x [rows, n] left to right, rounding the accumulator to `dtype` after every add (what a kernel
    that accumulates in bf16 or fp16 would do). Returns float32 [rows]."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating tensor [rows, n], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype must be torch.bfloat16, torch.float16 or torch.float32, got {dtype}")
    acc = torch.zeros(x.shape[0], dtype=dtype)
    for k in range(x.shape[1]):
        acc = acc + x[:, k].to(dtype)  # computed in float32, rounded once to `dtype`: an add in that precision
    return acc.float()


def _check_matmul(x: torch.Tensor, w: torch.Tensor) -> None:
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"x [M, K] @ w [K, N] needs matching K, got x {tuple(x.shape)} and w {tuple(w.shape)}")
    if x.dtype != w.dtype:
        raise ValueError(f"x and w must share a dtype, got {x.dtype} and {w.dtype}")
    if x.shape[0] == 0:
        raise ValueError("x has no rows: a row-by-row product needs at least one")


def rowwise_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ w [K, N], one row at a time: row i is always the product of a [1, K] row with w, the call a batch of
    one makes, so its bits cannot depend on how many rows came with it."""
    _check_matmul(x, w)
    return torch.cat([x[i : i + 1] @ w for i in range(x.shape[0])])


# the library calls, saved at import: batch_invariant() swaps F's attributes and the row calls must reach these
_linear, _sdpa = F.linear, F.scaled_dot_product_attention


def _rowwise_linear(x, weight, bias=None):
    flat = x.reshape(-1, x.shape[-1])
    rows = [_linear(flat[i : i + 1], weight, bias) for i in range(flat.shape[0])]
    return torch.cat(rows).reshape(*x.shape[:-1], weight.shape[0])


def _per_sequence_attention(query, key, value, *args, **kwargs):
    if query.dim() < 3:  # no batch dimension to split
        return _sdpa(query, key, value, *args, **kwargs)
    if args or kwargs.get("attn_mask") is not None:
        raise NotImplementedError("batch_invariant() handles attention without an explicit mask (is_causal is fine)")
    return torch.cat([_sdpa(query[b : b + 1], key[b : b + 1], value[b : b + 1], **kwargs)
                      for b in range(query.shape[0])])


@contextlib.contextmanager
def batch_invariant():
    """Inside this block, F.linear runs row by row and F.scaled_dot_product_attention sequence by sequence: every
    output row is computed by the same call, with the same shapes, as a batch of one would make. Bitwise invariant
    to the batch (at a fixed thread count), and slower: the batching is gone."""
    if F.linear is not _linear or F.scaled_dot_product_attention is not _sdpa:
        raise RuntimeError("batch_invariant() is already active (or F.linear was replaced by someone else): "
                           "do not nest it")
    F.linear, F.scaled_dot_product_attention = _rowwise_linear, _per_sequence_attention
    try:
        yield
    finally:
        F.linear, F.scaled_dot_product_attention = _linear, _sdpa
