"""Theoretical occupancy from what the compiler reports (lesson 06): registers and shared memory per kernel, read from
ptxas's `-v` report, turned into resident blocks and warps per SM for a named GPU, with the limit that binds.

    check = kernels.compile_check_cuda("90")       # softmax.cu through nvcc -Xptxas=-v: no GPU needed
    rows = softmax_cu_occupancy(check.log)          # per kernel and launch block size: registers, shared, Occupancy
    occupancy(registers=32, threads=128)            # the calculation alone

Occupancy is resident warps / the SM's maximum. It is an upper bound on latency hiding, not a speed: a memory-bound
kernel often reaches the copy roof well below 100%, and a kernel at 100% can still stall on bandwidth. What it does
say, exactly, is how many blocks of a kernel can be on one SM at once, and which resource stops the next one.

The rules are those of CUDA's own calculator, cuda_occupancy.h (shipped in the toolkit: include/cuda_occupancy.h of
CUDA 13.0, functions cudaOccMaxBlocksPerSMRegsLimit and cudaOccMaxBlocksPerSMSmemLimit): registers are allocated
per warp, registers x 32 rounded up to 256 (cudaOccRegAllocationGranularity), out of the register file split into
4 sub-partitions (cudaOccSubPartitionsPerMultiprocessor); shared memory per block is the kernel's static + dynamic
bytes + the 1 KiB the driver reserves per block since Ampere (cudaDeviceProp::reservedSharedMemPerBlock), rounded up
to 128 bytes (cudaOccSMemAllocationGranularity, compute capability 8-12). The per-SM limits of an H100 (compute
capability 9.0) are the CUDA C++ Programming Guide's "Technical Specifications per Compute Capability": 65,536
32-bit registers, 2,048 threads (64 warps), 32 resident blocks (also cudaOccMaxBlocksPerMultiprocessor), 228 KiB of
shared memory per SM with up to 227 KiB per block, 1,024 threads and 64K registers per block, 255 registers per
thread. Shared memory is counted against the largest carveout (228 KiB); the driver picks the carveout per kernel,
and for kernels that use a few hundred bytes, as most of softmax.cu's do, shared memory is nowhere near the binding
limit; its shared-memory kernel, which holds a whole row, is the exception (softmax_cu_occupancy shows it per row length).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from pathlib import Path

from utils import kernels

__all__ = ["SmLimits", "H100", "KernelUsage", "Occupancy", "parse_ptxas", "occupancy", "ptxas_usage",
           "softmax_cu_block_threads", "softmax_cu_launches", "softmax_cu_occupancy", "triton_occupancy"]


@dataclasses.dataclass(frozen=True)
class SmLimits:
    """Per-SM limits of one GPU architecture, and the allocation rules of cuda_occupancy.h (see the module doc)."""

    name: str
    registers: int  # 32-bit registers per SM
    max_warps: int
    max_blocks: int
    shared_bytes: int  # shared memory per SM (maximum carveout)
    shared_per_block: int  # most a block may use (opt-in), excluding the reserved bytes
    max_threads_per_block: int = 1024
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_granularity: int = 256  # registers, per warp
    sub_partitions: int = 4
    shared_granularity: int = 128  # bytes
    reserved_shared_per_block: int = 1024  # bytes, the driver's, per block
    warp: int = 32


H100 = SmLimits("H100 (sm_90)", registers=65536, max_warps=64, max_blocks=32, shared_bytes=228 * 1024,
                shared_per_block=227 * 1024)


@dataclasses.dataclass
class KernelUsage:
    """One kernel's resources, as ptxas -v reports them."""

    name: str  # the mangled symbol
    registers: int
    shared_bytes: int = 0  # static shared memory ("smem"); Triton's dynamic shared memory is not in it
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    barriers: int = 0

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads


@dataclasses.dataclass
class Occupancy:
    """Resident blocks and warps per SM for one kernel at one block size, and what limits them."""

    threads: int
    registers: int
    shared_bytes: int
    blocks: int  # resident blocks per SM
    warps: int  # resident warps per SM
    fraction: float  # warps / the SM's maximum
    limiter: str  # "warps", "blocks", "registers" or "shared memory" (the first of the tied ones)
    limits: dict[str, int]  # blocks each resource alone would allow

    def __str__(self) -> str:
        return (f"{self.threads} threads x {self.registers} registers, {self.shared_bytes} B shared: {self.blocks} "
                f"blocks = {self.warps} warps per SM ({self.fraction:.0%}), limited by {self.limiter}")


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")


