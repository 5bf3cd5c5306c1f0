"""utils.quantization (lesson 04, part 3) and lab 04q's checks: the affine mapping, the integer matmul, fake
quantization, calibration with ONNX Runtime, group-wise 4-bit (RTN, GPTQ, AWQ) and SmoothQuant."""

import math
import re

import pytest
import torch

from utils.checks import LabCheckFailed, lab04q
from utils.quantization import affine, calibrate, digits, qat, weights

INT8 = affine.qrange(8)


def test_qrange():
    assert affine.qrange(8) == (-128, 127)
    assert affine.qrange(8, signed=False) == (0, 255)
    assert affine.qrange(4) == (-8, 7)
    with pytest.raises(ValueError, match="bits"):
        affine.qrange(1)


def test_qparams_asymmetric_negative_zero_point():
    scale, zp = affine.qparams(-0.5, 10.0, 8)
    assert math.isclose(float(scale), 10.5 / 255, rel_tol=1e-6)
    assert int(zp) == -116  # -128 - round(-0.5 / scale)
    q = affine.quantize(torch.tensor([0.0, -0.5, 10.0]), scale, zp, *INT8)
    assert q.tolist() == [-116, -128, 127]
    assert float(affine.dequantize(q[:1], scale, zp)) == 0.0  # real zero is exact


def test_qparams_edge_cases():
    scale, zp = affine.qparams(0.0, 0.0, 8)  # zero-width range: a usable step, no NaN
    assert float(scale) > 0 and math.isfinite(float(scale)) and int(zp) == -128
    scale, zp = affine.qparams(2.0, 5.0, 8)  # widened to contain 0
    assert int(zp) == -128 and math.isclose(float(scale), 5 / 255, rel_tol=1e-6)
    s_sym, z_sym = affine.qparams(-1.0, 3.0, 8, symmetric=True)
    assert int(z_sym) == 0 and math.isclose(float(s_sym), 3 / 127, rel_tol=1e-6)
    scales, zps = affine.qparams(torch.tensor([-1.0, -2.0]), torch.tensor([1.0, 6.0]), 8)
    assert scales.shape == zps.shape == (2,)
    with pytest.raises(ValueError, match="<= xmax"):
        affine.qparams(1.0, -1.0)
    with pytest.raises(ValueError, match="finite"):
        affine.qparams(float("nan"), 1.0)
    with pytest.raises(ValueError, match="signed"):
        affine.qparams(-1.0, 1.0, symmetric=True, signed=False)


def test_quantize_rounds_half_to_even_and_saturates():
    q = affine.quantize(torch.tensor([0.5, 1.5, 2.5, -0.5, 1000.0, -1000.0]), 1.0, 0, *INT8)
    assert q.tolist() == [0, 2, 2, 0, 127, -128]
    assert q.dtype == torch.int32


def test_round_trip_error_is_at_most_half_a_step():
    scale, zp = affine.qparams(-3.0, 7.0, 8)
    x = torch.linspace(-3.0, 7.0, 10_001)
    err = (affine.dequantize(affine.quantize(x, scale, zp, *INT8), scale, zp) - x).abs().max()
    assert float(err / scale) <= 0.5 + 1e-4


