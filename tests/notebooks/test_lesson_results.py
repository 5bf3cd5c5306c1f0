"""Each lesson recorded what its contract (tests/lesson_contract.py) requires, and skipped only optional sections.

The lesson notebooks run earlier in the same session through nbval (conftest orders this file last). When a lesson's
results are missing (e.g. this file was run alone) the notebook is executed here with papermill in smoke mode.
"""

import json
from pathlib import Path

import pytest

from tests.lesson_contract import REQUIRED_METRICS, SECTION_METRICS
from utils.core import env, sections
from utils.course.run import lesson_notebooks, run_notebook

LESSONS = [p for p in lesson_notebooks() if p.stem in REQUIRED_METRICS]


def _results(nb: Path) -> dict:
    path = env.build_dir() / "results" / f"{nb.stem}.json"
    if not path.exists():
        run_notebook(nb, env.build_dir() / "executed", smoke=True)
    return json.loads(path.read_text())


@pytest.mark.parametrize("nb", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_recorded_its_metrics(nb):
    data = _results(nb)
    assert data["notebook"] == nb.stem
    excused = {m for section in data.get("skipped", {}) for m in SECTION_METRICS.get(section, [])}
    missing = [m for m in REQUIRED_METRICS[nb.stem] if m not in data["metrics"] and m not in excused]
    assert not missing, f"{nb.name} did not record {missing} (recorded: {sorted(data['metrics'])})"
    for name, value in data["metrics"].items():
        assert isinstance(value, bool | int | float | str), f"{name}: {value!r}"


@pytest.mark.parametrize("nb", LESSONS, ids=[p.stem for p in LESSONS])
def test_only_optional_sections_skipped(nb):
    data = _results(nb)
    for section, reason in data.get("skipped", {}).items():
        assert section in sections.OPTIONAL_SECTIONS, (
            f"{nb.name} skipped section {section!r} ({reason}) which is not listed in utils.core.sections.OPTIONAL_SECTIONS"
        )
        cap = sections.OPTIONAL_SECTIONS[section][0]
        assert not env.has(cap), f"{nb.name} skipped {section!r} although this machine has {cap}"
        assert section.startswith(nb.stem[:2] + "."), f"section {section!r} belongs to another lesson"


# Lessons whose speedups are measured in interleaved rounds: at least this share of their "x" metrics carry the
# interval of their rounds (00 states the rule, 08 only quotes the others).
MEASURED_LESSONS = ("01", "02", "03", "04", "05", "06", "07")
MIN_SHARE_WITH_INTERVAL = 0.9


@pytest.mark.parametrize("nb", [p for p in LESSONS if p.stem[:2] in MEASURED_LESSONS],
                         ids=[p.stem for p in LESSONS if p.stem[:2] in MEASURED_LESSONS])
def test_ratios_carry_their_interval(nb):
    data = _results(nb)
    ratios = [m for m, unit in data.get("units", {}).items() if unit == "x" and m in data["metrics"]]
    without = [m for m in ratios if m not in data.get("intervals", {})]
    for name, (low, high) in data.get("intervals", {}).items():
        assert low <= data["metrics"][name] <= high, f"{name}: {data['metrics'][name]} outside its [{low}, {high}]"
    assert len(ratios) - len(without) >= MIN_SHARE_WITH_INTERVAL * len(ratios), (
        f"{nb.name}: {len(without)} of {len(ratios)} speedups have no interval: {without}")


def test_section_metrics_name_required_metrics_of_optional_sections():
    for section, metrics in SECTION_METRICS.items():
        assert section in sections.OPTIONAL_SECTIONS, section
        # a section belongs to its lesson number; a lesson in parts records its metrics in the part that runs it
        required = {m for stem in REQUIRED_METRICS if stem.startswith(section[:2]) for m in REQUIRED_METRICS[stem]}
        assert required, f"{section}: no lesson {section[:2]} in REQUIRED_METRICS"
        assert set(metrics) <= required, (section, set(metrics) - required)


def test_every_lesson_has_a_contract():
    stems = {p.stem for p in lesson_notebooks()}
    unknown = sorted(stems - set(REQUIRED_METRICS))
    assert not unknown, f"lesson notebooks without required metrics in {__file__}: {unknown}"


def test_pruning_and_distillation_checks_hold():
    """Lesson 04 part 4: the checks its comparisons rest on (not its timings, which are the machine's)."""
    m = _results(next(p for p in LESSONS if p.stem == "04_sparsity_distillation"))["metrics"]
    assert m["unstructured_mask_matches_torch"] is True  # the global magnitude mask by hand is torch's
    assert abs(m["unstructured_90_sparsity"] - 0.9) < 1e-4  # fine-tuning under the mask kept every zero
    assert m["csr_parity_max_abs"] < 1e-4  # the CSR model computes what the dense model with the same zeros does
    assert m["structured_rebuild_parity_max_abs"] < 1e-4  # the narrow model is the large one with units masked
    assert m["distill_kl_by_hand_max_abs"] < 1e-4  # the soft-target term is the KL written out
    assert m["structured_flop_ratio"] > 1 and 0 < m["digits_mlp_dense_accuracy"] <= 1
    for name in ("unstructured_accuracy_drop_50_pp", "structured_accuracy_drop_after_finetune_pp",
                 "distill_accuracy_gain_pp"):
        assert -100 <= m[name] <= 100, (name, m[name])
