"""Checks for labs/04_quantization_lab.ipynb (lesson 04, part 3: the affine mapping and an int8 linear layer).

The learner writes choose_qparams(xmin, xmax, qmin, qmax), quantize(x, scale, zero_point, qmin, qmax),
dequantize(q, scale, zero_point) and int8_linear(qx, zx, sx, qw, sw, bias, s_out, z_out). Every result is integer
(or follows from integers) and is compared exactly with the reference arithmetic below; the edge cases are a zero
range, a range that does not contain 0, saturation, ties, and a negative zero point. Failure messages describe the
symptom, never the expected numbers.
"""

from __future__ import annotations

import math

import torch

from utils.checks import LabCheckFailed, call, expect, no_reference, passed
from utils.quantization import affine

__all__ = ["check_qparams", "check_quantize", "check_int8_linear"]

INT8, UINT8, INT4 = (-128, 127), (0, 255), (-8, 7)
# the lesson's own implementation: an answer that only calls it does not pass
_REFERENCE = (affine.qparams, affine.quantize, affine.dequantize, affine.int_matmul, affine.int_matmul_kernel_form,
              affine.requantize, affine.fake_quant)


def _ref_qparams(xmin: float, xmax: float, qmin: int, qmax: int) -> tuple[float, int]:
    lo, hi = min(xmin, 0.0), max(xmax, 0.0)
    scale = max((hi - lo) / (qmax - qmin), torch.finfo(torch.float32).eps)
    return scale, int(min(max(qmin - round(lo / scale), qmin), qmax))


def _ref_quantize(x, scale, zero_point, qmin, qmax):
    return torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax).to(torch.int32)


def _ref_int8_linear(qx, zx, sx, qw, sw, bias, s_out, z_out, *, skip=()):
    x = qx.to(torch.int32) - (0 if "zx" in skip else zx)
    acc = x @ qw.to(torch.int32).T
    scale = sx * sw.to(torch.float64)
    if bias is not None and "bias" not in skip:
        acc = acc + torch.round(bias.to(torch.float64) / scale).to(torch.int32)
    y = torch.round(acc.to(torch.float64) * (scale / s_out)) + z_out
    return y.to(torch.int32) if "clamp" in skip else torch.clamp(y, *INT8).to(torch.int32)


def _as_pair(out, what):
    expect(isinstance(out, tuple | list) and len(out) == 2,
           f"{what} should return (scale, zero_point), got {type(out).__name__}")
    scale, zp = out
    scale = float(scale)
    expect(math.isfinite(scale) and scale > 0, f"{what} returned scale {scale!r}: a scale must be finite and > 0 "
           "(a zero-width range still needs a usable step)")
    expect(float(zp) == int(float(zp)), f"{what} returned a zero point {zp!r} that is not an integer")
    return scale, int(float(zp))


def check_qparams(choose_qparams) -> None:
    """Asymmetric (scale, zero_point) on ordinary ranges, a zero range, a range without 0 and a negative zero point."""
    with no_reference(*_REFERENCE, what="choose_qparams"):
        _check_qparams(choose_qparams)


