"""Predict what mixed precision (AMP) does to a training step on this hardware, before timing it (lesson 03).

Autocast speeds up only the matrix math (convolutions, matmuls), and only where the hardware computes 16-bit
products faster than fp32 ones. So the prediction needs two numbers and the capability table that explains them:

- ``matmul_share(profile)``: the share of the fp32 step spent in convolution and matmul operators (from a profile);
- ``gemm_probe(shapes)``: how much faster the same matrix products run in 16 bits than in fp32 on this machine,
  timed as plain matmuls of the model's own GEMM shapes (``gemm_shapes(model, example)``);
- ``hardware_units(flags, gpu_capability)``: what the CPU flags (utils.env.cpu_flags) or the GPU's compute capability
  say about 16-bit units: the reason the probe comes out as it does.

``predict_amp(...)`` combines them with Amdahl's law into an expectation: faster, about the same, or slower.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from utils import bench, profiling

__all__ = [
    "FLAGS", "FASTER", "SLOWER", "MATMUL_OPS", "Units", "hardware_units", "gemm_shapes", "GemmProbe", "gemm_probe",
    "matmul_share", "AmpPrediction", "predict_amp", "outcome",
]

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")  # the capability table's rows
FASTER, SLOWER = 1.05, 0.95  # a step ratio (fp32 time / AMP time) outside this band counts as faster or slower
MATMUL_OPS = ("conv", "mm", "matmul", "linear", "gemm")  # operator names that run convolutions or matrix products
GPU_MATMUL_KERNELS = ("gemm", "conv", "xmma", "cutlass", "cudnn", "wgrad", "dgrad")  # the same, as GPU kernel names


@dataclass(frozen=True)
class Units:
    """What the capability table says about 16-bit math here (lesson 03)."""

    name: str
    meaning: str
    ceiling: float | None  # the most a 16-bit GEMM can gain over fp32 on these units (None: no useful limit)

    def __str__(self) -> str:
        return f"{self.name}: {self.meaning}"


def hardware_units(flags, gpu_capability: tuple[int, int] | None = None) -> Units:
    """The 16-bit units from CPU flags (utils.env.cpu_flags), or from a GPU's compute capability when given."""
    if gpu_capability is not None:
        major, minor = gpu_capability
        if (major, minor) >= (7, 0):
            return Units(f"tensor cores (compute capability {major}.{minor})",
                         "fp16 matrix products at several times the fp32 rate", None)
        return Units(f"no tensor cores (compute capability {major}.{minor})",
                     "fp16 runs on the fp32 units: little to gain beyond memory traffic", 2.0)
    flags = set(flags)
    if "amx_bf16" in flags:
        return Units("AMX tiles (amx_bf16)", "bf16 matrix products on tile units, many times the fp32 vector rate",
                     None)
    if "avx512_bf16" in flags:
        return Units("AVX512-BF16 dot products (avx512_bf16, no AMX)",
                     "one instruction does twice the multiply-adds of an fp32 FMA: at most 2x on the matrix math", 2.0)
    if "avx512f" in flags:
        return Units("AVX-512 without bf16 arithmetic",
                     "oneDNN widens bf16 to fp32, computes in fp32 and narrows the result: extra work, no faster math",
                     1.0)
    return Units("no AVX-512 (AVX2 at most)",
                 "no vectorised bf16 kernels in oneDNN: PyTorch falls back to generic code, far slower than fp32", 1.0)


