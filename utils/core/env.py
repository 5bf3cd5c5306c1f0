"""What is on this machine and what the course can run here (lesson 00): the bottom of the core, imports no other
course module.

The checkout and build folders, smoke mode, the hardware and software inventory (CPU flags, GPU, packages by import
name), and capabilities (cuda, nvcc, cxx, tensorrt, tritonserver, importable modules, and the platform's own: a usable
quantized engine, glibc's allocator, page-fault counters, Inductor's compiler, ONNX Runtime's CUDA provider, POSIX
process groups), each with a one-line reason when absent. WORKBOOK_EMULATE (utils.core.platforms) makes them report
what macOS, Windows or Linux aarch64 lacks. The guard for optional cells that uses them is utils.core.sections.requires().

``python -m utils.core.env [--short]`` (``make env``) prints the inventory and the capability table.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from utils.core import platforms

__all__ = [
    "repo_root",
    "build_dir",
    "child_environ",
    "smoke_default",
    "Capability",
    "capabilities",
    "has",
    "choose_device",
    "inventory",
    "cpu_flags",
    "tritonserver_path",
    "nvcc_path",
    "distribution_version",
    "package_versions",
    "use_quantized_engine",
    "page_faults",
    "cxx_compiler",
    "cpu_features",
    "torch_cpu_capability",
    "parse_arm_features",
    "parse_macos_sysctl",
]

def repo_root() -> Path:
    """The workbook checkout (the folder holding utils/)."""
    return Path(__file__).resolve().parents[2]  # utils/core/env.py -> the checkout


def build_dir() -> Path:
    """Where executed notebooks, results and reports go: $WORKBOOK_BUILD_DIR (relative to the checkout) or <repo>/build."""
    path = Path(os.environ.get("WORKBOOK_BUILD_DIR") or "build")
    if not path.is_absolute():  # relative to the checkout, not to the notebook's folder
        path = repo_root() / path
    path.mkdir(parents=True, exist_ok=True)
    return path


def child_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of os.environ (or `base`) for a child Python process that imports utils (`python -m utils.X`).

    The checkout goes first on PYTHONPATH, so a plain clone that was never pip-installed works in child processes
    too, whatever their working folder (a notebook's kernel runs in notebooks/).
    """
    out = dict(os.environ if base is None else base)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo_root()), out.get("PYTHONPATH", "")) if p)
    return out


def smoke_default() -> bool:
    """SMOKE for a notebook's parameters cell: True when WORKBOOK_SMOKE=1 (tests), False for a learner or `make course`."""
    # Every lesson's parameters cell calls this first: an emulated platform (WORKBOOK_EMULATE) is put in place here,
    # before any lesson code runs (a no-op on the real platform).
    platforms.apply()
    value = os.environ.get("WORKBOOK_SMOKE", "0").strip().lower()
    if value not in {"0", "1", "true", "false", "yes", "no", ""}:
        raise ValueError(f"WORKBOOK_SMOKE must be 0 or 1, got {value!r}")
    return value in {"1", "true", "yes"}


# ---------------------------------------------------------------------------------------------------------------------
# capabilities
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    """One optional component: whether it is here, and a one-line reason either way."""

    name: str
    available: bool
    reason: str


def _glibc_version() -> tuple[int, int]:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""  # e.g. "glibc 2.36"
        major, minor = text.split()[1].split(".")[:2]
        return int(major), int(minor)
    except (ValueError, IndexError, OSError, AttributeError):  # AttributeError: Windows has no os.confstr
        return (0, 0)


def tritonserver_path() -> Path | None:
    """The tritonserver binary bundled in the nvidia-pytriton wheel, or on PATH; None when absent."""
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "tritonserver" / "bin" / "tritonserver"
        if candidate.is_file():
            return candidate
    found = shutil.which("tritonserver")
    return Path(found) if found else None


