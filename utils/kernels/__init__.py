"""Build, cache and load the fused softmax extension (lesson 06); compile-check its CUDA source with nvcc.

``build()`` compiles softmax.cpp (and softmax.cu with ``cuda=True``) with torch.utils.cpp_extension into
``<build dir>/kernels/<name>-<hash>/``, the hash covering the source text, the compiler flags and the torch version:
the lesson, the tests and the lab reuse one build, and an edited source gets a fresh one. Each build registers its
operators under its own namespace (``torch.ops.<name>_<hash>``), so several builds can be loaded in one process.

The CPU capability is detected at build time (``cpu_capability()``): ATen's ``at::vec::Vectorized`` uses AVX2 or
AVX-512 only when the build defines ``CPU_CAPABILITY_AVX2`` / ``CPU_CAPABILITY_AVX512`` (with the matching ``-m``
flags); without the define it compiles to plain loops, and nothing warns you.

The operator the lesson registers (torch.library.custom_op, fake kernel, autograd) lives in ``utils.kernels.ops``.
The same softmax in the Triton language, and a tiled matmul whose loads are counted, live in
``utils.kernels.triton_softmax`` and ``utils.kernels.triton_matmul``: import them by name (they need triton).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from utils.core import env

__all__ = [
    "openmp_flags",
    "KERNEL_DIR",
    "CAPABILITIES",
    "Extension",
    "CompileCheck",
    "cpu_capability",
    "capability_cflags",
    "build",
    "build_many",
    "compile_check_cuda",
    "source_excerpt",
    "raw_errors",
    "RAW_BAD_INPUTS",
    "error_probe",
    "torch_build_compiler",
    "warmup",
]

KERNEL_DIR = Path(__file__).resolve().parent
CAPABILITIES = ("AVX512", "AVX2", "DEFAULT")
_AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")
_loaded: dict[str, Extension] = {}


def cpu_capability(flags: frozenset[str] | set[str] | None = None) -> str:
    """The widest at::vec capability this CPU supports: "AVX512", "AVX2" or "DEFAULT" (lesson 06).

    `flags` are /proc/cpuinfo flags (default: this machine's, from utils.core.env.cpu_flags()). ATen's AVX-512 kernels
    need F, BW, VL and DQ; its AVX2 kernels need AVX2 and FMA.
    """
    flags = env.cpu_flags() if flags is None else frozenset(flags)
    if all(f in flags for f in _AVX512_FLAGS) and "fma" in flags:
        return "AVX512"
    if "avx2" in flags and "fma" in flags:
        return "AVX2"
    return "DEFAULT"


def capability_cflags(capability: str) -> list[str]:
    """Compiler flags that make at::vec use `capability` (lesson 06): the define and the matching -m flags.

    "DEFAULT" gives no define at all, which is what a plain cpp_extension build gets: Vectorized falls back to loops.
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"capability must be one of {CAPABILITIES}, got {capability!r}")
    if capability == "AVX512":
        return ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl",
                "-mavx512dq", "-mfma", "-mf16c"]
    if capability == "AVX2":
        return ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"]
    return []


@dataclass
class Extension:
    """One loaded build of the softmax extension (lesson 06). ``ops`` is its operator namespace in torch.ops."""

    name: str
    namespace: str
    library: Path
    capability: str
    cuda: bool
    build_s: float
    cached: bool
    accurate_exp: bool = False

    @property
    def ops(self):
        import torch

        return getattr(torch.ops, self.namespace)

    def build_info(self) -> str:
        return self.ops.build_info()

    def __str__(self) -> str:
        how = "loaded from cache" if self.cached else f"built in {self.build_s:.1f} s"
        extras = (", 1-ulp exp" if self.accurate_exp else "") + (", CUDA" if self.cuda else "")
        return f"{self.name}: torch.ops.{self.namespace} ({self.capability}{extras}), {how}"


