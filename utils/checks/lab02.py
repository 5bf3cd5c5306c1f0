"""Checks for labs/02_graphs_lab.ipynb (lesson 02: torch.cond, torch.export with a dynamic batch, scripting a loop,
removing torch.compile's graph breaks from `squash_and_center`)."""

from __future__ import annotations

import logging
import time
import warnings

import torch

from utils import graphs
from utils.checks import LabCheckFailed, call, expect, expect_gain, figure, passed
from utils.core import bench, env

log = logging.getLogger(__name__)

ATOL, RTOL = 1e-5, 1e-5


def _branch_inputs(batch: int, dim: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """One input per branch of GatedMLP: mean > 0 takes the ReLU path, mean < 0 the tanh path."""
    base = torch.rand(batch, dim, generator=torch.Generator().manual_seed(seed)) + 0.1
    return {"relu (mean > 0)": base, "tanh (mean < 0)": -base}


def _todo_inside(exc: BaseException) -> bool:
    """True when an error comes from a TODO stub (directly, chained, or re-raised by the TorchScript interpreter)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError) or "NotImplementedError" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _parity(fn, reference, inputs: dict[str, torch.Tensor], what: str) -> float:
    worst = 0.0
    for name, x in inputs.items():
        with torch.no_grad():
            want = reference(x)
            got = call(fn, x, what=what)
        expect(
            isinstance(got, torch.Tensor) and got.shape == want.shape,
            f"{what} on the {name} branch should return a tensor of shape {tuple(want.shape)}, "
            f"got {type(got).__name__} {tuple(getattr(got, 'shape', ()))}",
        )
        err = (got - want).abs().max().item()
        expect(
            torch.allclose(got, want, atol=ATOL, rtol=RTOL),
            f"{what} differs from GatedMLP on the {name} branch at batch {x.shape[0]}: max abs error {err:.2e} "
            f"(atol {ATOL})",
        )
        worst = max(worst, err)
    return worst


class _BranchProbe(torch.fx.Interpreter):
    """Runs an exported program node by node; at every torch.cond it runs both branches on the same operands and keeps
    (predicate, {True: true branch's output, False: false branch's output}), then carries on with the branch taken."""

    def __init__(self, module):
        super().__init__(module)
        self.conds: list[tuple[bool, dict[bool, torch.Tensor]]] = []

    def call_function(self, target, args, kwargs):
        if target is not torch.ops.higher_order.cond:
            return super().call_function(target, args, kwargs)
        pred, true_fn, false_fn, operands = args
        outs = {True: true_fn(*operands), False: false_fn(*operands)}
        taken = bool(pred)
        first = {k: v[0] if isinstance(v, tuple | list) else v for k, v in outs.items()}
        self.conds.append((taken, first))
        return outs[taken]


def _check_branches(program, reference) -> None:
    """Each side's input takes a different branch of the first cond, the branch taken is right on its side, and the
    branch not taken computes something else (a cond around a torch.where, or with a constant predicate, fails)."""
    module, taken_by = program.module(), {}
    for name, x in _branch_inputs(4).items():
        probe = _BranchProbe(module)
        with torch.no_grad():
            probe.run(x)
            want = reference(x)
        expect(probe.conds, f"the exported program ran no cond for an input on the {name} side")
        taken, outs = probe.conds[0]
        taken_by[name] = branch = "true" if taken else "false"
        got, other = outs[taken], outs[not taken]
        expect(isinstance(got, torch.Tensor) and got.shape == want.shape
               and torch.allclose(got, want, atol=ATOL, rtol=RTOL),
               f"for an input on the {name} side the cond took its {branch} branch, and that branch's output differs "
               "from GatedMLP's on that side")
        expect(not (isinstance(other, torch.Tensor) and other.shape == got.shape
                    and torch.allclose(other, got, atol=ATOL, rtol=RTOL)),
               f"for an input on the {name} side both branches of the cond return the same values: the two branches "
               "compute the same thing, so the choice between the ReLU and tanh paths is made somewhere else than by "
               "the cond (inside the branches?)")
    expect(len(set(taken_by.values())) == 2,
           f"the cond took its {next(iter(taken_by.values()))} branch for inputs on both sides (mean > 0 and "
           "mean < 0): its predicate does not follow the input, so one branch never runs")


def check_cond_model(cond_cls) -> None:
    """Your torch.cond rewrite of GatedMLP gives the same results as GatedMLP on both branches, exports with a cond
    node, and that cond decides: inputs on each side take a different branch, each right on its side."""
    model = call(cond_cls, what=f"{getattr(cond_cls, '__name__', 'your class')}()")
    expect(isinstance(model, graphs.GatedMLP), "the class should subclass graphs.GatedMLP so it shares its weights")
    model.eval()
    reference = graphs.GatedMLP()
    worst = _parity(model, reference, _branch_inputs(4), "your model (eager)")
    try:
        with graphs.quiet_torch_logs():
            program = torch.export.export(model, (_branch_inputs(4)["relu (mean > 0)"],))
    except Exception as exc:
        if _todo_inside(exc):
            raise LabCheckFailed("forward() is not written yet: fill in its TODO and run this cell again.") from None
        raise LabCheckFailed(
            f"torch.export still fails on your forward: {graphs.first_line(exc)}. Export traces one program for "
            "every input, and a Python decision on a tensor's value cannot be traced."
        ) from None
    conds = [n for n in program.graph_module.graph.nodes if n.target is torch.ops.higher_order.cond]
    expect(conds, "the exported program has no cond node: export recorded only the path the example input took, so "
                  "every input would run that one path")
    _check_branches(program, reference)
    passed("torch.cond rewrite", f"both branches match GatedMLP (max abs error {worst:.1e}); the exported cond sends "
                                 "each side to its own branch")


def check_export(export_fn, cond_cls) -> None:
    """Your export function returns an ExportedProgram with a dynamic batch: parity on both branches at batch 3 and
    11 (the example has batch 4), also after a save/load round trip through a .pt2 file."""
    model = call(cond_cls, what=f"{getattr(cond_cls, '__name__', 'your class')}()").eval()
    example = _branch_inputs(4)["relu (mean > 0)"]
    try:
        with graphs.quiet_torch_logs():
            program = export_fn(model, example)
    except NotImplementedError as exc:
        raise LabCheckFailed(f"export_gated() or forward() is not written yet ({exc}). Fill in the TODO.") from None
    except Exception as exc:
        if _todo_inside(exc):
            raise LabCheckFailed("forward() is not written yet: fill in its TODO first.") from None
        raise LabCheckFailed(f"export_gated() raised {graphs.first_line(exc)}") from None
    expect(
        isinstance(program, torch.export.ExportedProgram),
        f"export_gated() should return torch.export.export(...)'s ExportedProgram, got {type(program).__name__}",
    )
    path = env.build_dir() / "labs" / "02_gated_mlp.pt2"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    reloaded = torch.export.load(str(path))
    reference = graphs.GatedMLP()
    worst = 0.0
    for batch in (3, 11):
        for name, prog in (("exported", program), ("reloaded .pt2", reloaded)):
            try:
                inputs = _branch_inputs(batch, seed=batch)
                worst = max(worst, _parity(prog.module(), reference, inputs, f"the {name} program"))
            except LabCheckFailed:
                raise
            except Exception as exc:
                raise LabCheckFailed(
                    f"the {name} program rejects batch {batch}: {graphs.first_line(exc)}. It was exported from a "
                    f"batch of {example.shape[0]} and accepts only that batch size."
                ) from None
    passed("dynamic-batch export", f"batches 3 and 11, both branches, after a .pt2 round trip (max abs error {worst:.1e})")


def check_scripted_loop(loop_cls) -> None:
    """Your Repeat module scripts with torch.jit.script, keeps a real loop, and matches a Python loop for 1 and 4 steps."""
    module = call(loop_cls, what=f"{getattr(loop_cls, '__name__', 'your class')}()").eval()
    expect(hasattr(module, "cell") and isinstance(module.cell, torch.nn.Linear), "keep the `cell` Linear layer from __init__")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.script is deprecated": lesson 02 explains it
            scripted = torch.jit.script(module)
    except Exception as exc:
        raise LabCheckFailed(
            f"torch.jit.script failed: {graphs.first_line(exc)}. TorchScript compiles a typed subset of Python: the "
            "line it names uses something outside it."
        ) from None
    x = torch.randn(2, module.cell.in_features, generator=torch.Generator().manual_seed(3))
    for steps in (1, 4):
        want = x
        with torch.no_grad():
            for _ in range(steps):
                want = torch.tanh(module.cell(want))
            try:
                got = scripted(x, steps)
            except Exception as exc:
                if _todo_inside(exc):
                    raise LabCheckFailed("Repeat.forward() is not written yet: fill in its TODO and run this cell again.") from None
                raise LabCheckFailed(f"the scripted module failed with steps={steps}: {graphs.first_line(exc)}") from None
        expect(
            isinstance(got, torch.Tensor) and torch.allclose(got, want, atol=ATOL, rtol=RTOL),
            f"with steps={steps} the scripted module's output differs from applying the layer {steps} time(s): "
            f"max abs error {(got - want).abs().max().item() if isinstance(got, torch.Tensor) else 'n/a'}",
        )
    loops = graphs.node_kinds(scripted)["prim::Loop"]
    expect(loops >= 1, "the scripted graph has no prim::Loop: the repetition was compiled as straight-line code, so "
                       "the program cannot repeat a number of times known only when it runs")
    passed("scripted loop", f"steps 1 and 4 match; the graph keeps {loops} prim::Loop")


# ---- section 5: remove the graph breaks ------------------------------------------------------------------------------


def squash_and_center(x: torch.Tensor) -> torch.Tensor:
    """Squash a batch of activations, rescale it by its peak, shift it by half the mean of its positive values and gate
    it (lab 02, section 5): ordinary eager PyTorch that torch.compile captures only in pieces."""
    h = torch.tanh(0.5 * x) + 0.05 * x
    peak = h.abs().max().item()
    if peak > 1.0:
        h = h / peak
    log.debug("peak %.3f", peak)
    h = h - 0.5 * h[h > 0].mean()
    if h.mean() > 0:
        h = torch.relu(h)
    else:
        h = 0.5 * h
    return h * torch.sigmoid(h)


# (scale, shift) of x = scale * randn + shift: one input per pair of branches of squash_and_center, each side with a
# margin (peak 0.7-0.97 or above 1.5; the shifted mean beyond +-0.03), checked in tests/build/test_graphs.py
BREAK_INPUTS = {
    "peak <= 1, mean > 0": (0.4, 0.4),
    "peak <= 1, mean <= 0": (0.4, -0.2),
    "peak > 1, mean > 0": (3.0, 2.0),
    "peak > 1, mean <= 0": (3.0, -1.0),
}
BREAKS_LINE = 2.0  # full mode: the rewrite compiled with inductor vs the original compiled with inductor
BREAKS_BACKEND = {True: "eager", False: "inductor"}  # smoke: Dynamo alone (inductor's C++ builds take ~30 s cold)


def breaks_setup(smoke: bool) -> dict:
    """What check_graph_breaks times in each mode: backend, input shape, rounds and seconds per round. Without
    Inductor (no C++ compiler here) full mode falls back to smoke mode's backend and says so."""
    backend = BREAKS_BACKEND[smoke]
    note = ""
    if backend == "inductor" and not env.has("inductor"):
        backend, note = BREAKS_BACKEND[True], env.capabilities()["inductor"].reason
    return {"backend": backend, "shape": (64, 256) if smoke else (2048, 2048),
            "rounds": 3 if smoke else 7, "min_run_time": 0.05 if smoke else 0.3, "no_inductor": note}


def branch_inputs_for_breaks(shape=(48, 80), seed: int = 7) -> dict[str, torch.Tensor]:
    """Fresh inputs, one per pair of branches of squash_and_center (names in BREAK_INPUTS)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: scale * torch.randn(shape, generator=gen) + shift for name, (scale, shift) in BREAK_INPUTS.items()}


def branches_taken(x: torch.Tensor) -> tuple[bool, bool]:
    """(peak > 1, shifted mean > 0): the two decisions squash_and_center makes on x, taken its own way."""
    h = torch.tanh(0.5 * x) + 0.05 * x
    peak = h.abs().max().item()
    if peak > 1.0:
        h = h / peak
    h = h - 0.5 * h[h > 0].mean()
    return peak > 1.0, bool(h.mean() > 0)


def _breaks_text(found: graphs.GraphBreaks) -> str:
    return "; ".join(f"break {i}: {reason}" for i, reason in enumerate(found.reasons, 1)) or "no break reason given"


def _first_call_s(fn, x) -> tuple[float, torch.Tensor]:
    """The first call of a torch.compile'd function (capture and compile, then the run) and its output."""
    with graphs.quiet_torch_logs(), torch.no_grad():
        t0 = time.perf_counter()
        out = fn(x)
        return time.perf_counter() - t0, out


def check_graph_breaks(fn) -> dict:
    """Your rewrite of squash_and_center: the same results on fresh inputs that take every branch, one graph and no
    break in torch._dynamo.explain on each of them (the original's graphs and breaks are counted in the same run),
    torch.compile(fullgraph=True) accepts it; then both compiled, timed in interleaved rounds. Full mode compiles with
    inductor and judges the gain against BREAKS_LINE; smoke mode uses Dynamo's eager backend (no C++ build), reports
    the gain and judges the rest. Dynamo's settings that would hide a break (capture_scalar_outputs,
    capture_dynamic_output_shape_ops) are kept at their defaults while the check runs."""
    import torch._dynamo

    smoke = env.smoke_default()
    setup = breaks_setup(smoke)
    with torch._dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        return _check_graph_breaks(fn, smoke, setup)


def _check_graph_breaks(fn, smoke: bool, setup: dict) -> dict:
    import torch._dynamo
    from torch._dynamo.utils import counters

    what = f"{getattr(fn, '__name__', 'your function')}(x)"
    worst = 0.0
    for name, x in branch_inputs_for_breaks().items():
        with torch.no_grad():
            want = squash_and_center(x)
            got = call(fn, x.clone(), what=what)
        expect(isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype,
               f"{what} on the input with {name} should return a {want.dtype} tensor of shape {tuple(want.shape)}, "
               f"got {type(got).__name__} {tuple(getattr(got, 'shape', ()))}")
        err = (got - want).abs().max().item()
        expect(torch.allclose(got, want, atol=ATOL, rtol=RTOL),
               f"{what} differs from squash_and_center on a fresh input where {name}: max abs error {err:.2e} (atol "
               f"{ATOL}). That side of the decision computes something else in your function (or your function "
               "always takes one side)")
        worst = max(worst, err)
    example = branch_inputs_for_breaks(setup["shape"], seed=11)["peak > 1, mean <= 0"]
    before = graphs.graph_breaks(squash_and_center, example)
    for name, x in branch_inputs_for_breaks(seed=8).items():
        found = graphs.graph_breaks(fn, x)
        expect(found.graph_count >= 1,
               f"torch._dynamo.explain captured no graph from your function on an input where {name}: Dynamo never "
               "traced it (is it excluded from compilation?)")
        expect(found.graph_count == 1 and found.break_count == 0,
               f"torch._dynamo.explain still finds {found.graph_count} graphs and {found.break_count} graph break(s) "
               f"in your function on an input where {name} (squash_and_center, counted in this run: "
               f"{before.graph_count} graphs, {before.break_count} breaks). {_breaks_text(found)}")
    backend = setup["backend"]
    torch._dynamo.reset()
    counters.clear()
    original_c = torch.compile(squash_and_center, backend=backend)
    try:
        yours_c = torch.compile(fn, backend=backend, fullgraph=True)
        yours_s, got = _first_call_s(yours_c, example)
    except LabCheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - what torch.compile says is what the learner needs
        raise LabCheckFailed(f"torch.compile(your function, fullgraph=True) refused it: {graphs.first_line(exc)}") from None
    original_s, want = _first_call_s(original_c, example)
    cache = (counters["inductor"].get("fxgraph_cache_hit", 0), counters["inductor"].get("fxgraph_cache_miss", 0))
    err = (got - want).abs().max().item()
    expect(torch.allclose(got, want, atol=ATOL, rtol=RTOL),
           f"compiled with fullgraph=True, your function differs from squash_and_center on the timed input: max abs "
           f"error {err:.2e} (atol {ATOL})")
    with torch.no_grad():
        res = bench.compare({"original, compiled": lambda: original_c(example), "yours, compiled": lambda: yours_c(example)},
                            rounds=setup["rounds"], min_run_time=setup["min_run_time"], quiet=True)
    torch._dynamo.reset()
    ratio = res.ratio("yours, compiled")
    rows, cols = example.shape
    print(f"torch._dynamo.explain: squash_and_center {before.graph_count} graphs, {before.break_count} breaks; yours "
          f"1 graph, 0 breaks on all {len(BREAK_INPUTS)} branch inputs (max abs error {max(worst, err):.1e})")
    print(f"backend {backend!r}, input {rows}x{cols} float32: first call (compile) original {original_s:.1f} s, yours "
          f"{yours_s:.1f} s" + (f" (yours compiled first: in a fresh process its time includes inductor's one-time "
                                f"start-up); inductor cache hits, misses {cache}" if backend == "inductor" else "")
          + f"; per call original {res['original, compiled'].median_ms:.3f} ms, yours {res['yours, compiled'].median_ms:.3f} ms")
    if setup["no_inductor"]:  # the line is Inductor's: without it the gain is reported, as in smoke mode
        print(f"no Inductor here ({setup['no_inductor']}): timed with Dynamo's {backend!r} backend, the gain reported, "
              "not judged")
    line = expect_gain("your rewrite, compiled", ratio, "squash_and_center compiled", BREAKS_LINE,
                       "Which kernels does each compiled version run per call, and which intermediate tensors does "
                       "each one write to memory and read back?", smoke=smoke or bool(setup["no_inductor"]))
    passed("graph breaks removed", f"1 graph instead of {before.graph_count}; {line}")
    figure("graph_breaks_speedup", ratio.value, "x")
    return {"graphs_before": before.graph_count, "breaks_before": before.break_count, "speedup": ratio,
            "backend": backend, "compile_s": {"original": original_s, "yours": yours_s}}
