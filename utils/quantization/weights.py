"""Weight-only 4-bit group-wise quantization of a transformer's Linear layers (lesson 04, part 3, section 4), and
SmoothQuant's scale migration for W8A8 (section 5).

Group-wise: each row of W [out, in] is cut into groups of `group` input columns; each group gets its own scale and
zero point (asymmetric, unsigned 4-bit: 0..15). Three ways to choose the integers, all with the same format:
round-to-nearest (RTN); GPTQ-style error feedback (quantize one column, spread its error over the columns not yet
quantized, weighted by the inverse Hessian of the layer's calibration inputs); AWQ-style activation-aware scaling
(scale the input channels that carry large activations up before rounding, and back down after).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from utils.quantization.affine import dequantize, qparams, qrange, quantize

__all__ = ["quantize_groupwise", "dequantize_groupwise", "rtn", "gptq", "awq", "pack_int4", "unpack_int4",
           "packed_bytes", "linear_inputs", "with_weights", "smooth_scales", "W8A8Linear", "w8a8"]


def _check_groups(w: torch.Tensor, group: int) -> None:
    if w.dim() != 2:
        raise ValueError(f"expected a weight matrix [out, in], got shape {tuple(w.shape)}")
    if group < 1 or w.shape[1] % group:
        raise ValueError(f"group size {group} must divide the {w.shape[1]} input columns")


def quantize_groupwise(w: torch.Tensor, bits: int = 4, group: int = 32):
    """(q [out, in] int32 in 0..2^bits-1, scale [out, in/group], zero [out, in/group]): asymmetric, one scale and
    zero point per row and group of `group` input columns, from the group's min and max."""
    _check_groups(w, group)
    g = w.detach().float().reshape(w.shape[0], -1, group)  # [out, n_groups, group]
    scale, zero = qparams(g.amin(-1), g.amax(-1), bits, signed=False)
    q = quantize(g, scale[..., None], zero[..., None], *qrange(bits, signed=False))
    return q.reshape(w.shape), scale, zero


def dequantize_groupwise(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The float weight a kernel reconstructs from the integers: scale * (q - zero), group by group."""
    out, n_groups = scale.shape
    g = q.reshape(out, n_groups, -1)
    return dequantize(g, scale[..., None], zero[..., None]).reshape(q.shape)


def rtn(w: torch.Tensor, x: torch.Tensor | None = None, bits: int = 4, group: int = 32) -> torch.Tensor:
    """Round-to-nearest: every weight to its nearest grid point, independently (x is ignored; same signature as the
    calibrated methods)."""
    return dequantize_groupwise(*quantize_groupwise(w, bits, group)).to(w.dtype)


def gptq(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group: int = 32, damp: float = 0.01,
         block: int = 128) -> torch.Tensor:
    """GPTQ-style: quantize the columns one by one; after each, push its rounding error onto the columns still float,
    in the proportions that minimise the layer's output error on the calibration inputs x [n, in].

    The output error of a column's error e is e^T H e with H = X^T X (the Hessian of ||X W^T - X Ŵ^T||^2); the
    optimal update of the remaining columns uses the inverse Hessian, here through the upper Cholesky factor U of
    H^-1 (row i of U holds the update weights after column i). Updates inside a block of columns are applied at once;
    the columns after the block get them in one matmul when the block ends (GPTQ's lazy batching: same result).
    Group scales are taken when a group starts, from the weights as updated so far.
    """
    _check_groups(w, group)
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"calibration inputs must be [n, {w.shape[1]}], got {tuple(x.shape)}")
    W = w.detach().double().clone()
    X = x.detach().double()
    H = X.T @ X / len(X)
    dead = torch.diag(H) == 0  # an input channel that never fires: its weights do not matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(len(H), dtype=H.dtype)  # dampening keeps H invertible
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    qmin, qmax = qrange(bits, signed=False)
    Q = torch.zeros_like(W)
    n = W.shape[1]
    for b0 in range(0, n, block):
        b1 = min(b0 + block, n)
        errs = torch.zeros(W.shape[0], b1 - b0, dtype=W.dtype)
        for i in range(b0, b1):
            if i % group == 0:  # the group's scale from the weights as they are now, after earlier feedback
                g = W[:, i : i + group]
                scale, zero = qparams(g.amin(1), g.amax(1), bits, signed=False)
                scale = scale.double()
            Q[:, i] = dequantize(quantize(W[:, i], scale, zero, qmin, qmax), scale, zero).double()
            err = (W[:, i] - Q[:, i]) / U[i, i]
            W[:, i + 1 : b1] -= err[:, None] * U[i, i + 1 : b1][None, :]  # feedback inside the block
            errs[:, i - b0] = err
        W[:, b1:] -= errs @ U[b0:b1, b1:]  # ... and onto every later column, once per block
    return Q.to(w.dtype)


def awq(w: torch.Tensor, x: torch.Tensor, bits: int = 4, group: int = 32, grid: int = 11):
    """AWQ-style: per input channel j, s_j = mean|x_j| ** alpha; quantize W * s (columns of busy channels get a finer
    grid, relatively), then divide by s again (in a real model 1/s folds into the previous op). alpha is searched on
    [0, 1] for the smallest output error on x; alpha = 0 is plain RTN. Returns (Ŵ, alpha)."""
    _check_groups(w, group)
    if x.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"calibration inputs must be [n, {w.shape[1]}], got {tuple(x.shape)}")
    act = x.detach().abs().mean(0).clamp(min=1e-8)
    ref = x @ w.T
    best = (float("inf"), None, 0.0)
    for alpha in torch.linspace(0, 1, grid).tolist():
        s = act**alpha
        s = s / (s.max() * s.min()).sqrt()  # centre the scales around 1
        w_hat = rtn(w * s, bits=bits, group=group) / s
        err = float(((x @ w_hat.T - ref) ** 2).mean())
        if err < best[0]:
            best = (err, w_hat, alpha)
    return best[1], best[2]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Two 4-bit integers (0..15) per byte: even columns in the low nibble, odd columns in the high one."""
    if q.shape[-1] % 2 or int(q.min()) < 0 or int(q.max()) > 15:
        raise ValueError("pack_int4 needs an even number of columns of integers in 0..15")
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4 (int32)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], -1).to(torch.int32)


