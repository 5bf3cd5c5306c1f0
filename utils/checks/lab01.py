"""Checks for labs/01_inference_modes_lab.ipynb (lesson 01: a correct, fast predict, a batch-size benchmark, and a
queue of small requests served faster than one predict call per request).

Each check builds its own small models and inputs, calls the learner's function through utils.checks.call (so a TODO
stub fails with a clear message), and compares with utils.inference, the lesson's reference helpers. The learner's
function runs under utils.checks.no_reference: an answer that calls those reference helpers fails.
"""

from __future__ import annotations

import copy
import itertools
import math
import time

from utils import inference
from utils.checks import LabCheckFailed, call, expect, expect_gain, figure, no_reference, passed
from utils.core import bench, env, models

# the lesson's reference: a predict (or benchmark) that calls these is the course's answer, not the learner's
_REFERENCE_PREDICT = (inference.predict, inference.validate_images, inference.model_device, inference.check_same_device)

# The serving task (section 5): a queue of small requests, each 1-4 images, served by ResNet-18.
SERVE_ATOL = SERVE_RTOL = 1e-4  # batches of other sizes run other kernels: about 1e-6 apart here
SERVE_LINE = 1.5  # your serve's speed over one predict call per request, every round of the comparison (full mode)
SERVE_MAX_BATCH = 32


