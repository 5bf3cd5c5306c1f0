"""A two-day workshop agenda from the measured run times (instructor guide; ``make agenda``).

``python -m utils.course.agenda [--update docs/INSTRUCTOR.md] [--start 09:00]`` prints the agenda, writes
build/agenda.md, and with --update rewrites the agenda block of the instructor guide.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from pathlib import Path

from utils.core import env
from utils.core.report import load_all
from utils.course.render import lesson_title
from utils.course.run import runtimes_path

__all__ = ["WORKSHOP_PLAN", "agenda", "update_agenda", "main"]

# Workshop plan: minutes of explanation and of lab work per lesson are planning estimates; the minutes spent running
# the notebook come from the measured run times (runtime_s) in build/results. Twenty-two parts of about 45 minutes each
# do not fit one day: day 2 starts with lesson 05 (WORKSHOP_DAYS).
WORKSHOP_PLAN: dict[str, tuple[int, int]] = {
    "00_environment": (15, 25),  # lab 00: the bandwidth probe, intensity, the ridge, the elementwise chain
    "01_inference_modes": (12, 0),  # part 1 of lesson 01: its lab comes after part 2
    "01_serving_basics": (13, 35),  # part 2 of lesson 01, with the lesson's lab (predict, benchmark, a request queue)
    "02_graphs": (12, 35),  # part 1 of lesson 02, with its lab (its graph-break task is part 2's subject)
    "02_jit_compilers": (13, 0),  # part 2 of lesson 02: no lab of its own
    "03_profiling_amp": (12, 25),
    "03_training_bound": (8, 0),  # part 2 of lesson 03: the lab is part 1's
    "04_onnx_tensorrt": (15, 0),  # part 1 of lesson 04: its lab comes after part 2
    "04_porting": (10, 25),  # part 2 of lesson 04, with the lab of parts 1 and 2
    "04_quantization": (20, 30),  # part 3 of lesson 04, with its lab (the arithmetic, then calibration)
    "04_sparsity_distillation": (15, 0),  # part 4 of lesson 04: no lab of its own
    "05_triton_ensemble": (10, 20),  # part 1 of lesson 05, with its lab (a config by hand, batching tuned)
    "05_triton_under_load": (8, 0),  # part 2 of lesson 05: no lab of its own
    "05_triton_vs_torchserve": (8, 0),  # part 3 of lesson 05: hardening and TorchServe, no lab of its own
    "06_fused_softmax": (14, 25),  # part 1 of lesson 06, with its lab (whose Triton task part 2 teaches)
    "06_gpu_kernels_triton": (6, 0),  # part 2 of lesson 06: its Triton task is in lesson 06's lab
    "06_numerics": (15, 0),  # part 3 of lesson 06: no lab of its own
    "07_llm_inference": (11, 0),  # lesson 07's lab comes after part 3: its tasks are parts 1, 2 and 3's
    "07_llm_scheduling": (9, 0),  # part 2 of lesson 07 (the lab's scheduler task): the lab comes after part 3
    "07_llm_serving": (15, 45),  # part 3 of lesson 07, then the lesson's lab (KV cache, scheduler, prefix cache)
    "07_llm_tuning": (15, 0),  # part 4 of lesson 07: no lab of its own
    "08_interview_prep": (10, 20),
}
WORKSHOP_DAYS = ("00_environment", "05_triton_ensemble")  # the first lesson of each day
_BREAKS = ((10 * 60 + 30, "coffee break", 15), (12 * 60 + 30, "lunch", 60), (15 * 60 + 15, "break", 15))


def _clock(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def agenda(results: dict[str, dict] | None = None, start: str = "09:00", runtimes: dict | None = None) -> str:
    """A two-day workshop agenda in Markdown, its run-time column taken from the measured runs (instructor guide).

    Each lesson's slot is explanation + running the notebook + lab. Explanation and lab minutes are the planning
    estimates in WORKSHOP_PLAN; the run minutes are measured. `runtimes` ({mode: {lesson: [seconds, oldest first]}},
    default build/runtimes.json) gives a clone's first run (cold caches, what a class meets) and its latest (warm):
    the plan counts the first. Without it, a results file's runtime_s. A lesson never measured counts 0 minutes.
    """
    results = load_all() if results is None else results
    if runtimes is None:
        path = runtimes_path()
        runtimes = json.loads(path.read_text()) if path.is_file() else {}
    try:
        hours, minutes = (int(x) for x in start.split(":"))
    except ValueError:
        raise ValueError(f"start must look like '09:00', got {start!r}") from None
    now = hours * 60 + minutes
    breaks = list(_BREAKS)
    lines = [
        "| time | session | explain (min, plan) | run the notebook (min, measured) | lab (min, plan) |",
        "|---|---|---|---|---|",
    ]
    unmeasured, modes, ends = [], set(), []
    for stem, (talk, lab) in WORKSHOP_PLAN.items():
        if stem in WORKSHOP_DAYS:  # a new day: the clock and the breaks start again
            if ends or stem != next(iter(WORKSHOP_PLAN)):
                lines.append(f"| {_clock(now)} | *end of day {len(ends) + 1}* | | | |")
                ends.append(now)
                now, breaks = hours * 60 + minutes, list(_BREAKS)
            lines.append(f"| | **day {len(ends) + 1}** | | | |")
        data = results.get(stem, {})
        mode = data.get("mode", "full")
        history = runtimes.get(mode, {}).get(stem) or ([data["runtime_s"]] if "runtime_s" in data else [])
        if history:
            first, last = history[0], history[-1]
            run_min = max(1, math.ceil(first / 60))
            modes.add(mode)
            run_txt = f"{run_min} ({mode} run, {first:.0f} s"
            run_txt += f" the first time, {last:.0f} s again)" if len(history) > 1 else ")"
        else:
            run_min = 0
            unmeasured.append(stem)
            run_txt = "not measured yet"
        # take a break before this lesson when more than half of it would run past the break's time
        while breaks and now + (talk + run_min + lab) / 2 >= breaks[0][0]:
            _, name, length = breaks.pop(0)
            lines.append(f"| {_clock(now)} | *{name}* | | | |")
            now += length
        title = lesson_title(stem)
        lines.append(f"| {_clock(now)} | {stem}{': ' + title if title else ''} | {talk} | {run_txt} | {lab} |")
        now += talk + run_min + lab
    lines.append(f"| {_clock(now)} | *end of day {len(ends) + 1}* | | | |")
    ends.append(now)
    notes = []
    if unmeasured:
        notes.append(f"Not measured yet: {', '.join(unmeasured)} (run `make course`, then `make agenda`).")
    if "smoke" in modes:
        notes.append("Some run times come from smoke runs (small sizes); a full run takes longer.")
    late = [f"day {i} ends at {_clock(end)}" for i, end in enumerate(ends, 1) if end > 17 * 60 + 30]
    if late:
        notes.append(f"{'; '.join(late).capitalize()}: run the slowest lessons in smoke mode in class "
                     "(`WORKBOOK_SMOKE=1`) or pre-run them with `make course` and walk through the executed copies.")
    return "\n".join(lines + ([""] + notes if notes else []))


def update_agenda(path: Path, results: dict[str, dict] | None = None, runtimes: dict | None = None) -> bool:
    """Rewrite the block between '<!-- agenda:start -->' and '<!-- agenda:end -->' in `path`; True if it changed."""
    text = Path(path).read_text()
    begin, end = "<!-- agenda:start -->", "<!-- agenda:end -->"
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no '{begin}' ... '{end}' block to update")
    inv = env.inventory()
    stamp = f"Generated by `make agenda` on {_dt.date.today().isoformat()} from build/results ({inv['cpu']}, {inv['cpu_count']} cores)."
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{stamp}\n\n{agenda(results, runtimes=runtimes)}\n{end}{tail}"
    if new != text:
        Path(path).write_text(new)
        return True
    return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m utils.course.agenda", description=__doc__.splitlines()[0])
    parser.add_argument("--update", type=Path, default=None, help="rewrite the agenda block of this file (docs/INSTRUCTOR.md)")
    parser.add_argument("--start", default="09:00")
    args = parser.parse_args(argv)
    if args.update:
        changed = update_agenda(args.update)
        print(f"{args.update}: agenda {'updated' if changed else 'unchanged'}")
    text = agenda(start=args.start)
    print(text)
    (env.build_dir() / "agenda.md").write_text("# Workshop agenda (from measured run times)\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
