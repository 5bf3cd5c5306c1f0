"""Which platform the course is running on, real or emulated (lesson 00; `make test-platforms`).

The one place that reads WORKBOOK_EMULATE. Unset (or empty), everything here reports the real machine. Set to one of
EMULATED's names, the course behaves as far as it can as it would on that platform, so that CI on one Linux x86-64
box proves that every lesson finishes there with skip reasons and no traceback:

    WORKBOOK_EMULATE=macos-arm64    WORKBOOK_EMULATE=windows    WORKBOOK_EMULATE=linux-aarch64

What IS emulated:
  - system() and machine() (what env's capabilities, the quantized-engine choice and the doctor read);
  - the capabilities that platform lacks (EMULATED[name].lacks), each with the reason a learner there would read:
    glibc's allocator, `resource`, POSIX process groups, an OpenMP-capable C++ compiler, Inductor's compiler, the
    Triton server, a GPU;
  - torch's quantized engine: env.use_quantized_engine() chooses as it would there (qnnpack on arm64), so dynamic
    int8 runs through qnnpack; apply() also sets the engine the platform's wheel starts with, where this build of
    torch accepts it (Linux builds refuse 'none', macOS wheels' default: tests/unit/test_platforms.py proves
    statically instead that every dynamic int8 call chooses its engine first);
  - the CPU features: none of this machine's x86 flags are reported (an ARM or Apple CPU has none of them).

What is NOT emulated (it is the real Linux x86-64 machine underneath):
  - process semantics: fork, signals and process groups still work; Windows' spawn-only multiprocessing, its
    missing os.killpg and preexec_fn are not reproduced (their code paths are unit-tested, not run);
  - compilers: an extension is still built by this machine's g++/clang++ with Linux flags; Apple clang's and MSVC's
    flags are unit-tested as text (utils.kernels.openmp_flags);
  - the C library: glibc stays loaded; only the capability says it is absent, so the lessons take their
    portable path (e.g. the profiler's memory count instead of mallinfo2);
  - the CPU's instructions and speed (qnnpack runs on x86 here), file paths, line endings and the console encoding.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field

__all__ = ["EMULATED", "Emulated", "emulated", "system", "machine", "is_arm", "lacks", "apply"]


@dataclass(frozen=True)
class Emulated:
    """One foreign platform: what platform.system()/machine() say there, the quantized engine its torch wheel starts
    with (None: whatever this machine's wheel picks), and {capability: why it is missing there}."""

    system: str
    machine: str
    quantized_engine: str | None
    lacks: dict[str, str] = field(default_factory=dict)


_NO_GPU = "emulated {platform}: no CUDA GPU (the emulation masks the GPU whatever this machine has)"
_NO_TRITON = "the Triton Inference Server wheel (nvidia-pytriton) is built for Linux with glibc >= 2.35 only"

EMULATED: dict[str, Emulated] = {
    "macos-arm64": Emulated("Darwin", "arm64", "none", {
        "glibc_malloc": "macOS has no glibc: its allocator is libmalloc (no mallinfo2/mallopt)",
        "tritonserver": _NO_TRITON,
        "cuda": _NO_GPU.format(platform="macOS"),
        "nvcc": "there is no CUDA toolkit for macOS",
        "triton": "the Triton language (pip package triton) has no macOS wheels",
    }),
    "windows": Emulated("Windows", "AMD64", None, {
        "glibc_malloc": "Windows has no glibc: its allocator is the UCRT heap (no mallinfo2/mallopt)",
        "process_groups": "Windows has no POSIX process groups (os.killpg, preexec_fn, PR_SET_PDEATHSIG)",
        "cxx": "no C++ compiler on PATH (torch on Windows builds with MSVC: start Jupyter from an "
               "'x64 Native Tools Command Prompt for VS')",
        "inductor": "torch.compile's Inductor needs MSVC's cl.exe on PATH on Windows (start Jupyter from an "
                    "'x64 Native Tools Command Prompt for VS')",
        "tritonserver": _NO_TRITON,
        "torchserve": "TorchServe's launcher uses POSIX process groups; on Windows run it by hand (torchserve --start)",
        "cuda": _NO_GPU.format(platform="Windows"),
        "triton": "the Triton language (pip package triton) has no official Windows wheels",
    }),
    "linux-aarch64": Emulated("Linux", "aarch64", None, {
        "tritonserver": "the bundled tritonserver in nvidia-pytriton is built for x86-64 only",
        "cuda": _NO_GPU.format(platform="Linux aarch64"),
    }),
}


def emulated() -> str | None:
    """The platform named by WORKBOOK_EMULATE, or None for the real one; a bad name is a ValueError listing the valid
    ones."""
    name = os.environ.get("WORKBOOK_EMULATE", "").strip().lower()
    if not name:
        return None
    if name not in EMULATED:
        raise ValueError(f"WORKBOOK_EMULATE must be one of {sorted(EMULATED)} (or unset for this machine), got {name!r}")
    return name


def system() -> str:
    """platform.system() of the platform the course runs on: 'Linux', 'Darwin' or 'Windows' (emulated or real)."""
    name = emulated()
    return EMULATED[name].system if name else platform.system()


def machine() -> str:
    """platform.machine() of the platform the course runs on, e.g. 'x86_64', 'AMD64', 'arm64', 'aarch64'."""
    name = emulated()
    return EMULATED[name].machine if name else platform.machine()


def is_arm() -> bool:
    """True on 64-bit ARM (Apple Silicon, Graviton, Jetson), real or emulated."""
    return machine().lower() in {"arm64", "aarch64"}


def lacks(capability: str) -> str | None:
    """Why the emulated platform has no `capability`, or None (not emulating, or that platform has it)."""
    name = emulated()
    return EMULATED[name].lacks.get(capability) if name else None


@functools.cache
def apply() -> str | None:
    """Put torch in the state the emulated platform's wheel starts in (today: its quantized engine); once per
    process, a no-op when not emulating. Returns the emulated platform's name."""
    name = emulated()
    engine = EMULATED[name].quantized_engine if name else None
    if engine is not None:
        import torch

        if engine in torch.backends.quantized.supported_engines:  # Linux builds refuse 'none' (see the docstring)
            torch.backends.quantized.engine = engine
    return name