def _operands(m=8, k=64, n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qa = torch.randint(0, 256, (m, k), generator=gen, dtype=torch.int32)
    qb = torch.randint(-127, 128, (k, n), generator=gen, dtype=torch.int32)
    return qa, torch.tensor(113, dtype=torch.int32), qb, torch.zeros(1, n, dtype=torch.int32)


def test_int_matmul_is_exact_and_kernel_form_agrees():
    qa, za, qb, zb = _operands()
    acc = affine.int_matmul(qa, za, qb, zb)
    assert acc.dtype == torch.int32
    ref = (qa.double() - 113) @ qb.double()
    assert torch.equal(acc.double(), ref)
    assert torch.equal(acc, affine.int_matmul_kernel_form(qa, za, qb, zb))
    zb_nonzero = torch.full((1, qb.shape[1]), -3, dtype=torch.int32)  # a weight zero point too
    assert torch.equal(affine.int_matmul(qa, za, qb, zb_nonzero), affine.int_matmul_kernel_form(qa, za, qb, zb_nonzero))


def test_int16_pair_overflows_counts_the_pairs_vpmaddubsw_saturates():
    qa = torch.tensor([[255, 255, 1, 0, 7]], dtype=torch.uint8)  # odd K: the last product has no partner
    qb = torch.tensor([[127, -128], [127, -128], [127, 127], [127, 127], [127, 127]], dtype=torch.int8)
    # pairs: 255*127*2 = 64,770 > 32,767 and 255*-128*2 = -65,280 < -32,768 (both saturate); 1*127 + 0 fits
    assert affine.int16_pair_overflows(qa, qb) == 2
    assert affine.int16_pair_overflows(qa, torch.clamp(qb, -64, 64)) == 0  # reduce_range's weights: 2*255*64 fits
    big_a = torch.randint(0, 256, (70, 64), dtype=torch.uint8)
    big_b = torch.randint(-128, 128, (64, 9), dtype=torch.int8)
    pairs = big_a[:, 0::2, None].int() * big_b[None, 0::2].int() + big_a[:, 1::2, None].int() * big_b[None, 1::2].int()
    expected = int(((pairs > 32767) | (pairs < -32768)).sum())
    assert affine.int16_pair_overflows(big_a, big_b, rows=32) == expected > 0  # counted in blocks of rows: the same
    with pytest.raises(ValueError, match=r"\[M, K\] x \[K, N\]"):
        affine.int16_pair_overflows(qa, qb[:4])


def test_int_matmul_rejects_bad_input():
    qa, za, qb, zb = _operands()
    with pytest.raises(ValueError, match=r"\[M, K\] x \[K, N\]"):
        affine.int_matmul(qa, za, qb.T, zb)
    with pytest.raises(TypeError, match="quantize first"):
        affine.int_matmul(qa.float(), za, qb, zb)
    with pytest.raises(TypeError, match="int32"):
        affine.requantize(qa.float(), 0.1, 0.1, 0.1, 0, *INT8)


def test_requantize_matches_the_float_formula_and_saturates():
    qa, za, qb, zb = _operands()
    acc = affine.int_matmul(qa, za, qb, zb)
    sa, sb, so = 0.02, torch.full((1, qb.shape[1]), 0.01), 0.5
    out = affine.requantize(acc, sa, sb, so, 4, *INT8)
    want = torch.clamp(torch.round(acc.double() * (sa * sb.double() / so)) + 4, -128, 127)
    assert (out.double() - want).abs().max() <= 1  # float32 scales vs float64: at most a near-tie apart
    assert int(out.max()) <= 127 and int(out.min()) >= -128
    bias = torch.full((qb.shape[1],), 10_000, dtype=torch.int32)
    assert (affine.requantize(acc, sa, sb, so, 4, *INT8, bias_q=bias) >= out).all()


def test_fake_quant_matches_torch_forward_and_gradient():
    x = (torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 1.5).requires_grad_()
    ours = affine.fake_quant(x, 0.02, 10, *INT8)
    ours.sum().backward()
    g = x.grad.clone()
    x.grad = None
    theirs = torch.fake_quantize_per_tensor_affine(x, 0.02, 10, *INT8)
    theirs.sum().backward()
    assert float((ours - theirs).detach().abs().max()) <= 0.02  # at most one step, only at exact ties
    assert torch.equal(g, x.grad)
    assert 0 < int((g == 0).sum()) < x.numel()  # saturated values get no gradient, the rest 1


def test_fake_quant_linear_needs_calibration_and_tracks_the_float_layer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.rand(64, 16)
    q8 = qat.fake_quantized(model, 8, 8)
    with pytest.raises(RuntimeError, match="calibrate"):
        q8.eval()(x)
    qat.calibrate(q8, x)
    with torch.no_grad():
        rel = float((q8(x) - model(x)).norm() / model(x).norm())
    assert rel < 0.05
    per_tensor = qat.calibrate(qat.fake_quantized(model, 4, 8, per_channel=False), x)
    with torch.no_grad():
        assert float((per_tensor(x) - model(x)).norm() / model(x).norm()) < 0.5
    with pytest.raises(ValueError, match="no nn.Linear"):
        qat.fake_quantized(torch.nn.ReLU(), 8, 8)
    with pytest.raises(TypeError, match="nn.Linear"):
        qat.FakeQuantLinear(torch.nn.ReLU(), 8, 8)


def test_qat_trains_through_fake_quant():
    X_tr, y_tr, X_te, y_te = digits.digits_split()
    model = digits.mlp(hidden=32)
    digits.train(model, X_tr[:400], y_tr[:400], 3)
    qmodel = qat.calibrate(qat.fake_quantized(model, 4, 4), X_tr[:200])
    before = [p.detach().clone() for p in qmodel.parameters()]
    losses = digits.train(qmodel, X_tr[:400], y_tr[:400], 2, lr=1e-3)
    assert all(math.isfinite(v) for v in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, qmodel.parameters(), strict=True))  # STE gradients
    assert 0.0 <= digits.accuracy(qmodel, X_te, y_te) <= 1.0
    with pytest.raises(ValueError, match="one row of logits per label"):
        digits.accuracy(torch.zeros(3, 10), y=y_te)


