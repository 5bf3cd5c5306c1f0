"""Graph capture helpers for lesson 02 (TorchScript, torch.export, torch.compile, tf.function and XLA).

- demo models with data-dependent control flow (``ClipNorm``, ``GatedMLP``), a model full of graph breaks and its
  fixed twin (``NoisyMLP`` / ``CleanMLP``), and a Hugging Face style attention block with an optional mask
  (``TinySelfAttention``);
- ``graph_breaks``: torch._dynamo.explain boiled down to counts and one line per break;
- ``node_kinds`` / ``kind_changes``: node-kind histograms of a TorchScript graph (before and after torch.jit.freeze);
- ``count_retraces``: how many times a tf.function traced its Python body for a list of calls;
- ``read_hlo_dump``: the XLA HLO modules written by ``XLA_FLAGS=--xla_dump_to=...``, before and after optimization
  (``HloModule.fusion_ops`` tells real fusions from single ops XLA wrapped in one);
- ``run_in_fresh_process``: load a saved TorchScript (.pt) or torch.export (.pt2) file in a new Python process that
  never imports this course's code, and bring the output back;
- ``jit_debug_run``: what a debugger sees of a scripted function's error, with TorchScript on and with PYTORCH_JIT=0
  (the program is ``jit_debug.py`` beside this file, ``JIT_DEBUG_PROGRAM``).

This module is only imported by lesson 02 and its lab, so torch is imported at the top; TensorFlow never is.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import logging
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch import nn

__all__ = [
    "ClipNorm",
    "GatedMLP",
    "NoisyMLP",
    "CleanMLP",
    "TinySelfAttention",
    "first_line",
    "quiet_torch_logs",
    "GraphBreaks",
    "graph_breaks",
    "node_kinds",
    "kind_changes",
    "count_retraces",
    "HloModule",
    "parse_hlo",
    "read_hlo_dump",
    "FreshRun",
    "run_in_fresh_process",
    "JIT_DEBUG_PROGRAM",
    "JitDebugRun",
    "jit_debug_run",
]


def _seeded_(module: nn.Module, seed: int) -> None:
    """Re-initialise every Linear of `module` from its own generator, so demo weights never depend on global RNG."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.Linear):
                bound = 1.0 / math.sqrt(sub.in_features)
                sub.weight.uniform_(-bound, bound, generator=gen)
                if sub.bias is not None:
                    sub.bias.uniform_(-bound, bound, generator=gen)


# ---------------------------------------------------------------------------------------------------------------------
# demo models
# ---------------------------------------------------------------------------------------------------------------------


class ClipNorm(nn.Module):
    """A linear layer whose output is rescaled to norm `max_norm` only when it is longer (lesson 02).

    The `if` depends on the *values* of the data, not on shapes: the textbook case where tracing records one branch.
    """

    def __init__(self, dim: int = 4, max_norm: float = 1.0, seed: int = 0):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.max_norm = max_norm
        _seeded_(self, seed)
        self.eval()

    def forward(self, x):
        h = self.lin(x)
        norm = h.norm()
        if norm > self.max_norm:
            h = h * (self.max_norm / norm)
        return h