def nvcc_path() -> Path | None:
    """nvcc from $CUDA_HOME/bin, PATH or /usr/local/cuda/bin; None when absent."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    if shutil.which("nvcc"):
        candidates.append(Path(shutil.which("nvcc")))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return next((c for c in candidates if c.is_file()), None)


def _cuda() -> Capability:
    try:
        import torch
    except Exception as exc:  # torch broken: a reason, not a crash
        return Capability("cuda", False, f"torch failed to import ({type(exc).__name__}: {exc})")
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none"
        return Capability("cuda", False, f"no CUDA GPU visible (torch {torch.__version__}, CUDA build {build})")
    name = torch.cuda.get_device_name(0)
    return Capability("cuda", True, f"{name} (CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s))")


def _tensorrt(cuda: Capability) -> Capability:
    if importlib.util.find_spec("tensorrt") is None:
        return Capability(
            "tensorrt", False, "TensorRT is not installed (GPU extra from NVIDIA's package index: see README)"
        )
    if not cuda.available:
        return Capability("tensorrt", False, "TensorRT is installed but needs an NVIDIA GPU: " + cuda.reason)
    dist, version = distribution_version("tensorrt") or ("tensorrt", "unknown version")
    return Capability("tensorrt", True, f"{dist} {version}")


def _tritonserver() -> Capability:
    path = tritonserver_path()
    if path is None:
        return Capability("tritonserver", False, "no tritonserver binary (pip package nvidia-pytriton not installed)")
    glibc = _glibc_version()
    if glibc < (2, 35):
        return Capability("tritonserver", False, f"the bundled tritonserver needs glibc >= 2.35, this is {glibc}")
    return Capability("tritonserver", True, str(path))


def _nvcc() -> Capability:
    path = nvcc_path()
    if path is None:
        return Capability("nvcc", False, "nvcc (CUDA toolkit) not found on PATH, $CUDA_HOME or /usr/local/cuda")
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30).stdout
        release = next((line.strip() for line in out.splitlines() if "release" in line), "unknown release")
    except (OSError, subprocess.SubprocessError) as exc:
        return Capability("nvcc", False, f"{path} does not run ({exc})")
    return Capability("nvcc", True, f"{path} ({release})")


def cxx_compiler() -> tuple[str, str] | None:
    """(path, kind) of the C++ compiler torch.utils.cpp_extension will use here, kind one of 'gcc', 'clang',
    'apple-clang', 'msvc' or 'unknown'; None when there is none (lessons 02 and 06). Like cpp_extension: $CXX, else
    cl on Windows, else c++ (then g++, clang++)."""
    if platforms.system() == "Windows":
        found = os.environ.get("CXX") or shutil.which("cl")
        return (found, "msvc" if Path(found).stem.lower() == "cl" else "unknown") if found else None
    found = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    return (found, _compiler_kind(found)) if found else None


@functools.cache
def _compiler_kind(compiler: str) -> str:
    try:
        text = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout.lower()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    kind = ("apple-clang" if "apple clang" in text or "apple llvm" in text else "clang" if "clang" in text
            else "gcc" if "gcc" in text or "g++" in text or "free software foundation" in text else "unknown")
    return kind


def _cxx() -> Capability:
    if platforms.system() == "Windows":
        hint = ("no MSVC cl.exe on PATH: torch builds extensions with MSVC on Windows (install Visual Studio Build "
                "Tools, then start Jupyter from an 'x64 Native Tools Command Prompt for VS')")
    elif platforms.system() == "Darwin":
        hint = "no C++ compiler: install Xcode's command line tools (xcode-select --install)"
    else:
        hint = "no C++ compiler: install g++ (Debian/Ubuntu: apt-get install g++) or clang++ and libomp-dev"
    found = cxx_compiler()
    if found is None:
        return Capability("cxx", False, hint + "; lesson 06 and torch.compile need it")
    compiler, kind = found
    if platforms.system() == "Windows" and kind != "msvc":
        return Capability("cxx", False, f"{compiler} is not MSVC: torch on Windows builds extensions with cl.exe; "
                          + hint)
    try:  # the version matters: an extension must be built by a compiler that agrees with torch's build
        proc = subprocess.run([compiler] if kind == "msvc" else [compiler, "--version"], capture_output=True,
                              text=True, timeout=30)
        out = (proc.stdout + proc.stderr).strip()
        version = out.splitlines()[0].strip() if out else "version unknown"
    except (OSError, subprocess.SubprocessError) as exc:
        return Capability("cxx", False, f"{compiler} does not run ({exc})")
    if version == "version unknown" and platforms.system() == "Darwin":  # the Xcode shim with no tools behind it
        return Capability("cxx", False, f"{compiler} printed no version (the Xcode shim without its tools): {hint}")
    note = " (emulated platform: the build still uses this machine's compiler and flags)" if platforms.emulated() else ""
    return Capability("cxx", True, f"{compiler} ({version}, {kind}){note}")


def _inductor(cxx: Capability) -> Capability:
    """torch.compile's default backend generates C++ for the CPU: it needs a working compiler (MSVC on Windows)."""
    if not cxx.available:
        return Capability("inductor", False, f"torch.compile (Inductor) compiles C++: {cxx.reason}")
    try:
        import torch

        major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    except Exception as exc:  # torch broken: a reason, not a crash
        return Capability("inductor", False, f"torch failed to import ({type(exc).__name__}: {exc})")
    if platforms.system() == "Windows" and (major, minor) < (2, 5):
        return Capability("inductor", False, f"torch {torch.__version__} has no Inductor on Windows (2.5 or newer)")
    return Capability("inductor", True, f"Inductor's C++ backend with {cxx.reason.split(' (')[0]}")