def test_groupwise_round_trip_and_packing():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    q, scale, zero = weights.quantize_groupwise(w, 4, 16)
    assert q.shape == w.shape and scale.shape == zero.shape == (16, 4)
    assert int(q.min()) >= 0 and int(q.max()) <= 15
    err = (weights.dequantize_groupwise(q, scale, zero) - w).abs().reshape(16, 4, 16)
    assert (err <= scale[..., None] / 2 + 1e-6).all()
    assert torch.equal(weights.unpack_int4(weights.pack_int4(q)), q)
    sizes = weights.packed_bytes(q, scale, zero)
    assert sizes == {"weights": 16 * 64 // 2, "scales": 16 * 4 * 2, "zeros": 16 * 4 // 2}
    with pytest.raises(ValueError, match="divide"):
        weights.quantize_groupwise(w, 4, 24)
    with pytest.raises(ValueError, match="0..15"):
        weights.pack_int4(q + 16)


def _correlated_inputs(n=512, d=64, seed=3):
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=gen) / d**0.5
    scale = torch.logspace(-1, 1, d)  # a few busy channels, as in a transformer's hidden state
    return (torch.randn(n, d, generator=gen) @ mix) * scale


def test_gptq_and_awq_beat_rtn_on_their_calibration_inputs():
    x = _correlated_inputs()
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(4)) * 0.1
    ref = x @ w.T

    def out_err(w_hat):
        return float(((x @ w_hat.T - ref) ** 2).mean())

    e_rtn = out_err(weights.rtn(w, bits=4, group=16))
    e_gptq = out_err(weights.gptq(w, x, bits=4, group=16))
    w_awq, alpha = weights.awq(w, x, bits=4, group=16)
    assert e_gptq < e_rtn
    assert out_err(w_awq) <= e_rtn + 1e-12 and 0.0 <= alpha <= 1.0  # alpha = 0 is RTN, so never worse
    with pytest.raises(ValueError, match="calibration inputs"):
        weights.gptq(w, x[:, :32])


def test_linear_inputs_and_with_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 3, 8)
    seen = weights.linear_inputs(model, lambda: model(x), ["0", "2"])
    assert seen["0"].shape == (15, 8) and torch.equal(seen["0"], x.reshape(15, 8))
    with pytest.raises(TypeError, match="not an nn.Linear"):
        weights.linear_inputs(model, lambda: model(x), ["1"])
    zeroed = weights.with_weights(model, {"2": torch.zeros(2, 8)})
    assert torch.equal(zeroed[2].weight, torch.zeros(2, 8)) and not torch.equal(model[2].weight, torch.zeros(2, 8))


def test_smoothquant_preserves_the_product_and_helps_with_an_outlier_channel():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(256, 32, generator=gen)
    x[:, 3] *= 60  # an outlier channel
    lin = torch.nn.Linear(32, 16)
    s = weights.smooth_scales(x.abs().amax(0), lin.weight, 0.5)
    assert torch.allclose((x / s) @ (lin.weight * s).T, x @ lin.weight.T, rtol=1e-4, atol=1e-3)
    with torch.no_grad():
        ref = lin(x)
        naive = float((weights.W8A8Linear(lin)(x) - ref).norm() / ref.norm())
        smooth = float((weights.W8A8Linear(lin, s)(x) - ref).norm() / ref.norm())
    assert smooth < naive
    with pytest.raises(ValueError, match="alpha"):
        weights.smooth_scales(x.abs().amax(0), lin.weight, 1.5)


