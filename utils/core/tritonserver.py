"""The real Triton Inference Server bundled in the nvidia-pytriton wheel, as a context manager (lessons 00 and 05).

    with triton.TritonServer(model_repository) as server:
        print(server.http_url, server.grpc_url)

The server binds to 127.0.0.1 on free ports with model control mode "none", is started in its own process group
(its Python-backend stubs are killed with it) and dies with the notebook kernel (PR_SET_PDEATHSIG), so no orphan is
left behind even when a cell fails or the kernel is interrupted. If it does not become ready in time, the error
carries the tail of the server log, where Triton says which model failed to load and why.

The wheel's tritonserver has only the Python backend. ``backend_dir()`` assembles the backend folder Triton expects
(libtriton_python.so, triton_python_backend_utils.py and the stub built for the running Python version).
It also ships one response-cache implementation, ``caches/local``; ``response_cache_status()`` says whether it is
there, and ``TritonServer(..., response_cache_bytes=N)`` points the server at it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from utils.core import env, procgroup

__all__ = [
    "TritonServerError",
    "TritonServer",
    "backend_dir",
    "response_cache_status",
    "free_port",
    "server_env",
    "is_loopback",
    "model_statistics",
    "batch_histogram",
    "scrape_metrics",
    "per_request_ms",
]


class TritonServerError(RuntimeError):
    """The server did not start, or stopped; the message ends with the tail of its log."""


def _pytriton_root() -> Path:
    binary = env.tritonserver_path()
    if binary is None or not env.has("tritonserver"):
        raise TritonServerError(f"no usable tritonserver: {env.capabilities()['tritonserver'].reason}")
    return binary.parents[1]  # .../pytriton/tritonserver


def backend_dir() -> Path:
    """build/triton/backends with python/ holding the backend library, its utils module and this Python's stub."""
    root = _pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonServerError(f"the pytriton wheel has no Python backend stub for Python {version} ({stub})")
    dest = env.build_dir() / "triton" / "backends" / "python"
    dest.mkdir(parents=True, exist_ok=True)
    sources = [
        root / "backends" / "python" / "libtriton_python.so",
        root / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ]
    for src in sources:
        link = dest / src.name
        if link.is_symlink() or link.exists():
            if link.resolve() == src.resolve():
                continue
            link.unlink()
        link.symlink_to(src)
    return dest.parent


def response_cache_status() -> tuple[bool, str]:
    """(usable, reason) for Triton's response cache with the bundled server (lesson 05).

    The server loads a cache implementation as a shared library from <cache directory>/<name>/libtritoncache_<name>.so;
    the wheel ships ``local`` (an in-process memory pool) and no ``redis``.
    """
    try:
        root = _pytriton_root()
    except TritonServerError as exc:
        return False, str(exc)
    lib = root / "caches" / "local" / "libtritoncache_local.so"
    if not lib.is_file():
        return False, f"this tritonserver ships no cache implementation ({lib} is missing)"
    return True, f"the 'local' cache implementation: {lib}"


