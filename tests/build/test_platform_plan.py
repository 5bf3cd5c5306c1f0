"""The doctor's plan is what the lessons did (issue 26): for every lesson, the optional sections it ran and skipped are
exactly those utils.core.sections.predict() (the doctor's plan) says, on this machine or on the platform
WORKBOOK_EMULATE names (`make test-platforms` runs this once per emulated platform in the lean environment)."""

import json

import pytest

from tests.notebooks.test_lesson_results import LESSONS, _results
from utils.core import env, platforms, sections


def _lesson_results(nb) -> dict:
    """Under WORKBOOK_EMULATE (make test-platforms) the lesson is run here when it has not run yet. Elsewhere this file
    only reads what the session's lesson runs recorded: in the full suite it comes before them, and running every
    lesson a second time here would double the suite's time."""
    if platforms.emulated() or (env.build_dir() / "results" / f"{nb.stem}.json").is_file():
        return _results(nb)
    pytest.skip(f"{nb.stem} has not run in this session yet (make test-platforms runs it under each emulation)")


@pytest.mark.parametrize("nb", LESSONS, ids=[p.stem for p in LESSONS])
def test_what_ran_is_what_the_doctor_predicted(nb):
    data = _lesson_results(nb)
    plan = {s: status for s, (status, _why) in sections.predict().items() if s.startswith(nb.stem[:2] + ".")}
    ran, skipped = set(data.get("ran", [])), set(data.get("skipped", {}))
    where = f"{nb.stem} on {platforms.emulated() or 'this machine'}"
    wrong = {s: f"predicted {status}, but " + ("ran" if s in ran else "skipped" if s in skipped else "not reached")
             for s, status in plan.items()
             if (status == "runs") != (s in ran) or (status == "skipped") != (s in skipped)}
    # a lesson file covers only its own sections (the four parts of lesson 04, 04_onnx_tensorrt to
    # 04_sparsity_distillation, share the prefix "04.")
    others = {s for s in wrong if s not in ran and s not in skipped and _section_in_other_notebook(s, nb)}
    wrong = {s: why for s, why in wrong.items() if s not in others}
    assert not wrong, f"{where}: the doctor's plan and the run disagree: {wrong}"


def _guards(nb) -> str:
    """The code of a notebook's code cells (where its section guards are)."""
    return "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")


def _section_in_other_notebook(section: str, nb) -> bool:
    """True when `section` is guarded in another notebook of the same lesson number, not in `nb`."""
    needle = f'section="{section}"'
    return needle not in _guards(nb) and any(needle in _guards(p) for p in nb.parent.glob(nb.stem[:2] + "_*.ipynb"))
