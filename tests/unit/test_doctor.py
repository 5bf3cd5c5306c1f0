"""`make doctor` (utils.course.doctor) and `make warmup` (utils.course.warmup): fast, honest about what runs, clear exit codes."""

import json
import subprocess
import sys

import pytest

from utils.core import env, sections
from utils.course import doctor, warmup


def test_doctor_answers_in_under_a_minute_and_lists_every_section():
    proc = subprocess.run([sys.executable, "-m", "utils.course.doctor"], capture_output=True, text=True, timeout=60,
                          cwd=env.repo_root())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "verdict: the course runs here" in out
    for lesson in doctor.LESSONS:
        assert f"\n  {lesson} " in out, f"lesson {lesson} missing from the plan"
    for section in sections.OPTIONAL_SECTIONS:
        assert section in out, section
    for cap, c in env.capabilities().items():
        if not c.available and any(need == cap for need, _ in sections.OPTIONAL_SECTIONS.values()):
            assert c.reason in out, f"the reason {cap} is missing is not printed"


def test_doctor_json_is_machine_readable(capsys):
    assert doctor.main(["--json", "--quick"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["course_can_run"] is True
    names = {c["name"] for c in data["checks"]}
    assert {"python", "core packages", "jupyter kernel", "build folder"} <= names
    listed = [s["section"] for v in data["sections"].values() for s in v]
    assert sorted(listed) == sorted(sections.OPTIONAL_SECTIONS)


def test_doctor_fails_only_when_the_course_cannot_run(monkeypatch, capsys):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda d: None if d == "tensorflow" else real(d))
    assert doctor.main(["--quick"]) == 0  # a lesson package missing is a warning
    assert "the TensorFlow sections of 01, 02, 04 and 08 will skip" in capsys.readouterr().out
    monkeypatch.setattr(doctor, "_version", lambda d: None if d == "torch" else real(d))
    assert doctor.main(["--quick"]) == 1  # a core package missing is fatal
    out = capsys.readouterr().out
    assert "CANNOT run" in out and "fix: make env" in out and "requirements-byo.txt" in out


def test_doctor_reports_an_unwritable_build_folder(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("WORKBOOK_BUILD_DIR", str(blocker / "build"))
    check = doctor._build_dir()
    assert check.status == "fail" and "WORKBOOK_BUILD_DIR" in check.fix


def test_warmup_lists_its_steps(capsys):
    assert warmup.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in warmup.STEPS)
    with pytest.raises(SystemExit):
        warmup.main(["no-such-step"])


def test_warmup_skips_absent_modules_and_hooks_with_a_reason():
    with pytest.raises(warmup.Skip, match="does not exist yet"):
        warmup._hook("utils.no_such_module_xyz", "99")()
    with pytest.raises(warmup.Skip, match="no warmup\\(\\) hook"):
        warmup._hook("utils.core.env", "00")()  # a module without a warmup() hook
    with pytest.raises(KeyError, match="unknown warm-up step"):
        warmup.run_step("nope")


def test_warmup_steps_run_in_their_own_process_and_report(tmp_path, monkeypatch):
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    res = warmup._in_subprocess("matplotlib", timeout=120)
    assert res == {"status": "done", "detail": "font cache built", "seconds": res["seconds"]}
    assert (tmp_path / "mpl").is_dir()
