"""utils.training.precision (lesson 03): the AMP prediction from the capability table, a GEMM probe and the matmul share."""

import pytest
import torch

from utils import training
from utils.core.data import image_data
from utils.training import precision, profiling

# the CPU flags of the four kinds of machine this project has run on (only the rows the rule reads)
AVX2_EPYC = {"avx2", "fma"}
AVX512_XEON = {"avx2", "avx512f", "avx512_vnni"}
ZEN4_EPYC = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
AMX_XEON = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}


def test_units_follow_the_flags():
    assert "AVX2" in precision.hardware_units(AVX2_EPYC).name
    assert "without bf16" in precision.hardware_units(AVX512_XEON).name
    assert "AVX512-BF16" in precision.hardware_units(ZEN4_EPYC).name
    assert "peak to peak" in precision.hardware_units(ZEN4_EPYC).meaning  # not a cap on a measured ratio
    assert "AMX" in precision.hardware_units(AMX_XEON).name
    assert "tensor cores" in precision.hardware_units(set(), gpu_capability=(9, 0)).name
    assert "no tensor cores" in precision.hardware_units(set(), gpu_capability=(6, 1)).name
    # ARM (Graviton 3 with bf16, a NEON-only core) and a CPU whose features could not be read
    assert "ARM BF16" in precision.hardware_units({"asimd", "sve", "bf16", "i8mm"}).name
    assert "NEON without bf16" in precision.hardware_units({"asimd", "asimddp"}).name
    assert "unknown" in precision.hardware_units(set()).name


@pytest.mark.parametrize("flags, ratio, share, casts, outcomes", [
    (AVX2_EPYC, 0.05, 0.7, 0.1, ("slower",)),  # generic bf16 code: the matrix math gets 20x slower
    (AVX512_XEON, 0.7, 0.7, 0.1, ("slower",)),  # widened to fp32: a little slower, plus the casts
    # the small layers gain little, the casts take most of it back: 1.08x, within 10% of the 1.10x line
    (ZEN4_EPYC, 1.3, 0.68, 0.08, ("about the same", "faster")),
    (ZEN4_EPYC, 1.8, 0.85, 0.05, ("faster",)),  # bigger images: more of the step is matrix math, and it gains more
    (AMX_XEON, 6.0, 0.7, 0.1, ("faster",)),
])
def test_prediction_is_amdahl_plus_casts(flags, ratio, share, casts, outcomes):
    p = precision.predict_amp(flags=flags, layer_ratio=ratio, share=share, cast_share=casts)
    assert p.outcomes == outcomes
    assert p.expected == " or ".join(outcomes)
    assert p.estimate == pytest.approx(1 / ((1 - share) + share / ratio + casts))
    assert p.expected in str(p) and f"{p.estimate:.2f}x" in str(p)


def test_an_estimate_near_a_line_predicts_both_sides_and_judges_a_measurement_by_them():
    # Amdahl gives 1.15x, within the estimate's 10% of the 1.10x line between "about the same" and "faster"
    p = precision.predict_amp(flags=ZEN4_EPYC, layer_ratio=1.35, share=0.68, cast_share=0.05)
    assert p.estimate == pytest.approx(1.15, abs=0.01)
    assert p.outcomes == ("faster", "about the same") and "too close to the 1.10x line" in str(p)
    assert p.low == pytest.approx(p.estimate / precision.ESTIMATE_ERROR)
    assert p.held(1.3) and p.held(0.93) and not p.held(0.85)
    # an estimate on neither line's doorstep: one outcome, judged by it alone
    far = precision.predict_amp(flags=AVX2_EPYC, layer_ratio=0.05, share=0.7, cast_share=0.1)
    assert far.outcomes == ("slower",) and far.held(0.08) and not far.held(0.95)
    # exactly 1.0x: both lines sit on the error's edges, not inside it
    assert precision.predict_amp(flags=ZEN4_EPYC, layer_ratio=1.0, share=0.5).outcomes == ("about the same",)


def test_outcome_and_bad_input():
    assert precision.outcome(1.2) == "faster" and precision.outcome(1.0) == "about the same"
    assert precision.outcome(precision.FASTER) == "faster" and precision.outcome(0.95) == "about the same"
    assert precision.outcome(0.5) == "slower"
    with pytest.raises(ValueError, match="positive"):
        precision.outcome(0)
    with pytest.raises(ValueError, match="share"):
        precision.predict_amp(flags=set(), layer_ratio=1.0, share=1.5)
    with pytest.raises(ValueError, match="layer_ratio"):
        precision.predict_amp(flags=set(), layer_ratio=-1.0, share=0.5)
    with pytest.raises(ValueError, match="cast_share"):
        precision.predict_amp(flags=set(), layer_ratio=1.0, share=0.5, cast_share=-0.1)
    with pytest.raises(ValueError, match="M, K, N"):
        precision.gemm_probe([(4, 0, 4)])
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        precision.gemm_probe([(4, 4, 4)], torch.float64)
    with pytest.raises(ValueError, match="calls"):
        precision.cast_probe(torch.nn.Linear(2, 2), calls=0)
    with pytest.raises(ValueError, match="no Conv2d or Linear"):
        precision.gemm_shapes(torch.nn.ReLU(), torch.randn(2))
    with pytest.raises(ValueError, match="no Conv2d or Linear"):
        precision.layer_probe(torch.nn.ReLU(), torch.randn(2))
    with pytest.raises(TypeError, match="Module"):
        precision.layer_probe("resnet", torch.randn(2))


def test_shapes_and_probes():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    x = torch.randn(2, 3, 4, 4)
    shapes = precision.gemm_shapes(net, x)
    assert shapes == [(2 * 4 * 4, 3 * 9, 8), (2, 128, 5)]
    for probe in (precision.gemm_probe(shapes, calls=2), precision.layer_probe(net, x, calls=2)):
        assert probe.fp32_ms > 0 and probe.low_ms > 0 and probe.ratio > 0 and "GFLOP/s" in str(probe)
        assert probe.speedup.rounds == 2 and probe.speedup.low <= probe.ratio <= probe.speedup.high
    assert precision.cast_probe(net, calls=2) > 0


def test_matmul_share_reads_the_profile():
    ds = image_data.AugmentedImages(image_data.synthetic_cifar(8, cache=False), image_size=16)
    with training.Trainer(ds, training.LoopConfig.fast(num_workers=0), batch_size=2, model="resnet18") as tr:
        prof = profiling.profile_steps(tr.step, wait=0, warmup=1, active=1)
    share = precision.matmul_share(prof)
    assert 0.05 < share < 1.0


def test_the_backward_layer_probe_runs_the_gradients_autograd_runs():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, stride=2), torch.nn.Flatten(), torch.nn.Linear(32, 5))
    x = torch.randn(2, 3, 4, 4)
    probe = precision.layer_probe(net, x, calls=2, backward=True)
    assert "forward and backward" in probe.what and probe.ratio > 0
    conv = net[0]  # the call _run_layers makes for a conv layer gives autograd's input and weight gradients
    xi, w = x.clone().requires_grad_(), conv.weight.detach().clone().requires_grad_()
    out = torch.nn.functional.conv2d(xi, w, None, conv.stride, conv.padding)
    g = torch.randn_like(out)
    want = torch.autograd.grad(out, (xi, w), g)
    got = torch.ops.aten.convolution_backward(g, x, conv.weight.detach(), None, conv.stride, conv.padding,
                                              conv.dilation, False, [0, 0], conv.groups, [True, True, False])
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
