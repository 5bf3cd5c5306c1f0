"""Predict what mixed precision (AMP) does to a training step on this hardware, before timing it (lesson 03).

Autocast speeds up only the matrix math (convolutions, matmuls), and only where the hardware computes 16-bit
products faster than fp32 ones; and it adds work of its own, casting the weights to 16 bits every step and their
gradients back. The prediction reads the capability table for the reason, and measures three small things:

- ``hardware_units(flags, gpu_capability)``: what the CPU flags (utils.core.env.cpu_flags) or the GPU's compute capability
  say about 16-bit units;
- ``matmul_share(profile)``: the share of the fp32 step spent in convolution and matmul operators (from a profile);
- ``layer_probe(model, example)``: the model's own convolution and linear layers, run one by one in fp32 and in 16
  bits: how much faster its matrix math gets here (``gemm_probe`` times plain matmuls of the same shapes, the
  units' best case, for comparison);
- ``cast_probe(model)``: what casting the weights to 16 bits and a gradient's worth back costs per step.

``predict_amp(...)`` combines them with Amdahl's law into an expectation: faster, about the same, or slower.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from utils.core import bench
from utils.training import profiling

__all__ = [
    "FLAGS", "FASTER", "SLOWER", "ESTIMATE_ERROR", "MATMUL_OPS", "Units", "hardware_units", "gemm_shapes", "Probe",
    "gemm_probe", "layer_probe", "cast_probe", "matmul_share", "AmpPrediction", "predict_amp", "outcome",
]

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")  # the capability table's rows
# fp32 time / AMP time from FASTER up counts as faster, up to SLOWER as slower, between as about the same
FASTER, SLOWER = 1.10, 1 / 1.10
# the estimate leaves out second-order costs (the backward's own kernels, activation casts, the rest of the model in
# 16 bits), so it is not finer than a factor ESTIMATE_ERROR either way: an estimate that close to a line between two
# outcomes predicts both
ESTIMATE_ERROR = 1.10
MATMUL_OPS = ("conv", "mm", "matmul", "linear", "gemm")  # operator names that run convolutions or matrix products
GPU_MATMUL_KERNELS = ("gemm", "conv", "xmma", "cutlass", "cudnn", "wgrad", "dgrad")  # the same, as GPU kernel names
_LAYERS = (torch.nn.Conv2d, torch.nn.Linear)


@dataclass(frozen=True)
class Units:
    """What the capability table says about 16-bit math here (lesson 03)."""

    name: str
    meaning: str

    def __str__(self) -> str:
        return f"{self.name}: {self.meaning}"


def hardware_units(flags, gpu_capability: tuple[int, int] | None = None) -> Units:
    """The 16-bit units from CPU flags (utils.core.env.cpu_flags), or from a GPU's compute capability when given."""
    if gpu_capability is not None:
        major, minor = gpu_capability
        if (major, minor) >= (7, 0):
            return Units(f"tensor cores (compute capability {major}.{minor})",
                         "fp16 matrix products at several times the fp32 rate")
        return Units(f"no tensor cores (compute capability {major}.{minor})",
                     "fp16 runs on the fp32 units: little to gain beyond memory traffic")
    flags = set(flags)
    if "amx_bf16" in flags:
        return Units("AMX tiles (amx_bf16)", "bf16 matrix products on tile units, many times the fp32 vector rate")
    if "avx512_bf16" in flags:
        return Units("AVX512-BF16 dot products (avx512_bf16, no AMX)",
                     "one instruction does twice the multiply-adds of an fp32 FMA: about twice the peak rate, peak to "
                     "peak, for the matrix math (a measured ratio compares two kernels at their own distance from "
                     "their peaks, and bf16 also halves the operand bytes)")
    if "avx512f" in flags:
        return Units("AVX-512 without bf16 arithmetic",
                     "oneDNN widens bf16 to fp32, computes in fp32 and narrows the result: extra work, no faster math")
    if "avx2" in flags:
        return Units("no AVX-512 (AVX2 at most)",
                     "no vectorised bf16 kernels in oneDNN: PyTorch falls back to generic code, far slower than fp32")
    # ARM, in Linux's names (/proc/cpuinfo's Features line; macOS sysctl hw.optional, mapped by utils.core.env)
    if "bf16" in flags:
        return Units("ARM BF16 instructions (bf16: BFDOT, BFMMLA)",
                     "bf16 dot products and small matrix multiply-accumulates: up to about twice the fp32 rate for "
                     "matrix math where the kernel library (oneDNN with the Arm Compute Library) uses them; the "
                     "measured GEMM probe says whether this build does")
    if "asimd" in flags:
        return Units("ARM NEON without bf16 arithmetic",
                     "bf16 is widened to fp32 for the math: no faster matrix products, only half the operand bytes")
    return Units("CPU features unknown (none could be read here)",
                 "no prediction from the hardware: the measured GEMM probe below is the only evidence")


