"""Course tooling: what runs, checks, grades and publishes the lessons. No notebook imports it; it may import the core
and the lesson modules, never the other way round.

    run        the headless runner behind `make course` (papermill, smoke/full, a failure names notebook and cell)
    render     the course report, build/report.md and .html (`make report`)
    agenda     the workshop agenda from measured run times (`make agenda`, docs/INSTRUCTOR.md)
    site       the executed course as static HTML (`make site`)
    labs       labs/ generated from solutions/ (`make labs`)
    nbtools    notebook hygiene: outputs stripped except nbval-checked cells
    grade      grading submitted labs into a CSV (`make grade`), in the sandbox of utils.course.sandbox
    sandbox    the grading sandbox: namespaces, read-only mounts, no network, dropped privileges
    doctor     what will run on this machine and why not (`make doctor`)
    warmup     what is slow the first time, built ahead of a workshop (`make warmup`)
    gpu_check  every GPU section on a GPU machine, with a table (`make gpu-check`)
    labserver  JupyterLab on the course, as root too (`make lab`)
"""
