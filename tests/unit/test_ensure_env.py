"""scripts/ensure_env.sh: an environment is kept with the newest previous one; older ones are removed and named."""

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _prune(envs: Path, current: str, **extra_env) -> subprocess.CompletedProcess:
    script = (ROOT / "scripts" / "ensure_env.sh").read_text()
    body = script[script.index("prune_old() {"):]
    body = body[: body.index("\n}\n") + 3]
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_ENV_DIR", "WORKBOOK_LEAN_ENV_DIR")}
    env.update(extra_env, envdir=str(envs / current))
    return subprocess.run(["bash", "-c", body + "\nprune_old"], env=env, capture_output=True, text=True, check=True)


def test_keeps_the_current_and_the_newest_previous_environment(tmp_path):
    for name in ("py311-aaa", "py311-bbb", "py311-ccc", "py311-ddd", "lean-py312-eee"):
        (tmp_path / name).mkdir()
        (tmp_path / f"{name}.lock").touch()
        time.sleep(0.02)  # distinct modification times: ls -t orders by them
    out = _prune(tmp_path, "py311-ddd")
    left = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert left == ["lean-py312-eee", "py311-ccc", "py311-ddd"]
    assert "py311-aaa" in out.stderr and "py311-bbb" in out.stderr


def test_a_folder_set_by_hand_is_never_pruned(tmp_path):
    for name in ("py311-aaa", "py311-bbb", "py311-ccc"):
        (tmp_path / name).mkdir()
        time.sleep(0.02)
    _prune(tmp_path, "py311-ccc", WORKBOOK_ENV_DIR=str(tmp_path / "py311-ccc"))
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 3


def test_pruning_runs_on_every_call_not_only_after_a_build():
    """Environments left by earlier lock changes are removed the next time the script runs, even when the current
    environment already exists (four stale ~9.5 GB environments once filled a 60 GB disk)."""
    script = (ROOT / "scripts" / "ensure_env.sh").read_text()
    locked = script[script.index("  flock 9\n"):script.index(') 9>"$envdir.lock"')]
    build = locked[locked.index('if [ ! -f "$envdir/.complete" ]'):]
    build = build[: build.index("\n  fi\n") + 6]  # the build branch, up to its own closing fi
    assert "prune_old" not in build
    assert "\n  prune_old\n" in locked