def _quantized_engine() -> Capability:
    try:
        engine = _choose_quantized_engine()
    except RuntimeError as exc:
        return Capability("quantized_engine", False, str(exc))
    return Capability("quantized_engine", True, f"{engine} ({platforms.machine()}; chosen by env.use_quantized_engine)")


def _choose_quantized_engine() -> str:
    import torch

    supported = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    # qnnpack is the ARM engine (and the only one macOS wheels ship); x86 (fbgemm + onednn) is the x86 one. torch 2.11
    # on aarch64 defaults to 'x86', which fails there ("unknown architecure"): never trust the default.
    order = ("qnnpack",) if platforms.is_arm() else ("x86", "fbgemm", "onednn", "qnnpack")
    for engine in order:
        if engine in supported:
            return engine
    raise RuntimeError(f"no usable quantized engine for {platforms.machine()}: torch "
                       f"{torch.__version__} supports {torch.backends.quantized.supported_engines}")


def use_quantized_engine() -> str:
    """Set torch.backends.quantized.engine to the one that works on this CPU and return its name (lessons 01, 04, 08).

    Call it before torch.ao.quantization.quantize_dynamic: macOS wheels leave the engine at 'none' (NoQEngine) and
    torch 2.11 on aarch64 picks 'x86' ("unknown architecure"). qnnpack on ARM, x86 (fbgemm) on x86-64.
    Raises RuntimeError naming the supported engines when none fits.
    """
    import torch

    engine = _choose_quantized_engine()
    torch.backends.quantized.engine = engine
    return engine


def _glibc_malloc() -> Capability:
    if platforms.system() != "Linux":
        return Capability("glibc_malloc", False, f"{platforms.system()} has no glibc (mallinfo2/mallopt are glibc's)")
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2, libc.mallopt  # noqa: B018 - the lookups are the probe
    except (OSError, AttributeError) as exc:
        return Capability("glibc_malloc", False, f"glibc >= 2.33 with mallinfo2 and mallopt is needed ({exc}); "
                          "musl and older distributions (Ubuntu 20.04, RHEL 8) lack it")
    major, minor = _glibc_version()
    return Capability("glibc_malloc", True, f"glibc {major}.{minor}: mallinfo2 and mallopt")


def page_faults() -> int:
    """Page faults this process has taken so far (lessons 00, 03, 04): minor faults from getrusage where `resource`
    exists (Linux, macOS), else psutil's num_page_faults (Windows, minor and major together). Take differences."""
    try:
        import resource
    except ImportError:
        import psutil

        return int(psutil.Process().memory_info().num_page_faults)
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def _page_faults() -> Capability:
    try:
        import resource  # noqa: F401
    except ImportError:
        import psutil

        if hasattr(psutil.Process().memory_info(), "num_page_faults"):
            return Capability("page_faults", True, "psutil num_page_faults (minor and major faults together)")
        return Capability("page_faults", False, "no page-fault counter: no `resource` module and psutil has none here")
    return Capability("page_faults", True, "getrusage ru_minflt (minor faults)")