def packed_bytes(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> dict[str, int]:
    """Bytes of the stored format: int4 weights packed two per byte, fp16 scales, int4 zero points packed."""
    return {"weights": pack_int4(q).numel(), "scales": scale.to(torch.float16).numel() * 2,
            "zeros": (zero.numel() + 1) // 2}


def linear_inputs(model: nn.Module, run: Callable[[], object], names: list[str]) -> dict[str, torch.Tensor]:
    """{name: every input row that the Linear `name` saw during run()} ([n, in]), collected with forward hooks."""
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    hooks = []
    for name in names:
        module = model.get_submodule(name)
        if not isinstance(module, nn.Linear):
            raise TypeError(f"{name} is a {type(module).__name__}, not an nn.Linear")
        hooks.append(module.register_forward_hook(
            lambda _m, args, _out, name=name: seen[name].append(args[0].detach().reshape(-1, args[0].shape[-1]))))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return {n: torch.cat(v) for n, v in seen.items()}


def with_weights(model: nn.Module, new: dict[str, torch.Tensor]) -> nn.Module:
    """A deep copy of `model` whose Linear layers named in `new` carry the given weights."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, w in new.items():
            out.get_submodule(name).weight.copy_(w)
    return out


def smooth_scales(x_absmax: torch.Tensor, w: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant: s_j = max|x_j|^alpha / max|W_:,j|^(1-alpha). Dividing the activations by s and multiplying the
    weight columns by s leaves x W^T unchanged, and moves part of an outlier channel's range into the weights."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    w_absmax = w.detach().abs().amax(0)
    return (x_absmax.clamp(min=1e-5) ** alpha / w_absmax.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)


class W8A8Linear(nn.Module):
    """A Linear with int8 weights (symmetric, per output row) and int8 activations (symmetric, one scale per tensor,
    from the tensor itself: dynamic), optionally smoothed by per-channel scales s (x / s, W * s)."""

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor | None = None):
        super().__init__()
        s = torch.ones(linear.in_features) if smooth is None else smooth.detach()
        self.register_buffer("s", s)
        w = linear.weight.detach() * s
        amax = w.abs().amax(1, keepdim=True)
        self.w_scale, _ = qparams(-amax, amax, 8, symmetric=True)
        self.w_q = quantize(w, self.w_scale, 0, *qrange(8))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x / self.s
        amax = x.detach().abs().amax()
        sx, _ = qparams(-amax, amax, 8, symmetric=True)
        x_q = quantize(x, sx, 0, *qrange(8))
        y = dequantize(x_q, sx, 0) @ dequantize(self.w_q, self.w_scale, 0).T
        return y if self.bias is None else y + self.bias


def w8a8(model: nn.Module, names: list[str], smooth: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """A deep copy of `model` with the named Linear layers run as W8A8Linear (smoothed where `smooth` gives scales)."""
    out = copy.deepcopy(model)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = out.get_submodule(parent_name) if parent_name else out
        setattr(parent, child, W8A8Linear(getattr(parent, child), (smooth or {}).get(name)))
    return out
