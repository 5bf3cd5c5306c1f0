"""A server started in its own process group, and everything it started (lesson 05's Triton and TorchServe).

``tree(proc)`` lists the process and its descendants; ``end(proc, timeout)`` waits for it to exit, kills the whole
group if it does not, and then kills whatever of the group outlived it (stubs and workers share the group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

__all__ = ["tree", "end"]


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
    SIGKILL the group if it is still running, then SIGKILL anything left in the group."""
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
