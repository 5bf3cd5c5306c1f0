"""Run by utils.graphs.run_in_fresh_process (lesson 02) in a new, isolated Python process (python -I): load each saved
model (TorchScript .pt with torch.jit.load, torch.export .pt2 with torch.export.load), run it on its inputs, and save
the outputs with the list of this course's modules the process imported (none is the point). Imports only torch.

    python -I fresh_run.py JOBS_PATH OUT_PATH
"""

import sys
import time

import torch


def main(jobs_path: str, out_path: str) -> None:
    results = []
    for model_path, inputs in torch.load(jobs_path, weights_only=True):
        t0 = time.perf_counter()
        if model_path.endswith(".pt2"):
            fn, kind = torch.export.load(model_path).module(), "torch.export"
        else:
            fn, kind = torch.jit.load(model_path), "TorchScript"
        with torch.no_grad():
            out = fn(*inputs)
        results.append({"out": out, "kind": kind, "seconds": time.perf_counter() - t0})
    course = sorted(m for m in sys.modules if m == "utils" or m.startswith("utils."))
    torch.save({"results": results, "course_modules": course}, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:3])
