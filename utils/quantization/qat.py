"""Post-training quantization (PTQ) against quantization-aware training (QAT) (lesson 04, part 3, section 3).

Both use the same fake-quantized layer: weights symmetric per output channel, the input activation asymmetric per
tensor with a range from an observer. PTQ calibrates the observers on a few batches and stops; QAT then keeps
training the float weights *through* the fake quantization (straight-through estimator), so they settle where the
rounding hurts least.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from utils.quantization.affine import fake_quant, qparams, qrange

__all__ = ["FakeQuantLinear", "fake_quantized", "calibrate"]


class FakeQuantLinear(nn.Module):
    """A Linear run as it would be in integers: input fake-quantized to `a_bits` (unsigned, per tensor, range from an
    observer), weight fake-quantized to `w_bits` (signed symmetric, one scale per output row)."""

    def __init__(self, linear: nn.Linear, w_bits: int, a_bits: int, momentum: float = 0.05, per_channel: bool = True):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"FakeQuantLinear wraps an nn.Linear, got {type(linear).__name__}")
        self.weight, self.bias = linear.weight, linear.bias
        self.w_bits, self.a_bits, self.momentum, self.per_channel = w_bits, a_bits, momentum, per_channel
        self.register_buffer("lo", torch.tensor(float("inf")))
        self.register_buffer("hi", torch.tensor(float("-inf")))
        self.calibrating = False

    def observe(self, x: torch.Tensor) -> None:
        lo, hi = x.detach().min(), x.detach().max()
        if self.calibrating or not torch.isfinite(self.lo):  # min-max over the calibration batches
            self.lo, self.hi = torch.minimum(self.lo, lo), torch.maximum(self.hi, hi)
        elif self.training:  # during QAT: an exponential moving average follows the drifting activations
            self.lo += self.momentum * (lo - self.lo)
            self.hi += self.momentum * (hi - self.hi)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calibrating or self.training:
            self.observe(x)
        if not torch.isfinite(self.lo):
            raise RuntimeError("this FakeQuantLinear has no activation range yet: run calibrate(model, X) first")
        sa, za = qparams(self.lo, self.hi, self.a_bits, signed=False)
        x = fake_quant(x, sa, za, *qrange(self.a_bits, signed=False))
        amax = self.weight.detach().abs().amax(dim=1, keepdim=True) if self.per_channel else self.weight.detach().abs().max()
        sw, zw = qparams(-amax, amax, self.w_bits, symmetric=True)
        w = fake_quant(self.weight, sw, zw, *qrange(self.w_bits))
        return F.linear(x, w, self.bias)


def fake_quantized(model: nn.Module, w_bits: int, a_bits: int, per_channel: bool = True) -> nn.Module:
    """A deep copy of `model` with every nn.Linear replaced by a FakeQuantLinear (uncalibrated); weights get one scale
    per output row (per_channel) or one for the whole matrix."""
    qmodel = copy.deepcopy(model)
    names = [name for name, m in qmodel.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise ValueError("the model has no nn.Linear to quantize")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = qmodel.get_submodule(parent_name) if parent_name else qmodel
        setattr(parent, child, FakeQuantLinear(getattr(parent, child), w_bits, a_bits, per_channel=per_channel))
    return qmodel


@torch.no_grad()
def calibrate(qmodel: nn.Module, X: torch.Tensor, batch: int = 128) -> nn.Module:
    """Min-max activation ranges of every FakeQuantLinear from the batches of X (post-training calibration)."""
    layers = [m for m in qmodel.modules() if isinstance(m, FakeQuantLinear)]
    if not layers:
        raise ValueError("no FakeQuantLinear in the model: call fake_quantized(model, ...) first")
    qmodel.eval()
    for m in layers:
        m.calibrating = True
    try:
        for xb in X.split(batch):
            qmodel(xb)
    finally:
        for m in layers:
            m.calibrating = False
    return qmodel