def _read_sources(source: str | Path | None, cuda: bool) -> dict[str, str]:
    """{file name: text} for the build. `source` may be C++ text, a path, or None for utils/kernels/softmax.cpp."""
    if source is None:
        texts = {"softmax.cpp": (KERNEL_DIR / "softmax.cpp").read_text()}
    elif isinstance(source, Path):
        if not source.is_file():
            raise FileNotFoundError(f"C++ source {source} does not exist")
        texts = {source.name: source.read_text()}
    elif isinstance(source, str):
        if "TORCH_LIBRARY" not in source:
            raise ValueError("the C++ source text registers no operators (no TORCH_LIBRARY block); "
                             "pass the whole .cpp text or a Path to the file")
        texts = {"source.cpp": source}
    else:
        raise TypeError(f"source must be C++ text, a pathlib.Path or None, got {type(source).__name__}")
    if cuda:
        texts["softmax.cu"] = (KERNEL_DIR / "softmax.cu").read_text()
    return texts


def _key(texts: dict[str, str], flags: list[str], cuda: bool) -> str:
    import torch

    h = hashlib.sha256()
    for part in [torch.__version__, str(cuda), *flags, *(f"{k}\0{v}" for k, v in sorted(texts.items()))]:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:10]


def _compiler_kind() -> str:
    found = env.cxx_compiler()
    return found[1] if found else "unknown"