class _TwoLayerMLP(nn.Module):
    """fc1: dim -> hidden, fc2: hidden -> dim, seeded weights, eval mode; subclasses write forward (lesson 02)."""

    def __init__(self, dim: int, hidden: int, seed: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        _seeded_(self, seed)
        self.eval()


class GatedMLP(_TwoLayerMLP):
    """The lab's model (lab 02): a residual MLP that takes a ReLU path when the input's mean is positive, else tanh."""

    def __init__(self, dim: int = 8, hidden: int = 16, seed: int = 0):
        super().__init__(dim, hidden, seed)

    def forward(self, x):
        if x.mean() > 0:
            return x + self.fc2(torch.relu(self.fc1(x)))
        return x - self.fc2(torch.tanh(self.fc1(x)))


class NoisyMLP(_TwoLayerMLP):
    """An MLP written the eager way, with two graph breaks for torch.compile (lesson 02).

    `.item()` turns a tensor into a Python float (the graph must end to produce it) and `if tensor:` branches in
    Python on a value only known at run time.
    """

    def __init__(self, dim: int = 64, hidden: int = 256, seed: int = 0):
        super().__init__(dim, hidden, seed)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        scale = h.abs().amax().item()  # graph break 1: a tensor leaves the graph as a Python float
        h = h / scale
        if h.mean() > 0.5:  # graph break 2: Python branches on a tensor's value
            h = h * 0.5
        return self.fc2(h)


class CleanMLP(NoisyMLP):
    """NoisyMLP with the same weights and results, rewritten with tensor ops only: no graph break (lesson 02)."""

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = h / h.abs().amax()  # stays a tensor
        h = torch.where(h.mean() > 0.5, h * 0.5, h)  # both sides computed, the mask picks: no Python branch
        return self.fc2(h)


class TinySelfAttention(nn.Module):
    """Multi-head self-attention in the Hugging Face style: `attention_mask` is optional (lesson 02).

    `attention_mask` has shape (batch, seq) with 1 for real tokens and 0 for padding. The `is not None` test is
    control flow that TorchScript's scripting keeps (Optional refinement); tracing would freeze one choice.
    """

    def __init__(self, dim: int = 16, heads: int = 2, seed: int = 0):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim must be divisible by heads, got dim={dim}, heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        _seeded_(self, seed)
        self.eval()

    def forward(self, x: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:  # noqa: UP045 (TorchScript reads the annotation)
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        if attention_mask is not None:
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        context = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(context)


# ---------------------------------------------------------------------------------------------------------------------
# small utilities for stable, readable output
# ---------------------------------------------------------------------------------------------------------------------


def first_line(exc: BaseException) -> str:
    """'ExceptionType: first line of the message' (lesson 02 prints errors this way so they stay stable)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip()


_NOISY_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._dynamo", "torch._export", "torch.export",
                  "torch.utils.cpp_extension")  # the last: 'No CUDA runtime is found' when inductor builds on a CPU


@contextlib.contextmanager
def quiet_torch_logs(level: int = logging.ERROR):
    """Silence torch's export/dynamo warnings and stderr prints inside the block (lesson 02).

    torch.export prints the partial graph of a failed export to stderr; that text is kept and yielded (an
    io.StringIO), so a cell can show the part it wants with stable output.
    """
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(level)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield captured
    finally:
        for lg, old in zip(loggers, saved, strict=True):
            lg.setLevel(old)


# ---------------------------------------------------------------------------------------------------------------------
# torch.compile graph breaks
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphBreaks:
    """What torch._dynamo.explain found: graphs captured, breaks between them and one line per break reason."""

    graph_count: int
    break_count: int
    reasons: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.graph_count} graph(s), {self.break_count} graph break(s)"]
        lines += [f"  break {i}: {reason}" for i, reason in enumerate(self.reasons, 1)]
        return "\n".join(lines)


def graph_breaks(fn, *args, **kwargs) -> GraphBreaks:
    """Run torch._dynamo.explain on `fn(*args, **kwargs)` and summarise the graph breaks (lesson 02).

    Dynamo's caches are reset first, so the result does not depend on what was compiled earlier.
    """
    import torch._dynamo

    if not callable(fn):
        raise TypeError(f"graph_breaks() needs a callable (a function or nn.Module), got {type(fn).__name__}")
    torch._dynamo.reset()
    with quiet_torch_logs(), torch.no_grad():
        explained = torch._dynamo.explain(fn)(*args, **kwargs)
    torch._dynamo.reset()
    reasons = [str(r.reason).strip().splitlines()[0] for r in explained.break_reasons]
    return GraphBreaks(explained.graph_count, explained.graph_break_count, reasons)


# ---------------------------------------------------------------------------------------------------------------------
# TorchScript graphs
# ---------------------------------------------------------------------------------------------------------------------


def node_kinds(graph_or_module) -> collections.Counter:
    """Histogram of node kinds ('aten::conv2d', 'prim::If', ...) in a TorchScript graph, nested blocks included.

    Accepts a ScriptModule (its inlined graph is used, so submodule calls are expanded), a ScriptFunction or a
    torch._C.Graph (lesson 02: what torch.jit.freeze removes).
    """
    if isinstance(graph_or_module, torch._C.Graph):
        graph = graph_or_module
    elif isinstance(graph_or_module, torch.jit.ScriptModule | torch.jit.ScriptFunction):
        graph = graph_or_module.inlined_graph
    else:
        raise TypeError(
            "node_kinds() expects a TorchScript module/function or a torch._C.Graph "
            f"(run torch.jit.script or torch.jit.trace first), got {type(graph_or_module).__name__}"
        )
    counts: collections.Counter = collections.Counter()

    def walk(block) -> None:
        for node in block.nodes():
            counts[node.kind()] += 1
            for inner in node.blocks():
                walk(inner)

    walk(graph)
    return counts


def kind_changes(before: collections.Counter, after: collections.Counter, *, skip=("prim::Constant",)) -> list[tuple[str, int, int]]:
    """(kind, count before, count after) for every node kind whose count changed, largest change first (lesson 02)."""
    kinds = (set(before) | set(after)) - set(skip)
    rows = [(k, before.get(k, 0), after.get(k, 0)) for k in kinds if before.get(k, 0) != after.get(k, 0)]
    return sorted(rows, key=lambda r: (-abs(r[1] - r[2]), r[0]))


# ---------------------------------------------------------------------------------------------------------------------
# TensorFlow
# ---------------------------------------------------------------------------------------------------------------------


def count_retraces(tf_function, calls) -> int:
    """Call a tf.function once per argument tuple in `calls`; return how many new traces that caused (lesson 02)."""
    if not hasattr(tf_function, "experimental_get_tracing_count"):
        raise TypeError(
            f"count_retraces() needs a tf.function (decorate with @tf.function), got {type(tf_function).__name__}"
        )
    before = tf_function.experimental_get_tracing_count()
    for args in calls:
        if not isinstance(args, tuple):
            raise TypeError(f"each call must be a tuple of arguments, got {type(args).__name__}: {args!r:.60}")
        tf_function(*args)
    return tf_function.experimental_get_tracing_count() - before


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[^\s=]+)\s*=\s*(?P<shape>.+?)\s(?P<op>[a-z][a-z0-9-]*)\(")
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%(?P<name>[^\s(]+)\s*\(.*\{\s*$")


@dataclass
class HloModule:
    """One HLO module as text plus, per computation, the opcodes of its instructions (lesson 02)."""

    name: str
    text: str
    entry: str
    computations: dict[str, list[str]]
    fusion_kinds: list[str]  # kind=kLoop / kInput / kOutput / kCustom of each fusion instruction in the entry
    fusion_calls: list[str] = field(default_factory=list)  # the computation each of those fusions calls, same order

    @property
    def entry_ops(self) -> collections.Counter:
        """Opcode histogram of the entry computation (parameters excluded)."""
        return collections.Counter(op for op in self.computations[self.entry] if op != "parameter")

    @property
    def fused_ops(self) -> int:
        """Instructions inside fused computations (what the fusions replaced), parameters excluded."""
        return sum(
            sum(op != "parameter" for op in ops) for name, ops in self.computations.items() if name.startswith("fused")
        )

    @property
    def fusion_ops(self) -> list[list[str]]:
        """Per fusion of the entry (same order as ``fusion_kinds``): the opcodes it runs as one loop, parameters excluded.

        A list of length 1 is a single op that XLA wrapped in a fusion to emit it (XLA:CPU names those ``wrapped_*``):
        nothing was fused there (lesson 02 separates the two when it counts the fusions of a training step).
        """
        return [[op for op in self.computations.get(name, []) if op != "parameter"] for name in self.fusion_calls]


def parse_hlo(text: str) -> HloModule:
    """Parse HLO text (as XLA dumps it) into computations and opcodes (lesson 02)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("HloModule "):
        raise ValueError(f"not HLO text: expected a first line starting with 'HloModule ', got {lines[:1]!r}")
    name = lines[0].split()[1].rstrip(",")
    computations: dict[str, list[str]] = {}
    entry, current, fusion_kinds, fusion_calls = "", None, [], []
    for line in lines[1:]:
        m = _COMPUTATION.match(line)
        if m:
            current = m.group("name")
            computations[current] = []
            if m.group("entry"):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            computations[current].append(m.group("op"))
            if current == entry and m.group("op") == "fusion":
                kind = re.search(r"kind=(k\w+)", line)
                fusion_kinds.append(kind.group(1) if kind else "unknown")
                calls = re.search(r"calls=%([^\s,]+)", line)
                fusion_calls.append(calls.group(1) if calls else "")
    if not entry:
        raise ValueError(f"HLO module {name} has no ENTRY computation")
    return HloModule(name, text, entry, computations, fusion_kinds, fusion_calls)


def read_hlo_dump(dump_dir, contains: str) -> tuple[HloModule, HloModule]:
    """(before optimization, after optimization) HLO of the newest dumped module whose file name has `contains`.

    The files come from ``XLA_FLAGS=--xla_dump_to=<dump_dir>`` (set before TensorFlow initialises XLA) (lesson 02).
    """
    dump_dir = Path(dump_dir)
    if not dump_dir.is_dir():
        raise FileNotFoundError(
            f"{dump_dir} does not exist: set XLA_FLAGS=--xla_dump_to={dump_dir} before TensorFlow starts, then run a "
            "jit_compile=True function"
        )
    before = sorted(p for p in dump_dir.glob(f"*{contains}*before_optimizations.txt"))
    if not before:
        names = sorted(p.name for p in dump_dir.glob("*before_optimizations.txt"))
        raise FileNotFoundError(f"no dumped HLO module in {dump_dir} matches {contains!r}; modules there: {names[:10]}")
    newest = before[-1]
    stem = newest.name.removesuffix("before_optimizations.txt")
    after = sorted(dump_dir.glob(f"{_glob_escape(stem)}*after_optimizations.txt"))
    if not after:
        raise FileNotFoundError(f"{newest.name} has no matching *after_optimizations.txt in {dump_dir}")
    return parse_hlo(newest.read_text()), parse_hlo(after[0].read_text())


def _glob_escape(text: str) -> str:
    """Escape glob wildcards in a literal file name part."""
    return re.sub(r"([*?\[])", r"[\1]", text)


# ---------------------------------------------------------------------------------------------------------------------
# a fresh Python process
# ---------------------------------------------------------------------------------------------------------------------



@dataclass(frozen=True)
class FreshRun:
    """The output of a saved model run in a new process, and what that process had imported of this course."""

    model: str
    output: torch.Tensor
    kind: str
    course_modules: list[str]
    load_and_run_s: float


def run_in_fresh_process(*jobs, timeout: float = 300) -> list[FreshRun]:
    """Load saved models in ONE new Python process and run each on its inputs (lesson 02).

    Each job is ``(model_path, inputs)``: a TorchScript ``.pt`` (torch.jit.load) or torch.export ``.pt2``
    (torch.export.load) file and a tuple of tensors. The child process imports only torch, in isolated mode: no class
    definition from this course or the notebook exists there, which is the point of a serialized graph. Inputs and
    outputs travel through files next to the first model, read back with torch.load(weights_only=True).
    """
    if not jobs:
        raise ValueError("run_in_fresh_process() needs at least one (model_path, inputs) job")
    clean = []
    for job in jobs:
        if not (isinstance(job, tuple) and len(job) == 2):
            raise TypeError(f"each job must be a (model_path, inputs) tuple, got {job!r:.80}")
        path, inputs = Path(job[0]), job[1]
        inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: save the model first (ScriptModule.save or torch.export.save)")
        if path.suffix not in {".pt", ".pt2"}:
            raise ValueError(f"expected a TorchScript .pt or a torch.export .pt2 file, got {path.name!r}")
        if not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
            raise TypeError(f"{path.name}: inputs must be one or more tensors, got {[type(t).__name__ for t in inputs]}")
        clean.append((str(path.resolve()), list(inputs)))
    first = Path(clean[0][0])
    jobs_path, out_path = first.with_name(first.name + ".jobs"), first.with_name(first.name + ".results")
    torch.save(clean, jobs_path)
    out_path.unlink(missing_ok=True)
    # -I: isolated mode, so neither the working directory nor PYTHONPATH can put the notebook's code on sys.path
    proc = subprocess.run(
        [sys.executable, "-I", str(Path(__file__).with_name("fresh_run.py")), str(jobs_path), str(out_path)],
        capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0 or not out_path.is_file():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"the fresh process could not run {[Path(p).name for p, _ in clean]} "
                           f"(exit code {proc.returncode}):\n{tail}")
    data = torch.load(out_path, weights_only=True)
    return [
        FreshRun(Path(path).name, r["out"], r["kind"], list(data["course_modules"]), float(r["seconds"]))
        for (path, _), r in zip(clean, data["results"], strict=True)
    ]


# ---------------------------------------------------------------------------------------------------------------------
# debugging scripted code
# ---------------------------------------------------------------------------------------------------------------------

JIT_DEBUG_PROGRAM = Path(__file__).with_name("jit_debug.py")


@dataclass(frozen=True)
class JitDebugRun:
    """What jit_debug.py saw in one child process (lesson 02): PYTORCH_JIT's value, what torch.jit.script returned,
    whether a good input still worked, the names of the Python frames in the bad input's traceback, the exception."""

    pytorch_jit: str
    scripted_type: str
    is_the_python_function: bool
    good_input_ok: bool
    python_frames: list[str]
    error_type: str
    error_message: str

    def here_line(self) -> str:
        """The source line TorchScript's own traceback marks (the line before its ``<--- HERE``), or ""."""
        lines = self.error_message.splitlines()
        marks = [i for i, line in enumerate(lines) if "<--- HERE" in line]
        return lines[marks[0] - 1].strip() if marks and marks[0] > 0 else ""


def jit_debug_run(pytorch_jit: str, timeout: float = 120) -> JitDebugRun:
    """Run JIT_DEBUG_PROGRAM in a new isolated process with PYTORCH_JIT set to "1" or "0" (lesson 02).

    PYTORCH_JIT=0 is read when torch is imported and turns torch.jit.script into a no-op that hands back the Python
    function, so a debugger (pdb, breakpoint(), an IDE) can stop inside it; with TorchScript on, the function runs in
    the TorchScript interpreter and its frames are not Python frames.
    """
    if pytorch_jit not in {"0", "1"}:
        raise ValueError(f"pytorch_jit must be '0' or '1', got {pytorch_jit!r}")
    child_env = {**os.environ, "PYTORCH_JIT": pytorch_jit}
    # -I: isolated mode (the program imports only torch); -W ignore: no deprecation warning on its stderr
    proc = subprocess.run([sys.executable, "-I", "-W", "ignore", str(JIT_DEBUG_PROGRAM)], env=child_env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise RuntimeError(f"{JIT_DEBUG_PROGRAM.name} with PYTORCH_JIT={pytorch_jit} failed "
                           f"(exit code {proc.returncode}):\n{tail}")
    msg = json.loads(lines[-1])
    error = msg["error"] or {"type": "", "message": ""}
    return JitDebugRun(msg["pytorch_jit"], msg["scripted_type"], msg["is_the_python_function"], msg["good_input_ok"],
                       list(msg["python_frames"]), error["type"], error["message"])
