"""`make gpu-check`: run every GPU section of the course on this machine and say what ran (README "GPU machines").

    python -m utils.course.gpu_check [--lessons 00 06 ...] [--no-tests] [--no-lessons]

For a machine with an NVIDIA GPU, in the course environment or your own (a plain clone, no make, no pip install of
the project: `python -m utils.course.gpu_check` from the checkout). It runs

1. the GPU tests (pytest over GPU_TESTS: the CUDA kernel build, parity, opcheck, the device probes), and
2. every lesson that has GPU sections, in smoke mode, through the same papermill runner as `make course`,

then writes ``<build>/results/gpu_check.json`` and prints a table: the device, each GPU section (ran, or skipped and
why), the tests, and the key numbers (CUDA softmax as a fraction of the device's measured copy bandwidth, fp16 AMP
training speedup, CUDA graphs speedup, ONNX Runtime CUDA and TensorRT speedups where installed).

Exit code: 0 when everything that ran passed, 1 when a test or a lesson failed, 2 when there is no CUDA GPU here
(nothing to check; the JSON says why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from utils import kernels
from utils.core import env, sections
from utils.course.run import NotebookFailed, lesson_notebooks, run_notebook

__all__ = ["GPU_CAPABILITIES", "GPU_TESTS", "KEY_METRICS", "gpu_sections", "device_info", "run_tests", "run_lessons",
           "summarize", "main"]

GPU_CAPABILITIES = {"cuda", "cuda+nvcc", "nvcc", "tensorrt"}
GPU_TESTS = ["tests/build/test_kernels.py", "tests/unit/test_env.py", "tests/unit/test_bench.py"]
# (lesson, metric) -> what the number means, printed in the table
KEY_METRICS = {
    ("00_environment", "gpu_copy_gbps"): "device copy bandwidth, GB/s (read + write)",
    ("00_environment", "gpu_matmul_fp16_gflops"): "fp16 matmul, GFLOP/s",
    ("01_inference_modes", "gpu_vs_cpu_speedup"): "ResNet-50 inference, GPU over CPU",
    ("02_graphs", "cuda_graph_speedup"): "CUDA graphs over eager launches (ResNet-18, batch 1)",
    ("03_profiling_amp", "gpu_amp_loop_speedup"): "fp16 AMP training loop over fp32",
    ("03_profiling_amp", "cudnn_benchmark_speedup"): "cudnn.benchmark over default",
    ("04_onnx_tensorrt", "ort_cuda_iobinding_speedup_vs_eager"): "ONNX Runtime CUDA (IO binding) over eager",
    ("04_onnx_tensorrt", "trt_fp16_speedup_vs_eager"): "TensorRT fp16 over eager",
    ("05_triton_ensemble", "gpu_throughput_rps_batching"): "Triton with a GPU encoder, req/s",
    ("06_fused_softmax", "gpu_softmax_fraction_of_copy_bw"): "CUDA softmax, fraction of the device's copy bandwidth",
    ("06_fused_softmax", "cuda_parity_max_abs_fp32"): "CUDA softmax parity, max |error| vs torch",
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


def run_tests(build: Path, files: list[str] = GPU_TESTS, timeout: int = 1800) -> dict:
    """Run `files` with pytest in a child process; {passed, failed: [...], skipped: {test: reason}, seconds}."""
    report_xml = build / "gpu_check_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report_xml}", *files]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=env.repo_root(), env=env.child_environ(), capture_output=True, text=True,
                          timeout=timeout)
    out = {"command": " ".join(cmd[2:]), "passed": 0, "failed": [], "skipped": {},
           "seconds": round(time.perf_counter() - t0, 1), "exit_code": proc.returncode}
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


def summarize(device: dict, tests: dict | None, lessons: dict[str, dict]) -> dict:
    """The gpu_check.json document: device, sections (ran / skipped with reason / not run), tests, key numbers."""
    by_section = {}
    for prefix, ids in gpu_sections().items():
        stem = next((s for s in lessons if s.startswith(prefix)), None)
        for section in ids:
            if stem is None:
                by_section[section] = {"status": "not run", "detail": "lesson not selected"}
                continue
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
    return {"device": device, "sections": by_section, "tests": tests,
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
    if doc["key_numbers"]:
        lines += ["", "key numbers:"]
        lines += [f"  {v['value']:>10.4g}  {v['what']}  [{k}]" for k, v in doc["key_numbers"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.course.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", nargs="*", default=None, help="lesson prefixes (default: every lesson with GPU sections)")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
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
    ran = {} if args.no_lessons else run_lessons(lessons, build)
    doc = summarize(device, tests, ran)
    out_path.write_text(json.dumps(doc, indent=2, default=str))
    print(_table(doc))
    print(f"\nwrote {out_path}")
    if doc["failed"]:
        print(f"FAILED: {doc['failed']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