def openmp_flags(kind: str | None = None, system: str | None = None) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) that enable OpenMP in an extension for compiler `kind` ('gcc', 'clang',
    'apple-clang', 'msvc'; default: this machine's, utils.core.env.cxx_compiler) on `system` (lesson 06).

    g++ and Linux clang++ take -fopenmp (clang needs libomp-dev); Apple clang rejects a bare -fopenmp but takes
    -Xpreprocessor -fopenmp with the omp.h and libomp.dylib that macOS torch wheels bundle; MSVC takes /openmp.
    Where OpenMP cannot be enabled the flags are empty and at::parallel_for runs serially (build_info says so).
    """
    import torch

    kind = kind or _compiler_kind()
    system = system or sys.platform
    if kind == "msvc" or system.startswith("win"):
        return ["/openmp"], []
    if kind == "apple-clang" or system == "darwin":
        torch_dir = Path(torch.__file__).parent
        if not (torch_dir / "lib" / "libomp.dylib").is_file():  # this wheel brings no libomp: build serial
            return [], []
        return (["-Xpreprocessor", "-fopenmp", f"-I{torch_dir / 'include'}"],
                [f"-L{torch_dir / 'lib'}", "-lomp", f"-Wl,-rpath,{torch_dir / 'lib'}"])
    if kind == "clang" and not _clang_has_libomp():  # Debian's clang++ without libomp-dev: build serial
        return [], []
    return ["-fopenmp"], ["-fopenmp"]


def _clang_has_libomp() -> bool:
    found = env.cxx_compiler()
    return bool(found) and _links_openmp(found[0])


@functools.cache
def _links_openmp(compiler: str) -> bool:
    """Whether `compiler -fopenmp` compiles and links a program using omp.h (Debian's clang needs libomp-dev)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([compiler, "-fopenmp", "-x", "c++", "-", "-o", str(Path(tmp) / "probe")],
                                  input="#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n",
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return False
    return proc.returncode == 0


def build(
    source: str | Path | None = None,
    *,
    name: str = "wb_softmax",
    capability: str | None = None,
    cuda: bool = False,
    accurate_exp: bool = False,
    verbose: bool = False,
) -> Extension:
    """Compile (or load the cached build of) the softmax extension and return it (lesson 06).

    `source`: C++ text, a Path, or None for utils/kernels/softmax.cpp. `capability`: "AVX512", "AVX2" or "DEFAULT";
    None detects this CPU's. `accurate_exp=True` builds the float kernels with Sleef's 1-ulp exp (torch.softmax's)
    instead of the 20-ulp exp_u20, for a like-for-like comparison. `cuda=True` adds softmax.cu (needs a CUDA build of torch and nvcc). The build also gets
    -fopenmp when torch uses OpenMP: at::parallel_for is header code, serial unless the extension enables OpenMP.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,30}", name):
        raise ValueError(f"name must be a short lower-case identifier such as 'wb_softmax', got {name!r}")
    import torch

    capability = capability or cpu_capability()
    # at::parallel_for is inline code in the headers: without OpenMP flags it compiles to a plain serial loop.
    openmp, openmp_ld = openmp_flags() if torch._C.has_openmp else ([], [])
    optimize = ["/O2"] if _compiler_kind() == "msvc" else ["-O3"]
    cflags = [*optimize, *capability_cflags(capability), *openmp, *(["-DWB_ACCURATE_EXP"] if accurate_exp else [])]
    texts = _read_sources(source, cuda)
    key = _key(texts, cflags, cuda)
    namespace = f"{name}_{key}"
    if namespace in _loaded:
        return _loaded[namespace]
    if cuda and not torch.cuda.is_available():
        raise RuntimeError(f"build(cuda=True) needs a CUDA GPU: {env.capabilities()['cuda'].reason}")
    if cuda and env.nvcc_path() is None:
        raise RuntimeError(f"build(cuda=True) needs nvcc: {env.capabilities()['nvcc'].reason}")
    folder = env.build_dir() / "kernels" / f"{name}-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{namespace}{'.pyd' if sys.platform == 'win32' else '.so'}"  # cpp_extension's suffix
    t0 = time.perf_counter()
    cached = library.is_file()
    if cached:
        from filelock import FileLock  # a torch dependency; cpp_extension holds the same lock while it builds

        with FileLock(str(folder / "lock")):  # never load a library another process is still writing
            torch.ops.load_library(str(library))
    else:
        from torch.utils import cpp_extension

        paths = []
        for file_name, text in texts.items():
            path = folder / file_name
            if not path.is_file() or path.read_text() != text:
                path.write_text(text)
            paths.append(str(path))
        define = f"-DWB_NAMESPACE={namespace}"
        try:
            built = cpp_extension.load(
                name=namespace,
                sources=paths,
                extra_cflags=[*cflags, define],
                extra_ldflags=openmp_ld,
                extra_cuda_cflags=["-O3", define, "--use_fast_math"] if cuda else None,
                with_cuda=cuda,
                is_python_module=False,
                build_directory=str(folder),
                verbose=verbose,
            )
        except RuntimeError as exc:
            raise RuntimeError(f"building {namespace} in {folder} failed:\n{_compiler_errors(str(exc))}") from None
        library = Path(built) if built else library
    ext = Extension(name, namespace, library, capability, cuda, time.perf_counter() - t0, cached, accurate_exp)
    _loaded[namespace] = ext
    return ext


def build_many(*configs: dict) -> list[Extension]:
    """Build several variants of the extension side by side and return them in order (lesson 06).

    Each dict holds the keyword arguments of one build() call. A build is one translation unit, so its compiler uses
    one core: the builds run in threads that each wait on their own compiler, and on a 2-core machine three builds
    take about half the time they take one after another. Cached builds just load.
    """
    from concurrent.futures import ThreadPoolExecutor

    if not configs or not all(isinstance(c, dict) for c in configs):
        raise TypeError("build_many takes one dict of build() keyword arguments per build, e.g. "
                        "build_many({}, {'accurate_exp': True})")
    with ThreadPoolExecutor(max_workers=len(configs)) as pool:
        return list(pool.map(lambda kwargs: build(**kwargs), configs))


def _compiler_errors(log: str, limit: int = 25) -> str:
    """What went wrong in a compiler log: each `error:` line (paths shortened to the file name) and the two source
    lines g++ prints under it; the last lines of the log when there is no such line (a link error, say)."""
    lines = [re.sub(r"\S*/([\w.-]+\.(?:cpp|cu|h|cuh|so))\b", r"\1", line) for line in log.splitlines()]
    picked: list[str] = []
    for i, line in enumerate(lines):
        if re.search(r"\berror\b:|undefined (reference|symbol)", line) and not line.startswith(("c++ ", "[")):
            for extra in lines[i : i + 3]:
                if extra not in picked:
                    picked.append(extra)
    return "\n".join(picked[:limit]) or "\n".join(lines[-limit:])


@dataclass
class CompileCheck:
    """What nvcc said about softmax.cu (lesson 06)."""

    ok: bool
    seconds: float
    cached: bool
    command: list[str]
    log: str
    registers: dict[str, int]

    def __str__(self) -> str:
        how = "cached object" if self.cached else f"{self.seconds:.1f} s"
        return f"nvcc compile check: {'OK' if self.ok else 'FAILED'} ({how})"


def compile_check_cuda(arch: str = "90", *, source: Path | None = None, timeout: int = 600) -> CompileCheck:
    """Compile softmax.cu to an object file with nvcc and torch's include paths, without a GPU (lesson 06).

    The object is cached under the build dir by source hash and arch. ``registers`` maps each kernel (demangled
    name) to the registers per thread ptxas reports, a first look at occupancy.
    """
    import torch
    from torch.utils import cpp_extension

    nvcc = env.nvcc_path()
    if nvcc is None:
        raise RuntimeError(f"compile_check_cuda needs nvcc: {env.capabilities()['nvcc'].reason}")
    if not re.fullmatch(r"\d{2,3}a?", arch):
        raise ValueError(f"arch is a compute capability such as '80' or '90', got {arch!r}")
    source = source or KERNEL_DIR / "softmax.cu"
    text = source.read_text()
    key = hashlib.sha256(f"{torch.__version__}\0{arch}\0{nvcc}\0{text}".encode()).hexdigest()[:10]
    folder = env.build_dir() / "kernels" / f"nvcc-check-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    obj, log_path = folder / "softmax_cu.o", folder / "nvcc.log"
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    command = [
        str(nvcc), "-c", str(source), "-o", str(obj), "-std=c++20", "-O3", "--use_fast_math",
        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas=-v", "-Xcompiler=-fPIC",
        f"-DWB_NAMESPACE=wb_softmax_check_{key}", *cpp_extension.COMMON_NVCC_FLAGS, *includes,
    ]
    if obj.is_file() and log_path.is_file():
        log = log_path.read_text()
        return CompileCheck(True, 0.0, True, command, log, _ptxas_registers(log))
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    if proc.returncode == 0:
        log_path.write_text(log)
    else:
        obj.unlink(missing_ok=True)
    return CompileCheck(proc.returncode == 0, seconds, False, command, log, _ptxas_registers(log))


def _ptxas_registers(log: str) -> dict[str, int]:
    """{kernel: registers per thread} from ``nvcc -Xptxas=-v`` output, kernel names demangled and shortened."""
    found: dict[str, int] = {}
    current = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            found[current] = int(m.group(1))
            current = None
    names = _demangle(list(found))
    return {names[k]: v for k, v in found.items()}


def _demangle(symbols: list[str]) -> dict[str, str]:
    """Mangled kernel symbol -> "kernel<template args>" (c++filt where present, else the symbol itself)."""
    try:
        proc = subprocess.run(["c++filt"], input="\n".join(symbols), capture_output=True, text=True, timeout=30)
        plain = proc.stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        plain = []
    if len(plain) != len(symbols):
        return {s: s for s in symbols}
    out = {}
    for symbol, name in zip(symbols, plain, strict=True):
        name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
        out[symbol] = name.split("(", 1)[0].replace("c10::", "")
    return out


def source_excerpt(block: str, file: str = "softmax.cpp") -> str:
    """The lines between ``// BEGIN <block>`` and ``// END <block>`` in a kernel source (lesson 06 prints them)."""
    text = (KERNEL_DIR / file).read_text()
    m = re.search(rf"^// BEGIN {re.escape(block)}\n(.*?)^// END {re.escape(block)}$", text, re.S | re.M)
    if not m:
        blocks = re.findall(r"^// BEGIN (.+)$", text, re.M)
        raise KeyError(f"no block {block!r} in {file}; blocks: {blocks}")
    return m.group(1).rstrip()


# Bad inputs for the raw extension ops (no Python wrapper in front): each must come back as a RuntimeError that
# names what was expected. Expressions over `ops` (the build's torch.ops namespace) and `torch`.
RAW_BAD_INPUTS = {
    "strided x to the raw kernel": "ops.softmax_forward(torch.ones(4, 6).t(), 0)",
    "out of the wrong shape": "ops.softmax_forward_out(torch.ones(2, 3), torch.empty(3, 2), 0)",
    "unknown algorithm": "ops.softmax_forward(torch.ones(2, 3), 7)",
    "backward shape mismatch": "ops.softmax_backward(torch.ones(3, 4), torch.ones(3, 5))",
    "backward dtype mismatch": "ops.softmax_backward(torch.ones(3, 4), torch.ones(3, 4, dtype=torch.float64))",
}



def raw_errors(ext: Extension, calls: dict[str, str] | None = None, timeout: float = 120) -> dict[str, str]:
    """Call `ext`'s raw ops with bad inputs in a child process: {name: "RuntimeError: <first line>"} (lesson 06).

    `calls` maps a name to an expression over ``ops`` (the build's operator namespace) and ``torch``; the default is
    RAW_BAD_INPUTS. A C++ error normally comes back as a Python RuntimeError. On a machine where the compiler and
    the installed torch disagree about how exceptions cross the library boundary, the call kills its process
    instead: in the child that becomes "crashed: SIGSEGV ..." for that call, and the remaining calls run in a new
    child. The notebook or test that asked never goes down.
    """
    pending = dict(RAW_BAD_INPUTS if calls is None else calls)
    results: dict[str, str] = {}
    while pending:
        proc = subprocess.run([sys.executable, "-m", "utils.kernels.raw_call", str(ext.library), ext.namespace,
                               json.dumps(pending)], env=env.child_environ(),
                              capture_output=True, text=True, timeout=timeout)
        started = None
        for line in proc.stdout.splitlines():
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                results[msg["name"]] = msg["result"]
                pending.pop(msg["name"], None)
        if proc.returncode != 0:
            if started is None or started in results:  # died before or between calls: report it, do not loop
                tail = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
                raise RuntimeError(f"the child process for {ext.namespace} failed (exit {proc.returncode}): {tail}")
            how = (f"signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                   else f"exit code {proc.returncode}")
            fatal = next((ln.strip() for ln in proc.stderr.splitlines() if ln.startswith("Fatal Python error")), "")
            results[started] = (f"crashed: {how} (a C++ exception did not come back to Python: "
                                f"see `make doctor`, check 'C++ extension errors'){'; ' + fatal if fatal else ''}")
            pending.pop(started)
    return {name: results[name] for name in (RAW_BAD_INPUTS if calls is None else calls)}


def error_probe() -> tuple[bool, str]:
    """Build utils/kernels/probe.cpp like softmax.cpp and make it raise (`make doctor`; lesson 06).

    (True, detail) when its C++ error comes back to Python as a RuntimeError; (False, detail) when the call kills
    its (child) process, which means a bad input to any extension built here would take the notebook down.
    """
    import torch

    ext = build(KERNEL_DIR / "probe.cpp", name="wb_probe")
    (result,) = raw_errors(ext, {"strided": "ops.check_contiguous(torch.ones(4, 6).t())"}).values()
    where = (f"extension built by {env.capabilities()['cxx'].reason}; torch {torch.__version__} built by "
             f"{torch_build_compiler()}")
    if result.startswith("RuntimeError") and "expected a contiguous tensor" in result:
        return True, f"an error in a C++ extension comes back as a Python RuntimeError ({where})"
    return False, f"{result} ({where})"


def torch_build_compiler() -> str:
    """The compiler the installed torch was built with, e.g. "GCC 13.3", from torch.__config__.show() (lesson 06).

    An extension's exceptions travel through torch's own frames, so when a bad input kills the process instead of
    raising, building the extension with this compiler (CXX=g++-13) is the first thing to try.
    """
    import torch

    m = re.search(r"^\s*-\s*((?:GCC|clang|Clang|MSVC)\s+[\w.]+)", torch.__config__.show(), re.M)
    return m.group(1) if m else "an unknown compiler"


def warmup() -> str:
    """Build everything lesson 06 builds, ahead of time (``make warmup`` calls this): a one-line summary.

    The CPU extension, its 1-ulp-exp twin (the like-for-like build), its DEFAULT-capability twin (the at::vec trap
    demo), the nvcc compile check where nvcc exists, and the CUDA extension where a GPU does. The lab's extension depends on the learner's code: not here.
    """
    parts = []
    if not env.has("cxx"):
        return "skipped: " + env.capabilities()["cxx"].reason
    for ext in build_many({}, {"accurate_exp": True}, {"capability": "DEFAULT"}):
        kind = f"{ext.capability}{' 1-ulp exp' if ext.accurate_exp else ''}"
        parts.append(f"{kind} CPU build {'cached' if ext.cached else f'built in {ext.build_s:.0f} s'}")
    if env.has("nvcc"):
        check = compile_check_cuda()
        parts.append(f"nvcc compile check {'OK' if check.ok else 'FAILED'}")
    if env.has("cuda+nvcc"):
        ext = build(cuda=True)
        parts.append(f"CUDA build {'cached' if ext.cached else f'built in {ext.build_s:.0f} s'}")
    return "; ".join(parts)
