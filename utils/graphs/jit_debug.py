"""Run by utils.graphs.jit_debug_run (lesson 02) in a new, isolated Python process, once as it is and once with
PYTORCH_JIT=0: script a function, call it with an input it cannot take, and print (one JSON line) what a debugger
would have to work with: the type torch.jit.script returned, the Python frames of the traceback, the exception.

    python -I jit_debug.py

PYTORCH_JIT is read when torch is imported, which is why this runs in a process of its own.
"""

import json
import os
import traceback

import torch


def rows_to_unit_norm(x: torch.Tensor) -> torch.Tensor:
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)  # a 1-D input has no dim 1: the error starts here
    return x / norms.clamp(min=1e-12)


def main() -> None:
    fn = torch.jit.script(rows_to_unit_norm)
    good = fn(torch.ones(2, 3))  # a 2-D input works either way
    try:
        fn(torch.ones(3))  # a 1-D input fails inside the function
        frames, error = [], None
    except Exception as exc:  # report what failed; the parent prints it
        frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
        error = {"type": type(exc).__name__, "message": str(exc)}
    print(json.dumps({
        "pytorch_jit": os.environ.get("PYTORCH_JIT", ""),
        "scripted_type": type(fn).__name__,
        "is_the_python_function": fn is rows_to_unit_norm,
        "good_input_ok": bool(torch.allclose(torch.linalg.vector_norm(good, dim=1), torch.ones(2))),
        "python_frames": frames,
        "error": error,
    }))


if __name__ == "__main__":
    main()
