"""The grading sandbox (instructor kit; docs/INSTRUCTOR.md "Grading"): run a command with no network, every mount
but its scratch folder read-only, and no capabilities.

Isolation (Linux). Every submission runs inside fresh user, network, mount and PID namespaces (util-linux
``unshare``): the network namespace has only a loopback interface (the notebook kernel talks to its client over
it), so nothing outside the sandbox can be reached; every mount except the scratch folder is remounted read-only,
with private empty tmpfs on /tmp and /dev/shm (also when the scratch folder lives under one of them: it is bound
back at its path inside the tmpfs); all capabilities are dropped and no_new_privs is set before the
notebook runs, so it cannot undo the read-only mounts; HOME, TMPDIR, WORKBOOK_BUILD_DIR, IPYTHONDIR, MPLCONFIGDIR
and JUPYTER_RUNTIME_DIR point into the scratch folder (seeded with a copy of the compiled lesson 06 extensions from
the build folder, so the lab does not rebuild them); when the timeout expires the whole PID namespace is killed.
``sandbox()`` probes this once and checks it (a write outside scratch must fail, only ``lo`` may exist). Where
user namespaces are disabled, root gets the same without the user namespace. Where neither works, grading refuses
to run unless ``--unsafe-no-sandbox`` is given, and then says so. Not enforced: CPU and memory limits (use the
timeout, or run under a cgroup), reading files the grader's user can read, and a submission deliberately
tampering with the check helpers in its own kernel: the sandbox protects the machine, not the grade.

``python -m utils.course.sandbox _enter SCRATCH -- COMMAND...`` and ``... _probe SCRATCH OUTSIDE PORT`` are the stages
run inside the namespaces; utils.course.grade calls sandbox() and stage().
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from utils.core import env

__all__ = ["Sandbox", "sandbox", "stage"]


@dataclasses.dataclass(frozen=True)
class Sandbox:
    """How submissions are isolated here: the command prefix and a plain description of what is enforced."""

    prefix: tuple[str, ...]
    description: str
    enforced: bool



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


_PRIVATE = ("/tmp", "/dev/shm")  # each gets an empty tmpfs of its own inside the sandbox


def _lock_down(scratch: Path) -> list[str]:
    """Inside fresh namespaces: loopback up, private tmpfs, everything but scratch read-only. Returns rw leftovers.

    /tmp and /dev/shm are private wherever scratch lives: programs write there whatever TMPDIR says (the Triton
    Python backend aborts without a writable /tmp). What the command needs from under them (the scratch folder, the
    course's checkout, the Python environment) is held open before the tmpfs hides it and bound back at the same
    path; the tmpfs's folders above such a path are read-only.
    """
    scratch_s = os.path.realpath(scratch)
    _loopback_up()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    needed = {os.path.realpath(p) for p in (env.repo_root(), sys.prefix, sys.base_prefix)}
    needed = sorted({scratch_s} | {p for p in needed if any(_under(p, t) and p != t for t in _PRIVATE)}, key=len)
    held = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in needed}  # reachable via /proc/self/fd once hidden
    try:
        private = [t for t in _PRIVATE if os.path.isdir(t)]
        for tmp in private:
            _mount("tmpfs", tmp, "tmpfs", _MS["nosuid"] | _MS["nodev"], "mode=1777,size=1g")
        inside = {p: t for p in held for t in private if _under(p, t) and p != t}
        for path in inside:
            os.makedirs(path, exist_ok=True)  # the mount point, in the tmpfs
        for path, tmp in inside.items():
            parent = os.path.dirname(path)
            while parent != tmp:
                os.chmod(parent, 0o555)
                parent = os.path.dirname(parent)
        for path, fd in held.items():  # shortest first: a folder is bound back before a folder inside it
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    finally:
        for fd in held.values():
            os.close(fd)
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


def stage(scratch: Path, command: list[str]) -> list[str]:
    """The command that locks a fresh namespace down around `scratch`, then runs `command` in it."""
    return [sys.executable, "-m", "utils.course.sandbox", "_enter", str(scratch), "--", *command]


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
    probe = [sys.executable, "-m", "utils.course.sandbox", "_probe", str(scratch), str(outside), str(port)]
    try:
        proc = subprocess.run([*prefix, *stage(scratch, probe)], capture_output=True, text=True, timeout=60,
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


def main(argv: list[str]) -> int:
    """The stages run inside the namespaces (not for people): _enter and _probe."""
    if argv and argv[0] == "_enter":
        sep = argv.index("--")
        return _enter(Path(argv[1]), argv[sep + 1:])
    if argv and argv[0] == "_probe":
        return _probe(Path(argv[1]), Path(argv[2]), int(argv[3]))
    print("usage: python -m utils.course.sandbox _enter SCRATCH -- COMMAND... | _probe SCRATCH OUTSIDE PORT",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
