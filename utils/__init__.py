"""Helpers for the ML Framework Internals Workbook.

One module per concern; nothing heavy happens at import time (torch, TensorFlow and friends are imported inside the
functions that need them), so ``import utils.core.env`` is instant even on a machine where a framework is broken.

    env        hardware/software inventory, capability flags, the one guard for optional cells (lesson 00)
    bench      timing on torch.utils.benchmark (lesson 00, used everywhere)
    report     recorded metrics and the course report (lesson 00)
    run        the headless course runner behind `make course` (README)
    labs       lab generation from solutions and the check helpers (every lab)
    triton     the bundled Triton server as a context manager (lessons 00 and 05)
    models     offline models: seeded torchvision architectures, the bundled MiniLM (lessons 01-05)
    inference  predict helpers, autograd memory, file sizes (lesson 01)
    graphs     capture demos: trace/script/export/compile, retracing, HLO (lesson 02)
    data, profiling, training   the profiled ResNet-50 loop (lesson 03)
    onnx_tools, trt             export, parity, ORT optimization, quantization, TensorRT (lesson 04)
    triton_repo, load           the Triton model repository and the load generator (lesson 05)
    kernels    the fused softmax extension (lesson 06)
    interview, claims, site, grade, warmup, doctor   interview prep, report and instructor kit (07)
    labserver  `make lab`: JupyterLab on the course, as root too (README)
    gpu_check  `make gpu-check`: every GPU section on a GPU machine, with a table (README "GPU machines")
    checks     one module of lab checks per lesson
"""

__all__ = ["env", "bench", "report", "run", "labs", "triton", "models"]
