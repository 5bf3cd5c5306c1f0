"""Lesson 06's extension built by clang++ instead of g++ (issue 26): a second compiler path, proved by the same
parity tests. Debian's clang (apt-get install clang libomp-dev; .ci/run installs it where it can) is all it needs."""

import shutil
import subprocess
import sys

import pytest

from utils.core import env

PARITY = ("forward_matches or out_variant or naive_loop or masked_nan or empty_and_one or strides or "
          "backward_kernel or build_is_cached")


@pytest.mark.skipif(shutil.which("clang++") is None,
                    reason="no clang++ (Debian/Ubuntu: apt-get install clang libomp-dev; .ci/run installs it as root)")
def test_lesson06_extension_builds_with_clang_and_passes_its_parity_tests(tmp_path):
    child = env.child_environ()
    child.update(CXX=shutil.which("clang++"), CC=shutil.which("clang") or "clang", WORKBOOK_BUILD_DIR=str(tmp_path))
    child.pop("WORKBOOK_EMULATE", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/build/test_kernels.py",
                           "-k", PARITY], capture_output=True, text=True, timeout=900, cwd=env.repo_root(), env=child)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and " skipped" not in proc.stdout.splitlines()[-1], tail
    ninja = list((tmp_path / "kernels").glob("*/build.ninja"))
    assert ninja, f"no extension was built under {tmp_path}: {tail}"
    assert all("clang++" in p.read_text() for p in ninja), "the build did not use clang++"
