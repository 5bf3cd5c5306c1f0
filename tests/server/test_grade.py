"""utils.course.grade: a folder of submissions becomes the right CSV; submissions run sandboxed, one scratch folder each.

The graded lab here is a tiny one written by the test (solutions/99_tiny_lab.ipynb in a temporary repository root),
so a submission runs in seconds; the same code grades the real labs (`make grade`).
"""

import csv
import socket
import threading

import nbformat
import pytest

from utils.course import grade, sandbox

LAB = "99_tiny_lab"
SETUP = "from utils.checks import LabCheckFailed, call, expect, passed\nfrom utils.core import env\nSMOKE = env.smoke_default()"
DOUBLE = "def double(x):\n    # BEGIN SOLUTION: return twice x\n    return 2 * x\n    # END SOLUTION"
NEGATE = "def negate(x):\n    # BEGIN SOLUTION: return minus x\n    return -x\n    # END SOLUTION"
CHECK_DOUBLE = ('# CHECK\ngot = call(double, 21)\nexpect(got == 42, f"double(21) should be 42, got {got!r}")\n'
                'passed("double")')
CHECK_NEGATE = ('# CHECK\ngot = call(negate, 3)\nexpect(got == -3, f"negate(3) should be -3, got {got!r}")\n'
                'passed("negate")')


def _notebook(*sources):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.cells[0].metadata["tags"] = []
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _solution(**replace):
    cells = {"setup": SETUP, "double": DOUBLE, "check_double": CHECK_DOUBLE, "negate": NEGATE, "check_negate": CHECK_NEGATE}
    cells.update(replace)
    return _notebook(*[c for c in cells.values() if c is not None])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    (root / "solutions").mkdir()
    nbformat.write(_solution(), str(root / "solutions" / f"{LAB}.ipynb"))
    return root


