"""The affine mapping real <-> integer, the integer matmul and fake quantization (lesson 04, part 3, sections 1 and 3).

``x ≈ scale * (q - zero_point)`` with q an integer in [qmin, qmax]. Per-tensor: one scale and zero point; per-channel:
one per row (``dim=0``) or column, given as tensors that broadcast against x. The functions here are what the lesson
prints with inspect.getsource and what lab 04q checks the learner's code against.
"""

from __future__ import annotations

import torch

__all__ = ["qrange", "qparams", "quantize", "dequantize", "int_matmul", "int_matmul_kernel_form", "requantize",
           "int16_pair_overflows", "fake_quant"]


def qrange(bits: int, signed: bool = True) -> tuple[int, int]:
    """(qmin, qmax) of a `bits`-bit integer: signed 8 -> (-128, 127), unsigned 8 -> (0, 255), signed 4 -> (-8, 7)."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not 2 <= bits <= 16:
        raise ValueError(f"bits must be an int in 2..16, got {bits!r}")
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)


def _as_tensor(v) -> torch.Tensor:
    return v.detach().float() if isinstance(v, torch.Tensor) else torch.tensor(float(v))


def qparams(xmin, xmax, bits: int = 8, *, symmetric: bool = False, signed: bool = True):
    """(scale, zero_point) that map the real range [xmin, xmax] onto the `bits`-bit integers.

    The range is widened to contain 0, so real zero is exactly representable (padding, ReLU outputs). Asymmetric:
    scale = (xmax - xmin) / (qmax - qmin), zero_point = qmin - round(xmin / scale). Symmetric (signed only):
    scale = max(|xmin|, |xmax|) / qmax, zero_point = 0. A zero-width range gets the smallest positive scale instead of
    a division by zero. xmin/xmax may be tensors (one range per channel): scale and zero_point then have their shape.
    """
    lo, hi = _as_tensor(xmin), _as_tensor(xmax)
    if lo.shape != hi.shape:
        raise ValueError(f"xmin and xmax must have the same shape, got {tuple(lo.shape)} and {tuple(hi.shape)}")
    if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
        raise ValueError("xmin and xmax must be finite (a NaN or inf in the calibration data?)")
    if (lo > hi).any():
        raise ValueError(f"xmin must be <= xmax, got xmin {lo.max().item():g} > xmax {hi.min().item():g} somewhere")
    qmin, qmax = qrange(bits, signed)
    lo, hi = torch.clamp(lo, max=0.0), torch.clamp(hi, min=0.0)  # the range must contain real zero
    tiny = torch.finfo(torch.float32).eps
    if symmetric:
        if not signed:
            raise ValueError("symmetric quantization here is signed (zero point 0); use symmetric=False for unsigned")
        scale = torch.clamp(torch.maximum(-lo, hi) / qmax, min=tiny)
        return scale, torch.zeros_like(scale, dtype=torch.int32)
    scale = torch.clamp((hi - lo) / (qmax - qmin), min=tiny)
    zero_point = torch.clamp(qmin - torch.round(lo / scale), qmin, qmax).to(torch.int32)
    return scale, zero_point


def quantize(x: torch.Tensor, scale, zero_point, qmin: int, qmax: int) -> torch.Tensor:
    """Real -> integer: round(x / scale) + zero_point, clipped (saturated) to [qmin, qmax]. Returns int32."""
    q = torch.round(x / scale) + zero_point  # round half to even, like the hardware's default rounding mode
    return torch.clamp(q, qmin, qmax).to(torch.int32)


def dequantize(q: torch.Tensor, scale, zero_point) -> torch.Tensor:
    """Integer -> real: scale * (q - zero_point)."""
    return (q.to(torch.int32) - zero_point).to(torch.float32) * scale


def int_matmul(qa: torch.Tensor, za, qb: torch.Tensor, zb) -> torch.Tensor:
    """The int32 accumulator of an integer matmul: sum_k (qa[m,k] - za) * (qb[k,n] - zb), every step an integer.

    qa [M, K] (activations, one zero point), qb [K, N] (weights, zb a scalar or one per column [1, N]).
    """
    if qa.dim() != 2 or qb.dim() != 2 or qa.shape[1] != qb.shape[0]:
        raise ValueError(f"int_matmul needs [M, K] x [K, N], got {tuple(qa.shape)} x {tuple(qb.shape)}")
    if qa.is_floating_point() or qb.is_floating_point():
        raise TypeError(f"int_matmul takes integer tensors, got {qa.dtype} and {qb.dtype}: quantize first")
    return (qa.to(torch.int32) - za) @ (qb.to(torch.int32) - zb)


def int_matmul_kernel_form(qa: torch.Tensor, za, qb: torch.Tensor, zb) -> torch.Tensor:
    """The same accumulator as an int8 kernel computes it: one raw product qa @ qb (the part VNNI/AMX/tensor cores do)
    and zero-point corrections from row and column sums that are computed once (the weights' at load time)."""
    k = qa.shape[1]
    qa32, qb32 = qa.to(torch.int32), qb.to(torch.int32)
    raw = qa32 @ qb32
    return raw - zb * qa32.sum(1, keepdim=True) - za * qb32.sum(0, keepdim=True) + k * za * zb


def requantize(acc: torch.Tensor, scale_a, scale_b, scale_out, zero_out, qmin: int, qmax: int,
               bias_q: torch.Tensor | None = None) -> torch.Tensor:
    """int32 accumulator -> the next layer's integers: the accumulator counts units of scale_a * scale_b, so multiply
    by M = scale_a * scale_b / scale_out, round, add the output zero point, saturate. A bias is added in the int32
    domain first, quantized with scale scale_a * scale_b and zero point 0. (Integer-only kernels hold M as a 32-bit
    fixed-point multiplier and a shift; this float M gives the same integers except at exact ties.)"""
    if acc.dtype != torch.int32:
        raise TypeError(f"requantize takes the int32 accumulator, got {acc.dtype}")
    if bias_q is not None:
        acc = acc + bias_q.to(torch.int32)
    multiplier = (scale_a * scale_b) / scale_out
    return torch.clamp(torch.round(acc.to(torch.float64) * multiplier) + zero_out, qmin, qmax).to(torch.int32)


def int16_pair_overflows(qa: torch.Tensor, qb: torch.Tensor, rows: int = 32) -> int:
    """How many sums of two adjacent raw products, qa[m,k]·qb[k,n] + qa[m,k+1]·qb[k+1,n] (k even), fall outside int16:
    the pairs an x86 uint8 x int8 kernel without VNNI (vpmaddubsw) saturates before it widens to int32. Raw integers,
    as the kernel multiplies them (the zero points are corrected afterwards, int_matmul_kernel_form). qa [M, K]
    (uint8 codes), qb [K, N] (int8 codes); an odd K's last product has no partner. `rows` of qa at a time bound the
    memory ([rows, K/2, N] int32)."""
    if qa.dim() != 2 or qb.dim() != 2 or qa.shape[1] != qb.shape[0]:
        raise ValueError(f"int16_pair_overflows needs [M, K] x [K, N], got {tuple(qa.shape)} x {tuple(qb.shape)}")
    k = qa.shape[1] - qa.shape[1] % 2
    a, b = qa[:, :k].to(torch.int32), qb[:k].to(torch.int32)
    count = 0
    for i in range(0, a.shape[0], rows):
        block = a[i : i + rows]
        pairs = block[:, 0::2, None] * b[None, 0::2] + block[:, 1::2, None] * b[None, 1::2]
        count += int(((pairs > 32767) | (pairs < -32768)).sum())
    return count


def fake_quant(x: torch.Tensor, scale, zero_point, qmin: int, qmax: int) -> torch.Tensor:
    """Quantize then dequantize in float (forward), with a straight-through estimator (backward).

    round() has zero gradient almost everywhere, so training through it learns nothing. The STE pretends the
    rounding is the identity: the gradient passes straight through inside the clipping range, and is zero where the
    value saturated (clamp's own gradient), which is what torch.fake_quantize_per_tensor_affine does.
    """
    q = torch.round(x / scale) + zero_point
    inside = (q >= qmin) & (q <= qmax)  # a saturated value gets no gradient: clipping is flat there
    x_q = (torch.clamp(q, qmin, qmax) - zero_point) * scale
    return x_q.detach() + (x - x.detach()) * inside  # value: x_q; gradient: 1 inside the range, 0 outside
