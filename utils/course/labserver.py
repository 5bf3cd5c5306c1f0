"""`make lab`: JupyterLab on the course, started the way every learner's machine needs it (README, instructor kit).

    python -m utils.course.labserver [--port N] [--no-browser]

Serves the checkout (notebooks/, labs/, solutions/) on 127.0.0.1 only and opens lesson 00. Adds ``--allow-root``
only when the process runs as root: containers and cloud GPU machines often run the learner as root, and JupyterLab
refuses to start as root without it ("Running as root is not recommended"). Notebooks find ``utils`` from the plain
clone (their first cell), so the server needs no editable install either.
"""

from __future__ import annotations

import os
import sys

from utils.core import env

__all__ = ["FIRST_LESSON", "command", "main"]

FIRST_LESSON = "notebooks/00_environment.ipynb"


def command(port: int | None = None, token: str | None = None, browser: bool = True) -> list[str]:
    """The `jupyter lab` command line `make lab` runs (tested by starting it and opening a lesson in Chromium)."""
    argv = [sys.executable, "-m", "jupyter", "lab", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.root_dir={env.repo_root()}", f"--LabApp.default_url=/lab/tree/{FIRST_LESSON}"]
    if port is not None:
        argv += [f"--ServerApp.port={port}", "--ServerApp.port_retries=0"]
    if token is not None:
        argv.append(f"--IdentityProvider.token={token}")
    if not browser:
        argv.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # only as root: JupyterLab refuses root without it
    return argv


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m utils.course.labserver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=None, help="port (default: JupyterLab's, 8888 or the next free)")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser (remote machines)")
    args = parser.parse_args(argv)
    cmd = command(port=args.port, browser=not args.no_browser)
    print("starting:", " ".join(cmd[1:]), flush=True)
    os.execv(cmd[0], cmd)  # replace this process: Ctrl-C reaches JupyterLab directly
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