def _ort_cuda(cuda: Capability) -> Capability:
    if not cuda.available:
        return Capability("ort_cuda", False, f"ONNX Runtime's CUDA provider needs a GPU: {cuda.reason}")
    try:
        import onnxruntime as ort

        providers = ort.get_available_providers()
    except Exception as exc:  # not installed or broken: a reason, not a crash
        return Capability("ort_cuda", False, f"onnxruntime does not import ({type(exc).__name__}: {exc})")
    if "CUDAExecutionProvider" not in providers:
        return Capability("ort_cuda", False, f"this onnxruntime lists {providers}: install onnxruntime-gpu "
                          "(in place of onnxruntime) for CUDAExecutionProvider")
    return Capability("ort_cuda", True, "CUDAExecutionProvider listed by onnxruntime and a GPU present")


def _process_groups() -> Capability:
    if platforms.system() == "Windows" or not hasattr(os, "killpg"):
        return Capability("process_groups", False, "no POSIX process groups (os.killpg, preexec_fn) on Windows")
    return Capability("process_groups", True, f"POSIX process groups on {platforms.system()}")


@functools.cache
def _import_names() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution_version(module: str) -> tuple[str, str] | None:
    """(distribution, version) of whatever installed distribution provides the top-level `module`, or None (lesson 00).

    One import name can come from several distributions: ``onnxruntime`` from onnxruntime (CPU), onnxruntime-gpu
    or onnxruntime-openvino; ``cv2`` from opencv-python or its headless twin. Asking for one distribution's name
    breaks in an environment that has the other; asking by import name does not. Nothing is imported.
    """
    if importlib.util.find_spec(module) is None:
        return None
    for dist in sorted(_import_names().get(module, [])):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:  # a stale entry: keep looking
            continue
    return module, "unknown version"  # importable, but from no distribution (a plain folder on sys.path)


def _torchserve() -> Capability:
    """TorchServe (lesson 05's optional section): the torchserve and torch-model-archiver packages, and a Java 11+
    runtime for its frontend, found as its launcher finds it ($JAVA_HOME/bin/java, else java on PATH)."""
    import re

    problems = []
    if platforms.system() == "Windows":  # its launcher and the course's server helper use POSIX process groups
        return Capability("torchserve", False, "the course starts TorchServe in a POSIX process group: not on Windows")
    found = {dist: distribution_version(mod) for dist, mod in (("torchserve", "ts"),
                                                               ("torch-model-archiver", "model_archiver"))}
    missing = [dist for dist, f in found.items() if f is None]
    if missing:
        problems.append(f"python package{'s' * (len(missing) > 1)} {' and '.join(missing)} not installed "
                        "(pip install torchserve torch-model-archiver)")
    jdk_hint = "install a Java 11+ runtime (Debian/Ubuntu: apt install openjdk-17-jre-headless)"
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    java_text = ""
    if not java or not Path(java).is_file():
        where = f"{java} is missing ($JAVA_HOME is set)" if java_home else "no java on PATH"
        problems.append(f"TorchServe's frontend needs Java: {where}; {jdk_hint}")
    else:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
            m = re.search(r'version "((\d+)(?:\.(\d+))?[^"]*)"', out.stderr + out.stdout)
        except (OSError, subprocess.SubprocessError) as exc:
            m, out = None, exc
        if m is None:
            problems.append(f"{java} -version did not say its version ({str(out)[:80]}): {jdk_hint}")
        else:
            major = int(m.group(3)) if m.group(2) == "1" and m.group(3) else int(m.group(2))  # "1.8.0" is Java 8
            if major < 11:
                problems.append(f"{java} is Java {major}; TorchServe needs 11+: {jdk_hint}")
            java_text = f"Java {m.group(1)} ({java})"
    if problems:
        return Capability("torchserve", False, "; ".join(problems))
    return Capability("torchserve", True, ", ".join(f"{d} {f[1]}" for d, f in found.items()) + ", " + java_text)


