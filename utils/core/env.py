"""What is on this machine and what the course can run here (lesson 00): the bottom of the core, imports no other
course module.

The checkout and build folders, smoke mode, the hardware and software inventory (CPU flags, GPU, packages by import
name), and capabilities (cuda, nvcc, cxx, tensorrt, tritonserver, importable modules), each with a one-line reason
when absent. The guard for optional cells that uses them is utils.core.sections.requires().

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
    except (ValueError, IndexError, OSError):
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


def _cxx() -> Capability:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        return Capability("cxx", False, "no C++ compiler (install g++: needed by torch.compile and lesson 06)")
    try:  # the version matters: an extension must be built by a compiler that agrees with torch's build
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = out.splitlines()[0].strip() if out.strip() else "version unknown"
    except (OSError, subprocess.SubprocessError) as exc:
        return Capability("cxx", False, f"{compiler} does not run ({exc})")
    return Capability("cxx", True, f"{compiler} ({version})")


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
    caps = {
        "cuda": cuda,
        "tensorrt": _tensorrt(cuda),
        "tritonserver": _tritonserver(),
        "nvcc": _nvcc(),
        "cxx": _cxx(),
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
    return caps


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


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
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
    flags = cpu_flags()
    inv = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "cpu_features": {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")},
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


def _print_doctor(short: bool) -> int:
    inv = inventory()
    print(f"python {inv['python']} on {inv['platform']}")
    print(f"cpu    {inv['cpu']} ({inv['cpu_count']} logical cores, {inv['memory_gib']} GiB)")
    feats = ", ".join(k for k, v in inv["cpu_features"].items() if v) or "none detected"
    print(f"       features: {feats}")
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
