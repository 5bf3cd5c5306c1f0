"""A small load generator for a Triton server on this machine, built on tritonclient (lesson 05).

``run_load`` keeps `concurrency` requests in flight (a closed loop: each worker sends its next request when the
previous one answered), stops after `max_requests` or `max_seconds`, whichever comes first, and checks every response
against the expected outputs. One asyncio event loop (tritonclient.grpc.aio) drives all workers from one thread, which
costs far less CPU than one thread per in-flight request: on a 2-core machine the client competes with the server.

Traffic goes to the loopback interface only: any other host is refused. ``perf_analyzer_status`` says whether
NVIDIA's perf_analyzer can run here (its wheels need glibc 2.38); where it cannot, this module is the load tool.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LoadResult", "LOOPBACK_HOSTS", "check_loopback", "run_load", "percentile", "perf_analyzer_status"]

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def check_loopback(url: str) -> str:
    """Return `url` if its host is a loopback address; raise ValueError otherwise (lesson 05)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"expected a 'host:port' URL on 127.0.0.1, got {url!r}")
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    host = rest.rsplit(":", 1)[0] if rest.count(":") == 1 or rest.startswith("[") else rest
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"utils.serving.loadgen only sends traffic to this machine's loopback interface "
                         f"({sorted(LOOPBACK_HOSTS)}); got host {host!r} in {url!r}")
    return url


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation, as numpy.percentile (lesson 05)."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in 0..100, got {q}")
    data = sorted(values)
    if not data:
        return math.nan
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class LoadResult:
    """One load run: counts, wall time and per-request latencies in milliseconds (lesson 05)."""

    label: str
    concurrency: int
    requests: int  # responses received (including failed ones)
    failed: int  # the server or the transport returned an error
    wrong: int  # a response arrived but did not match the expected outputs
    seconds: float
    latencies_ms: list[float] = field(repr=False, default_factory=list)
    errors: list[str] = field(repr=False, default_factory=list)  # the first few messages, for diagnosis
    client_cpu_s: float = 0.0  # CPU time of this process (the client) during the measured window, warm-up excluded
    snapshots: tuple = field(repr=False, default=(None, None))  # snapshot() right before and after that window

    @property
    def ok(self) -> int:
        return self.requests - self.failed - self.wrong

    @property
    def throughput(self) -> float:
        """Correct responses per second."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p95(self) -> float:
        return percentile(self.latencies_ms, 95)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 99)

    def row(self) -> dict:
        return {"label": self.label, "concurrency": self.concurrency, "requests": self.requests,
                "failed": self.failed, "wrong": self.wrong, "req_per_s": round(self.throughput, 1),
                "p50_ms": round(self.p50, 2), "p95_ms": round(self.p95, 2), "p99_ms": round(self.p99, 2)}

    def __str__(self) -> str:
        return (f"{self.label or 'load'} c={self.concurrency:<3d} {self.requests:5d} requests in {self.seconds:5.1f} s: "
                f"{self.throughput:7.1f} req/s, p50 {self.p50:6.1f} ms, p95 {self.p95:6.1f} ms, p99 {self.p99:6.1f} ms,"
                f" failed {self.failed}, wrong {self.wrong}")


def _matches(got, want, atol: float, rtol: float) -> bool:
    import numpy as np

    if got is None or got.shape != want.shape:
        return False
    if want.dtype == object or want.dtype.kind in "SU":
        return got.tolist() == want.tolist()
    with np.errstate(invalid="ignore"):  # the cheap test first (a few us); np.allclose decides what it cannot (inf, nan)
        if (np.abs(got - want) <= atol + rtol * np.abs(want)).all():
            return True
    return bool(np.allclose(got, want, atol=atol, rtol=rtol))


def _validate(requests, expected) -> None:
    import numpy as np

    if not isinstance(requests, Sequence) or not requests:
        raise ValueError("requests must be a non-empty list of {input name: numpy array} dicts")
    for i, req in enumerate(requests):
        if not isinstance(req, Mapping) or not req or not all(isinstance(v, np.ndarray) for v in req.values()):
            raise ValueError(f"requests[{i}] must be a non-empty {{input name: numpy array}} dict, got {type(req).__name__}")
    if expected is not None:
        if len(expected) != len(requests):
            raise ValueError(f"expected has {len(expected)} entries for {len(requests)} requests; they must align")
        for i, exp in enumerate(expected):
            if not isinstance(exp, Mapping) or not exp:
                raise ValueError(f"expected[{i}] must be a non-empty {{output name: numpy array}} dict")


def _triton_dtype(array) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return "BYTES" if array.dtype == object else np_to_triton_dtype(array.dtype)


async def _drive(client, model, requests, expected, concurrency, max_requests, max_seconds, atol, rtol, timeout_s,
                 model_version):
    import tritonclient.grpc.aio as grpcclient
    from tritonclient.utils import InferenceServerException

    prepared = []
    for req in requests:  # build the InferInput objects once; reusing them keeps the client's CPU cost low
        inputs = []
        for name, array in req.items():
            inp = grpcclient.InferInput(name, list(array.shape), _triton_dtype(array))
            inp.set_data_from_numpy(array)
            inputs.append(inp)
        prepared.append(inputs)
    outputs = None
    if expected is not None:
        outputs = [[grpcclient.InferRequestedOutput(name) for name in exp] for exp in expected]
    latencies, errors = [], []
    counts = {"sent": 0, "failed": 0, "wrong": 0}
    deadline = time.perf_counter() + max_seconds

    async def worker(client):
        while counts["sent"] < max_requests and time.perf_counter() < deadline:
            i = counts["sent"] % len(prepared)
            counts["sent"] += 1
            t0 = time.perf_counter()
            try:
                result = await client.infer(model, prepared[i], outputs=outputs[i] if outputs else None,
                                            model_version=model_version, client_timeout=timeout_s)
            except InferenceServerException as exc:
                latencies.append((time.perf_counter() - t0) * 1e3)
                counts["failed"] += 1
                if len(errors) < 5:
                    errors.append(str(exc))
                continue
            latencies.append((time.perf_counter() - t0) * 1e3)
            if expected is not None:
                bad = [n for n, want in expected[i].items() if not _matches(result.as_numpy(n), want, atol, rtol)]
                if bad:
                    counts["wrong"] += 1
                    if len(errors) < 5:
                        errors.append(f"request {i}: output(s) {bad} differ from the expected values")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    seconds = time.perf_counter() - t0
    return latencies, errors, counts, seconds


async def _run(url, model, requests, expected, concurrency, max_requests, max_seconds, atol, rtol, timeout_s,
               model_version, warmup, snapshot):
    """Warm-up, then the measured window, on one connection; CPU time and snapshots bracket only the window."""
    import tritonclient.grpc.aio as grpcclient

    async with grpcclient.InferenceServerClient(url) as client:
        if warmup:
            await _drive(client, model, requests, None, min(concurrency, warmup), warmup, max_seconds, atol, rtol,
                         timeout_s, model_version)
        before = snapshot() if snapshot else None
        cpu0 = time.process_time()
        out = await _drive(client, model, requests, expected, concurrency, max_requests, max_seconds, atol, rtol,
                           timeout_s, model_version)
        cpu1 = time.process_time()
        after = snapshot() if snapshot else None
    return (*out, cpu1 - cpu0, (before, after))


def run_load(
    url: str,
    model: str,
    requests: Sequence[Mapping],
    *,
    expected: Sequence[Mapping] | None = None,
    concurrency: int = 1,
    max_requests: int = 200,
    max_seconds: float = 30.0,
    warmup: int = 0,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    timeout_s: float = 30.0,
    model_version: str = "",
    label: str = "",
    snapshot: Callable[[], object] | None = None,
) -> LoadResult:
    """Send requests to `model` at gRPC `url` (127.0.0.1 only) with `concurrency` in flight (lesson 05).

    requests: [{input name: numpy array with the batch dimension}], sent round-robin. expected: the outputs each
    request must return ({output name: array}; strings compared exactly, numbers with atol/rtol), or None to count
    only errors. The run ends after max_requests responses or max_seconds, whichever is first; warmup requests are sent
    first, on the same connection, and not counted. The result's client_cpu_s is this process's CPU time during the
    measured window only, and snapshot (e.g. a server's cpu_seconds) is called right before and after that window:
    the result's snapshots, so that per-request costs leave out connection set-up and warm-up. Runs its own event loop
    in a helper thread, so it works inside Jupyter too.
    """
    check_loopback(url)
    _validate(requests, expected)
    for name, value, low in (("concurrency", concurrency, 1), ("max_requests", max_requests, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be > 0, got {max_seconds!r}")

    box: dict = {}

    def target():
        try:
            box["out"] = asyncio.run(_run(url, model, requests, expected, concurrency, max_requests, max_seconds, atol,
                                          rtol, timeout_s, model_version, warmup, snapshot))
        except BaseException as exc:  # re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name="utils.serving.loadgen", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    latencies, errors, counts, seconds, cpu_s, snapshots = box["out"]
    return LoadResult(label=label or model, concurrency=concurrency, requests=len(latencies), failed=counts["failed"],
                      wrong=counts["wrong"], seconds=seconds, latencies_ms=latencies, errors=errors, client_cpu_s=cpu_s,
                      snapshots=snapshots)


def perf_analyzer_status() -> tuple[bool, str]:
    """(usable, reason) for NVIDIA's perf_analyzer on this machine (lesson 05).

    Looks on PATH and inside the perf_analyzer Python package, then runs `perf_analyzer --version`. The reason says
    what is missing: no binary (e.g. a placeholder wheel) or a binary the C library cannot load (glibc too old).
    """
    candidates = []
    if shutil.which("perf_analyzer"):
        candidates.append(Path(shutil.which("perf_analyzer")))
    try:
        import perf_analyzer

        pkg = Path(perf_analyzer.__file__).parent
        candidates += [pkg / "bin" / "perf_analyzer", pkg / "perf_analyzer"]
        from importlib.metadata import version

        pkg_note = f"the installed perf-analyzer {version('perf-analyzer')} package"
    except ImportError:
        pkg_note = "no perf-analyzer Python package"
    binary = next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)
    if binary is None:
        return False, (f"no perf_analyzer binary: {pkg_note} ships none and none is on PATH (NVIDIA's current wheels "
                       "are built for glibc >= 2.38; the Triton SDK container has it)")
    try:
        proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{binary} does not start: {exc}"
    text = (proc.stdout + proc.stderr).strip()
    if "GLIBC" in text or proc.returncode not in (0, 1):
        first = next((line for line in text.splitlines() if line.strip()), f"exit code {proc.returncode}")
        return False, f"{binary} cannot run here: {first}"
    return True, f"{binary}: {text.splitlines()[0] if text else 'runs'}"
