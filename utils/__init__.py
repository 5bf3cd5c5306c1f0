"""Helpers for the ML Framework Internals Workbook.

One module per concern; nothing heavy happens at import time (torch, TensorFlow and friends are imported inside the
functions that need them), so ``import utils.env`` is instant even on a machine where a framework is broken.

    env        hardware/software inventory, capability flags, the one guard for optional cells (lesson 00)
    bench      timing on torch.utils.benchmark (lesson 00, used everywhere)
    report     recorded metrics and the course report (lesson 00)
    run        the headless course runner behind `make course` (README)
    labs       lab generation from solutions and the check helpers (every lab)
    triton     the bundled Triton server as a context manager (lessons 00 and 05)
"""

__all__ = ["env", "bench", "report", "run", "labs", "triton"]
