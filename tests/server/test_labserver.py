"""`make lab` (utils.course.labserver): JupyterLab starts wherever the course runs, as root too, serves a lesson that renders
in the headless browser the site test uses, and stops when asked."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

from tests.server.browser import CHROMIUM, CHROMIUM_FLAGS
from utils.core import env
from utils.course import labserver


def test_allow_root_is_added_only_as_root(monkeypatch):
    monkeypatch.setattr(labserver.os, "geteuid", lambda: 0)
    as_root = labserver.command(port=8890, token="t", browser=False)
    assert "--allow-root" in as_root
    assert "--ServerApp.ip=127.0.0.1" in as_root and "--no-browser" in as_root
    monkeypatch.setattr(labserver.os, "geteuid", lambda: 1000)
    assert "--allow-root" not in labserver.command()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not CHROMIUM, reason="no chromium: sudo apt-get install -y --no-install-recommends chromium")
def test_make_lab_serves_lesson_00_and_it_renders(tmp_path):
    port = _free_port()
    log = tmp_path / "lab.log"
    child = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "IPYTHONDIR": str(tmp_path / "ipython")}
    with open(log, "w") as out:
        # `make lab` in the course environment; in your own (WORKBOOK_OWN_ENV=1) the command it runs, there
        own = [sys.executable, "-m", "utils.course.labserver", "--no-browser", "--port", str(port)]
        make = ["make", "--no-print-directory", "lab", f"LAB_ARGS=--no-browser --port {port}"]
        proc = subprocess.Popen(own if os.environ.get("WORKBOOK_OWN_ENV") == "1" else make,
                                cwd=env.repo_root(), env=child, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            assert proc.poll() is None, f"make lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            m = re.search(rf"(http://127\.0\.0\.1:{port}/lab/tree/\S+\?token=\w+)", log.read_text())
            url = m.group(1) if m else None
            time.sleep(0.5)
        assert url, f"no URL with a token within 120 s:\n{log.read_text()[-3000:]}"
        assert labserver.FIRST_LESSON in url
        token = url.rsplit("token=", 1)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=30) as resp:
            assert resp.status == 200
        flags = [f for f in CHROMIUM_FLAGS if not f.startswith("--virtual-time-budget")]
        dom = subprocess.run([CHROMIUM, *flags, "--virtual-time-budget=30000",
                              f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180).stdout
        title = nbformat.read(str(env.repo_root() / labserver.FIRST_LESSON), as_version=4).cells[0].source
        title = title.splitlines()[0].lstrip("# ").strip()  # "Lesson 00 — Your machine, measured"
        assert "jp-Notebook-cell" in dom, f"no notebook cells rendered; page starts: {dom[:500]}"
        assert title in dom, f"lesson 00's title {title!r} is not on the rendered page"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode is not None
    with socket.socket() as s:  # the port is free again: the server is gone
        assert s.connect_ex(("127.0.0.1", port)) != 0, "JupyterLab still answers after being stopped"
