"""utils.precision (lesson 03): the AMP prediction from the capability table, a GEMM probe and the matmul share."""

import pytest
import torch

from utils import precision, profiling, training

# the CPU flags of the four kinds of machine this project has run on (only the rows the rule reads)
AVX2_EPYC = {"avx2", "fma"}
AVX512_XEON = {"avx2", "avx512f", "avx512_vnni"}
ZEN4_EPYC = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
AMX_XEON = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}


def test_units_follow_the_flags():
    assert "AVX2" in precision.hardware_units(AVX2_EPYC).name
    assert precision.hardware_units(AVX512_XEON).ceiling == 1.0
    assert precision.hardware_units(ZEN4_EPYC).ceiling == 2.0
    assert precision.hardware_units(AMX_XEON).ceiling is None and "AMX" in precision.hardware_units(AMX_XEON).name
    assert "tensor cores" in precision.hardware_units(set(), gpu_capability=(9, 0)).name
    assert "no tensor cores" in precision.hardware_units(set(), gpu_capability=(6, 1)).name


@pytest.mark.parametrize("flags, ratio, share, expected", [
    (AVX2_EPYC, 0.05, 0.7, "slower"),  # generic bf16 code: the matrix math gets 20x slower
    (AVX512_XEON, 0.7, 0.7, "slower"),  # widened to fp32: a little slower
    (ZEN4_EPYC, 1.05, 0.6, "about the same"),  # small GEMMs barely gain
    (ZEN4_EPYC, 1.8, 0.7, "faster"),
    (AMX_XEON, 6.0, 0.7, "faster"),
])
def test_prediction_is_amdahl_on_the_probe(flags, ratio, share, expected):
    p = precision.predict_amp(flags=flags, gemm_ratio=ratio, share=share)
    assert p.expected == expected
    assert p.estimate == pytest.approx(1 / ((1 - share) + share / ratio))
    assert p.probe_agrees and expected in str(p)


def test_a_probe_beyond_the_units_is_flagged():
    p = precision.predict_amp(flags=ZEN4_EPYC, gemm_ratio=6.0, share=0.7)
    assert not p.probe_agrees and "busy" in str(p)


def test_outcome_and_bad_input():
    assert precision.outcome(1.2) == "faster" and precision.outcome(1.0) == "about the same"
    assert precision.outcome(0.5) == "slower"
    with pytest.raises(ValueError, match="positive"):
        precision.outcome(0)
    with pytest.raises(ValueError, match="share"):
        precision.predict_amp(flags=set(), gemm_ratio=1.0, share=1.5)
    with pytest.raises(ValueError, match="gemm_ratio"):
        precision.predict_amp(flags=set(), gemm_ratio=-1.0, share=0.5)
    with pytest.raises(ValueError, match="M, K, N"):
        precision.gemm_probe([(4, 0, 4)])
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        precision.gemm_probe([(4, 4, 4)], torch.float64)
    with pytest.raises(ValueError, match="no Conv2d or Linear"):
        precision.gemm_shapes(torch.nn.ReLU(), torch.randn(2))


def test_gemm_shapes_and_probe():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    shapes = precision.gemm_shapes(net, torch.randn(2, 3, 4, 4))
    assert shapes == [(2 * 4 * 4, 3 * 9, 8), (2, 128, 5)]
    probe = precision.gemm_probe(shapes, min_run_time=0.01, rounds=1)
    assert probe.fp32_ms > 0 and probe.low_ms > 0 and probe.ratio > 0 and "GFLOP" in str(probe)


def test_matmul_share_reads_the_profile():
    ds = training.image_data.AugmentedImages(training.image_data.synthetic_cifar(8, cache=False), image_size=16)
    with training.Trainer(ds, training.LoopConfig.fast(num_workers=0), batch_size=2, model="resnet18") as tr:
        prof = profiling.profile_steps(tr.step, wait=0, warmup=1, active=1)
    share = precision.matmul_share(prof)
    assert 0.05 < share < 1.0
