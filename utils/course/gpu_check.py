"""`make gpu-check`: run every GPU section of the course on this machine and say what ran (README "GPU machines").

    python -m utils.course.gpu_check [--lessons 00 06 ...] [--no-tests] [--no-sanitizer] [--no-lessons]

For a machine with an NVIDIA GPU, in the course environment or your own (a plain clone, no make, no pip install of
the project: `python -m utils.course.gpu_check` from the checkout). It runs

1. the GPU tests (pytest over GPU_TESTS: the CUDA kernel build, parity, opcheck, the Triton kernels compiled, the
   device probes),
2. the CUDA softmax's parity test again under NVIDIA's compute-sanitizer, where the CUDA toolkit ships it: memcheck
   (out-of-bounds and misaligned accesses) over the whole test, racecheck (shared-memory hazards, which only the
   block kernels can have) over the row lengths that take the block path (SANITIZER_RUNS), and
3. every lesson that has GPU sections, in smoke mode, through the same papermill runner as `make course`,

then writes ``<build>/results/gpu_check.json`` and prints a table: the device, each GPU section (ran, or skipped and
why), the tests, the sanitizer's findings, and the key numbers (CUDA and Triton softmax as fractions of the device's
measured copy bandwidth, fp16 AMP training speedup, CUDA graphs speedup, ONNX Runtime CUDA and TensorRT speedups
where installed).

Exit code: 0 when everything that ran passed, 1 when a test, a sanitizer run or a lesson failed, 2 when there is no
CUDA GPU here (nothing to check; the JSON says why).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from utils import kernels
from utils.core import env, sections
from utils.course.run import NotebookFailed, lesson_notebooks, run_notebook

__all__ = ["GPU_CAPABILITIES", "GPU_TESTS", "KEY_METRICS", "SANITIZER_RUNS", "gpu_sections", "device_info",
           "run_tests", "sanitizer_path", "sanitizer_command", "parse_sanitizer", "run_sanitizer", "run_lessons",
           "summarize", "main"]

GPU_CAPABILITIES = {"cuda", "cuda+nvcc", "nvcc", "tensorrt", "ort_cuda"}
GPU_TESTS = ["tests/build/test_kernels.py", "tests/build/test_triton_kernels.py", "tests/build/test_triton_attention.py",
             "tests/build/test_cuda_occupancy.py", "tests/unit/test_env.py", "tests/unit/test_bench.py"]
# compute-sanitizer tool -> the pytest arguments it runs. memcheck: the CUDA softmax's whole parity test (warp and block
# kernels, every dtype, forward and backward). racecheck checks shared memory only, which only the block kernels use
# (rows longer than 1024): the scalar (4099) and vectorized (32768) block paths, at a fraction of the run's cost.
_CUDA_PARITY_TEST = "tests/build/test_kernels.py::test_cuda_kernel_matches_torch"
SANITIZER_RUNS = {"memcheck": [_CUDA_PARITY_TEST], "racecheck": [_CUDA_PARITY_TEST, "-k", "4099 or 32768"]}
SANITIZER_EXIT = 86  # compute-sanitizer's exit code when it found something: told apart from a failing test's 1
# (lesson, metric) -> what the number means, printed in the table
KEY_METRICS = {
    ("00_environment", "gpu_copy_gbps"): "device copy bandwidth, GB/s (read + write)",
    ("00_environment", "gpu_matmul_fp16_gflops"): "fp16 matmul, GFLOP/s",
    ("01_serving_basics", "gpu_vs_cpu_speedup"): "ResNet-50 inference, GPU over CPU",
    ("02_jit_compilers", "cuda_graph_speedup"): "CUDA graphs over eager launches (ResNet-18, batch 1)",
    ("03_training_bound", "gpu_amp_loop_speedup"): "fp16 AMP training loop over fp32",
    ("03_training_bound", "cudnn_benchmark_speedup"): "cudnn.benchmark over default",
    ("04_onnx_tensorrt", "ort_cuda_iobinding_speedup_vs_eager"): "ONNX Runtime CUDA (IO binding) over eager",
    ("04_porting", "trt_fp16_speedup_vs_eager"): "TensorRT fp16 over eager",
    ("05_triton_under_load", "gpu_throughput_rps_batching"): "Triton with a GPU encoder, req/s",
    ("06_fused_softmax", "gpu_softmax_fraction_of_copy_bw"): "CUDA softmax, fraction of the device's copy bandwidth "
                                                             "(rows of 64 to 32K floats)",
    ("06_fused_softmax", "gpu_softmax_few_rows_fraction_of_copy_bw"): "CUDA softmax, 8 rows x 128K (split-row), "
                                                                      "fraction of copy bandwidth",
    ("06_fused_softmax", "cuda_parity_max_abs_fp32"): "CUDA softmax parity, max |error| vs torch",
    ("06_gpu_kernels_triton", "triton_gpu_parity_max_abs_fp32"): "Triton softmax compiled, parity, max |error| vs torch",
    ("06_gpu_kernels_triton", "triton_gpu_softmax_fraction_of_copy_bw"): "Triton softmax, fraction of the device's "
                                                                         "copy bandwidth (rows of 256 to 32K floats)",
    ("06_gpu_kernels_triton", "triton_gpu_few_long_rows_fraction_of_copy_bw"): "Triton looped softmax, few long rows, "
                                                                               "fraction of copy bandwidth",
    ("06_gpu_kernels_triton", "triton_gpu_softmax_speedup_vs_torch_geomean"): "Triton softmax over torch.softmax",
    ("07_llm_inference", "gpu_sdpa_flash_speedup_vs_math"): "SDPA flash backend over math, fp16 causal attention",
}


def gpu_sections() -> dict[str, list[str]]:
    """{lesson prefix: [section ids]} for every optional section that needs a GPU capability (or nvcc, TensorRT)."""
    out: dict[str, list[str]] = {}
    for section, (cap, _what) in sections.OPTIONAL_SECTIONS.items():
        if cap in GPU_CAPABILITIES:
            out.setdefault(section[:2], []).append(section)
    return out


def device_info() -> dict:
    """The GPU and the software around it: what a GPU run report starts with."""
    import torch

    caps = env.capabilities()
    info = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "python": sys.version.split()[0],
            "capabilities": {k: {"available": c.available, "reason": c.reason} for k, c in caps.items()},
            "packages": env.package_versions(), "date": time.strftime("%Y-%m-%d"),
            # an extension's C++ errors cross torch's frames: the two compilers are the first suspects if they crash
            "cxx": caps["cxx"].reason, "torch_built_with": kernels.torch_build_compiler()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count)
    return info


def run_tests(build: Path, files: list[str] = GPU_TESTS, timeout: int = 1800, *, wrapper: list[str] = (),
              name: str = "gpu_check_tests") -> dict:
    """Run `files` with pytest in a child process, under `wrapper` (a command prefix such as compute-sanitizer's) if
    given; {passed, failed: [...], skipped: {test: reason}, seconds, exit_code}. The whole output goes to
    ``<build>/<name>.log``."""
    report_xml, log = build / f"{name}.xml", build / f"{name}.log"
    report_xml.unlink(missing_ok=True)  # a crashed run must not be read from the last run's report
    cmd = [*wrapper, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report_xml}", *files]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=env.repo_root(), env=env.child_environ(), capture_output=True, text=True,
                          timeout=timeout)
    log.write_text(proc.stdout + proc.stderr)
    shown = [Path(wrapper[0]).name, *wrapper[1:]] if wrapper else []
    out = {"command": " ".join([*shown, *cmd[len(wrapper) + 2 :]]), "passed": 0, "failed": [], "skipped": {},
           "seconds": round(time.perf_counter() - t0, 1), "exit_code": proc.returncode, "log": str(log)}
    if not report_xml.is_file():
        out["failed"].append(f"pytest wrote no report (exit {proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        return out
    for case in ET.parse(report_xml).getroot().iter("testcase"):
        name = f"{Path(case.get('file') or case.get('classname', '').replace('.', '/')).stem}::{case.get('name')}"
        if case.find("skipped") is not None:
            out["skipped"][name] = case.find("skipped").get("message", "")
        elif case.find("failure") is not None or case.find("error") is not None:
            node = case.find("failure") if case.find("failure") is not None else case.find("error")
            out["failed"].append(f"{name}: {(node.get('message') or '').splitlines()[0][:300] if node.get('message') else ''}")
        else:
            out["passed"] += 1
    return out


def sanitizer_path() -> Path | None:
    """NVIDIA's compute-sanitizer (part of the CUDA toolkit): on PATH, beside nvcc, or in the toolkit's own folder."""
    found = shutil.which("compute-sanitizer")
    candidates = [Path(found)] if found else []
    nvcc = env.nvcc_path()
    if nvcc is not None:
        toolkit = Path(nvcc).resolve().parent.parent
        candidates += [toolkit / "bin" / "compute-sanitizer", toolkit / "compute-sanitizer" / "compute-sanitizer"]
    candidates.append(Path("/usr/local/cuda/compute-sanitizer/compute-sanitizer"))
    return next((c for c in candidates if c.is_file()), None)


def sanitizer_command(tool: str, sanitizer: Path | str) -> list[str]:
    """The compute-sanitizer prefix for one tool ("memcheck", "racecheck", "initcheck" or "synccheck").

    ``--report-api-errors no``: the check is about the kernels' memory accesses; torch's runtime probes CUDA API calls
    that may fail by design, which are not this course's findings. ``--target-processes all``: pytest may start
    children. ``--error-exitcode``: tells "the tool found something" from "a test failed"."""
    if tool not in ("memcheck", "racecheck", "initcheck", "synccheck"):
        raise ValueError(f"tool must be memcheck, racecheck, initcheck or synccheck, got {tool!r}")
    return [str(sanitizer), "--tool", tool, "--report-api-errors", "no", "--target-processes", "all",
            "--print-limit", "20", "--error-exitcode", str(SANITIZER_EXIT)]


_SUMMARY = re.compile(r"^=+ ERROR SUMMARY: (\d+) errors?", re.M)
_RACE_SUMMARY = re.compile(r"^=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", re.M)
_NOT_FINDINGS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Process ID",
                 "Target application returned", "This can take a while")


def parse_sanitizer(text: str, tool: str) -> dict:
    """What compute-sanitizer said: {tool, errors, warnings, findings: [the first line of each report, at most 20],
    clean, reason}. `clean` needs the tool's own summary line: a run that died before printing it is not clean,
    whatever else it printed."""
    if not isinstance(text, str):
        raise TypeError(f"parse_sanitizer: expected compute-sanitizer's output as text, got {type(text).__name__}")
    findings: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^=+ (\S.*)$", line)  # a report starts at the margin; its details are indented below it
        if m and not m.group(1).startswith(_NOT_FINDINGS) and m.group(1) not in findings:
            findings.append(m.group(1))
    out = {"tool": tool, "errors": None, "warnings": 0, "findings": findings[:20], "clean": False, "reason": ""}
    if tool == "racecheck":  # its verdict is its own summary line: hazards, as errors and warnings
        races = _RACE_SUMMARY.findall(text)
        if races:
            out.update(errors=sum(int(r[1]) for r in races), warnings=sum(int(r[2]) for r in races))
    elif summaries := _SUMMARY.findall(text):
        out["errors"] = sum(int(n) for n in summaries)
    if out["errors"] is None:
        out["reason"] = f"no {tool} summary in the output: the tool or the program stopped before the end"
    elif out["errors"]:
        out["reason"] = f"{out['errors']} error(s) reported"
    else:
        out["clean"] = True
    return out


def run_sanitizer(build: Path, runs: dict[str, list[str]] = SANITIZER_RUNS, timeout: int = 3600) -> dict:
    """Run each tool of `runs` over its pytest arguments under compute-sanitizer: {tool: run_tests' dict + the parse},
    or {"skipped": reason} where there is no compute-sanitizer."""
    sanitizer = sanitizer_path()
    if sanitizer is None:
        return {"skipped": "no compute-sanitizer (it ships with the CUDA toolkit: install the toolkit, or put its "
                           "bin folder on PATH)"}
    out = {}
    for tool, args in runs.items():
        print(f"  compute-sanitizer --tool {tool} ...", flush=True)
        result = run_tests(build, args, timeout, wrapper=sanitizer_command(tool, sanitizer), name=f"sanitizer_{tool}")
        result.update(parse_sanitizer(Path(result["log"]).read_text(), tool))
        if result["exit_code"] not in (0, SANITIZER_EXIT) and not result["reason"]:
            result.update(clean=False, reason=f"exit code {result['exit_code']} (a test failed or the run crashed)")
        elif result["clean"] and not result["passed"]:  # nothing ran under the tool: nothing was checked
            skipped = "; ".join(sorted(set(result["skipped"].values()))) or "no test selected"
            result.update(clean=False, reason=f"no test ran under the sanitizer ({skipped})")
        out[tool] = result
    return out


def run_lessons(lessons: list[str], build: Path) -> dict[str, dict]:
    """Run each lesson (by prefix, e.g. "06") in smoke mode; {stem: {ok, seconds, error, results}}."""

    previous = os.environ.get("WORKBOOK_BUILD_DIR")
    os.environ["WORKBOOK_BUILD_DIR"] = str(build)  # the kernels inherit it: results land in <build>/results
    out = {}
    try:
        for path in [p for p in lesson_notebooks() if p.name[:2] in lessons]:
            entry = {"ok": True, "seconds": None, "error": None}
            print(f"  running {path.name} (smoke mode) ...", flush=True)
            try:
                entry["seconds"] = round(run_notebook(path, build / "executed", smoke=True), 1)
            except NotebookFailed as exc:
                entry.update(ok=False, error=str(exc))
            results = build / "results" / f"{path.stem}.json"
            entry["results"] = json.loads(results.read_text()) if results.is_file() else {}
            out[path.stem] = entry
    finally:
        if previous is None:
            os.environ.pop("WORKBOOK_BUILD_DIR", None)
        else:
            os.environ["WORKBOOK_BUILD_DIR"] = previous
    return out


def summarize(device: dict, tests: dict | None, lessons: dict[str, dict], sanitizer: dict | None = None) -> dict:
    """The gpu_check.json document: device, sections (ran / skipped with reason / not run), tests, sanitizer runs,
    key numbers, and what failed."""
    by_section = {}
    for prefix, ids in gpu_sections().items():
        stems = [s for s in lessons if s.startswith(prefix)]  # a lesson in parts has one entry per part
        for section in ids:
            if not stems:
                by_section[section] = {"status": "not run", "detail": "lesson not selected"}
                continue
            # the part that reached this section (ran or skipped it), else a part that failed, else the first part
            reached = [s for s in stems if section in lessons[s]["results"].get("ran", [])
                       or section in lessons[s]["results"].get("skipped", {})]
            stem = (reached or [s for s in stems if not lessons[s]["ok"]] or stems)[0]
            entry = lessons[stem]
            skipped = entry["results"].get("skipped", {})
            if section in skipped:
                by_section[section] = {"status": "skipped", "detail": skipped[section]}
            elif section in entry["results"].get("ran", []):
                status = "ran" if entry["ok"] else "ran, lesson failed"
                by_section[section] = {"status": status, "detail": sections.OPTIONAL_SECTIONS[section][1]}
            elif not entry["ok"]:
                by_section[section] = {"status": "failed", "detail": entry["error"].splitlines()[0]}
            else:  # its guard was never reached (e.g. nested in a TensorFlow section that was skipped)
                by_section[section] = {"status": "not run", "detail": "the lesson ran but never reached this section"}
    numbers = {}
    for (stem, metric), what in KEY_METRICS.items():
        value = lessons.get(stem, {}).get("results", {}).get("metrics", {}).get(metric)
        if value is not None:
            numbers[f"{stem}.{metric}"] = {"value": value, "what": what}
    failed = [s for s, e in lessons.items() if not e["ok"]] + (tests["failed"] if tests else [])
    for tool, run in (sanitizer or {}).items():
        if isinstance(run, dict) and not run.get("clean", True):
            failed.append(f"compute-sanitizer {tool}: {run['reason']}")
    return {"device": device, "sections": by_section, "tests": tests, "sanitizer": sanitizer,
            "lessons": {s: {k: v for k, v in e.items() if k != "results"} for s, e in lessons.items()},
            "key_numbers": numbers, "failed": failed}


def _table(doc: dict) -> str:
    d = doc["device"]
    lines = [f"device: {d.get('gpu') or 'no CUDA GPU'}" + (f" (compute {d['compute_capability']}, {d['memory_gib']} GiB)"
                                                           if d.get("gpu") else f": {d['capabilities']['cuda']['reason']}"),
             f"software: torch {d['torch']} (CUDA build {d['cuda_build']}), Python {d['python']}, {d['date']}", "",
             f"{'section':24s} {'status':8s} detail"]
    lines += [f"{s:24s} {e['status']:8s} {e['detail']}" for s, e in doc["sections"].items()]
    if doc["tests"]:
        t = doc["tests"]
        lines += ["", f"GPU tests: {t['passed']} passed, {len(t['failed'])} failed, {len(t['skipped'])} skipped "
                      f"({t['seconds']} s): {t['command']}"]
        lines += [f"  FAILED {f}" for f in t["failed"]]
        reasons = sorted(set(t["skipped"].values()))
        lines += [f"  skipped ({sum(v == r for v in t['skipped'].values())}): {r}" for r in reasons]
    sanitizer = doc.get("sanitizer")
    if sanitizer and "skipped" in sanitizer:
        lines += ["", f"compute-sanitizer: skipped: {sanitizer['skipped']}"]
    elif sanitizer:
        lines += [""]
        for tool, run in sanitizer.items():
            verdict = "clean" if run["clean"] else f"NOT CLEAN ({run['reason']})"
            lines += [f"compute-sanitizer {tool}: {verdict}; {run['passed']} tests passed, {len(run['failed'])} "
                      f"failed ({run['seconds']} s): {run['command']}"]
            lines += [f"  {f}" for f in run["findings"][:5]]
    if doc["key_numbers"]:
        lines += ["", "key numbers:"]
        lines += [f"  {v['value']:>10.4g}  {v['what']}  [{k}]" for k, v in doc["key_numbers"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.course.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", nargs="*", default=None, help="lesson prefixes (default: every lesson with GPU sections)")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
    parser.add_argument("--no-sanitizer", action="store_true", help="skip the compute-sanitizer runs")
    parser.add_argument("--no-lessons", action="store_true", help="skip the lessons")
    args = parser.parse_args(argv)
    build = env.build_dir() / "gpu-check"
    build.mkdir(parents=True, exist_ok=True)
    device = device_info()
    out_path = env.build_dir() / "results" / "gpu_check.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not env.has("cuda"):
        doc = summarize(device, None, {})
        for entry in doc["sections"].values():
            entry.update(status="skipped", detail="no CUDA GPU here")
        out_path.write_text(json.dumps(doc, indent=2, default=str))
        print(_table(doc))
        print(f"\nnothing to check: gpu-check needs a CUDA GPU ({env.capabilities()['cuda'].reason}); wrote {out_path}")
        return 2
    lessons = sorted(gpu_sections()) if args.lessons is None else args.lessons
    tests = None if args.no_tests else run_tests(build)
    sanitizer = None if args.no_sanitizer else run_sanitizer(build)
    ran = {} if args.no_lessons else run_lessons(lessons, build)
    doc = summarize(device, tests, ran, sanitizer)
    out_path.write_text(json.dumps(doc, indent=2, default=str))
    print(_table(doc))
    print(f"\nwrote {out_path}")
    if doc["failed"]:
        print(f"FAILED: {doc['failed']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