def gemm_shapes(model, example) -> list[tuple[int, int, int]]:
    """The (M, K, N) of every convolution and linear layer of `model` on `example`, as the GEMM it lowers to.

    A convolution with C_in input channels, a kh x kw kernel and C_out outputs on an N x H_out x W_out output is a
    matrix product of (N*H_out*W_out) x (C_in/groups*kh*kw) by (C_in/groups*kh*kw) x C_out (im2col).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"gemm_shapes() needs a torch.nn.Module, got {type(model).__name__}")
    shapes: list[tuple[int, int, int]] = []
    for module, x, y in _layer_calls(model, example):
        if isinstance(module, torch.nn.Conv2d):
            m = y[0] * y[2] * y[3]
            k = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            shapes.append((m, k, module.out_channels))
        else:
            shapes.append((x.numel() // x.shape[-1], module.in_features, module.out_features))
    return shapes


def _layer_calls(model, example) -> list[tuple]:
    """(layer, its input, its output shape) for every Conv2d and Linear call of one no-grad forward pass on `example`."""
    calls = []
    handles = [m.register_forward_hook(lambda m, i, o: calls.append((m, i[0].detach().clone(), tuple(o.shape))))
               for m in model.modules() if isinstance(m, _LAYERS)]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    if not calls:
        raise ValueError(f"{type(model).__name__} has no Conv2d or Linear layer: nothing for AMP to speed up")
    return calls


@dataclass(frozen=True)
class Probe:
    """Some work timed in fp32 and in a 16-bit `dtype` in rounds (lesson 03): each round keeps each side's fastest
    call; `fp32_ms`/`low_ms` are the fastest overall, `speedup` the per-round ratios as a bench.Ratio."""

    what: str
    dtype: str
    fp32_ms: float
    low_ms: float
    gflop: float = 0.0
    fp32_rounds: tuple[float, ...] = ()
    low_rounds: tuple[float, ...] = ()

    @property
    def speedup(self) -> bench.Ratio:
        """fp32 time / 16-bit time with the spread of the rounds (one round when none were kept)."""
        if not self.fp32_rounds:
            return bench.Ratio.from_times([self.fp32_ms], [self.low_ms])
        return bench.Ratio.from_times(self.fp32_rounds, self.low_rounds)

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios (what the prediction uses)."""
        return self.speedup.value

    def __str__(self) -> str:
        rate = (lambda ms: f" ({self.gflop / ms * 1e3:.0f} GFLOP/s)") if self.gflop else (lambda ms: "")
        return (f"{self.what}: fp32 {self.fp32_ms:.1f} ms{rate(self.fp32_ms)}, {self.dtype} {self.low_ms:.1f} ms"
                f"{rate(self.low_ms)}: {self.speedup}")


def _check(dtype, calls) -> None:
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive int, got {calls!r}")


def _fastest(fp32_fn, low_fn, calls: int, device, rounds: int = 1) -> tuple[list[float], list[float]]:
    """Run the two alternately `calls` times each, split into `rounds`; per round each keeps its fastest call (ms).

    On a shared machine other programs only ever slow a call down, so the fastest of many short calls is the one
    least disturbed (a median over long blocks would average the disturbance in). The rounds give the ratio its
    spread.
    """
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            fn()
        sync()
        return (time.perf_counter() - t0) * 1e3

    timed(fp32_fn), timed(low_fn)  # first calls: kernel selection, allocations
    rounds = max(1, min(rounds, calls))
    best32, best16 = [float("inf")] * rounds, [float("inf")] * rounds
    for i in range(calls):
        r = i * rounds // calls
        best32[r], best16[r] = min(best32[r], timed(fp32_fn)), min(best16[r], timed(low_fn))
    return best32, best16