def parse_ptxas(text: str) -> dict[str, KernelUsage]:
    """{mangled kernel name: KernelUsage} from ptxas's verbose report (``nvcc -Xptxas=-v`` or ``--resource-usage``,
    or ``ptxas -v``). A report with no kernel gives {}; a kernel without a "Used N registers" line is left out."""
    if not isinstance(text, str):
        raise TypeError(f"parse_ptxas: expected ptxas's report as text, got {type(text).__name__}")
    found: dict[str, KernelUsage] = {}
    current, props = None, (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current, props = m.group(1), (0, 0, 0)
        elif (m := _PROPS.search(line)) and current:
            props = tuple(int(g) for g in m.groups())
        elif (m := _USED.search(line)) and current:
            regs, barriers, smem = (int(g) if g else 0 for g in m.groups())
            found[current] = KernelUsage(current, regs, smem, props[1], props[2], props[0], barriers)
            current = None
    return found


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def occupancy(registers: int, threads: int, shared_bytes: int = 0, limits: SmLimits = H100) -> Occupancy:
    """Theoretical occupancy of a kernel using `registers` per thread and `shared_bytes` (static + dynamic) per block,
    launched with `threads` per block, on `limits` (lesson 06). cuda_occupancy.h's rules; see the module doc."""
    for name, value in (("registers", registers), ("threads", threads), ("shared_bytes", shared_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"occupancy: {name} must be a non-negative int, got {value!r}")
    if not 1 <= threads <= limits.max_threads_per_block:
        raise ValueError(f"occupancy: threads per block must be 1..{limits.max_threads_per_block} on {limits.name}, "
                         f"got {threads}")
    if registers > limits.max_registers_per_thread:
        raise ValueError(f"occupancy: {registers} registers per thread is more than {limits.name} allows "
                         f"({limits.max_registers_per_thread}); ptxas would have spilled instead")
    if shared_bytes > limits.shared_per_block:
        raise ValueError(f"occupancy: {shared_bytes} B of shared memory per block is more than {limits.name} allows "
                         f"({limits.shared_per_block} B); the launch would fail")
    warps = -(-threads // limits.warp)
    per_warp = _round_up(registers * limits.warp, limits.register_granularity)
    by_regs = 10**9
    if per_warp:
        if per_warp * _round_up(warps, limits.sub_partitions) > limits.registers_per_block:
            raise ValueError(f"occupancy: {threads} threads x {registers} registers do not fit one block's "
                             f"{limits.registers_per_block} registers on {limits.name}; the launch would fail")
        warps_per_partition = (limits.registers // limits.sub_partitions) // per_warp
        by_regs = warps_per_partition * limits.sub_partitions // warps
    per_block_shared = _round_up(shared_bytes + limits.reserved_shared_per_block, limits.shared_granularity)
    blocks_by = {"warps": limits.max_warps // warps, "blocks": limits.max_blocks, "registers": by_regs,
                 "shared memory": limits.shared_bytes // per_block_shared}
    blocks = min(blocks_by.values())
    limiter = next(k for k, v in blocks_by.items() if v == blocks)
    return Occupancy(threads, registers, shared_bytes, blocks, blocks * warps, blocks * warps / limits.max_warps,
                     limiter, blocks_by)


def ptxas_usage(ptx: str, *, ptxas: str | Path | None = None, timeout: int = 300) -> KernelUsage:
    """Run ptxas -v on PTX text (Triton's ``compiled.asm["ptx"]``) for the GPU its ``.target`` line names and return
    the one kernel's usage. `ptxas` defaults to the one that ships with triton (no CUDA toolkit needed)."""
    target = re.search(r"^\.target\s+(\w+)", ptx, re.M) if isinstance(ptx, str) else None
    if target is None:
        raise ValueError("ptxas_usage: expected PTX text with a `.target sm_XX` line (Triton: compiled.asm['ptx'])")
    if ptxas is None:
        import triton

        ptxas = triton.knobs.nvidia.ptxas.path
    if not Path(ptxas).is_file():
        raise RuntimeError(f"ptxas_usage needs ptxas; none at {ptxas} (triton's NVIDIA backend ships one)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.ptx"
        path.write_text(ptx)
        run = subprocess.run([str(ptxas), "-v", f"--gpu-name={target.group(1)}", str(path), "-o", f"{path}.o"],
                             capture_output=True, text=True, timeout=timeout)
    report = run.stdout + run.stderr
    usage = parse_ptxas(report)
    if run.returncode != 0 or len(usage) != 1:
        raise RuntimeError(f"ptxas -v gave {len(usage)} kernels (exit {run.returncode}), expected one:\n"
                           f"{report[-2000:]}")
    return next(iter(usage.values()))


def softmax_cu_block_threads(n: int, vec: int) -> int:
    """Threads per block softmax.cu's block kernels are launched with for rows of `n` (its ``block_threads``): 256,
    doubled up to 1024 while each thread would get more than 8 vectors of `vec` elements. Kept in step with the C++
    by tests/unit/test_occupancy.py, which reads the function from softmax.cu."""
    per_thread = -(-n // vec)
    threads = 256
    while threads < 1024 and per_thread > threads * 8:
        threads *= 2
    return threads


# The launch shapes of softmax.cu (softmax_forward_cuda / softmax_backward_cuda): the warp kernels always run
# 32 x kWarpRowsPerBlock = 128 threads; the block and shared-memory kernels 256-1024 threads (block_threads); the
# split-row kernels kSplitThreads = 512.
_WARP_THREADS = 128
_SPLIT_THREADS = 512
# Row lengths at which the shared-memory kernel's rows are shown: its dynamic shared memory is the row itself
# (n x 4 bytes for float32, half and bfloat16, which it widens to float; n x 8 for float64), so its occupancy depends
# on n, unlike the other kernels'.
SMEM_EXAMPLE_COLS = (2048, 8192, 16384)


def softmax_cu_launches(kernel: str) -> list[int]:
    """The block sizes softmax.cu launches `kernel` (a demangled name) with: [128] for the warp kernels, [512] for the
    split-row kernels, the three sizes block_threads can return for the block and shared-memory kernels."""
    if "_warp<" in kernel:
        return [_WARP_THREADS]
    if "_split_" in kernel:
        return [_SPLIT_THREADS]
    if "_block<" in kernel or "_smem<" in kernel:
        return [256, 512, 1024]
    raise ValueError(f"softmax_cu_launches: expected a softmax.cu kernel (..._warp<...>, ..._block<...>, "
                     f"..._smem<...> or ..._split_...), got {kernel!r}")


def _template_args(kernel: str) -> list[str]:
    return [a.strip() for a in kernel[kernel.index("<") + 1: kernel.rindex(">")].split(",")]


def softmax_cu_occupancy(report: str, limits: SmLimits = H100) -> list[dict]:
    """One row per (softmax.cu kernel, block size it is launched with): {kernel, threads, registers, shared_bytes,
    spill_bytes, occupancy} from nvcc's ptxas report (``kernels.compile_check_cuda(arch).log``), lesson 06.

    The shared-memory kernel gets one row per length in SMEM_EXAMPLE_COLS ("softmax_forward_smem<float, 4> n=8192"),
    at the block size the launcher picks for it and with the row's bytes added to ptxas' static shared memory."""
    usage = parse_ptxas(report)
    names = kernels._demangle(list(usage))
    rows = []
    for symbol, u in usage.items():
        kernel = names[symbol]
        if "_smem<" in kernel:
            dtype, vec = _template_args(kernel)
            width = 8 if dtype == "double" else 4
            for n in SMEM_EXAMPLE_COLS:
                threads, shared = softmax_cu_block_threads(n, int(vec)), u.shared_bytes + n * width
                rows.append({"kernel": f"{kernel} n={n}", "threads": threads, "registers": u.registers,
                             "shared_bytes": shared, "spill_bytes": u.spill_bytes,
                             "occupancy": occupancy(u.registers, threads, shared, limits)})
            continue
        for threads in softmax_cu_launches(kernel):
            rows.append({"kernel": kernel, "threads": threads, "registers": u.registers,
                         "shared_bytes": u.shared_bytes, "spill_bytes": u.spill_bytes,
                         "occupancy": occupancy(u.registers, threads, u.shared_bytes, limits)})
    def order(r):  # the shared-memory kernel's rows by row length, not as text
        name, _, n = r["kernel"].partition(" n=")
        return name, int(n or 0), r["threads"]

    return sorted(rows, key=order)


def triton_occupancy(built, limits: SmLimits = H100) -> Occupancy:
    """Occupancy of a kernel Triton compiled for a GPU (lesson 06), from its ``registers`` and ``num_warps`` and, where
    it reports one, its ``shared_bytes`` (Triton's dynamic shared memory): triton_attention.GpuBuild has all three;
    triton_softmax.GpuCompile has no shared memory figure, so 0 is used, an upper bound (its reductions' scratch is
    tiny: 64 B for the row kernel at BLOCK=8192 on sm_90, far from the 228 KiB that would bind). Needs no GPU: Triton's compiler and ptxas run here."""
    registers, warps = getattr(built, "registers", None), getattr(built, "num_warps", None)
    if not isinstance(registers, int) or not isinstance(warps, int):
        raise ValueError(f"triton_occupancy: expected a compiled kernel with registers and num_warps "
                         f"(triton_softmax.compile_for_gpu, triton_attention.compile_for_gpu), got {built!r:.200}")
    return occupancy(registers, warps * limits.warp, int(getattr(built, "shared_bytes", 0) or 0), limits)