def test_ort_calibrators_minmax_keeps_a_glitch_percentile_cuts_it(tmp_path):
    pytest.importorskip("onnxruntime")
    from utils.core import onnx_io

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)).eval()
    path = onnx_io.export_model(model, (torch.rand(2, 64),), tmp_path / "m.onnx", input_names=["pixels"],
                                output_names=["logits"], dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}})
    data = calibrate.with_glitches(torch.rand(256, 64), 3, 50.0)
    assert int((data == 50.0).sum()) == 3
    batches = list(data.split(64))
    mm = calibrate.ranges(calibrate.tensors_data(path, "pixels", batches, "MinMax", workdir=tmp_path))
    pc = calibrate.ranges(calibrate.tensors_data(path, "pixels", batches, "Percentile", workdir=tmp_path))
    assert mm["pixels"][1] == pytest.approx(50.0)
    assert pc["pixels"][1] < 2.0
    entropy = calibrate.tensors_data(path, "pixels", batches, "Entropy", workdir=tmp_path, num_bins=256)
    assert calibrate.ranges(entropy)["pixels"][1] < 50.0  # a finer histogram than ORT's default lets it clip
    out = calibrate.quantize_static_with(path, tmp_path / "q.onnx", entropy, workdir=tmp_path)
    fp32 = onnx_io.ort_session(path).run(None, {"pixels": data[4:8].numpy()})[0]
    int8 = onnx_io.ort_session(out).run(None, {"pixels": data[4:8].numpy()})[0]
    assert int8.shape == (4, 10) and abs(int8 - fp32).max() < 0.1 * abs(fp32).max()
    np = pytest.importorskip("numpy")
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    def int8_weight_amax(p):
        return max(int(np.abs(numpy_helper.to_array(t).astype(np.int32)).max())
                   for t in onnx.load(str(p)).graph.initializer if t.data_type == onnx.TensorProto.INT8 and t.dims)

    reduced = calibrate.quantize_static_with(path, tmp_path / "q7.onnx", entropy, workdir=tmp_path, reduce_range=True)
    assert int8_weight_amax(out) > 64 >= int8_weight_amax(reduced)  # 7-bit weights: no int16 pair can saturate
    with pytest.raises(ValueError, match="unknown calibration method"):
        calibrate.tensors_data(path, "pixels", batches, "Median", workdir=tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# lab 04q's checks: pass on a correct answer, fail with the symptom on typical mistakes, refuse the reference
# ---------------------------------------------------------------------------------------------------------------------

def good_qparams(xmin, xmax, qmin, qmax):
    xmin, xmax = min(float(xmin), 0.0), max(float(xmax), 0.0)
    scale = max((xmax - xmin) / (qmax - qmin), torch.finfo(torch.float32).eps)
    return scale, int(min(max(qmin - round(xmin / scale), qmin), qmax))


def good_quantize(x, scale, zero_point, qmin, qmax):
    return torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax).to(torch.int32)


def good_dequantize(q, scale, zero_point):
    return (q.to(torch.int32) - zero_point).to(torch.float32) * scale


def good_linear(qx, zx, sx, qw, sw, bias, s_out, z_out, *, use_zx=True, clip=True):
    acc = (qx.to(torch.int32) - (zx if use_zx else 0)) @ qw.to(torch.int32).T
    scale = sx * sw.to(torch.float64)
    if bias is not None:
        acc = acc + torch.round(bias.to(torch.float64) / scale).to(torch.int32)
    y = torch.round(acc.to(torch.float64) * (scale / s_out)) + z_out
    return (torch.clamp(y, -128, 127) if clip else y).to(torch.int32)


def test_lab_checks_pass_on_a_correct_answer(capsys):
    lab04q.check_qparams(good_qparams)
    lab04q.check_quantize(good_quantize, good_dequantize)
    lab04q.check_int8_linear(good_linear)
    assert capsys.readouterr().out.count("PASSED") == 3


