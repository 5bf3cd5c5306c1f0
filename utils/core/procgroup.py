"""A server started in its own process group, and everything it started (lesson 05's Triton and TorchServe).

``spawn(command, log_path, env=...)`` starts it as the leader of a new process group, its output in a log file, set to
get SIGTERM when the process that started it dies (PR_SET_PDEATHSIG): no orphan is left when a kernel is killed.
``tree(proc)`` lists the process and its descendants; ``end(proc, timeout)`` waits for it to exit, kills the whole
group if it does not, and then kills whatever of the group outlived it (stubs and workers share the group).
``log_tail(path)`` is the end of its log, for error messages.

POSIX only in full (the process_groups capability): on Windows the server gets a new process group
(CREATE_NEW_PROCESS_GROUP) but no parent-death signal, and end() kills the process tree through psutil.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["spawn", "tree", "end", "log_tail"]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(command: list[str], log_path: os.PathLike, *, env: dict, cwd: os.PathLike | None = None) -> subprocess.Popen:
    """Start `command` as the leader of a new process group, stdout and stderr to `log_path` (overwritten), dying with
    this process."""
    log = open(log_path, "w")  # noqa: SIM115 - the child owns it; closed after Popen
    try:
        if not hasattr(os, "killpg"):  # Windows: no preexec_fn, no sessions
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                    creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0))
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=_die_with_parent)
    finally:
        log.close()


def log_tail(path: os.PathLike, lines: int = 40) -> str:
    """The last `lines` lines of a log file, or "(no log)"."""
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def tree(proc: subprocess.Popen | None) -> list:
    """psutil.Process objects of `proc` and every process it started; [] when it is None or gone."""
    import psutil

    if proc is None:
        return []
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def end(proc: subprocess.Popen, timeout: float, *, sigterm: bool = False) -> None:
    """Wait up to `timeout` s for `proc` (a process-group leader) to exit, after SIGTERM to the group if `sigterm`;
    SIGKILL the group if it is still running, then SIGKILL anything left in the group. Without POSIX process groups
    (Windows) the same is done to the process tree through psutil."""
    if not hasattr(os, "killpg"):
        _end_tree(proc, timeout, sigterm=sigterm)
        return
    if sigterm:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError, PermissionError):  # members that outlived the leader, if any
        os.killpg(proc.pid, signal.SIGKILL)


def _end_tree(proc: subprocess.Popen, timeout: float, *, sigterm: bool) -> None:
    import psutil

    members = tree(proc)
    if sigterm:
        for p in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    for p in members:  # whatever outlived the leader, and the leader if it did not exit
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait(timeout=10)