def _probe(what, dtype, fp32_fn, low_fn, calls, device, rounds, gflop=0.0) -> Probe:
    r32, r16 = _fastest(fp32_fn, low_fn, calls, device, rounds)
    return Probe(what, str(dtype).removeprefix("torch."), min(r32), min(r16), gflop, tuple(r32), tuple(r16))


def gemm_probe(shapes, dtype=torch.bfloat16, *, device="cpu", calls: int = 20, seed: int = 0, rounds: int = 5) -> Probe:
    """Plain matmuls of the given (M, K, N) shapes in fp32 and in `dtype`: the 16-bit units' best case (lesson 03)."""
    shapes = [tuple(int(v) for v in s) for s in shapes]
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"shapes must be (M, K, N) triples of positive ints, got {shapes[:3]!r}...")
    _check(dtype, calls)
    gen = torch.Generator().manual_seed(seed)
    pairs32 = [(torch.randn(m, k, generator=gen).to(device), torch.randn(k, n, generator=gen).to(device))
               for m, k, n in shapes]
    pairs16 = [(a.to(dtype), b.to(dtype)) for a, b in pairs32]
    gflop = sum(2 * m * k * n for m, k, n in shapes) / 1e9
    return _probe("plain matmuls of the model's GEMM shapes", dtype, lambda: [a @ b for a, b in pairs32],
                  lambda: [a @ b for a, b in pairs16], calls, device, rounds, gflop)


def _run_layers(layers, dtype, grads=None):
    """Each layer's forward; with `grads` (one output gradient per layer) also its backward: the input and the weight
    gradient, the two convolutions (or matmuls) autograd runs for it in a training step."""
    for i, (module, x, w) in enumerate(layers):
        if isinstance(module, torch.nn.Conv2d):
            F.conv2d(x, w, None, module.stride, module.padding, module.dilation, module.groups)
            if grads is not None:
                torch.ops.aten.convolution_backward(grads[i], x, w, None, module.stride, module.padding,
                                                    module.dilation, False, [0, 0], module.groups, [True, True, False])
        else:
            F.linear(x, w)
            if grads is not None:
                g = grads[i].reshape(-1, w.shape[0])
                g @ w, g.t() @ x.reshape(-1, w.shape[1])  # input gradient, weight gradient


