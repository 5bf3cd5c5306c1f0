"""Grade a folder of submitted lab notebooks (instructor kit; docs/INSTRUCTOR.md "Grading").

    python -m utils.course.grade SUBMISSIONS [--out grades.csv] [--timeout 300] [--full] [--lab 00_environment_lab]
    make grade SUBMISSIONS=path/to/folder

A submission is a lab notebook named after its lab: ``SUBMISSIONS/<learner>/00_environment_lab.ipynb`` or
``SUBMISSIONS/<learner>_00_environment_lab.ipynb`` (with ``--lab``, any ``SUBMISSIONS/<learner>.ipynb``). Each one is
copied into its own scratch folder, its ``# CHECK`` cells are replaced by the reference ones from solutions/ (so an
edited check cannot pass itself), and it is executed there with a per-submission timeout. The CSV has one row per
learner and check: ``learner, lab, check, status, detail, seconds`` with status ``passed``, ``failed`` (the check
raised LabCheckFailed), ``error`` (anything else: a crash, a missing function, a dead kernel), ``timeout`` or
``not_run``.

Isolation (Linux). Every submission runs inside fresh user, network, mount and PID namespaces (util-linux
``unshare``): the network namespace has only a loopback interface (the notebook kernel talks to its client over
it), so nothing outside the sandbox can be reached; every mount except the scratch folder is remounted read-only,
with private empty tmpfs on /tmp and /dev/shm; all capabilities are dropped and no_new_privs is set before the
notebook runs, so it cannot undo the read-only mounts; HOME, TMPDIR, WORKBOOK_BUILD_DIR, IPYTHONDIR, MPLCONFIGDIR
and JUPYTER_RUNTIME_DIR point into the scratch folder (seeded with a copy of the compiled lesson 06 extensions from
the build folder, so the lab does not rebuild them); when the timeout expires the whole PID namespace is killed.
``sandbox()`` probes this once and checks it (a write outside scratch must fail, only ``lo`` may exist). Where
user namespaces are disabled, root gets the same without the user namespace. Where neither works, grading refuses
to run unless ``--unsafe-no-sandbox`` is given, and then says so. Not enforced: CPU and memory limits (use the
timeout, or run under a cgroup), reading files the grader's user can read, and a submission deliberately
tampering with the check helpers in its own kernel: the sandbox protects the machine, not the grade.
"""

from __future__ import annotations

import csv
import ctypes
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from utils.core import env

__all__ = [
    "COLUMNS",
    "STATUSES",
    "Submission",
    "Sandbox",
    "find_submissions",
    "reference_checks",
    "sandbox",
    "grade_one",
    "grade",
    "main",
]

COLUMNS = ("learner", "lab", "check", "status", "detail", "seconds")
STATUSES = ("passed", "failed", "error", "timeout", "not_run")
CHECK = "# CHECK"
_CHECK_CALL = re.compile(r"\b(lab\w*)\.(check_\w+)\s*\(")
_DETAIL_MAX = 300


@dataclasses.dataclass(frozen=True)
class Submission:
    """One learner's notebook for one lab."""

    learner: str
    lab: str  # stem of solutions/<lab>.ipynb, e.g. "00_environment_lab"
    path: Path


@dataclasses.dataclass(frozen=True)
class Sandbox:
    """How submissions are isolated here: the command prefix and a plain description of what is enforced."""

    prefix: tuple[str, ...]
    description: str
    enforced: bool


# ---------------------------------------------------------------------------------------------------------------------
# finding submissions and checks
# ---------------------------------------------------------------------------------------------------------------------


def known_labs(root: Path | None = None) -> list[str]:
    """The lab stems that can be graded (one per solutions/*.ipynb)."""
    root = root or env.repo_root()
    return sorted(p.stem for p in (root / "solutions").glob("*.ipynb"))


def _learner_from(name: str, lab: str) -> str:
    rest = name.replace(lab, " ")
    return re.sub(r"^[\s_.-]+|[\s_.-]+$", "", rest) or ""


