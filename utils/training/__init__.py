"""Lesson 03, profiling and mixed precision: a ResNet training loop with one switch per performance fix, and the
tools the lesson reads it with.

    loop       LoopConfig, Trainer (one labelled training step), loop_source / fix_diff (the loop's code as it runs),
               compare_loops (side-by-side timing), synthetic_step
    ablation   Fix, fixes, try_fix: the fixes tried one at a time
    allocator  page faults per step; glibc malloc told to keep freed memory
    profiling  labelled phases (record_function), profiler schedules, Chrome traces, the bottleneck finder
    precision  the AMP prediction from the hardware (CPU flags, GPU compute capability) and its probes
    codeview   a method's own source with a config's switches resolved (how loop_source prints the loop)
    __main__   the loop outside Jupyter (Nsight)

The names below are the loop's API, so a lesson writes ``training.Trainer(...)``.
"""

from utils.training.ablation import Fix, FixTrial, ceiling, fixes, over_ceiling, try_fix
from utils.training.allocator import allocator_ab, keep_freed_memory, page_faults_per_step
from utils.training.loop import (
    LoopConfig,
    Trainer,
    amp_dtype,
    build_model,
    compare_loops,
    fix_diff,
    loop_source,
    synthetic_step,
)

__all__ = [
    "LoopConfig", "Trainer", "amp_dtype", "build_model", "compare_loops", "fix_diff", "loop_source", "synthetic_step",
    "Fix", "FixTrial", "ceiling", "fixes", "over_ceiling", "try_fix", "keep_freed_memory", "page_faults_per_step", "allocator_ab",
]
