"""The core every lesson and every tool stands on; it imports nothing from the lesson modules or utils.course.

    env       what is on this machine: paths, smoke mode, inventory, capabilities (lesson 00). Imports no course module.
    report    recorded metrics (build/results/<lesson>.json) and report.show(), the one results view (every lesson)
    claims    the source material's claims and their verdicts from recorded metrics (report.show(), course report)
    sections  the optional sections and their guard, sections.requires() (every lesson)
    bench     timing on torch.utils.benchmark: warm-up, median, IQR, copy/matmul probes (lesson 00, everywhere)
    models    offline models: seeded torchvision architectures, the bundled MiniLM (lessons 01-05)
    onnx_io   export to ONNX, ONNX Runtime sessions, parity checks (lessons 01, 04, 05)
    data      course data: labelled sentences (05), synthetic images (03)

Layering inside the core: env <- report (<- claims) <- sections; bench, models, onnx_io and data use env at most.
"""