def gemm_shapes(model, example) -> list[tuple[int, int, int]]:
    """The (M, K, N) of every convolution and linear layer of `model` on `example`, as the GEMM it lowers to.

    A convolution with C_in input channels, a kh x kw kernel and C_out outputs on an N x H_out x W_out output is a
    matrix product of (N*H_out*W_out) x (C_in/groups*kh*kw) by (C_in/groups*kh*kw) x C_out (im2col).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gemm_shapes() needs a torch.nn.Module, got {type(model).__name__}")
    shapes: list[tuple[int, int, int]] = []

    def hook(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            m = output.shape[0] * output.shape[2] * output.shape[3]
            k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            shapes.append((m, k, module.out_channels))
        else:
            shapes.append((inputs[0].numel() // inputs[0].shape[-1], module.in_features, module.out_features))

    handles = [mod.register_forward_hook(hook) for mod in model.modules()
               if isinstance(mod, torch.nn.Conv2d | torch.nn.Linear)]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    if not shapes:
        raise ValueError(f"{type(model).__name__} has no Conv2d or Linear layer: nothing for AMP to speed up")
    return shapes


@dataclass(frozen=True)
class GemmProbe:
    """Time for all the GEMMs once in fp32 and in `dtype` (lesson 03): the ratio is what 16 bits buy here."""

    dtype: str
    fp32_ms: float
    low_ms: float
    gflop: float

    @property
    def ratio(self) -> float:
        return self.fp32_ms / self.low_ms

    def __str__(self) -> str:
        return (f"{self.gflop:.2f} GFLOP of GEMMs: fp32 {self.fp32_ms:.1f} ms ({self.gflop / self.fp32_ms * 1e3:.0f} "
                f"GFLOP/s), {self.dtype} {self.low_ms:.1f} ms ({self.gflop / self.low_ms * 1e3:.0f} GFLOP/s): "
                f"{self.ratio:.2f}x")


def gemm_probe(shapes, dtype=torch.bfloat16, *, device="cpu", min_run_time: float = 0.5, rounds: int = 2,
               seed: int = 0) -> GemmProbe:
    """Time plain matmuls of the given (M, K, N) shapes in fp32 and in `dtype`, interleaved, best of `rounds`."""
    shapes = [tuple(int(v) for v in s) for s in shapes]
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"shapes must be (M, K, N) triples of positive ints, got {shapes[:3]!r}...")
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    gen = torch.Generator().manual_seed(seed)
    pairs32 = [(torch.randn(m, k, generator=gen).to(device), torch.randn(k, n, generator=gen).to(device))
               for m, k, n in shapes]
    pairs16 = [(a.to(dtype), b.to(dtype)) for a, b in pairs32]

    def run(pairs):
        return [a @ b for a, b in pairs]

    best = {}
    for _ in range(rounds):
        for name, pairs in (("fp32", pairs32), ("low", pairs16)):
            ms = bench.measure(lambda p=pairs: run(p), name, warmup=1, min_run_time=min_run_time).median_ms
            best[name] = min(best.get(name, ms), ms)
    gflop = sum(2 * m * k * n for m, k, n in shapes) / 1e9
    return GemmProbe(str(dtype).removeprefix("torch."), best["fp32"], best["low"], gflop)


def matmul_share(profile, phases=("forward", "backward")) -> float:
    """Share of the profiled step spent in convolution and matmul operators inside `phases` (lesson 03).

    Self CPU time of operators whose name contains one of MATMUL_OPS, over the step's time. On a GPU the CPU timeline
    shows launches, not kernels, so there it is the device time of GEMM and convolution kernels over the step's time.
    """
    if torch.cuda.is_available():  # kernels on the device timeline (unverified: no GPU where this was written)
        events = profile.prof.events() if isinstance(profile, profiling.Profile) else profile.events()
        step_us = sum(ev.cpu_time_total for ev in events if ev.name.startswith("ProfilerStep"))
        spent = sum(ev.self_device_time_total for ev in events
                    if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.is_user_annotation
                    and any(word in ev.name.lower() for word in GPU_MATMUL_KERNELS))
        return min(1.0, spent / step_us) if step_us else 0.0
    times = profiling.phase_times(profile)
    ops = profiling.ops_by_phase(profile)
    spent = sum(ms for ph in phases for op, ms in ops.get(ph, {}).items()
                if any(word in op.lower() for word in MATMUL_OPS))
    return spent / times["step"]


@dataclass(frozen=True)
class AmpPrediction:
    """What AMP should do to the step here, and why (lesson 03)."""

    expected: str  # "faster", "about the same" or "slower"
    estimate: float  # Amdahl: 1 / ((1 - share) + share / gemm_ratio)
    units: Units
    share: float
    gemm_ratio: float

    @property
    def probe_agrees(self) -> bool:
        """False when the GEMM probe gained more than the units allow (25% slack): a busy machine skewed it."""
        return self.units.ceiling is None or self.gemm_ratio <= 1.25 * self.units.ceiling

    def __str__(self) -> str:
        text = (f"{self.units}. The matrix math is {self.share:.0%} of the fp32 step and runs {self.gemm_ratio:.2f}x "
                f"as fast in 16 bits here, so the step should take {(1 - self.share) + self.share / self.gemm_ratio:.2f} "
                f"of its fp32 time: {self.estimate:.2f}x, i.e. {self.expected}")
        if not self.probe_agrees:
            text += (f" (but the probe's {self.gemm_ratio:.2f}x is more than these units allow, about "
                     f"{self.units.ceiling:g}x: the machine was probably busy while it ran; rerun the cell)")
        return text


def outcome(speedup: float) -> str:
    """'faster', 'about the same' or 'slower' for a measured (or estimated) fp32-time / AMP-time ratio."""
    if not speedup > 0:
        raise ValueError(f"a speedup is a positive ratio, got {speedup!r}")
    return "faster" if speedup >= FASTER else "slower" if speedup <= SLOWER else "about the same"


def predict_amp(*, flags, gemm_ratio: float, share: float, gpu_capability: tuple[int, int] | None = None
                ) -> AmpPrediction:
    """Expect faster / about the same / slower from the 16-bit units, the GEMM probe and the matmul share (lesson 03).

    Amdahl's law: only the matrix math changes speed (by `gemm_ratio`); the rest of the step stays as it is. The
    estimate leaves out autocast's own casts, so it is an upper bound on what AMP can gain here.
    """
    if not 0 <= share <= 1:
        raise ValueError(f"share is a fraction of the step between 0 and 1, got {share!r}")
    if not gemm_ratio > 0:
        raise ValueError(f"gemm_ratio is a positive speed ratio, got {gemm_ratio!r}")
    units = hardware_units(flags, gpu_capability)
    estimate = 1 / ((1 - share) + share / gemm_ratio)
    return AmpPrediction(outcome(estimate), estimate, units, share, gemm_ratio)
