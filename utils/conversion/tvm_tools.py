"""Lesson 04, Apache TVM (section 4, "A compiler, not a runtime"): plumbing around the compiler calls the lesson shows.

The notebook itself calls ``tvm.relax.frontend.onnx.from_onnx``, ``relax.get_pipeline("zero")``, ``tvm.compile``,
``relax.VirtualMachine`` and ``tvm.s_tir.Schedule``. These helpers only look at what came out (the Relax operators,
the TensorIR functions and their loop kinds), cut one TensorIR function out as a module of its own, and make seeded
arguments for it. tvm is imported inside the functions: importing this module never needs it.
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["relax_op_histogram", "prim_functions", "loop_kinds", "single_function", "random_arguments",
           "tuning_target"]


def _require_module(mod):
    import tvm

    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"expected a tvm.IRModule (what from_onnx or a relax pipeline returns), got {type(mod).__name__}")


def relax_op_histogram(mod, func: str = "main") -> Counter:
    """{Relax operator name: calls} in `mod[func]`, e.g. {'relax.nn.conv2d': 20, ...} after from_onnx (lesson 04)."""
    import tvm
    from tvm import relax

    _require_module(mod)
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if func not in names:
        raise KeyError(f"function {func!r} is not in the module; it has {sorted(names)}")
    ops: Counter = Counter()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            ops[expr.op.name] += 1

    relax.analysis.post_order_visit(mod[func], visit)
    return ops


def prim_functions(mod) -> dict:
    """{name: tirx.PrimFunc} of every TensorIR function in `mod` (after legalization and fusion) (lesson 04)."""
    from tvm import tirx

    _require_module(mod)
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


_LOOP_KINDS = {"parallel": r"T\.parallel\(", "vectorized": r"T\.vectorized\(", "unrolled": r"T\.unroll\("}


def loop_kinds(mod) -> dict[str, int]:
    """How many loops of each annotated kind the printed TensorIR of `mod` has: parallel, vectorized, unrolled.

    Counted in ``mod.script()``, the text the lesson prints: a schedule changes these, the legalized ops have none.
    """
    _require_module(mod)
    text = mod.script()
    return {kind: len(re.findall(pattern, text)) for kind, pattern in _LOOP_KINDS.items()}


def single_function(mod, name: str):
    """A new IRModule whose only function, ``main``, is the TensorIR function `name` of `mod` (lesson 04)."""
    import tvm

    funcs = prim_functions(mod)
    if name not in funcs:
        raise KeyError(f"no TensorIR function {name!r}; the module has {sorted(funcs)}")
    return tvm.IRModule({"main": funcs[name].with_attr("global_symbol", "main")})


def random_arguments(func, seed: int = 0) -> list:
    """Seeded float32 tvm tensors (standard normal) for every buffer parameter of a TensorIR function, in order.

    The last one is the output buffer; its initial values are overwritten by the call.
    """
    import numpy as np
    import tvm
    from tvm import tirx

    if isinstance(func, tvm.IRModule):
        func = func["main"]
    if not isinstance(func, tirx.PrimFunc):
        raise TypeError(f"expected a tirx.PrimFunc or a module with one 'main', got {type(func).__name__}")
    rng = np.random.default_rng(seed)
    args = []
    for p in func.params:
        if not isinstance(p, tirx.Buffer):
            raise TypeError(f"parameter {p} of the function is a scalar, not a buffer; this helper makes tensors only")
        shape = [int(d) for d in p.shape]
        args.append(tvm.runtime.tensor(rng.standard_normal(shape).astype(str(p.dtype))))
    return args


def tuning_target(target, cores: int):
    """The same LLVM target with ``num-cores`` set, which MetaSchedule needs to plan parallel loops (lesson 04)."""
    import tvm

    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    config = {k: v for k, v in target.export().items() if k in ("kind", "mtriple", "mcpu", "mattr")}
    if config.get("kind") != "llvm":
        raise ValueError(f"tuning_target is for CPU (llvm) targets, got {config.get('kind')!r}")
    return tvm.target.Target({**config, "num-cores": int(cores)})
