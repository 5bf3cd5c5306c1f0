"""Pre-build what is slow the first time, so workshop cells start fast (instructor kit; `make warmup`).

    python -m utils.course.warmup [--list] [STEP ...]

Each step runs in its own Python process (a crash or a hang in one cannot take the others down; TensorFlow and
torch's compiler must not share a process in the wrong import order) and prints ``done``, ``skipped`` with the
reason, or ``FAILED`` with the error. Results land where the lessons look for them (the build folder and the usual
caches), so running it before a workshop turns first-run compiles into cache hits.

Lesson modules take part through a hook: a module that defines ``warmup()`` (for example ``utils.kernels``,
``utils.conversion.onnx_tools``, ``utils.serving.repository``) gets it called; a module that is absent, or has no hook yet, is
skipped with that reason. The exit code is 1 when a step failed, else 0.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable

from utils.core import env, tritonserver

__all__ = ["STEPS", "run_step", "main"]


class Skip(Exception):
    """A step that cannot run here; the message is the reason."""


def _imports() -> str:
    t = {}
    for name in ("torch", "torchvision", "onnxruntime", "transformers"):
        t0 = time.perf_counter()
        importlib.import_module(name)
        t[name] = time.perf_counter() - t0
    return ", ".join(f"{k} {v:.1f} s" for k, v in t.items())


def _tensorflow() -> str:
    if importlib.util.find_spec("tensorflow") is None:
        raise Skip("tensorflow is not installed")
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401  (triton after tensorflow crashes torch.compile in one process)
    t0 = time.perf_counter()
    import tensorflow as tf

    tf.constant(1.0) + 1.0
    return f"tensorflow imported in {time.perf_counter() - t0:.1f} s"


def _matplotlib() -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    plt.close(fig)
    return "font cache built"


def _kernel() -> str:
    from jupyter_client.manager import start_new_kernel

    t0 = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive("import utils.core.env", timeout=120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return f"a python3 kernel started and stopped in {time.perf_counter() - t0:.1f} s"


def _hook(module: str, lesson: str) -> Callable[[], str]:
    def step() -> str:
        if importlib.util.find_spec(module) is None:
            raise Skip(f"{module} does not exist yet (lesson {lesson} builds this when it runs)")
        mod = importlib.import_module(module)
        fn = getattr(mod, "warmup", None)
        if fn is None:
            raise Skip(f"{module} has no warmup() hook yet (lesson {lesson} builds this when it runs)")
        return str(fn() or "done")

    return step


def _kernels() -> str:
    if importlib.util.find_spec("utils.kernels") is None:
        raise Skip("utils.kernels does not exist yet (lesson 06 builds its extension when it runs)")
    mod = importlib.import_module("utils.kernels")
    if hasattr(mod, "warmup"):
        return str(mod.warmup() or "done")
    if not env.has("cxx"):
        raise Skip(env.capabilities()["cxx"].reason)
    parts = []
    ext = mod.build()
    parts.append(f"CPU extension {'found in cache' if getattr(ext, 'cached', False) else 'built'}")
    if env.has("cuda+nvcc"):
        ext = mod.build(cuda=True)
        parts.append(f"CUDA extension {'found in cache' if getattr(ext, 'cached', False) else 'built'}")
    else:
        parts.append("CUDA extension skipped: " + env.capabilities()["cuda+nvcc"].reason)
    return "; ".join(parts)


def _tritonserver() -> str:
    if not env.has("tritonserver"):
        raise Skip(env.capabilities()["tritonserver"].reason)
    repo = env.build_dir() / "triton" / "empty_repository"
    repo.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tritonserver.TritonServer(repo, name="warmup") as server:
        ready = server.is_ready()
    return f"tritonserver started (ready={ready}) and stopped in {time.perf_counter() - t0:.1f} s"


STEPS: dict[str, tuple[str, Callable[[], str]]] = {
    "imports": ("import torch, torchvision, onnxruntime, transformers (cold disk cache)", _imports),
    "tensorflow": ("import TensorFlow once", _tensorflow),
    "matplotlib": ("build matplotlib's font cache", _matplotlib),
    "kernel": ("start a Jupyter kernel once", _kernel),
    "kernels": ("lesson 06: build the C++ (and CUDA) softmax extension", _kernels),
    "onnx": ("lesson 04: exported ONNX models", _hook("utils.conversion.onnx_tools", "04")),
    "triton-repo": ("lesson 05: the Triton model repository", _hook("utils.serving.repository", "05")),
    "tritonserver": ("start the bundled tritonserver once", _tritonserver),
    "llm": ("lesson 07: train and cache the TinyGPT weights", _hook("utils.llm", "07")),
}


def run_step(name: str) -> dict:
    """Run one step in this process; returns {"status": done|skipped|failed, "detail": ..., "seconds": ...}."""
    if name not in STEPS:
        raise KeyError(f"unknown warm-up step {name!r}; steps: {list(STEPS)}")
    t0 = time.perf_counter()
    try:
        detail, status = STEPS[name][1](), "done"
    except Skip as exc:
        detail, status = str(exc), "skipped"
    except Exception as exc:  # reported as FAILED with the error, never as success
        detail, status = f"{type(exc).__name__}: {exc}", "failed"
    return {"status": status, "detail": detail, "seconds": round(time.perf_counter() - t0, 1)}


def _in_subprocess(name: str, timeout: int) -> dict:
    try:
        proc = subprocess.run([sys.executable, "-m", "utils.course.warmup", "_step", name], capture_output=True, text=True,
                              timeout=timeout, cwd=env.repo_root())
    except subprocess.TimeoutExpired:
        return {"status": "failed", "detail": f"still running after {timeout} s", "seconds": float(timeout)}
    line = next((ln for ln in proc.stdout.splitlines()[::-1] if ln.startswith("STEP ")), "")
    if not line:
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"status": "failed", "detail": f"the step's process died: {tail}", "seconds": 0.0}
    return json.loads(line[5:])


def main(argv=None) -> int:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_step"]:
        print("STEP " + json.dumps(run_step(argv[1])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m utils.course.warmup", description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="*", help=f"some of {list(STEPS)} (default: all)")
    parser.add_argument("--list", action="store_true", help="list the steps")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per step")
    args = parser.parse_args(argv)
    if args.list:
        for name, (what, _) in STEPS.items():
            print(f"{name:13s} {what}")
        return 0
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; steps: {list(STEPS)}")
    failed = 0
    t0 = time.perf_counter()
    for name in args.steps or list(STEPS):
        res = _in_subprocess(name, args.timeout)
        mark = {"done": "done   ", "skipped": "skipped", "failed": "FAILED "}[res["status"]]
        print(f"[{mark}] {name:13s} {res['seconds']:6.1f} s  {res['detail']}", flush=True)
        failed += res["status"] == "failed"
    print(f"warm-up finished in {time.perf_counter() - t0:.0f} s" + (f", {failed} step(s) FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
