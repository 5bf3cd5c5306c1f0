"""TorchServe, PyTorch's own model server, for lesson 05's optional section 05.torchserve: the plumbing.

TorchServe is a Java frontend (Netty: the REST and gRPC endpoints, a queue per model, the batch aggregator) that
starts Python worker processes; each worker imports the handler packed in a model archive (.mar, built by
torch-model-archiver) and calls it with batches of requests. The lesson archives utils/serving/torchserve_handler.py
with the MiniLM pipeline's files and serves it next to the Triton ensemble.

    with torchserve.TorchServe(model_store, {"minilm": {"mar": "minilm.mar"}}) as server:
        status, body = torchserve.post(server.predictions_url("minilm"), "a sentence")

- every endpoint (inference, management, metrics, gRPC inference and management) is on 127.0.0.1 with a free port;
  token authorization is off (loopback only; on by default since TorchServe 0.11.1), the management API cannot
  register models (TorchServe's default), config snapshots are off (--ncs);
- ``start()`` runs the ``torchserve --start --foreground`` entry point in its own process group, with a parent-death
  signal, from a launcher that forwards SIGTERM to its group (TorchServe's own launcher does not, so java and its
  workers would outlive a killed kernel); it waits for /ping and for every model's workers to be READY;
- its temp folder is private (the launcher's pid file, the workers' Unix sockets, the unpacked archives) and removed
  by ``stop()``, which runs ``torchserve --stop`` and makes sure nothing of the process group is left; ``leftovers()``
  says what still runs or listens. Logs go to build/torchserve/<name>/.

TorchServe has been in limited maintenance upstream since 2025 (no planned updates, bug fixes or security patches);
the course serves with Triton and shows TorchServe for comparison.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from utils.core import env, procgroup, tritonserver
from utils.serving import loadgen

__all__ = ["ARCHIVER", "HANDLER", "TorchServeError", "TorchServe", "config_properties", "post", "http_load"]

# The torch-model-archiver command: what its console script runs, with this interpreter (so it works where the
# package is importable but its script is not on PATH).
ARCHIVER = (sys.executable, "-c", "import sys; from model_archiver.model_packaging import generate_model_archive; "
            "sys.argv[0] = 'torch-model-archiver'; sys.exit(generate_model_archive())")
HANDLER = Path(__file__).with_name("torchserve_handler.py")  # the lesson's handler, copied into the archive
PORTS = ("inference", "management", "metrics", "grpc_inference", "grpc_management")

# The `torchserve` command's entry point (ts.model_server.start), in a process that passes SIGTERM on to its whole
# process group once: TorchServe's launcher starts java and waits for it (--foreground) but forwards no signal.
_LAUNCHER = """\
import os, signal, sys
def _down(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(0, signal.SIGTERM)
if hasattr(os, "killpg"):  # POSIX; on Windows procgroup.end() ends the process tree instead
    signal.signal(signal.SIGTERM, _down)
from ts.model_server import start
sys.argv[0] = "torchserve"
start()
"""


class TorchServeError(RuntimeError):
    """TorchServe did not start, or a model did not load; the message ends with the tail of its log."""


def _registration(name: str, spec: Mapping) -> dict:
    unknown = set(spec) - {"mar", "batch_size", "max_batch_delay_ms", "workers"}
    if unknown or "mar" not in spec:
        raise ValueError(f"model {name!r}: expected keys mar (archive file name), batch_size, max_batch_delay_ms, "
                         f"workers; got {sorted(spec)}")
    batch, delay, workers = int(spec.get("batch_size", 1)), int(spec.get("max_batch_delay_ms", 0)), int(spec.get("workers", 1))
    if batch < 1 or delay < 0 or workers < 1:
        raise ValueError(f"model {name!r}: batch_size and workers must be >= 1 and max_batch_delay_ms >= 0, got "
                         f"{batch}, {workers}, {delay}")
    return {"marName": str(spec["mar"]), "minWorkers": workers, "maxWorkers": workers, "batchSize": batch,
            "maxBatchDelay": delay, "defaultVersion": True}


def config_properties(ports: Mapping[str, int], models: Mapping[str, Mapping], *, versions: Mapping[str, str] | None = None,
                      extra: Mapping[str, str] | None = None) -> str:
    """The config.properties text: loopback addresses on `ports`, and the models registered at start (lesson 05).

    `models`: {name: {"mar": file in the model store, "batch_size": 1, "max_batch_delay_ms": 0, "workers": 1}}.
    Two names may share one archive (the same handler registered with and without batching). `versions` gives the
    archive's --version per model (default "1.0").
    """
    if set(ports) != set(PORTS):
        raise ValueError(f"ports must name exactly {list(PORTS)}, got {sorted(ports)}")
    if not models:
        raise ValueError("register at least one model")
    for name in models:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ValueError(f"model name {name!r}: letters, digits, '_', '-' and '.' only")
    versions = dict(versions or {})
    registered = {name: {versions.get(name, "1.0"): _registration(name, spec)} for name, spec in models.items()}
    lines = [
        f"inference_address=http://127.0.0.1:{ports['inference']}",
        f"management_address=http://127.0.0.1:{ports['management']}",
        f"metrics_address=http://127.0.0.1:{ports['metrics']}",
        "grpc_inference_address=127.0.0.1",
        f"grpc_inference_port={ports['grpc_inference']}",
        "grpc_management_address=127.0.0.1",
        f"grpc_management_port={ports['grpc_management']}",
        "install_py_dep_per_model=false",  # never pip install at model load: offline, and what you archived is what runs
        "disable_system_metrics=true",  # no system-metrics subprocess every minute
        "load_models=" + ",".join(f"{name}={spec['mar']}" for name, spec in models.items()),
        "models=" + json.dumps(registered),
    ]
    lines += [f"{k}={v}" for k, v in (extra or {}).items()]
    return "\n".join(lines) + "\n"


class TorchServe:
    """A TorchServe process on 127.0.0.1 (lesson 05). Use as a context manager, or call start()/stop()."""

    def __init__(self, model_store: str | os.PathLike, models: Mapping[str, Mapping], *, name: str = "torchserve",
                 startup_timeout: float = 240.0, versions: Mapping[str, str] | None = None):
        if not env.has("torchserve"):
            raise TorchServeError(f"TorchServe cannot run here: {env.capabilities()['torchserve'].reason}")
        self.model_store = Path(model_store).resolve()
        if not self.model_store.is_dir():
            raise FileNotFoundError(f"model store {self.model_store} is not a folder")
        missing = [spec["mar"] for spec in models.values() if not (self.model_store / str(spec.get("mar", ""))).exists()]
        if missing:
            raise FileNotFoundError(f"not in the model store {self.model_store}: {missing} (run torch-model-archiver first)")
        self.models = {n: dict(s) for n, s in models.items()}
        self.versions = dict(versions or {})
        config_properties(dict.fromkeys(PORTS, 1), self.models, versions=self.versions)  # validate now, not at start
        self.startup_timeout = startup_timeout
        self.workdir = env.build_dir() / "torchserve" / name
        self.tmp_dir = self.workdir / "tmp"
        self.log_path = self.workdir / "torchserve.log"
        self.config_path = self.workdir / "config.properties"
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen | None = None
        self.stop_seconds: float | None = None
        self._seen: dict[int, str] = {}  # pid -> name of every process of the server seen while it ran

    # -- addresses -------------------------------------------------------------------------------------------------
    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['inference']}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['management']}"

    def predictions_url(self, model: str) -> str:
        return f"{self.inference_url}/predictions/{model}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The torchserve command line this server runs (its first word is the `torchserve` entry point)."""
        return ["torchserve", "--start", "--foreground", "--ts-config", str(self.config_path),
                "--model-store", str(self.model_store), "--ncs", "--disable-token-auth"]

    def environ(self) -> dict[str, str]:
        """The process environment: private temp folder, logs in the work folder, offline Hugging Face, quiet tokenizers."""
        out = dict(os.environ)
        out.update(TMPDIR=str(self.tmp_dir), TEMP=str(self.tmp_dir), LOG_LOCATION=str(self.workdir / "logs"),
                   METRICS_LOCATION=str(self.workdir / "logs"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false")
        return out

    def log_tail(self, lines: int = 40) -> str:
        return procgroup.log_tail(self.log_path, lines)

    def log_lines(self, pattern: str) -> list[str]:
        """Lines of the server log that match a regular expression."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if re.search(pattern, ln)]

    def _load_failure(self) -> str:
        """The worker's own report of a failed model load (its message and traceback), or "" when there is none."""
        lines = self.log_lines(r"MODEL_LOG - ")
        start = next((i for i, ln in enumerate(lines) if "MODEL_LOG - Failed to load model" in ln), None)
        if start is None:
            return ""
        end = next((i for i in range(start, len(lines)) if "Backend worker process died" in lines[i]), len(lines))
        return "\n".join(ln.split("MODEL_LOG - ", 1)[1] for ln in lines[start:end + 1][:40])

    def _get_json(self, url: str):
        with urllib.request.urlopen(loadgen.check_loopback(url), timeout=2) as resp:
            return json.loads(resp.read().decode())

    def is_healthy(self) -> bool:
        try:
            return self._get_json(f"{self.inference_url}/ping").get("status") == "Healthy"
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def model_status(self, model: str) -> dict:
        """The management API's description of a model (GET /models/<name>): batch size, delay, workers and their status."""
        return self._get_json(f"{self.management_url}/models/{model}")[0]

    def _models_ready(self) -> bool:
        try:
            workers = [self.model_status(m)["workers"] for m in self.models]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
            return False
        return all(ws and all(w.get("status") == "READY" for w in ws) for ws in workers)

    def start(self) -> TorchServe:
        if self.process is not None:
            raise TorchServeError("this server is already started")
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir(parents=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.ports = {p: tritonserver.free_port() for p in PORTS}
        self.config_path.write_text(config_properties(self.ports, self.models, versions=self.versions))
        self.process = procgroup.spawn([sys.executable, "-c", _LAUNCHER, *self.command()[1:]], self.log_path,
                                       env=self.environ(), cwd=self.workdir)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()  # whatever it started, and its temp folder
                raise TorchServeError(f"torchserve exited with code {code} while starting; log tail:\n{self.log_tail()}")
            failed = self._load_failure()
            if failed:
                self.stop()  # a worker that fails to load is restarted forever: give up at the first failure
                raise TorchServeError(f"a model failed to load in its worker; from the server log:\n{failed}")
            if self.is_healthy() and self._models_ready():
                self._remember()
                return self
            time.sleep(0.25)
        self.stop()
        raise TorchServeError(f"TorchServe or a model not ready after {self.startup_timeout:.0f} s; log tail:\n"
                              f"{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> None:
        """`torchserve --stop`, wait, then SIGKILL whatever of the process group is left; remove the temp folder.

        Safe to call twice. stop_seconds says how long it took.
        """
        if self.process is None:
            return
        self._remember()
        proc, self.process = self.process, None
        atexit.unregister(self.stop)
        t0 = time.perf_counter()
        if proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # the group kill below is the fallback
                subprocess.run([sys.executable, "-m", "ts.model_server", "--stop"], env=self.environ(), cwd=self.workdir,
                               capture_output=True, timeout=timeout)
        procgroup.end(proc, timeout)  # kills the group if java did not stop, and any worker that outlived it
        self.stop_seconds = time.perf_counter() - t0
        shutil.rmtree(self.tmp_dir, ignore_errors=True)

    # -- inspection --------------------------------------------------------------------------------------------------
    def processes(self) -> list:
        """psutil.Process objects: the launcher, java (the frontend) and the Python workers."""
        return procgroup.tree(self.process)

    def _remember(self) -> None:
        import psutil

        for p in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                self._seen[p.pid] = p.name()

    def seen_processes(self) -> dict[int, str]:
        """{pid: name} of every process of this server seen at start and at stop."""
        return dict(self._seen)

    def listening_addresses(self) -> list[tuple[str, int]]:
        """(ip, port) of every socket a process of the server listens on."""
        import psutil

        out = set()
        for p in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                out |= {(c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        return sorted(out)

    def leftovers(self) -> dict[str, list]:
        """After stop(): {"processes": ["pid name", ...] still running, "ports": [port, ...] still accepting}."""
        import socket

        import psutil

        alive = []
        for pid, name in sorted(self._seen.items()):
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {name}")
        ports = []
        for port in self.ports.values():
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    ports.append(port)
        return {"processes": alive, "ports": ports}

    def __enter__(self) -> TorchServe:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}, REST {self.inference_url}" if self.process else "stopped"
        return f"TorchServe({', '.join(self.models)}: {state})"


# ---------------------------------------------------------------------------------------------------------------------
# clients (lesson 05)
# ---------------------------------------------------------------------------------------------------------------------


def post(url: str, body: str | bytes | dict, *, timeout: float = 60.0) -> tuple[int, bytes]:
    """POST to a server on 127.0.0.1 (lesson 05): text as text/plain, a dict as JSON. Returns (HTTP status, body)."""
    if isinstance(body, dict):
        data, ctype = json.dumps(body).encode(), "application/json"
    else:
        data, ctype = (body.encode() if isinstance(body, str) else bytes(body)), "text/plain; charset=utf-8"
    req = urllib.request.Request(loadgen.check_loopback(url), data=data, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _closed_loop(send: Callable[[int], bool], first: int, count: int, concurrency: int, seconds: float) -> dict:
    lock = threading.Lock()
    out = {"next": first, "latencies": [], "failed": 0, "wrong": 0, "errors": []}
    stop_at = time.perf_counter() + seconds

    def worker():
        while True:
            with lock:
                if out["next"] >= first + count or time.perf_counter() > stop_at:
                    return
                i = out["next"]
                out["next"] += 1
            t0 = time.perf_counter()
            try:
                good, err = bool(send(i)), None
            except Exception as exc:  # counted as a failed request and kept for diagnosis; the run goes on
                good, err = False, f"{type(exc).__name__}: {exc}"
            ms = (time.perf_counter() - t0) * 1e3
            with lock:
                out["latencies"].append(ms)
                if err is not None:
                    out["failed"] += 1
                    out["errors"] = (out["errors"] + [err])[:5]
                elif not good:
                    out["wrong"] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["seconds"] = time.perf_counter() - t0
    return out


def http_load(send: Callable[[int], bool], *, concurrency: int, max_requests: int, max_seconds: float,
              warmup: int = 0, label: str = "") -> loadgen.LoadResult:
    """A closed loop of `concurrency` threads, each calling send(i) for the next request number i (lesson 05).

    send(i) sends one request and returns whether its answer is right; an exception counts as a failed request.
    `warmup` requests go first, unmeasured; then the measured run stops after `max_requests` answers or
    `max_seconds`, whichever comes first. One client for any HTTP server, so two servers are measured the same way.
    """
    if concurrency < 1 or max_requests < 1 or max_seconds <= 0 or warmup < 0:
        raise ValueError(f"need concurrency >= 1, max_requests >= 1, max_seconds > 0, warmup >= 0; got {concurrency}, "
                         f"{max_requests}, {max_seconds}, {warmup}")
    if warmup:
        _closed_loop(send, 0, warmup, concurrency, max_seconds)
    run = _closed_loop(send, warmup, max_requests, concurrency, max_seconds)
    return loadgen.LoadResult(label=label, concurrency=concurrency, requests=len(run["latencies"]),
                              failed=run["failed"], wrong=run["wrong"], seconds=run["seconds"],
                              latencies_ms=run["latencies"], errors=run["errors"])