def server_env() -> dict:
    """The process environment for tritonserver and its Python-backend stubs (lessons 00, 05).

    - LD_LIBRARY_PATH: the wheel's bundled libraries, then this interpreter's libpython folder (when Python was built
      shared), so the stub embeds the same Python as the notebook rather than whatever libpython3.X the OS has;
    - PATH: this interpreter's bin/ folder first. The stub is a separate program that embeds Python in isolated mode
      (it ignores PYTHONPATH) and derives sys.prefix from the first `python3` on PATH; finding the course
      environment's python3 next to its pyvenv.cfg, it adds the environment's site-packages, so a model.py imports
      numpy, onnxruntime and tokenizers from the course environment (pytriton does the same).
    """
    import sysconfig

    libs = _pytriton_root().parents[1] / "nvidia_pytriton.libs"
    environ = dict(os.environ)
    lib_dirs = [str(libs)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and sysconfig.get_config_var("LIBDIR"):
        lib_dirs.append(sysconfig.get_config_var("LIBDIR"))
    environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (*lib_dirs, environ.get("LD_LIBRARY_PATH", "")) if p)
    environ["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), environ.get("PATH", "")) if p)
    environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # model.py runs in a forked stub: keep tokenizers serial
    return environ


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonServer:
    """A tritonserver process on 127.0.0.1 (lesson 05). Use as a context manager, or call start()/stop()."""

    def __init__(
        self,
        model_repository: str | os.PathLike,
        *,
        startup_timeout: float = 180.0,
        log_verbose: int = 0,
        extra_args: list[str] | None = None,
        name: str = "tritonserver",
        response_cache_bytes: int | None = None,
    ):
        self.model_repository = Path(model_repository).resolve()
        if not self.model_repository.is_dir():
            raise FileNotFoundError(f"model repository {self.model_repository} is not a folder")
        self.startup_timeout = startup_timeout
        self.log_verbose = log_verbose
        self.extra_args = list(extra_args or [])
        if response_cache_bytes is not None:
            ok, reason = response_cache_status()
            if not ok:
                raise TritonServerError(f"response cache asked for, but {reason}")
            if not isinstance(response_cache_bytes, int) or response_cache_bytes <= 0:
                raise ValueError(f"response_cache_bytes must be a positive int, got {response_cache_bytes!r}")
        self.response_cache_bytes = response_cache_bytes
        self.log_path = env.build_dir() / "triton" / f"{name}.log"
        self.http_port = self.grpc_port = self.metrics_port = None
        self.process: subprocess.Popen | None = None

    # -- addresses -------------------------------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    # -- lifecycle -------------------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        binary = _pytriton_root() / "bin" / "tritonserver"
        return [
            str(binary),
            f"--model-repository={self.model_repository}",
            "--model-control-mode=none",
            f"--backend-directory={backend_dir()}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            f"--log-verbose={self.log_verbose}",
            "--exit-timeout-secs=10",
            *self._cache_args(),
            *self.extra_args,
        ]

    def _cache_args(self) -> list[str]:
        if self.response_cache_bytes is None:
            return []
        return [f"--cache-directory={_pytriton_root() / 'caches'}",
                f"--cache-config=local,size={self.response_cache_bytes}"]

    def log_tail(self, lines: int = 40) -> str:
        return procgroup.log_tail(self.log_path, lines)

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def start(self) -> TritonServer:
        if self.process is not None:
            raise TritonServerError("this server is already started")
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = procgroup.spawn(self.command(), self.log_path, env=server_env())  # stop() ends its stubs too
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise TritonServerError(f"tritonserver exited with code {code} while starting; log tail:\n{self.log_tail()}")
            if self.is_ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise TritonServerError(f"tritonserver not ready after {self.startup_timeout:.0f} s; log tail:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server and everything in its process group; safe to call twice."""
        proc, self.process = self.process, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        procgroup.end(proc, timeout, sigterm=True)  # the stubs share the group: none outlives the server

    # -- inspection (lesson 05) -------------------------------------------------------------------------------------
    def processes(self) -> list:
        """psutil.Process objects of the server and everything it started (the Python-backend stubs)."""
        return procgroup.tree(self.process)

    def _per_model(self, read) -> dict[str, float]:
        """{"tritonserver": x, <model name>: x, ...}: read(process) summed per model; a stub is named by its model.py."""
        import psutil

        out: dict[str, float] = {}
        for proc in self.processes():
            try:
                args = proc.cmdline()
                value = read(proc)
            except psutil.NoSuchProcess:  # a stub that exited between listing and reading
                continue
            model_py = next((a for a in args[1:] if a.endswith("/model.py")), None)
            name = Path(model_py).parent.parent.name if model_py else "tritonserver"
            out[name] = out.get(name, 0.0) + value
        return out

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far: {"tritonserver": s, <model name>: s, ...} (lesson 05).

        Each Python-backend stub runs one model instance and is named by the model.py it was started with
        (<repository>/<model>/<version>/model.py); a model's instances are summed. Take two snapshots around a load
        run and subtract them to see where the server's work went.
        """
        return self._per_model(lambda p: sum(p.cpu_times()[:2]))

    def memory_mib(self) -> dict[str, float]:
        """Resident memory (RSS, MiB) now, named as cpu_seconds() names CPU time (lesson 05).

        RSS counts a shared library in every process that maps it, so the sum over-states the total a little: the
        safe side for a memory limit.
        """
        return self._per_model(lambda p: p.memory_info().rss / 2**20)

    def listening_addresses(self) -> list[tuple[str, int]]:
        """(ip, port) of every socket the server process listens on."""
        import psutil

        if self.process is None:
            raise TritonServerError("the server is not running")
        conns = psutil.Process(self.process.pid).net_connections(kind="inet")
        return sorted({(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN})

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}, http {self.http_url}, grpc {self.grpc_url}" if self.process else "stopped"
        return f"TritonServer({self.model_repository.name}: {state})"


# ---------------------------------------------------------------------------------------------------------------------
# observability (lesson 05)
# ---------------------------------------------------------------------------------------------------------------------


def is_loopback(ip: str) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1) (lesson 05)."""
    import ipaddress

    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool(addr.is_loopback or (mapped is not None and mapped.is_loopback))


def model_statistics(grpc_url: str, model: str, version: str = "") -> dict:
    """Triton's statistics extension for one model as a dict (summed over its loaded versions) (lesson 05).

    Keys: inference_count, execution_count, queue_ns, compute_ns, cache_hits, cache_misses, and batches
    {batch size: executions}.
    """
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(grpc_url) as client:
        raw = client.get_inference_statistics(model, version, as_json=True)
    out = {"inference_count": 0, "execution_count": 0, "queue_ns": 0, "compute_ns": 0, "cache_hits": 0,
           "cache_misses": 0, "batches": {}}
    for stats in raw.get("model_stats", []):
        out["inference_count"] += int(stats.get("inference_count", 0))
        out["execution_count"] += int(stats.get("execution_count", 0))
        inf = stats.get("inference_stats", {})
        out["queue_ns"] += int(inf.get("queue", {}).get("ns", 0))
        out["compute_ns"] += sum(int(inf.get(k, {}).get("ns", 0)) for k in ("compute_input", "compute_infer", "compute_output"))
        out["cache_hits"] += int(inf.get("cache_hit", {}).get("count", 0))
        out["cache_misses"] += int(inf.get("cache_miss", {}).get("count", 0))
        for b in stats.get("batch_stats", []):
            size = int(b["batch_size"])
            out["batches"][size] = out["batches"].get(size, 0) + int(b["compute_infer"]["count"])
    return out


def batch_histogram(before: dict, after: dict) -> dict[int, int]:
    """{batch size: executions} that happened between two model_statistics() snapshots (lesson 05)."""
    sizes = sorted(set(before["batches"]) | set(after["batches"]))
    hist = {s: after["batches"].get(s, 0) - before["batches"].get(s, 0) for s in sizes}
    return {s: n for s, n in hist.items() if n > 0}


def scrape_metrics(metrics_url: str) -> dict[tuple[str, str], float]:
    """Triton's Prometheus endpoint as {(metric name, model): value}, summed over versions and labels (lesson 05)."""
    import re

    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    pattern = re.compile(r'^(\w+)\{([^}]*)\}\s+([-+0-9.eE]+|NaN)$')
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = pattern.match(line.strip())
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        key = (m.group(1), labels.get("model", ""))
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def per_request_ms(before: dict, after: dict, model: str) -> dict[str, float]:
    """Average queue, compute and whole-request time per request of `model` between two scrapes (lesson 05)."""
    def delta(name):
        return after.get((name, model), 0.0) - before.get((name, model), 0.0)

    n = delta("nv_inference_request_success")
    if n <= 0:
        return {"requests": 0, "queue_ms": float("nan"), "compute_ms": float("nan"), "request_ms": float("nan")}
    compute = sum(delta(f"nv_inference_compute_{k}_duration_us") for k in ("input", "infer", "output"))
    execs = delta("nv_inference_exec_count")
    return {
        "requests": int(n),
        "executions": int(execs),
        "queue_ms": delta("nv_inference_queue_duration_us") / n / 1e3,
        "compute_ms": compute / n / 1e3,
        "request_ms": delta("nv_inference_request_duration_us") / n / 1e3,
    }