def last_level_cache_bytes() -> int | None:
    """Size of the largest CPU cache (usually the L3 one core sees) from sysfs, or None where it cannot be read.
    Lessons 00, 01 and 06 size their out-of-cache probes and activations against it."""
    best = None
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        m = re.fullmatch(r"(\d+)([KMG]?)", path.read_text().strip())
        if m:
            best = max(best or 0, int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])
    return best


def quiet_profiler_log() -> None:
    """Without a GPU, silence Kineto, torch.profiler's C++ side (lessons 03, 07, 08). It reads KINETO_LOG_LEVEL once,
    at the first profiler start in a process, and otherwise writes profiler_start/stop and a failed GPU probe
    straight to stderr. A value you set yourself wins; on a GPU machine the log stays (CUPTI errors matter there)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def nginx_binary() -> str | None:
    """The nginx binary lesson 05's proxy section runs (05.proxy-limit): on PATH, in /usr/sbin, or unpacked by
    scripts/fetch_nginx.sh into the course cache. None where there is none."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ml-workbook" / "nginx" / "usr" / "sbin"
    found = shutil.which("nginx") or shutil.which("nginx", path=os.pathsep.join(["/usr/sbin", str(cache)]))
    return found


def _nginx() -> Capability:
    found = nginx_binary()
    if not found:
        return Capability("nginx", False, "no nginx binary (Debian: apt-get install nginx, or scripts/fetch_nginx.sh "
                                          "to unpack it into the course cache without a service)")
    return Capability("nginx", True, found)


def _module(name: str, install_hint: str) -> Capability:
    found = distribution_version(name)
    if found is None:
        return Capability(name, False, f"python package {install_hint} is not installed")
    return Capability(name, True, f"{found[0]} {found[1]}")


@functools.cache
def capabilities() -> dict[str, Capability]:
    """Every optional component the course knows about, probed once per process."""
    cuda = _cuda()
    cxx = _cxx()
    caps = {
        "cuda": cuda,
        "tensorrt": _tensorrt(cuda),
        "tritonserver": _tritonserver(),
        "nvcc": _nvcc(),
        "cxx": cxx,
        "inductor": _inductor(cxx),
        "quantized_engine": _quantized_engine(),
        "glibc_malloc": _glibc_malloc(),
        "page_faults": _page_faults(),
        "ort_cuda": _ort_cuda(cuda),
        "process_groups": _process_groups(),
        "tensorflow": _module("tensorflow", "tensorflow"),
        "onnxruntime": _module("onnxruntime", "onnxruntime (or onnxruntime-gpu)"),
        "onnxruntime_extensions": _module("onnxruntime_extensions", "onnxruntime-extensions"),
        "tritonclient": _module("tritonclient", "tritonclient[all]"),
        "kubernetes_validate": _module("kubernetes_validate", "kubernetes-validate"),
        "openvino": _module("openvino", "openvino"),
        "tvm": _module("tvm", "apache-tvm"),
        "lightning": _module("lightning", "lightning"),
        # the Triton language compiler (lesson 06), not the Triton Inference Server: CUDA builds of torch on Linux ship it
        "triton": _module("triton", "triton (the Triton language; torch's CUDA builds on Linux install it)"),
        "torchserve": _torchserve(),
        "nginx": _nginx(),
    }
    tf2onnx = _module("tf2onnx", "tf2onnx")
    caps["tf2onnx"] = Capability("tf2onnx", caps["tensorflow"].available and tf2onnx.available,
                                 "; ".join(dict.fromkeys([caps["tensorflow"].reason, tf2onnx.reason])))
    caps["cuda+nvcc"] = Capability(
        "cuda+nvcc", cuda.available and caps["nvcc"].available, f"{cuda.reason}; {caps['nvcc'].reason}"
    )
    return _mask_emulated(caps)


def _mask_emulated(caps: dict[str, Capability]) -> dict[str, Capability]:
    """What an emulated platform (WORKBOOK_EMULATE) lacks is reported missing, with the reason a learner there reads;
    what depends on a masked capability goes with it."""
    if not platforms.emulated():
        return caps
    depends = {"tensorrt": "cuda", "ort_cuda": "cuda", "cuda+nvcc": "cuda", "inductor": "cxx",
               "torchserve": "process_groups"}
    out = {}
    for name, cap in caps.items():
        why = platforms.lacks(name) or (platforms.lacks(depends[name]) if name in depends else None)
        out[name] = Capability(name, False, f"{why} (emulated: WORKBOOK_EMULATE={platforms.emulated()})") \
            if why and cap.available else cap
    return out


