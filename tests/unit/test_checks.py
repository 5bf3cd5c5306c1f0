"""The lab checks' shared helpers: a speed target fails a learner's check and is recorded under the test suite."""

import pytest

from utils import checks


def test_speed_target_is_enforced_by_default(monkeypatch, capsys):
    monkeypatch.delenv(checks.SPEED_TARGETS_VAR, raising=False)
    assert checks.speed_targets_enforced()
    checks.expect_speed(True, "unused")
    with pytest.raises(checks.LabCheckFailed, match="1.05x, the target is 1.2x"):
        checks.expect_speed(False, "1.05x, the target is 1.2x")
    assert capsys.readouterr().out == ""


def test_speed_target_is_recorded_under_the_test_suite(monkeypatch, capsys):
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")
    assert not checks.speed_targets_enforced()
    checks.expect_speed(False, "1.05x, the target is 1.2x")
    out = capsys.readouterr().out
    assert "SPEED TARGET NOT ENFORCED" in out and "1.05x, the target is 1.2x" in out


def test_a_correctness_check_is_enforced_under_the_test_suite_too(monkeypatch):
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "record")
    with pytest.raises(checks.LabCheckFailed, match="wrong answer"):
        checks.expect(False, "wrong answer")


def test_an_unknown_setting_is_named(monkeypatch):
    monkeypatch.setenv(checks.SPEED_TARGETS_VAR, "off")
    with pytest.raises(ValueError, match="must be 'enforce' or 'record', got 'off'"):
        checks.speed_targets_enforced()
