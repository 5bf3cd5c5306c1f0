"""Test-suite setup: smoke mode, a separate build folder, and lesson-result checks ordered after the notebooks."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Tests never overwrite a learner's `make course` results: they write under build/test/.
os.environ.setdefault("WORKBOOK_BUILD_DIR", str(ROOT / "build" / "test"))
os.environ.setdefault("WORKBOOK_SMOKE", "1")
# Keep TensorFlow quiet and off any GPU probing noise in notebook kernels started by the tests.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# Test tiers by folder: `make test-fast` runs tests/unit (under 2 minutes); `make test` runs every tier.
TIERS = {"unit": "unit", "build": "build", "server": "server", "notebooks": "notebook"}


def pytest_collection_modifyitems(session, config, items):
    """Mark each test with its tier (its folder; notebooks executed by nbval are "notebook"), and run the lesson
    notebooks (nbval) before tests/notebooks/test_lesson_results.py, which reads what they recorded."""
    for item in items:
        path = Path(str(item.fspath))
        tier = "notebook" if path.suffix == ".ipynb" else TIERS.get(path.parent.name)
        if tier is None:
            raise pytest.UsageError(f"{path} is not in a tier folder: put it under tests/{{{','.join(TIERS)}}}/")
        item.add_marker(tier)
    last = [it for it in items if Path(str(it.fspath)).name == "test_lesson_results.py"]
    first = [it for it in items if it not in last]
    items[:] = first + last


def pytest_sessionstart(session):
    """Start from empty results so a lesson that failed to record cannot pass on an earlier run's file."""
    import shutil

    results = Path(os.environ["WORKBOOK_BUILD_DIR"]) / "results"
    if results.is_dir() and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(results)