def _check_qparams(choose_qparams) -> None:
    cases = {
        "int8 over [-1, 3]": (-1.0, 3.0, *INT8),
        "uint8 over [-0.25, 6.0]": (-0.25, 6.0, *UINT8),
        "int4 over [-2, 2]": (-2.0, 2.0, *INT4),
        "int8 over [-0.5, 10] (a negative zero point)": (-0.5, 10.0, *INT8),
        "int8 over [2, 5] (does not contain 0)": (2.0, 5.0, *INT8),
        "uint8 over [-7, -3] (does not contain 0)": (-7.0, -3.0, *UINT8),
        "int8 over [0, 0] (a zero-width range)": (0.0, 0.0, *INT8),
    }
    for name, (lo, hi, qmin, qmax) in cases.items():
        what = f"choose_qparams({lo}, {hi}, {qmin}, {qmax})"
        scale, zp = _as_pair(call(choose_qparams, lo, hi, qmin, qmax, what=what), what)
        want_scale, want_zp = _ref_qparams(lo, hi, qmin, qmax)
        expect(qmin <= zp <= qmax, f"{name}: the zero point {zp} lies outside [{qmin}, {qmax}], so real 0 cannot be "
               "stored; widen the range to contain 0 before computing it")
        zero_back = (_ref_quantize(torch.tensor(0.0), scale, zp, qmin, qmax) - zp).item() * scale
        expect(zero_back == 0.0, f"{name}: real 0 does not survive a round trip (comes back as {zero_back:g}): the "
               "range must contain 0 and the zero point must be the integer that stands for it")
        expect(math.isclose(scale, want_scale, rel_tol=1e-6),
               f"{name}: the step does not spread the range over all {qmax - qmin + 1} codes (scale off by a factor "
               f"{scale / want_scale:.3f}); check the range you divide and by how many steps")
        expect(zp == want_zp, f"{name}: the zero point is off by {zp - want_zp:+d} code(s); it is the integer that "
               "stands for real 0, counted from qmin with the same rounding as quantize")
    passed("choose_qparams", f"{len(cases)} ranges incl. a zero-width range, ranges without 0, a negative zero point")


def check_quantize(quantize, dequantize) -> None:
    """quantize/dequantize exactly as the affine mapping: rounding half to even, saturation, the zero point."""
    with no_reference(*_REFERENCE, what="quantize / dequantize"):
        _check_quantize(quantize, dequantize)


def _check_quantize(quantize, dequantize) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4096, generator=gen) * 2
    cases = {"int8, zero point -116": (0.041176, -116, *INT8), "uint8, zero point 37": (0.02, 37, *UINT8),
             "int4, zero point 0": (0.3, 0, *INT4)}
    for name, (scale, zp, qmin, qmax) in cases.items():
        q = call(quantize, x, scale, zp, qmin, qmax, what="quantize(x, scale, zero_point, qmin, qmax)")
        expect(isinstance(q, torch.Tensor) and q.shape == x.shape,
               f"quantize should return a tensor shaped like x {tuple(x.shape)}, got {getattr(q, 'shape', type(q))}")
        expect(not q.is_floating_point(), f"{name}: quantize returned {q.dtype}; codes are integers (e.g. torch.int32)")
        want = _ref_quantize(x, scale, zp, qmin, qmax)
        expect(int(q.min()) >= qmin and int(q.max()) <= qmax,
               f"{name}: codes {int(q.min())}..{int(q.max())} leave [{qmin}, {qmax}]: values beyond the range must "
               "saturate at the end codes")
        bad = q.to(torch.int32) != want
        if bad.any():
            off = (q.to(torch.int32) - want)[bad]
            shift = "all by the same amount" if off.unique().numel() == 1 else "by different amounts"
            hint = ("a constant shift points at the zero point: does real 0 get the code zero_point?" if
                    off.unique().numel() == 1 else "codes that drift apart point at the step: does a value one scale "
                    "larger get a code exactly one larger?")
            raise LabCheckFailed(f"{name}: {int(bad.sum())} of {x.numel()} codes differ from the affine mapping, "
                                 f"{shift}: {hint}")
        ties = (torch.arange(-6, 6) + 0.5) * 0.25  # exactly halfway between two codes of step 0.25
        q_ties = call(quantize, ties, 0.25, zp, qmin, qmax, what="quantize(x, scale, zero_point, qmin, qmax)")
        expect(torch.equal(q_ties.to(torch.int32), _ref_quantize(ties, 0.25, zp, qmin, qmax)),
               f"{name}: values exactly halfway between two codes round differently from the hardware's "
               "round-half-to-even (torch.round); floor(x + 0.5) rounds every tie up")
        back = call(dequantize, want, scale, zp, what="dequantize(q, scale, zero_point)")
        expect(isinstance(back, torch.Tensor) and back.is_floating_point(),
               f"dequantize should return a float tensor, got {getattr(back, 'dtype', type(back))}")
        want_back = (want - zp).to(torch.float32) * scale
        expect(torch.allclose(back.float(), want_back, rtol=1e-6, atol=0),
               f"{name}: dequantize is off by up to {float((back.float() - want_back).abs().max()):.3g}: does the "
               "code zero_point come back as 0.0, and does each code above it add exactly one scale?")
        inside = (x >= (qmin - zp) * scale) & (x <= (qmax - zp) * scale)
        err = (back.float() - x).abs()[inside].max() / scale
        expect(float(err) <= 0.5 + 1e-4, f"{name}: a round trip inside the range is off by {float(err):.2f} steps "
               "(rounding allows 0.5)")
    passed("quantize / dequantize", f"{len(cases)} formats, {x.numel()} values each, ties, saturation, exact codes")