def _recording(inner):
    """Wrap a module so that every forward call records its batch size, input device, autograd state, mode and
    duration (the same calls the learner times, so the comparison holds however loaded the machine is)."""
    import torch

    class Recording(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner
            self.calls = []

        def forward(self, x):
            t0 = time.perf_counter()
            out = self.inner(x)
            self.calls.append({
                "batch": int(x.shape[0]),
                "device": x.device,
                "grad_enabled": torch.is_grad_enabled(),
                "training": self.training,
                "ms": (time.perf_counter() - t0) * 1e3,
            })
            return out

    return Recording()


def _images(n, seed=0, size=32):
    import torch

    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def _predict(predict, *args, what: str, **kwargs):
    """The learner's predict, called as a check calls it (a stub or a call to the reference fails clearly)."""
    with no_reference(*_REFERENCE_PREDICT, what="your predict"):
        return call(predict, *args, what=what, **kwargs)


def check_predict_correct(predict) -> None:
    """predict(model, x, max_batch) matches the reference on a model left in train mode, with a CPU float output."""
    import torch

    model = inference.tiny_cnn(seed=1)  # train mode on purpose: Dropout and BatchNorm must be switched off
    reference = inference.predict(copy.deepcopy(model), _images(10), max_batch=4)
    got = _predict(predict, model, _images(10), max_batch=4, what="predict(model, x, max_batch=4)")
    expect(torch.is_tensor(got), f"predict should return a torch.Tensor, got {type(got).__name__}")
    expect(tuple(got.shape) == tuple(reference.shape),
           f"predict returned shape {tuple(got.shape)}, expected {tuple(reference.shape)} (one row per input image)")
    expect(got.device.type == "cpu", f"predict should return its outputs on the CPU, got {got.device}")
    again = _predict(predict, model, _images(10), max_batch=4, what="predict(model, x, max_batch=4)")  # RNG moved on
    if not torch.equal(got, again):
        raise LabCheckFailed("two predict() calls on the same model and input gave different outputs: something random "
                             "(Dropout) is still switched on while the model serves")
    err = (got.float() - reference).abs().max().item()
    expect(err <= 1e-5, f"predict differs from the reference by up to {err:.3g} (expected <= 1e-5): an image's output "
                        "depends on the other images of its batch (BatchNorm still normalizing with the batch's own "
                        "statistics?), or the outputs come back in another order than the images")
    passed("predict is correct", f"max |diff| vs reference {err:.2g}")


def check_no_graph(predict) -> None:
    """predict builds no autograd graph: nothing is saved for backward and the output has no grad_fn."""
    import torch

    model = inference.tiny_cnn(seed=2).eval()
    expect(all(p.requires_grad for p in model.parameters()), "internal: the check model should require grad")
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = _predict(predict, model, _images(6), max_batch=3, what="predict(model, x, max_batch=3)")
    expect(torch.is_tensor(out), f"predict should return a torch.Tensor, got {type(out).__name__}")
    expect(not packed, f"autograd saved {len(packed)} tensors for backward during predict: the model ran while "
                       "autograd was recording, and those activations stayed alive for a backward pass that never "
                       "comes (detaching the result afterwards is too late)")
    expect(out.grad_fn is None and not out.requires_grad,
           f"the output still belongs to an autograd graph (grad_fn={out.grad_fn}): autograd recorded the forward pass")
    passed("no autograd graph", "0 tensors saved for backward, the output has no grad_fn")


def check_batching(predict) -> None:
    """The model never sees more than max_batch images at once, every image is processed once, in order."""
    import torch

    inner = inference.tiny_cnn(seed=3).eval()
    x = _images(37, seed=3)
    reference = inference.predict(copy.deepcopy(inner), x, max_batch=37)
    rec = _recording(inner)
    got = _predict(predict, rec, x, max_batch=8, what="predict(model, x, max_batch=8)")
    sizes = [c["batch"] for c in rec.calls]
    expect(sizes, "predict never called the model")
    expect(max(sizes) <= 8, f"with max_batch=8 the model saw batches of {sizes}: a batch larger than max_batch "
                            "reached the model, so memory grows with the size of x")
    expect(sum(sizes) == 37, f"the model saw {sum(sizes)} images in batches {sizes}, but x has 37")
    expect(torch.is_tensor(got) and tuple(got.shape) == (37, 10),
           f"predict should return all 37 rows, got {getattr(got, 'shape', type(got).__name__)}")
    err = (got.float() - reference).abs().max().item()
    expect(err <= 1e-5, f"outputs differ from the reference by {err:.3g}: rows come back in another order than the "
                        "images, or some were computed twice")
    rec.calls.clear()
    _predict(predict, rec, x[:5], max_batch=64, what="predict(model, x[:5], max_batch=64)")
    expect([c["batch"] for c in rec.calls] == [5],
           f"5 images with max_batch=64 should be one call of 5, got {[c['batch'] for c in rec.calls]}")
    for bad in (0, -1):
        try:
            with no_reference(*_REFERENCE_PREDICT, what="your predict"):
                predict(rec, x[:2], max_batch=bad)
        except NotImplementedError:
            raise LabCheckFailed("predict() is not written yet: fill in its TODO") from None
        except ValueError as exc:
            expect(str(bad) in str(exc), f"the ValueError for max_batch={bad} should show the value, got: {exc}")
        else:
            raise LabCheckFailed(f"predict(..., max_batch={bad}) should raise ValueError (max_batch must be >= 1)")
    passed("batching", f"37 images with max_batch=8 ran as batches {sizes}")


def check_validation(predict) -> None:
    """Bad input raises TypeError/ValueError naming what came, before the model runs."""
    import numpy as np
    import torch

    rec = _recording(inference.tiny_cnn(seed=4).eval())
    cases = [
        ("a single image without batch dimension", torch.randn(3, 32, 32), (ValueError,), "(3, 32, 32)"),
        ("a channels-last batch", torch.randn(2, 32, 32, 3), (ValueError,), "(2, 32, 32, 3)"),
        ("an empty batch", torch.randn(0, 3, 32, 32), (ValueError,), "(0, 3, 32, 32)"),
        ("uint8 pixels", torch.randint(0, 255, (2, 3, 32, 32), dtype=torch.uint8), (TypeError, ValueError), "uint8"),
        ("a NumPy array", np.zeros((2, 3, 32, 32), dtype=np.float32), (TypeError,), "ndarray"),
    ]
    for label, bad, errors, shown in cases:
        rec.calls.clear()
        try:
            with no_reference(*_REFERENCE_PREDICT, what="your predict"):
                predict(rec, bad, max_batch=4)
        except NotImplementedError:
            raise LabCheckFailed("predict() is not written yet: fill in its TODO and run this cell again") from None
        except LabCheckFailed:
            raise
        except errors as exc:
            forms = (shown, "[" + shown[1:-1] + "]") if shown.startswith("(") else (shown,)
            expect(any(f in str(exc) for f in forms),
                   f"for {label} the {type(exc).__name__} should say what came ({shown!r}); yours says: {exc}")
        except Exception as exc:
            raise LabCheckFailed(f"for {label} predict should raise {' or '.join(e.__name__ for e in errors)} "
                                 f"with a clear message, it raised {type(exc).__name__}: {exc}") from None
        else:
            raise LabCheckFailed(f"predict accepted {label}; it should raise "
                                 f"{' or '.join(e.__name__ for e in errors)} naming {shown!r}")
        expect(not rec.calls, f"for {label} the model ran before the error was raised: the bad batch reached the model")
    passed("input validation", f"{len(cases)} bad inputs rejected with clear messages before the model ran")


def check_device_placement(predict) -> None:
    """predict moves each chunk to the model's device (tested with the data-less 'meta' device, and CUDA if present)."""
    import torch

    class MetaModel(torch.nn.Module):
        """Parameters on 'meta' (shape, no data); forward returns CPU zeros, so any CPU machine can run it."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(10, 3, device="meta"))

        def forward(self, x):
            return torch.zeros(x.shape[0], 10)

    rec = _recording(MetaModel())
    _predict(predict, rec, _images(5), max_batch=2, what="predict(meta_model, x, max_batch=2)")
    devices = sorted({str(c["device"]) for c in rec.calls})
    expect(devices == ["meta"], f"the model's parameters are on 'meta' but it received inputs on {devices}: on a GPU "
                                "this is the 'Expected all tensors to be on the same device' error")
    detail = "inputs follow the model to 'meta'"
    if torch.cuda.is_available():
        model = inference.tiny_cnn(seed=5).eval()
        reference = inference.predict(copy.deepcopy(model), _images(4), max_batch=2)
        got = _predict(predict, model.to("cuda"), _images(4), max_batch=2, what="predict(cuda_model, x)")
        expect(got.device.type == "cpu", f"predict should return CPU outputs, got {got.device}")
        err = (got - reference).abs().max().item()
        expect(err <= 1e-4, f"on CUDA predict differs from the CPU reference by {err:.3g}")
        detail += " and to CUDA"
    passed("device placement", detail)


def check_benchmark(benchmark_batches, batch_sizes=(1, 4, 16), image_size: int = 32) -> dict:
    """benchmark_batches(model, batch_sizes, image_size) returns {bs: {"latency_ms", "images_per_s"}} measured in
    eval mode without autograd, for every batch size; each latency matches the model calls it actually timed."""
    inner = inference.tiny_cnn(seed=6)
    rec = _recording(inner)
    with no_reference(inference.throughput_sweep, what="your benchmark_batches"):
        results = call(benchmark_batches, rec, list(batch_sizes), image_size=image_size,
                       what="benchmark_batches(model, batch_sizes, image_size)")
    expect(isinstance(results, dict), f"benchmark_batches should return a dict, got {type(results).__name__}")
    expect(sorted(results) == sorted(batch_sizes),
           f"expected one entry per batch size {sorted(batch_sizes)}, got keys {sorted(results)}")
    seen = {c["batch"] for c in rec.calls}
    missing = sorted(set(batch_sizes) - seen)
    expect(not missing, f"the model never ran a batch of {missing}, so that latency was not measured")
    expect(not any(c["grad_enabled"] for c in rec.calls),
           "the model ran with autograd recording: that times a training forward pass, not a served model")
    expect(not any(c["training"] for c in rec.calls), "the model ran in train mode (Dropout on, BatchNorm updating "
                                                      "its statistics): that is not what a served model runs")
    for bs, entry in results.items():
        expect(isinstance(entry, dict) and {"latency_ms", "images_per_s"} <= set(entry),
               f"results[{bs}] should be a dict with 'latency_ms' and 'images_per_s', got {entry!r}")
        lat, ips = entry["latency_ms"], entry["images_per_s"]
        expect(all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in (lat, ips)),
               f"results[{bs}] should hold positive numbers, got {entry!r}")
        expect(abs(ips * lat / 1e3 - bs) <= 0.02 * bs,
               f"results[{bs}]: {ips:.1f} images/s at {lat:.3f} ms per batch of {bs} is inconsistent: "
               "images_per_s = batch size / (latency in seconds)")
    for bs in batch_sizes:
        # a per-call latency lies between the fastest and the slowest of the calls it was measured on, however
        # loaded the machine is; a total over many calls or a unit mix-up (seconds, microseconds) does not
        durations = [c["ms"] for c in rec.calls if c["batch"] == bs]
        low, high = min(durations) / 2, max(durations) * 2
        expect(low <= results[bs]["latency_ms"] <= high,
               f"results[{bs}]['latency_ms'] = {results[bs]['latency_ms']:.3f} ms, but each of the {len(durations)} "
               f"model calls of batch {bs} that your benchmark made took between {min(durations):.3f} and "
               f"{max(durations):.3f} ms: the reported latency is not the time of one call in milliseconds")
    passed("batch-size benchmark", ", ".join(f"bs {bs}: {results[bs]['images_per_s']:.0f} img/s"
                                             for bs in sorted(results)))
    figure("best_images_per_s", max(r["images_per_s"] for r in results.values()), "img/s")
    return results


def check_pick_batch_size(pick_batch_size) -> None:
    """The highest-throughput batch size whose latency fits the budget; ValueError naming the budget when none fits."""
    table = {
        1: {"latency_ms": 10.0, "images_per_s": 100.0},
        8: {"latency_ms": 40.0, "images_per_s": 200.0},
        16: {"latency_ms": 70.0, "images_per_s": 228.0},
        32: {"latency_ms": 150.0, "images_per_s": 213.0},
    }
    for budget, want in ((100.0, 16), (40.0, 8), (1000.0, 16), (10.0, 1)):
        got = call(pick_batch_size, table, budget, what=f"pick_batch_size(results, {budget})")
        expect(got == want, f"with a {budget:g} ms budget the best batch size is {want} (highest images/s among those "
                            f"with latency <= budget), got {got!r}")
    try:
        pick_batch_size(table, 5.0)
    except NotImplementedError:
        raise LabCheckFailed("pick_batch_size() is not written yet: fill in its TODO") from None
    except ValueError as exc:
        expect("5" in str(exc), f"the ValueError should name the budget (5 ms), got: {exc}")
    else:
        raise LabCheckFailed("pick_batch_size(results, 5.0) should raise ValueError: no batch size fits 5 ms")
    passed("pick_batch_size", "budgets 100/40/1000/10 ms -> 16/8/16/1; 5 ms rejected")


# -- section 5: serve a queue of small requests -----------------------------------------------------------------------


def serve_queue(n: int, size: int, seed: int, sizes=None):
    """A queue of `n` requests, each a (k, 3, size, size) batch with k from 1 to 4 (or the given `sizes`), seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    sizes = list(sizes) if sizes is not None else torch.randint(1, 5, (n,), generator=g).tolist()
    return [torch.randn(k, 3, size, size, generator=g) for k in sizes]


def one_predict_per_request(model, requests, max_batch: int):
    """The straightforward way, the baseline: the lesson's predict called once for each request."""
    return [inference.predict(model, r, max_batch=max_batch) for r in requests]


def _served(serve, model, requests, max_batch: int, label: str) -> tuple[list, list, list]:
    """The learner's serve on a recorded copy of `model`, checked against one reference predict per request; returns
    the batch sizes the model saw, the learner's outputs and the reference ones."""
    import torch

    want = one_predict_per_request(copy.deepcopy(model), requests, max_batch)
    rec = _recording(copy.deepcopy(model))
    what = f"serve(model, requests, max_batch={max_batch}) on {label}"
    with no_reference(*_REFERENCE_PREDICT, what="your serve"):
        got = call(serve, rec, requests, max_batch, what=what)
    total, n = sum(len(r) for r in requests), len(requests)
    expect(isinstance(got, list | tuple), f"{what} should return a list with one output per request, got "
                                          f"{type(got).__name__}")
    expect(len(got) == n, f"{what} returned {len(got)} outputs for {n} requests: one output per request, in the "
                          "order of the queue")
    sizes = [c["batch"] for c in rec.calls]
    expect(sizes, f"{what} never called the model, so its outputs cannot be this queue's")
    expect(not any(c["grad_enabled"] for c in rec.calls),
           f"{what}: the model ran with autograd recording, keeping every activation alive for a backward pass that "
           "never comes")
    expect(not any(c["training"] for c in rec.calls),
           f"{what}: the model ran in train mode (Dropout on, BatchNorm normalizing with each batch's statistics)")
    expect(max(sizes) <= max_batch, f"{what}: the model saw batches of {sizes}; a batch larger than max_batch="
                                    f"{max_batch} reached it, so memory grows with the queue")
    expect(sum(sizes) == total, f"{what}: the model saw {sum(sizes)} images in batches {sizes}, but the queue holds "
                                f"{total} ({'some ran more than once' if sum(sizes) > total else 'some never ran'})")
    for i, (r, out, ref) in enumerate(zip(requests, got, want, strict=True)):
        expect(torch.is_tensor(out) and tuple(out.shape) == tuple(ref.shape),
               f"{what}: the output for request {i} ({len(r)} images) has shape "
               f"{tuple(out.shape) if torch.is_tensor(out) else type(out).__name__}, expected {tuple(ref.shape)}: one "
               "row per image of that request")
        expect(out.device.type == "cpu", f"{what}: the output for request {i} is on {out.device}, not on the CPU")
        if not torch.allclose(out.float(), ref, atol=SERVE_ATOL, rtol=SERVE_RTOL):
            err = float((out.float() - ref).abs().max())
            raise LabCheckFailed(f"{what}: the output for request {i} ({len(r)} images) differs from predict on that "
                                 f"request alone by up to {err:.3g} (atol {SERVE_ATOL}, rtol {SERVE_RTOL}): its rows "
                                 "belong to other images, come from an earlier queue, or were computed in a lower "
                                 "precision than predict's")
    return sizes, list(got), want


def _still_equal(got, want, what: str) -> None:
    """The outputs of an earlier queue, compared again after later queues were served: they must not have changed."""
    import torch

    for i, (out, ref) in enumerate(zip(got, want, strict=True)):
        if not torch.allclose(out.float(), ref, atol=SERVE_ATOL, rtol=SERVE_RTOL):
            raise LabCheckFailed(f"the outputs serve returned for {what} changed after later queues were served (request "
                                 f"{i} now differs from predict by up to {float((out.float() - ref).abs().max()):.3g}): "
                                 "an output handed to a caller shares memory with something serve writes again")


def check_serve(serve, *, smoke: bool | None = None, requests: int | None = None, image_size: int | None = None) -> dict:
    """The learner's serve(model, requests, max_batch): one output per request, in order, as the lesson's predict
    gives it for that request alone (within SERVE_ATOL / SERVE_RTOL).

    Correctness first, on fresh queues each time, on a tiny CNN left in train mode: a queue with a request larger
    than max_batch, a queue of the same sizes with new images (outputs kept from an earlier queue fail), a third
    queue, a queue of one image. Every model call
    is recorded: at most max_batch images, each image once, eval mode, no autograd. The course's predict and its
    helpers may not be called. Then ResNet-18 at 64 px (smoke: 32 px) on a queue of 32 requests (smoke: 12) with
    max_batch SERVE_MAX_BATCH, the learner's serve against one predict call per request in interleaved rounds: full
    mode judges the gain against SERVE_LINE, smoke mode reports it."""
    smoke = env.smoke_default() if smoke is None else smoke
    tiny = inference.tiny_cnn(seed=7)  # train mode on purpose
    first = serve_queue(0, 32, seed=21, sizes=[3, 11, 1, 4, 2])  # 21 images, max_batch 8: one request is larger
    _, first_got, first_want = _served(serve, tiny, first, 8, "a queue of 5 requests (3, 11, 1, 4, 2 images)")
    _served(serve, tiny, serve_queue(0, 32, seed=22, sizes=[3, 11, 1, 4, 2]), 8,
            "a second queue of the same sizes, new images")
    third = serve_queue(7, 32, seed=25)
    _served(serve, tiny, third, 8, f"a third queue of 7 requests ({sum(len(r) for r in third)} images)")
    one, _, _ = _served(serve, tiny, serve_queue(0, 32, seed=23, sizes=[1]), 8, "a queue of one image")
    expect(one == [1], f"a queue of one image should be one model call of 1, got {one}")
    _still_equal(first_got, first_want, "the first queue")

    n = requests or (12 if smoke else 32)
    size = image_size or (32 if smoke else 64)
    model = models.vision_model("resnet18")
    queue = serve_queue(n, size, seed=24)
    calls, _, _ = _served(serve, model, queue, SERVE_MAX_BATCH, f"the timed queue of {n} requests")
    # every timed call gets a queue of its own (the same request sizes, new images), so nothing served before can be
    # handed back; the last one each side served is checked after the timing
    sizes, seeds, last = [len(r) for r in queue], itertools.count(1000), {}

    def fresh_queue():
        return serve_queue(n, size, seed=next(seeds), sizes=sizes)

    def timed_serve():
        q = fresh_queue()
        last["served"] = q, serve(model, q, SERVE_MAX_BATCH)

    res = bench.compare({"one predict per request": lambda: one_predict_per_request(model, fresh_queue(),
                                                                                    SERVE_MAX_BATCH),
                         "your serve": timed_serve},
                        rounds=3 if smoke else 5, min_run_time=0.05 if smoke else 0.5, quiet=True)
    timed_queue, timed_out = last["served"]
    _still_equal(timed_out, one_predict_per_request(model, timed_queue, SERVE_MAX_BATCH),
                 "the last timed queue (compared once the timing was over)")
    images = sum(len(r) for r in queue)
    for name, r in res.items():
        print(f"  {name:24s} {r.median_ms:8.1f} ms per queue, {images / (r.median_ms / 1e3):7.1f} images/s")
    print(f"  ResNet-18 at {size} px, {n} requests of 1-4 images ({images} in all), max_batch {SERVE_MAX_BATCH}: one "
          f"predict per request calls the model {sum(-(-len(r) // SERVE_MAX_BATCH) for r in queue)} times, your serve "
          f"{len(calls)} times")
    ratio = res.ratio("your serve")
    line = expect_gain("your serve", ratio, "one predict per request", SERVE_LINE,
                       "What does one model call cost besides its arithmetic, and how many calls does your serve make "
                       "for this queue?", smoke=smoke)
    passed("serve a queue", f"outputs match predict per request (atol {SERVE_ATOL}, rtol {SERVE_RTOL}), at most "
                            f"max_batch images per call, eval mode, no autograd; {line}")
    figure("serve_speedup_over_per_request", ratio.value, "x")
    return {"speedup": ratio, "calls": calls, "images": images}