def test_lab_checks_name_the_symptom():
    def no_widening(xmin, xmax, qmin, qmax):
        scale = max((xmax - xmin) / (qmax - qmin), 1e-7)
        return scale, int(round(qmin - xmin / scale))

    with pytest.raises(LabCheckFailed, match="outside|real 0"):
        lab04q.check_qparams(no_widening)

    def zero_step(xmin, xmax, qmin, qmax):
        xmin, xmax = min(xmin, 0.0), max(xmax, 0.0)
        scale = (xmax - xmin) / (qmax - qmin)
        return scale, int(qmin - round(xmin / scale)) if scale else qmin

    with pytest.raises(LabCheckFailed, match="finite and > 0"):
        lab04q.check_qparams(zero_step)

    def half_up(x, scale, zero_point, qmin, qmax):
        return torch.clamp(torch.floor(x / scale + 0.5) + zero_point, qmin, qmax).to(torch.int32)

    with pytest.raises(LabCheckFailed, match="halfway"):
        lab04q.check_quantize(half_up, good_dequantize)

    def no_clip(x, scale, zero_point, qmin, qmax):
        return (torch.round(x / scale) + zero_point).to(torch.int32)

    with pytest.raises(LabCheckFailed, match="saturate"):
        lab04q.check_quantize(no_clip, good_dequantize)

    with pytest.raises(LabCheckFailed, match="zero point is left out"):
        lab04q.check_int8_linear(lambda *a: good_linear(*a, use_zx=False))
    with pytest.raises(LabCheckFailed, match="saturate"):
        lab04q.check_int8_linear(lambda *a: good_linear(*a, clip=False))

    def shifted(x, scale, zero_point, qmin, qmax):  # the zero point added twice
        return good_quantize(x, scale, zero_point, qmin, qmax).add(zero_point).clamp(qmin, qmax)

    def no_output_scale(qx, zx, sx, qw, sw, bias, s_out, z_out):  # requantized as if s_out were 1
        return good_linear(qx, zx, sx, qw, sw, bias, 1.0, z_out)

    recipes = ("divide by the scale", "sx*sw", "add z_out", "step x (code")  # the answer, which no message may give
    for check, symptom in (
        (lambda: lab04q.check_quantize(shifted, good_dequantize), "codes differ|saturate"),
        (lambda: lab04q.check_quantize(good_quantize, lambda q, s, z: q.float() * s), "dequantize is off"),
        (lambda: lab04q.check_int8_linear(no_output_scale), "Follow the units|saturate"),
    ):
        with pytest.raises(LabCheckFailed, match=symptom) as info:
            check()
        assert not any(r in str(info.value) for r in recipes), str(info.value)


def test_lab_checks_refuse_the_reference_and_stubs():
    with pytest.raises(LabCheckFailed, match="reference implementation"):
        lab04q.check_quantize(affine.quantize, affine.dequantize)

    def stub(*_):
        raise NotImplementedError("TODO")

    for check, args in ((lab04q.check_qparams, (stub,)), (lab04q.check_quantize, (stub, stub)),
                        (lab04q.check_int8_linear, (stub,))):
        with pytest.raises(LabCheckFailed, match="not written yet"):
            check(*args)


# ---------------------------------------------------------------------------------------------------------------------
# lab 04q's open task: calibrate(samples, qmin, qmax), judged by held-out output error against min-max's
# ---------------------------------------------------------------------------------------------------------------------

def good_calibrate(samples, qmin, qmax, *, stray=1e-4, steps=100):
    """Keep the few values far from the rest out of the error, then search the clipping range with the smallest
    round-trip error of the samples (stray=0: the plain search, which the corrupted values steer)."""
    v = samples.flatten().float()
    k = max(1, int(v.numel() * stray)) if stray else 1
    lo, hi = float(v.kthvalue(k).values), float(v.kthvalue(v.numel() - k + 1).values)
    v = v[(v >= lo) & (v <= hi)]
    best = None
    for f in torch.linspace(1 / steps, 1.0, steps).tolist():
        scale, zp = good_qparams(lo * f, hi * f, qmin, qmax)
        err = float((good_dequantize(good_quantize(v, scale, zp, qmin, qmax), scale, zp) - v).pow(2).mean())
        if best is None or err < best[0]:
            best = (err, scale, zp)
    return best[1], best[2]


