"""utils.serving.loadgen and the observability helpers of utils.core.tritonserver (lesson 05), without a server."""

import numpy as np
import pytest

from utils.core import tritonserver
from utils.serving import loadgen


@pytest.mark.parametrize("url", ["127.0.0.1:8001", "localhost:8000", "[::1]:8001", "http://127.0.0.1:8000/v2",
                                 "127.0.0.1"])
def test_loopback_accepted(url):
    assert loadgen.check_loopback(url) == url


@pytest.mark.parametrize("url", ["10.0.0.5:8001", "example.com:80", "0.0.0.0:8001", "", "http://192.168.1.2:8000"])
def test_non_loopback_refused(url):
    with pytest.raises(ValueError, match="loopback|127.0.0.1"):
        loadgen.check_loopback(url)


def test_run_load_refuses_remote_hosts_before_sending():
    req = [{"TEXT": np.array([[b"x"]], dtype=object)}]
    with pytest.raises(ValueError, match="loopback"):
        loadgen.run_load("8.8.8.8:8001", "m", req)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(concurrency=0), "concurrency"), (dict(max_requests=0), "max_requests"), (dict(max_seconds=0), "max_seconds"),
     (dict(warmup=-1), "warmup"), (dict(expected=[]), "align")],
)
def test_run_load_bad_arguments(kwargs, message):
    req = [{"TEXT": np.array([[b"x"]], dtype=object)}]
    with pytest.raises(ValueError, match=message):
        loadgen.run_load("127.0.0.1:1", "m", req, **kwargs)


def test_run_load_bad_requests():
    with pytest.raises(ValueError, match="non-empty list"):
        loadgen.run_load("127.0.0.1:1", "m", [])
    with pytest.raises(ValueError, match="requests\\[0\\]"):
        loadgen.run_load("127.0.0.1:1", "m", [{"TEXT": [1, 2]}])


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    xs = rng.exponential(size=101).tolist()
    for q in (0, 50, 95, 99, 100):
        assert loadgen.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert np.isnan(loadgen.percentile([], 50))
    with pytest.raises(ValueError):
        loadgen.percentile(xs, 101)


def test_load_result_properties():
    r = loadgen.LoadResult("m", 4, requests=10, failed=1, wrong=1, seconds=2.0, latencies_ms=list(range(1, 11)))
    assert r.ok == 8 and r.throughput == 4.0
    assert r.p50 == pytest.approx(5.5)
    assert r.row()["failed"] == 1 and "wrong 1" in str(r)


def test_perf_analyzer_status_is_a_reason():
    ok, reason = loadgen.perf_analyzer_status()
    if ok:  # the binary runs: the reason is its path and version line
        assert "perf_analyzer" in reason and ": " in reason
    else:  # it names what is missing or why the binary cannot run
        assert any(why in reason for why in ("no perf_analyzer binary", "cannot run here", "does not start")), reason


@pytest.mark.parametrize("ip, want", [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True),
                                      ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("10.1.2.3", False),
                                      ("::", False)])
def test_is_loopback(ip, want):
    assert tritonserver.is_loopback(ip) is want


def test_batch_histogram_and_per_request():
    before = {"batches": {1: 5, 4: 1}}
    after = {"batches": {1: 7, 4: 1, 8: 3}}
    assert tritonserver.batch_histogram(before, after) == {1: 2, 8: 3}
    m0 = {("nv_inference_request_success", "enc"): 10, ("nv_inference_queue_duration_us", "enc"): 1000,
          ("nv_inference_compute_infer_duration_us", "enc"): 5000, ("nv_inference_exec_count", "enc"): 10,
          ("nv_inference_request_duration_us", "enc"): 7000}
    m1 = {("nv_inference_request_success", "enc"): 30, ("nv_inference_queue_duration_us", "enc"): 21000,
          ("nv_inference_compute_infer_duration_us", "enc"): 45000, ("nv_inference_exec_count", "enc"): 15,
          ("nv_inference_request_duration_us", "enc"): 77000}
    out = tritonserver.per_request_ms(m0, m1, "enc")
    assert out["requests"] == 20 and out["executions"] == 5
    assert out["queue_ms"] == pytest.approx(1.0) and out["compute_ms"] == pytest.approx(2.0)
    assert out["request_ms"] == pytest.approx(3.5)
    assert tritonserver.per_request_ms(m1, m1, "enc")["requests"] == 0


def test_matches_compares_strings_exactly_and_numbers_like_allclose():
    strings = np.array([[b"sports"]], dtype=object)
    assert loadgen._matches(strings.copy(), strings, 1e-3, 1e-3)
    assert not loadgen._matches(np.array([[b"food"]], dtype=object), strings, 1e-3, 1e-3)
    assert not loadgen._matches(np.array([["sports"]], dtype=object), strings, 1e-3, 1e-3)  # str is not bytes
    want = np.array([[1.0, -2.0, np.inf]], dtype=np.float32)
    assert loadgen._matches(want + np.float32(5e-4), want, 1e-3, 1e-3)  # inf == inf, as np.allclose says
    assert not loadgen._matches(want + np.float32(1e-2), want, 1e-3, 1e-3)
    assert not loadgen._matches(np.array([[1.0, -2.0, np.nan]], dtype=np.float32), want, 1e-3, 1e-3)
    assert not loadgen._matches(want[:, :2], want, 1e-3, 1e-3) and not loadgen._matches(None, want, 1e-3, 1e-3)