def find_submissions(folder: Path, lab: str | None = None, root: Path | None = None) -> list[Submission]:
    """The submissions in `folder` (see the module docstring for the accepted layouts), sorted by learner and lab."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"submissions folder {folder} does not exist")
    labs = known_labs(root)
    if lab is not None and lab not in labs:
        raise ValueError(f"unknown lab {lab!r}; expected one of {labs}")
    found = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or any(part.startswith(".grade") for part in path.parts):
            continue
        rel = path.relative_to(folder)
        matches = [lab] if lab else [s for s in labs if s in path.stem]
        if len(rel.parts) > 1:  # <learner>/<anything>.ipynb
            learner = rel.parts[0]
        else:
            learner = _learner_from(path.stem, matches[0]) if matches else ""
            learner = learner or (path.stem if lab else "")
        if not matches:
            found.append(Submission(learner or path.stem, "", path))
            continue
        found.append(Submission(learner or path.stem, max(matches, key=len), path))
    if not found:
        raise FileNotFoundError(f"no .ipynb submissions under {folder}")
    return sorted(found, key=lambda s: (s.learner, s.lab, str(s.path)))


def _check_name(source: str, index: int) -> str:
    calls = [m.group(2) for m in _CHECK_CALL.finditer(source)]
    return "+".join(dict.fromkeys(calls)) or f"check {index + 1}"


def reference_checks(lab: str, root: Path | None = None) -> list[tuple[str, str]]:
    """(name, source) of every `# CHECK` cell of solutions/<lab>.ipynb, in order."""
    import nbformat

    root = root or env.repo_root()
    path = root / "solutions" / f"{lab}.ipynb"
    if not path.is_file():
        raise FileNotFoundError(f"no reference notebook {path}")
    nb = nbformat.read(str(path), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code" and c.source.lstrip().startswith(CHECK)]
    if not cells:
        raise ValueError(f"{path} has no '{CHECK}' cells to grade with")
    return [(_check_name(src, i), src) for i, src in enumerate(cells)]


def _prepare(sub: Submission, checks: list[tuple[str, str]], scratch: Path) -> tuple[Path, list[int], str]:
    """Copy the submission into scratch with the reference check cells. Returns (path, check cell indices, problem)."""
    import nbformat

    try:
        nb = nbformat.read(str(sub.path), as_version=4)
    except Exception as exc:  # an unreadable file is the learner's problem, reported per check
        return scratch / "submission.ipynb", [], f"the notebook cannot be read ({type(exc).__name__}: {exc})"
    positions = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.lstrip().startswith(CHECK)]
    if len(positions) != len(checks):
        return (scratch / "submission.ipynb", [],
                f"the notebook has {len(positions)} '# CHECK' cells, the lab has {len(checks)}: "
                "restore the check cells from labs/ and resubmit")
    for i, (_, src) in zip(positions, checks, strict=True):
        nb.cells[i].source = src
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    path = scratch / "submission.ipynb"
    nbformat.write(nb, str(path))
    return path, positions, ""


# ---------------------------------------------------------------------------------------------------------------------
# the sandbox
# ---------------------------------------------------------------------------------------------------------------------

_MS = {"ro": 1, "nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21,
       "strictatime": 1 << 24}
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if _libc().mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mounts() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) from /proc/self/mountinfo, topmost last."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        out.append((point, set(fields[5].split(","))))
    return out


def _loopback_up() -> None:
    import fcntl
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _lock_down(scratch: Path) -> list[str]:
    """Inside fresh namespaces: loopback up, private tmpfs, everything but scratch read-only. Returns rw leftovers."""
    scratch_s = os.path.realpath(scratch)
    _loopback_up()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    private = []
    for tmp in ("/tmp", "/dev/shm"):
        if os.path.isdir(tmp) and not _under(scratch_s, tmp):
            _mount("tmpfs", tmp, "tmpfs", _MS["nosuid"] | _MS["nodev"], "mode=1777,size=1g")
            private.append(tmp)
    _mount(scratch_s, scratch_s, None, MS_BIND | MS_REC)
    keep = {scratch_s, *private}
    mounts = _mounts()
    tops = {point: opts for point, opts in mounts}  # the last entry per point is the visible one
    for point, opts in tops.items():
        if point in keep or "ro" in opts:
            continue
        flags = MS_REMOUNT | MS_BIND | _MS["ro"] | sum(_MS[o] for o in opts if o in _MS and o != "ro")
        try:
            _mount(None, point, None, flags)
        except OSError:
            pass  # checked below
    return [p for p, o in {p: o for p, o in _mounts()}.items() if p not in keep and "ro" not in o]


def _drop_privileges() -> None:
    """Empty the capability bounding set and set no_new_privs: after exec the process has no capabilities."""
    libc = _libc()
    pr_capbset_drop, pr_set_no_new_privs = 24, 38
    for cap in range(64):
        libc.prctl(pr_capbset_drop, cap, 0, 0, 0)  # EINVAL past the last capability: ignored
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _capabilities() -> dict[str, int]:
    caps = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Cap"):
            key, value = line.split(":")
            caps[key] = int(value.strip(), 16)
    return caps


def _enter(scratch: Path, command: list[str]) -> int:
    """Stage 1, run by `unshare`: lock the namespace down, verify, drop privileges, exec `command`."""
    leftovers = _lock_down(scratch)
    if leftovers:
        print(f"sandbox: could not make {leftovers} read-only; refusing to run the submission", file=sys.stderr)
        return 97
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"]:
        print(f"sandbox: network interfaces {interfaces} are visible (expected only lo); refusing", file=sys.stderr)
        return 97
    _drop_privileges()
    os.chdir(scratch)
    os.execvp(command[0], command)
    return 99  # not reached


def _probe(scratch: Path, outside: Path, port: int) -> int:
    """What a submission could do in the sandbox: write outside scratch, reach a host port, keep capabilities."""
    report: dict[str, object] = {}
    try:
        outside.write_text("escaped")
        report["write_outside"] = True
    except OSError as exc:
        report["write_outside"] = False
        report["write_outside_error"] = exc.strerror
    try:
        (scratch / "inside.txt").write_text("ok")
        report["write_scratch"] = True
    except OSError:
        report["write_scratch"] = False
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            report["reached_host_port"] = True
    except OSError:
        report["reached_host_port"] = False
    try:
        with socket.create_connection(("1.1.1.1", 53), timeout=2):
            report["reached_internet"] = True
    except OSError:
        report["reached_internet"] = False
    report["interfaces"] = [name for _, name in socket.if_nameindex()]
    report["capabilities_effective"] = _capabilities().get("CapEff", -1)
    print("PROBE " + json.dumps(report))
    return 0


_UNSHARE_USER = ("unshare", "--user", "--map-root-user", "--net", "--mount", "--pid", "--fork", "--kill-child",
                 "--mount-proc")
_UNSHARE_ROOT = ("unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc")
_sandbox_cache: Sandbox | None = None


def _stage(scratch: Path, command: list[str]) -> list[str]:
    return [sys.executable, "-m", "utils.course.grade", "_enter", str(scratch), "--", *command]


def _try_prefix(prefix: tuple[str, ...], workdir: Path) -> tuple[bool, str]:
    scratch = workdir / "probe-scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    outside = workdir / "outside.txt"
    outside.unlink(missing_ok=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.1)
    port = listener.getsockname()[1]
    probe = [sys.executable, "-m", "utils.course.grade", "_probe", str(scratch), str(outside), str(port)]
    try:
        proc = subprocess.run([*prefix, *_stage(scratch, probe)], capture_output=True, text=True, timeout=60,
                              cwd=env.repo_root(), env=env.child_environ())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{prefix[0]} failed to start ({exc})"
    finally:
        try:
            listener.accept()[0].close()
            reached = True
        except OSError:
            reached = False
        listener.close()
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), "")
    if proc.returncode != 0 or not line:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"`{' '.join(prefix[:3])} ...` did not work here ({why})"
    report = json.loads(line[6:])
    problems = []
    if report["write_outside"] or outside.exists():
        problems.append("a write outside the scratch folder succeeded")
    if not report["write_scratch"]:
        problems.append("the scratch folder is not writable")
    if report["reached_host_port"] or reached or report["reached_internet"]:
        problems.append("the network was reachable")
    if report["capabilities_effective"] != 0:
        problems.append("capabilities were not dropped")
    if problems:
        return False, "; ".join(problems)
    return True, f"interfaces {report['interfaces']}, write outside scratch -> {report.get('write_outside_error')}"


def sandbox(workdir: Path | None = None, refresh: bool = False) -> Sandbox:
    """Find and verify the isolation this machine supports (probed once per process). See the module docstring."""
    global _sandbox_cache
    if _sandbox_cache is not None and not refresh:
        return _sandbox_cache
    reasons = []
    if not sys.platform.startswith("linux"):
        reasons.append(f"namespaces need Linux, this is {sys.platform}")
    elif shutil.which("unshare") is None:
        reasons.append("util-linux `unshare` is not installed")
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="grade-probe-", dir=workdir) as tmp:
            candidates = [("user namespace", _UNSHARE_USER)]
            if os.geteuid() == 0:
                candidates.append(("root, no user namespace", _UNSHARE_ROOT))
            for label, prefix in candidates:
                ok, detail = _try_prefix(prefix, Path(tmp))
                if ok:
                    _sandbox_cache = Sandbox(
                        prefix, f"{label}: own network namespace (loopback only), every mount but the scratch folder "
                        f"read-only, private /tmp and /dev/shm, no capabilities; verified ({detail})", True)
                    return _sandbox_cache
                reasons.append(f"{label}: {detail}")
    _sandbox_cache = Sandbox((), "NO SANDBOX: " + "; ".join(reasons), False)
    return _sandbox_cache


# ---------------------------------------------------------------------------------------------------------------------
# running and classifying
# ---------------------------------------------------------------------------------------------------------------------


def _scratch_env(scratch: Path, smoke: bool) -> dict[str, str]:
    out = dict(os.environ)
    for key in list(out):
        if key.startswith(("JUPYTER_", "JPY_", "PYDEVD")):
            out.pop(key)
    dirs = {"HOME": "home", "TMPDIR": "tmp", "WORKBOOK_BUILD_DIR": "build", "IPYTHONDIR": "ipython",
            "MPLCONFIGDIR": "mpl", "JUPYTER_RUNTIME_DIR": "runtime", "JUPYTER_DATA_DIR": "jupyter-data",
            "XDG_CACHE_HOME": "cache", "TORCH_EXTENSIONS_DIR": "torch_extensions", "TRITON_CACHE_DIR": "triton"}
    for key, sub in dirs.items():
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        out[key] = str(scratch / sub)
    out["WORKBOOK_SMOKE"] = "1" if smoke else "0"
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env.child_environ(out)


def _run(nb_in: Path, nb_out: Path, timeout: int) -> int:
    """Stage 2, inside the sandbox: execute the notebook cell by cell within `timeout` seconds in total (kernel
    start included), keep going after errors, and save the notebook after every cell so a kill keeps what ran."""
    import time

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    deadline = time.monotonic() + timeout
    nb = nbformat.read(str(nb_in), as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(nb_in.parent)}})
    status = {"error": ""}

    def save():
        nb.metadata["grade_status"] = status
        nbformat.write(nb, str(nb_out))

    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    status["error"] = f"Timeout: the submission used its {timeout} s"
                    break
                client.timeout = max(1, int(remaining))
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    status["error"] = f"Timeout: cell {index} was still running when the {timeout} s ran out"
                    break
                except DeadKernelError as exc:
                    status["error"] = f"DeadKernelError: {exc}"[:200]
                    break
                save()
    except Exception as exc:  # a kernel that fails to start or dies between cells: graded as what ran
        status["error"] = status["error"] or f"{type(exc).__name__}: {str(exc).strip()[:160]}"
    save()
    return 0


def _cell_seconds(cell) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    try:
        from datetime import datetime

        start = datetime.fromisoformat(timing["iopub.status.busy"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(timing["iopub.status.idle"].replace("Z", "+00:00"))
        return round((end - start).total_seconds(), 2)
    except (KeyError, ValueError, TypeError):
        return 0.0


def _short(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(text).split()))
    return text if len(text) <= _DETAIL_MAX else text[: _DETAIL_MAX - 3] + "..."


def _classify(nb, positions: list[int], checks, sub: Submission, end_state: str) -> list[dict]:
    rows = []
    for (name, _), index in zip(checks, positions, strict=True):
        cell = nb.cells[index]
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        row = {"learner": sub.learner, "lab": sub.lab, "check": name, "seconds": _cell_seconds(cell)}
        if errors:
            err = errors[0]
            if err.get("ename") == "LabCheckFailed":
                row.update(status="failed", detail=_short(err.get("evalue", "")))
            else:
                row.update(status="error", detail=_short(f"{err.get('ename')}: {err.get('evalue', '')}"))
        elif cell.get("execution_count") is None:
            if end_state.startswith("timeout"):
                row.update(status="timeout", detail=_short(end_state))
            elif end_state:
                row.update(status="error", detail=_short(f"the kernel stopped before this check ran ({end_state})"))
            else:
                row.update(status="not_run", detail="the check cell did not run")
        elif "PASSED" in text:
            row.update(status="passed", detail=_short(next(ln for ln in text.splitlines() if "PASSED" in ln)))
        else:
            row.update(status="error", detail=_short("the check ran but printed no PASSED line: " + text))
        rows.append(row)
    return rows


def grade_one(sub: Submission, scratch_root: Path, *, timeout: int = 300, smoke: bool = True,
              box: Sandbox | None = None, keep_scratch: bool = False, root: Path | None = None) -> list[dict]:
    """Grade one submission in its own scratch folder; returns its CSV rows (one per check)."""
    import nbformat

    if not sub.lab:
        return [{"learner": sub.learner, "lab": "", "check": "(submission)", "status": "error", "seconds": 0.0,
                 "detail": f"cannot tell which lab {sub.path.name} is: name it after one of {known_labs(root)}"}]
    checks = reference_checks(sub.lab, root)
    box = box if box is not None else sandbox()
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{sub.learner}__{sub.lab}")
    scratch = Path(scratch_root).resolve() / safe
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        nb_in, positions, problem = _prepare(sub, checks, scratch)
        if problem:
            return [{"learner": sub.learner, "lab": sub.lab, "check": name, "status": "error", "detail": _short(problem),
                     "seconds": 0.0} for name, _ in checks]
        cache = env.build_dir() / "kernels"  # lesson 06's compiled extensions (make warmup): reuse, don't rebuild
        if cache.is_dir():
            shutil.copytree(cache, scratch / "build" / "kernels", dirs_exist_ok=True)
        nb_out = scratch / "executed.ipynb"
        runner = [sys.executable, "-m", "utils.course.grade", "_run", str(nb_in), str(nb_out), "--timeout", str(timeout)]
        command = [*box.prefix, *_stage(scratch, runner)] if box.enforced else runner
        end_state = ""
        proc = subprocess.Popen(command, cwd=scratch, env=_scratch_env(scratch, smoke), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            log, _ = proc.communicate(timeout=timeout + 30)  # the runner stops itself at `timeout`
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            log, _ = proc.communicate()
            end_state = f"timeout: the submission ran longer than {timeout} s and was stopped"
        (scratch / "grader.log").write_text(log or "")
        if not nb_out.is_file():
            state = end_state or f"the sandboxed run produced no notebook (exit code {proc.returncode}): " + _short(
                (log or "").strip().splitlines()[-1] if (log or "").strip() else "no output")
            status = "timeout" if end_state else "error"
            return [{"learner": sub.learner, "lab": sub.lab, "check": name, "status": status, "detail": _short(state),
                     "seconds": 0.0} for name, _ in checks]
        nb = nbformat.read(str(nb_out), as_version=4)
        run_error = nb.metadata.get("grade_status", {}).get("error", "")
        if run_error.startswith("Timeout"):
            end_state = f"timeout: {run_error.split(': ', 1)[1]}"
        elif run_error:
            end_state = run_error
        return _classify(nb, positions, checks, sub, end_state)
    finally:
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def grade(folder: Path, out: Path | None = None, *, timeout: int = 300, smoke: bool = True, lab: str | None = None,
          allow_unsandboxed: bool = False, keep_scratch: bool = False, root: Path | None = None) -> Path:
    """Grade every submission in `folder` and write the CSV (default: <folder>/grades.csv). Returns its path."""
    from tqdm.auto import tqdm

    subs = find_submissions(folder, lab, root)
    out = Path(out) if out is not None else Path(folder) / "grades.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch_root = out.parent / ".grade-scratch"
    scratch_root.mkdir(exist_ok=True)
    box = sandbox(scratch_root)
    print(f"sandbox: {box.description}")
    if not box.enforced and not allow_unsandboxed:
        raise RuntimeError("refusing to execute submissions without a sandbox (see above). Pass --unsafe-no-sandbox "
                           "only for notebooks you trust: they would run with your network and files.")
    rows = []
    for sub in tqdm(subs, desc="grading", unit="submission"):
        rows += grade_one(sub, scratch_root, timeout=timeout, smoke=smoke, box=box, keep_scratch=keep_scratch, root=root)
    if not keep_scratch:
        shutil.rmtree(scratch_root, ignore_errors=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    learners = sorted({r["learner"] for r in rows})
    for learner in learners:
        mine = [r for r in rows if r["learner"] == learner]
        print(f"  {learner:20s} {sum(r['status'] == 'passed' for r in mine)}/{len(mine)} checks passed")
    return out


def main(argv=None) -> int:
    import argparse

    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "_enter":  # internal stages, run inside the sandbox
        sep = argv.index("--")
        return _enter(Path(argv[1]), argv[sep + 1:])
    if argv and argv[0] == "_probe":
        return _probe(Path(argv[1]), Path(argv[2]), int(argv[3]))
    if argv and argv[0] == "_run":
        return _run(Path(argv[1]), Path(argv[2]), int(argv[argv.index("--timeout") + 1]))
    parser = argparse.ArgumentParser(prog="python -m utils.course.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", type=Path, help="folder of submitted lab notebooks")
    parser.add_argument("--out", type=Path, default=None, help="CSV path (default <submissions>/grades.csv)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per submission (default 300)")
    parser.add_argument("--full", action="store_true", help="run the labs in full mode (default smoke)")
    parser.add_argument("--lab", default=None, help="grade every notebook as this lab (e.g. 00_environment_lab)")
    parser.add_argument("--keep-scratch", action="store_true", help="keep each submission's scratch folder")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="run without isolation where the sandbox is unavailable (trusted notebooks only)")
    parser.add_argument("--check-sandbox", action="store_true", help="only probe and describe the sandbox")
    args = parser.parse_args(argv)
    if args.check_sandbox:
        box = sandbox()
        print(box.description)
        return 0 if box.enforced else 1
    try:
        out = grade(args.submissions, args.out, timeout=args.timeout, smoke=not args.full, lab=args.lab,
                    allow_unsandboxed=args.unsafe_no_sandbox, keep_scratch=args.keep_scratch)
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