def test_calibration_cases_are_fresh_and_hold_out_their_inputs():
    names = list(lab04q.CALIBRATION_CASES)
    cases = [lab04q.calibration_case(n) for n in names]
    spans = [float(c["samples"].abs().max()) for c in cases]
    assert len({round(math.log10(s)) for s in spans}) == len(spans)  # scales far apart: no one range serves them all
    assert len({(c["qmin"], c["qmax"]) for c in cases}) == len(cases)
    for c in cases:
        assert c["inputs"].shape == (lab04q.CAL_CHUNKS, lab04q.CAL_CHUNK_TOKENS, lab04q.CAL_CHANNELS)
        assert not c["glitches"] or float(c["samples"].abs().max()) > 2 * float(c["inputs"].abs().max())
    again = lab04q.calibration_case(names[0])
    assert torch.equal(again["samples"], cases[0]["samples"])  # seeded: the measurement is deterministic


def test_calibration_check_passes_on_a_good_answer(capsys):
    results = lab04q.check_calibration(good_calibrate)
    out = capsys.readouterr().out
    assert "PASSED calibrate" in out
    assert re.search(r"^FIGURE calibration_error_ratio: \S+ x \(lower is better\)$", out, re.MULTILINE)
    assert out.count("-> held") == len(lab04q.CALIBRATION_CASES)
    for ratio in results.values():  # the reference's worst held-out chunk sits well under the line
        assert ratio.high * 1.3 <= lab04q.CALIBRATION_LINE, ratio


def minmax_calibrate(samples, qmin, qmax):
    return good_qparams(samples.min(), samples.max(), qmin, qmax)


def one_sd_calibrate(samples, qmin, qmax):  # clipped so hard that typical values saturate
    m, s = float(samples.mean()), float(samples.std())
    return good_qparams(m - s, m + s, qmin, qmax)


def hard_coded_calibrate(samples, qmin, qmax):  # the range that serves the first case, written into the code
    return good_qparams(-24.0, 22.0, qmin, qmax)


def table_calibrate(samples, qmin, qmax):  # a good answer for each format, computed once and looked up by format
    if not hasattr(table_calibrate, "table"):
        table_calibrate.table = {case[:2]: good_calibrate(lab04q.calibration_case(name)["samples"], *case[:2])
                                 for name, case in lab04q.CALIBRATION_CASES.items()}
    return table_calibrate.table[(qmin, qmax)]


def int8_only_calibrate(samples, qmin, qmax):  # ignores the format it is given
    return good_calibrate(samples, -128, 127)


def plain_search_calibrate(samples, qmin, qmax):  # the clipping search, steered by the corrupted values
    return good_calibrate(samples, qmin, qmax, stray=0)


def in_place_calibrate(samples, qmin, qmax):
    return good_calibrate(samples.clamp_(-20.0, 20.0), qmin, qmax)


def reference_calibrate(samples, qmin, qmax):
    lo, hi = samples.flatten().float().quantile(torch.tensor([1e-4, 1 - 1e-4]))
    return affine.qparams(float(lo), float(hi), 8, signed=qmin < 0)


@pytest.mark.parametrize("answer, symptom", [
    (minmax_calibrate, "no gain over min-max"),
    (one_sd_calibrate, "Clipping dominates: .* lie beyond your range"),
    (hard_coded_calibrate, "its range does not follow the samples it is given"),
    (table_calibrate, "its range does not follow the samples it is given"),
    (int8_only_calibrate, "ignores how many codes"),
    (plain_search_calibrate, "Rounding dominates.*a few far from the rest"),
    (in_place_calibrate, "changed the samples"),
    (lambda s, qmin, qmax: (0.0, 0), "finite and > 0"),
    (lambda s, qmin, qmax: (float(s.max() - s.min()) / 255, qmin - 1), "zero point .* lies outside"),
    (reference_calibrate, "reference implementation"),
])
def test_calibration_check_names_the_symptom(answer, symptom):
    with pytest.raises(LabCheckFailed, match=symptom) as info:
        lab04q.check_calibration(answer)
    recipes = ("percentile", "quantile", "kthvalue", "trim", "search over", "1e-4")  # the answer, which no message gives
    assert not any(r in str(info.value).lower() for r in recipes), str(info.value)


def test_calibration_check_refuses_a_stub():
    def stub(*_):
        raise NotImplementedError("TODO")

    with pytest.raises(LabCheckFailed, match="not written yet"):
        lab04q.check_calibration(stub)


def test_calibration_line_in_the_lab_text_matches_the_check():
    import json

    from utils.core import env

    nb = json.loads((env.repo_root() / "solutions" / "04_quantization_lab.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert f"`lab04q.CALIBRATION_LINE` ({lab04q.CALIBRATION_LINE:g})" in text