def _read(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _write(folder, name, nb):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def test_reference_checks_come_from_the_solution(root):
    assert [name for name, _ in grade.reference_checks(LAB, root)] == ["check 1", "check 2"]
    with pytest.raises(FileNotFoundError):
        grade.reference_checks("98_missing_lab", root)


def test_finding_submissions_in_both_layouts(root, tmp_path):
    _write(tmp_path, f"alice_{LAB}.ipynb", _solution())
    _write(tmp_path, f"bob/{LAB}.ipynb", _solution())
    _write(tmp_path, "carol-homework.ipynb", _solution())
    _write(tmp_path, f".ipynb_checkpoints/alice_{LAB}-checkpoint.ipynb", _solution())
    subs = grade.find_submissions(tmp_path, root=root)
    assert [(s.learner, s.lab) for s in subs] == [("alice", LAB), ("bob", LAB), ("carol-homework", "")]
    forced = grade.find_submissions(tmp_path, lab=LAB, root=root)
    assert {s.learner for s in forced} == {"alice", "bob", "carol-homework"} and {s.lab for s in forced} == {LAB}
    with pytest.raises(ValueError, match="unknown lab"):
        grade.find_submissions(tmp_path, lab="nope", root=root)
    with pytest.raises(FileNotFoundError):
        grade.find_submissions(tmp_path / "missing", root=root)


def test_a_correct_an_incomplete_and_a_crashing_submission(root, tmp_path):
    subs = tmp_path / "subs"
    _write(subs, f"alice_{LAB}.ipynb", _solution())
    incomplete = _solution(negate='def negate(x):\n    raise NotImplementedError("TODO: return minus x")')
    _write(subs, f"bob_{LAB}.ipynb", incomplete)
    crashing = _solution(negate="import os\nos._exit(3)  # the kernel dies before the second check")
    _write(subs, f"carol/{LAB}.ipynb", crashing)
    tampered = _solution(check_double='# CHECK\nprint("PASSED double")', double="def double(x):\n    return x")
    _write(subs, f"dave_{LAB}.ipynb", tampered)
    broken_structure = _solution(check_negate=None)
    _write(subs, f"erin_{LAB}.ipynb", broken_structure)
    _write(subs, "frank.ipynb", _solution())
    box = sandbox.sandbox(tmp_path)
    out = grade.grade(subs, tmp_path / "grades.csv", timeout=120, root=root, allow_unsandboxed=not box.enforced)
    rows = _read(out)
    assert list(rows[0]) == list(grade.COLUMNS)
    got = {(r["learner"], r["check"]): r for r in rows}
    assert len(rows) == 11
    assert got[("alice", "check 1")]["status"] == got[("alice", "check 2")]["status"] == "passed"
    assert got[("bob", "check 1")]["status"] == "passed"
    assert got[("bob", "check 2")]["status"] == "failed" and "not written yet" in got[("bob", "check 2")]["detail"]
    assert got[("carol", "check 1")]["status"] == "passed"
    assert got[("carol", "check 2")]["status"] == "error" and "kernel" in got[("carol", "check 2")]["detail"].lower()
    assert got[("dave", "check 1")]["status"] == "failed" and "should be 42" in got[("dave", "check 1")]["detail"]
    assert {got[("erin", c)]["status"] for c in ("check 1", "check 2")} == {"error"}
    assert "CHECK' cells" in got[("erin", "check 1")]["detail"]
    assert got[("frank", "(submission)")]["status"] == "error" and "which lab" in got[("frank", "(submission)")]["detail"]
    assert not (tmp_path / ".grade-scratch").exists(), "scratch folders are removed after grading"
    board = _read(tmp_path / "leaderboard.csv")
    assert [(r["learner"], r["checks_passed"]) for r in board if r["lab"] == LAB][0] == ("alice", "2")


def _row(learner, lab, status, **figures):
    return {"learner": learner, "lab": lab, "check": "c", "status": status, "detail": "", "seconds": 1.0,
            "figures": dict(figures)}


def test_leaderboard_ranks_by_checks_then_by_the_first_figure_in_its_direction(tmp_path):
    rows = [
        _row("ann", "03_lab", "passed", speedup=(1.4, "x", "higher")), _row("ann", "03_lab", "passed"),
        _row("ben", "03_lab", "passed", speedup=(2.1, "x", "higher")), _row("ben", "03_lab", "passed"),
        _row("cid", "03_lab", "passed", speedup=(9.9, "x", "higher")), _row("cid", "03_lab", "failed"),
        _row("dee", "05_lab", "passed", p95=(30.0, "ms", "lower")), _row("eve", "05_lab", "passed", p95=(12.0, "ms", "lower")),
        _row("fay", "05_lab", "error"),
    ]
    csv_path, html_path = grade.leaderboard(rows, tmp_path)
    board = _read(csv_path)
    order = [(r["lab"], r["rank"], r["learner"]) for r in board]
    # cid's figure is the highest, but one of cid's checks failed: checks passed come first
    assert order == [("03_lab", "1", "ben"), ("03_lab", "2", "ann"), ("03_lab", "3", "cid"),
                     ("05_lab", "1", "eve"), ("05_lab", "2", "dee"), ("05_lab", "3", "fay")]
    assert board[0]["speedup"] == "2.1" and board[3]["p95"] == "12" and board[5]["p95"] == ""
    page = html_path.read_text()
    assert "<caption>03_lab</caption>" in page and "speedup (x, higher is better)" in page and "2/2" in page


def test_figure_lines_are_what_the_grader_parses(capsys):
    from utils.checks import figure

    figure("fraction_of_copy_roof", 0.8125, "x")
    figure("p95", 12.5, "ms", better="lower")
    text = capsys.readouterr().out
    assert [m.groups() for m in grade._FIGURE.finditer(text)] == [
        ("fraction_of_copy_roof", "0.8125", "x", "higher"), ("p95", "12.5", "ms", "lower")]
    with pytest.raises(ValueError, match="finite"):
        figure("x", float("nan"), "x")
    with pytest.raises(ValueError, match="one word"):
        figure("two words", 1.0, "x")


def test_a_submission_that_runs_too_long_times_out(root, tmp_path):
    subs = tmp_path / "subs"
    _write(subs, f"slow_{LAB}.ipynb", _solution(negate="import time\ntime.sleep(600)"))
    box = sandbox.sandbox(tmp_path)
    rows = _read(grade.grade(subs, tmp_path / "g.csv", timeout=20, root=root, allow_unsandboxed=not box.enforced))
    status = {r["check"]: r["status"] for r in rows}
    assert status == {"check 1": "passed", "check 2": "timeout"}


def test_submissions_cannot_reach_the_network_or_write_outside_scratch(root, tmp_path):
    box = sandbox.sandbox(tmp_path)
    if not box.enforced:
        pytest.skip(f"no sandbox on this machine: {box.description}")
    outside = tmp_path / "escaped.txt"
    hits = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(30)
    port = server.getsockname()[1]

    def accept():
        try:
            conn, _ = server.accept()
            hits.append(1)
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    attack = (
        "import os, socket\n"
        f"for target in ({str(outside)!r}, os.path.expanduser('~/../../escaped-home.txt')):\n"
        "    try:\n        open(target, 'w').write('x')\n    except OSError as e:\n        print('write blocked:', e)\n"
        f"for host, port in (('127.0.0.1', {port}), ('1.1.1.1', 53)):\n"
        "    try:\n        socket.create_connection((host, port), timeout=3).close(); print('CONNECTED', host)\n"
        "    except OSError as e:\n        print('network blocked:', host, e)\n"
    )
    subs = tmp_path / "subs"
    _write(subs, f"mallory_{LAB}.ipynb", _solution(negate=NEGATE + "\n" + attack))
    rows = _read(grade.grade(subs, tmp_path / "g.csv", timeout=120, root=root, keep_scratch=True))
    server.close()
    thread.join(5)
    assert {r["status"] for r in rows} == {"passed"}, rows
    assert not outside.exists(), "a submission wrote outside its scratch folder"
    assert not (tmp_path / ".grade-scratch" / "escaped-home.txt").exists()
    assert not hits, "a submission reached a port on the host's loopback"
    log = next((tmp_path / ".grade-scratch").glob("mallory*")) / "executed.ipynb"
    text = "".join(o.get("text", "") for c in nbformat.read(str(log), as_version=4).cells for o in c.get("outputs", []))
    assert "write blocked" in text and "network blocked: 127.0.0.1" in text and "CONNECTED" not in text


def test_refuses_to_run_without_a_sandbox(root, tmp_path, monkeypatch):
    _write(tmp_path / "subs", f"alice_{LAB}.ipynb", _solution())
    monkeypatch.setattr(sandbox, "_sandbox_cache", sandbox.Sandbox((), "NO SANDBOX: test", False))
    with pytest.raises(RuntimeError, match="refusing"):
        grade.grade(tmp_path / "subs", tmp_path / "g.csv", root=root)
    assert grade.main([str(tmp_path / "subs"), "--out", str(tmp_path / "g.csv")]) == 2


def test_the_sandbox_gives_a_private_tmp_when_scratch_lives_under_tmp():
    """Scratch under /tmp (pytest's own tmp_path usually is): the command still gets a private, writable /tmp (the
    Triton Python backend aborts without one), its scratch folder, and nothing else of the host's /tmp."""
    import os
    import subprocess
    import sys
    import tempfile
    import uuid
    from pathlib import Path

    from utils.core import env

    box = sandbox.sandbox()
    if not box.enforced:
        pytest.skip(f"no sandbox on this machine: {box.description}")
    parent = Path(tempfile.mkdtemp(prefix="grade-tmp-test-", dir="/tmp"))
    scratch = parent / "scratch"
    scratch.mkdir()
    private = f"/tmp/sandbox-private-{uuid.uuid4().hex}.txt"
    script = (
        "import os, tempfile\n"
        f"open({private!r}, 'w').write('x')\n"
        "print('PRIVATE_TMP', os.path.exists(" + repr(private) + "), tempfile.mkdtemp(dir='/tmp'))\n"
        "open('inside.txt', 'w').write('ok')\n"
        f"try:\n    open({str(parent / 'outside.txt')!r}, 'w').write('x'); print('ESCAPED')\n"
        "except OSError as e:\n    print('BLOCKED', e.strerror)\n"
    )
    try:
        proc = subprocess.run([*box.prefix, *sandbox.stage(scratch, [sys.executable, "-c", script])],
                              capture_output=True, text=True, timeout=120, cwd=env.repo_root(), env=env.child_environ())
        assert proc.returncode == 0, proc.stderr
        assert "PRIVATE_TMP True /tmp/" in proc.stdout and "BLOCKED" in proc.stdout, proc.stdout + proc.stderr
        assert (scratch / "inside.txt").read_text() == "ok", "the scratch folder is the host's"
        assert not os.path.exists(private), "the sandbox's /tmp is its own, not the host's"
        assert not (parent / "outside.txt").exists()
    finally:
        import shutil

        shutil.rmtree(parent, ignore_errors=True)


def test_grading_lab05_from_a_folder_under_tmp():
    """The real lab 05, graded from /tmp in smoke mode (slow: each submission starts a Triton server): the solution
    passes every check; a tuning no better than the baseline fails the speed check with its measurement."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from utils.core import env

    box = sandbox.sandbox()
    if not box.enforced:
        pytest.skip(f"no sandbox on this machine: {box.description}")
    if not env.has("tritonserver"):
        pytest.skip(env.capabilities()["tritonserver"].reason)
    lab = "05_triton_ensemble_lab"
    solution = env.repo_root() / "solutions" / f"{lab}.ipynb"
    folder = Path(tempfile.mkdtemp(prefix="grade-lab05-", dir="/tmp"))
    try:
        shutil.copy(solution, folder / f"alice_{lab}.ipynb")
        nb = json.loads(solution.read_text())
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if src.startswith("def my_tuning"):  # the baseline's own settings: nothing to gain
                cell["source"] = "def my_tuning() -> dict:\n    return dict(max_batch_size=16, batching=False, threads=0)\n"
        (folder / f"bob_{lab}.ipynb").write_text(json.dumps(nb))
        rows = _read(grade.grade(folder, folder / "grades.csv", timeout=600))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    got = {(r["learner"], r["check"]): r for r in rows}
    # alice's speed target is a measurement (timing thresholds are benchmarks, not tests): passed, or failed with the
    # rounds' numbers when other programs load the machine; every other check of hers passes
    assert {r["status"] for r in rows if r["learner"] == "alice" and r["check"] != "check_tuned"} == {"passed"}, rows
    alice = got[("alice", "check_tuned")]
    assert alice["status"] == "passed" or "interleaved rounds" in alice["detail"], alice
    bob = got[("bob", "check_tuned")]
    # "undecided" when other programs disturbed the rounds; either way a measurement, not a pass
    assert bob["status"] == "failed" and bob["detail"].startswith(("not yet", "undecided")), bob
    assert "interleaved rounds" in bob["detail"]
    assert {r["status"] for r in rows if r["learner"] == "bob" and r["check"] != "check_tuned"} == {"passed"}