def has(name: str) -> bool:
    """True when the named capability (see capabilities()) is present."""
    caps = capabilities()
    if name not in caps:
        raise KeyError(f"unknown capability {name!r}; expected one of {sorted(caps)}")
    return caps[name].available


def choose_device(preference: str = "auto"):
    """The torch.device for a lesson (lesson 01): 'auto' picks CUDA when present, else CPU.

    Asking for 'cuda' on a machine without a GPU is an error that says so, rather than a late device mismatch.
    """
    import torch

    preference = (preference or "auto").lower()
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"DEVICE={preference!r} was asked for but {capabilities()['cuda'].reason}; use 'cpu' or 'auto'")
    if not (preference == "cpu" or preference.startswith("cuda")):
        raise ValueError(f"DEVICE must be 'auto', 'cpu' or 'cuda[:N]', got {preference!r}")
    return torch.device(preference)


# ---------------------------------------------------------------------------------------------------------------------
# inventory
# ---------------------------------------------------------------------------------------------------------------------


def parse_arm_features(cpuinfo: str) -> frozenset[str]:
    """The `Features:` line of an aarch64 /proc/cpuinfo (asimd = NEON, sve, sve2, bf16, i8mm, asimddp, ...)."""
    for line in cpuinfo.splitlines():
        if line.startswith("Features"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


# macOS names its CPU features hw.optional.<name>: 1; the course uses Linux's names for the same features
_SYSCTL_NAMES = {"neon": "asimd", "AdvSIMD": "asimd", "arm.FEAT_BF16": "bf16", "arm.FEAT_I8MM": "i8mm",
                 "arm.FEAT_DotProd": "asimddp", "arm.FEAT_FHM": "asimdfhm", "arm.FEAT_SME": "sme",
                 "avx2_0": "avx2", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vnni": "avx512_vnni"}


def parse_macos_sysctl(text: str) -> frozenset[str]:
    """CPU features from `sysctl hw.optional` output ("hw.optional.arm.FEAT_BF16: 1" lines), in Linux's names
    (asimd, bf16, i8mm, asimddp, ...); features set to 0 are left out."""
    found = set()
    for line in text.splitlines():
        m = re.fullmatch(r"\s*hw\.optional\.([\w.]+)\s*:\s*(\d+)\s*", line)
        if m and int(m.group(2)) and m.group(1) in _SYSCTL_NAMES:
            found.add(_SYSCTL_NAMES[m.group(1)])
    return frozenset(found)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags, in Linux's names: the x86 `flags:` or ARM `Features:` line of /proc/cpuinfo, or
    macOS's `sysctl hw.optional` (lessons 00, 03, 04, 06). Empty where none can be read, and on an emulated platform
    (WORKBOOK_EMULATE: this machine's x86 flags are not that platform's)."""
    if platforms.emulated():
        return frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
        return parse_arm_features(text)
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True, timeout=10).stdout
            return parse_macos_sysctl(out)
        except (OSError, subprocess.SubprocessError):
            pass
    return frozenset()


# What the inventory shows: x86's vector and bf16/AMX units, ARM's NEON, SVE, bf16 and int8 matrix instructions
TRACKED_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile",
                    "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm")


def cpu_features() -> dict[str, bool]:
    """{feature: present} for TRACKED_FEATURES on this CPU, x86 and ARM alike (lesson 00; the doctor)."""
    flags = cpu_flags()
    return {f: f in flags for f in TRACKED_FEATURES}


def torch_cpu_capability() -> str | None:
    """Which kernels ATen dispatches to on this CPU (torch.backends.cpu.get_cpu_capability(): 'AVX512', 'AVX2',
    'DEFAULT', 'SVE256', ...), or None where torch cannot say or the platform is emulated (lesson 00; the doctor)."""
    if platforms.emulated():
        return None
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # torch broken or too old to say: the inventory reports the rest
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:  # psutil reads it on every OS (/proc/meminfo, sysctl hw.memsize, GlobalMemoryStatusEx)
        import psutil

        return round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:  # psutil missing or broken: Linux's file, else unknown
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


# What the inventory lists: label -> import name. Versions come from whichever distribution provides the import
# (onnxruntime or onnxruntime-gpu, ...). CORE_PACKAGES are needed by every lesson; the rest by some sections only.
PACKAGES = {
    "torch": "torch", "torchvision": "torchvision", "numpy": "numpy", "onnx": "onnx", "onnxruntime": "onnxruntime",
    "onnxscript": "onnxscript", "transformers": "transformers", "scikit-learn": "sklearn",
    "tensorflow": "tensorflow", "tf2onnx": "tf2onnx", "onnxruntime-extensions": "onnxruntime_extensions",
    "nvidia-pytriton": "pytriton", "tritonclient": "tritonclient", "openvino": "openvino", "torchserve": "ts",
    "apache-tvm": "tvm", "lightning": "lightning",
}
CORE_PACKAGES = ("torch", "torchvision", "numpy")


def package_versions() -> dict[str, str | None]:
    """{label: version or None} for PACKAGES, by import name (lesson 00's inventory; `make doctor`)."""
    out = {}
    for label, module in PACKAGES.items():
        found = distribution_version(module)
        out[label] = None if found is None else found[1]
    return out


def inventory() -> dict:
    """A JSON-able description of this machine and the course's software (lesson 00; stored with every result)."""
    inv = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "os": platforms.system(),
        "machine": platforms.machine(),
        "libc": libc_name(),
        "emulated": platforms.emulated(),
        "cpu_features": cpu_features(),
        "torch_cpu_capability": torch_cpu_capability(),
        "packages": package_versions(),
        "capabilities": {k: {"available": c.available, "reason": c.reason} for k, c in capabilities().items()},
    }
    try:
        import torch

        inv["torch_threads"] = torch.get_num_threads()
        inv["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as exc:  # a broken torch is reported, not fatal, in the inventory
        inv["torch_error"] = f"{type(exc).__name__}: {exc}"
    return inv


def libc_name() -> str:
    """The C library: 'glibc 2.36', 'musl', 'libSystem (macOS)' or 'UCRT (Windows)' (doctor and lesson 00)."""
    system = platforms.system()
    if system == "Darwin":
        return "libSystem (macOS)"
    if system == "Windows":
        return "UCRT (Windows)"
    major, minor = _glibc_version()
    if (major, minor) != (0, 0):
        return f"glibc {major}.{minor}"
    name, version = platform.libc_ver()
    return f"{name} {version}".strip() or "unknown (not glibc: musl?)"


def _print_doctor(short: bool) -> int:
    inv = inventory()
    print(f"python {inv['python']} on {inv['platform']}")
    print(f"cpu    {inv['cpu']} ({inv['cpu_count']} logical cores, {inv['memory_gib']} GiB)")
    feats = ", ".join(k for k, v in inv["cpu_features"].items() if v) or "none of the tracked ones"
    print(f"       features: {feats}; torch dispatches {inv['torch_cpu_capability'] or 'unknown'} kernels")
    print(f"os     {inv['os']} {inv['machine']}, {inv['libc']}"
          + (f" (emulated: WORKBOOK_EMULATE={inv['emulated']})" if inv["emulated"] else ""))
    if not short:
        for name, version in inv["packages"].items():
            print(f"  {name:24s} {version or 'NOT INSTALLED'}")
    print("capabilities:")
    for name, cap in capabilities().items():
        mark = "yes" if cap.available else "no "
        print(f"  [{mark}] {name:13s} {cap.reason}")
    missing = [p for p, v in inv["packages"].items() if v is None]
    core = [p for p in missing if p in CORE_PACKAGES]
    if core:
        print(f"error: the course cannot run without {core}: run `make env` (or see README 'Bring your own "
              "environment')", file=sys.stderr)
        return 1
    if missing:
        print(f"not installed (the sections that need them skip, saying why): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(_print_doctor(short="--short" in sys.argv))
