"""Helpers for the ML Framework Internals Workbook, in layers (README "How the course is built").

    core/        what every lesson stands on; imports nothing above it
                 env (machine, paths, capabilities), report (record + show), claims, sections (the optional-cell
                 guard), bench, models, onnx_io, data (sentences, synthetic images), tritonserver (the server process)
    inference    lesson 01: predict helpers, autograd memory, file sizes
    graphs/      lesson 02: trace/script/export/compile demos, retracing, a fresh-process runner
    training/    lesson 03: the profiled ResNet loop, its ablation, allocator, profiling, AMP prediction
    conversion/  lesson 04: ONNX graph work, graphs drawn as SVG, TensorRT
    serving/     lesson 05: the Triton model repository, its Python-backend programs, load generator, deployment
    kernels/     lesson 06: the fused softmax extension (C++/CUDA sources, builds, sweeps)
    interview/   lesson 08: the question bank, its proofs, quiz and practice sets
    llm          lesson 07: a tiny GPT, KV cache, tiled attention, static vs continuous batching, paged KV, int8
    checks/      one module of lab checks per lab, and the helpers they share
    course/      tooling no notebook imports: runner, report rendering, agenda, site, labs, notebook hygiene,
                 grading and its sandbox, doctor, warm-up, gpu-check, JupyterLab

A lesson module imports the core and itself; checks add the lesson modules; course tooling may import anything
(tests/unit/test_layers.py). Heavy frameworks (torch, TensorFlow, ONNX Runtime, tritonclient) are imported where a
module needs them, inside functions when the package is optional, so ``import utils.core.env`` is instant even on a
machine where a framework is broken.
"""