def _linear_case(gen, m, k, n, zx, *, bias=True, s_out=None):
    lo, hi = INT8 if zx < 0 else UINT8  # a negative zero point only makes sense for signed activations
    qx = torch.randint(lo, hi + 1, (m, k), generator=gen, dtype=torch.int32)
    qw = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int32)
    sx = 0.013
    sw = (torch.rand(n, generator=gen, dtype=torch.float64) * 0.02 + 0.001)
    b = torch.randn(n, generator=gen, dtype=torch.float64) if bias else None
    return qx, zx, sx, qw, sw, b, s_out or 0.9, -3


def check_int8_linear(int8_linear) -> None:
    """Exact int8 outputs: int32 accumulation, activation zero point, bias in the int32 domain, requantization in
    float64, saturation to int8."""
    with no_reference(*_REFERENCE, what="int8_linear"):
        _check_int8_linear(int8_linear)


def _check_int8_linear(int8_linear) -> None:
    gen = torch.Generator().manual_seed(7)
    cases = {
        "uint8 activations, zero point 120, with bias": _linear_case(gen, 16, 96, 24, 120),
        "int8 activations, negative zero point -116, with bias": _linear_case(gen, 8, 64, 12, -116),
        "no bias": _linear_case(gen, 4, 32, 8, 5, bias=False),
        "outputs that saturate": _linear_case(gen, 8, 128, 16, 60, s_out=0.05),
    }
    for name, args in cases.items():
        got = call(int8_linear, *args, what="int8_linear(qx, zx, sx, qw, sw, bias, s_out, z_out)")
        want = _ref_int8_linear(*args)
        expect(isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape),
               f"{name}: expected an output tensor of shape {tuple(want.shape)} [rows of qx, rows of qw], got "
               f"{getattr(got, 'shape', type(got))}")
        expect(not got.is_floating_point(), f"{name}: int8_linear returned {got.dtype}; outputs are integer codes")
        got = got.to(torch.int32)
        if torch.equal(got, want):
            continue
        expect(int(got.min()) >= INT8[0] and int(got.max()) <= INT8[1],
               f"{name}: outputs {int(got.min())}..{int(got.max())} leave int8's [-128, 127]: an output beyond it must "
               "saturate at the end code, whatever the zero point adds")
        for skip, symptom in (
            (("zx",), "your outputs are what you get when the activations' zero point is left out of the product"),
            (("bias",), "your outputs are what you get without the bias"),
        ):
            if torch.equal(got, _ref_int8_linear(*args, skip=skip)):
                raise LabCheckFailed(f"{name}: {symptom}")
        diff = (got - want).abs()
        if int(diff.max()) == 1:
            raise LabCheckFailed(f"{name}: {int((diff > 0).sum())} of {diff.numel()} outputs are one code off: "
                                 "rounding or precision differs (round half to even, and do the float steps in float64)")
        raise LabCheckFailed(f"{name}: {int((diff > 0).sum())} of {diff.numel()} outputs differ, by up to "
                             f"{int(diff.max())} codes. Follow the units: what real value does one unit of your int32 "
                             "accumulator stand for, is the bias added in those units, and what takes that unit to "
                             "the output's step?")
    passed("int8_linear", f"{len(cases)} layers: integer outputs identical to the reference, incl. a negative zero "
           "point and saturation")