def layer_probe(model, example, dtype=torch.bfloat16, *, calls: int = 20, rounds: int = 5,
                backward: bool = False) -> Probe:
    """The model's convolution and linear layers, each on the input it gets from `example`, in fp32 and `dtype`.

    The same kernels the training step's *forward* runs (lesson 03), without the rest of the model around them. With
    `backward`, each layer also runs its backward (the input and weight gradients, about twice the forward's work,
    from a random output gradient), so the ratio covers the kernels of a whole training step's matrix math; without
    it, using the ratio for the backward assumes it gains what the forward gains.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"layer_probe() needs a torch.nn.Module, got {type(model).__name__}")
    _check(dtype, calls)
    calls_made = _layer_calls(model, example)
    layers32 = [(m, x.float(), m.weight.detach().float()) for m, x, _ in calls_made]
    layers16 = [(m, x.to(dtype), w.to(dtype)) for m, x, w in layers32]
    gflop = sum(2 * m * k * n for m, k, n in gemm_shapes(model, example)) / 1e9
    grads32 = grads16 = None
    if backward:
        gen = torch.Generator().manual_seed(0)
        grads32 = [torch.randn(shape, generator=gen).to(example.device) for _, _, shape in calls_made]
        grads16 = [g.to(dtype) for g in grads32]
        gflop *= 3  # the two gradients cost about twice the forward
    what = "the model's own conv and linear layers (" + ("forward and backward" if backward else "forward only") + ")"
    return _probe(what, dtype, lambda: _run_layers(layers32, torch.float32, grads32),
                  lambda: _run_layers(layers16, dtype, grads16), calls, example.device, rounds, gflop)


def cast_probe(model, dtype=torch.bfloat16, *, calls: int = 10) -> float:
    """Milliseconds autocast spends per training step casting (lesson 03), measured as the fastest of `calls`.

    Forward: every conv and linear weight fp32 -> 16 bits; backward: each weight's 16-bit gradient -> fp32.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"cast_probe() needs a torch.nn.Module, got {type(model).__name__}")
    _check(dtype, calls)
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, _LAYERS)]
    grads16 = [w.to(dtype) for w in weights]
    device = weights[0].device if weights else "cpu"

    def casts():
        for w, g in zip(weights, grads16, strict=True):
            w.to(dtype)
            g.float()

    return min(_fastest(casts, lambda: None, calls, device)[0])


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
    """What AMP should do to the step here, and why (lesson 03).

    `outcomes` are the outcomes the estimate allows within its error (ESTIMATE_ERROR either way), the estimate's own
    first: one outcome where the estimate is far from a line, two where it is near one.
    """

    outcomes: tuple[str, ...]  # e.g. ("faster",) or ("faster", "about the same")
    estimate: float  # 1 / ((1 - share) + share / layer_ratio + cast_share)
    units: Units
    share: float
    layer_ratio: float
    cast_share: float

    @property
    def expected(self) -> str:
        """The prediction in words: 'faster', or 'faster or about the same' when the estimate is near a line."""
        return " or ".join(self.outcomes)

    @property
    def low(self) -> float:
        return self.estimate / ESTIMATE_ERROR

    @property
    def high(self) -> float:
        return self.estimate * ESTIMATE_ERROR

    def held(self, measured_speedup: float) -> bool:
        """Whether a measured fp32-time / AMP-time ratio falls in one of the predicted outcomes."""
        return outcome(measured_speedup) in self.outcomes

    def __str__(self) -> str:
        left = (1 - self.share) + self.share / self.layer_ratio + self.cast_share
        text = (f"{self.units}. The matrix math is {self.share:.0%} of the fp32 step and the model's layers run "
                f"{self.layer_ratio:.2f}x as fast in 16 bits here; the casts add {self.cast_share:.0%} of the step. "
                f"So the step should take {1 - self.share:.2f} + {self.share:.2f} / {self.layer_ratio:.2f} + "
                f"{self.cast_share:.2f} = {left:.2f} of its fp32 time: {self.estimate:.2f}x")
        if len(self.outcomes) == 1:
            return f"{text}, i.e. {self.expected} (still {self.expected} anywhere in {self.low:.2f}-{self.high:.2f}x)"
        line = next(v for v in (SLOWER, FASTER) if self.low < v < self.high)
        return (f"{text}; within the estimate's error ({self.low:.2f}-{self.high:.2f}x) that is {self.expected}: "
                f"too close to the {line:.2f}x line to call one")


def outcome(speedup: float) -> str:
    """'faster', 'about the same' or 'slower' for a measured (or estimated) fp32-time / AMP-time ratio."""
    if not speedup > 0:
        raise ValueError(f"a speedup is a positive ratio, got {speedup!r}")
    return "faster" if speedup >= FASTER else "slower" if speedup <= SLOWER else "about the same"


def predict_amp(*, flags, layer_ratio: float, share: float, cast_share: float = 0.0,
                gpu_capability: tuple[int, int] | None = None) -> AmpPrediction:
    """Expect faster / about the same / slower (lesson 03), by Amdahl's law plus autocast's own casts.

    Only the matrix math (`share` of the fp32 step) changes speed, by `layer_ratio`; the rest stays as it is; the
    casts add `cast_share` of the fp32 step. `flags` / `gpu_capability` name the units that explain the ratio. The
    outcomes are those of the estimate and of the estimate ESTIMATE_ERROR either way (one, or two near a line).
    """
    if not 0 <= share <= 1:
        raise ValueError(f"share is a fraction of the step between 0 and 1, got {share!r}")
    if not layer_ratio > 0:
        raise ValueError(f"layer_ratio is a positive speed ratio, got {layer_ratio!r}")
    if not cast_share >= 0:
        raise ValueError(f"cast_share is a fraction of the step >= 0, got {cast_share!r}")
    units = hardware_units(flags, gpu_capability)
    estimate = 1 / ((1 - share) + share / layer_ratio + cast_share)
    outcomes = [outcome(estimate)]
    for line, below, above in ((SLOWER, "slower", "about the same"), (FASTER, "about the same", "faster")):
        if estimate / ESTIMATE_ERROR < line < estimate * ESTIMATE_ERROR:  # the line lies inside the error: both sides
            outcomes += [o for o in (below, above) if o not in outcomes]
    return AmpPrediction(tuple(outcomes), estimate, units, share, layer_ratio, cast_share)
