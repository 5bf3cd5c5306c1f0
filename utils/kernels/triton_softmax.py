"""The fused row softmax in the Triton language (lesson 06): compiled on a CUDA GPU, interpreted on CPU tensors.

Three kernels, each a plain ``@triton.jit`` function that lesson 06 prints with inspect.getsource:

- ``softmax_kernel``: one program per row; the whole row is one block of ``BLOCK`` lanes (the next power of two
  >= n), the lanes past the row's end masked off and loaded as -inf, so that they add exp(-inf) = 0 to the sum;
- ``softmax_rows_kernel``: ``ROWS`` rows per program, a 2-D ``[ROWS, BLOCK]`` block, for short rows (one program
  per 64-float row would leave most of its lanes idle);
- ``softmax_looped_kernel``: one program per row, for rows longer than one block: a first loop over the row in
  ``BLOCK`` chunks keeps a running (max, sum) merged chunk by chunk with lesson 06's rule, a second loop writes.

Each has a Python wrapper (``softmax_row``, ``softmax_rows``, ``softmax_looped``) that checks the input, picks the
block, and launches the grid. Math is fp32 for fp16/bf16 inputs; the output has the input's dtype.

Interpreter or compiled, per call, by the tensor's device. Triton's compiler targets GPUs only: a CPU tensor runs
in Triton's interpreter (what ``TRITON_INTERPRET=1`` switches on: every program of the grid is run in turn, its
block operations done by NumPy), a CUDA tensor runs the compiled kernel. The environment variable is no switch for
a running process: ``@triton.jit`` reads it when it decorates, so triton's own library functions (``tl.max`` and
``tl.sum`` are @triton.jit functions) were fixed when triton was imported, perhaps by torch.compile long before
this module, and setting it would also change every later ``@triton.jit`` in the process. So this module never sets
it: ``interpreted(kernel)`` runs the same Python function in Triton's interpreter and routes the library functions
it calls there too, for the duration of the launch only. ``TRITON_INTERPRET=1`` set by you before triton's import
is honoured: the kernels are then interpreted on CUDA tensors too.

``compile_for_gpu`` runs the other half without a GPU: Triton's compiler and the ptxas shipped with triton build a
kernel for a named NVIDIA GPU and report its registers per thread and spills, which the interpreter cannot see.

Nothing here runs at import time but the decorators (triton must be installed; torch's CUDA builds on Linux ship it).
No ``from __future__ import annotations`` here: the kernels' ``tl.constexpr`` annotations are read by triton.
"""

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
import time

import numpy
import torch
import triton
import triton.language as tl

__all__ = ["DTYPES", "MAX_ROW_BLOCK", "softmax_kernel", "softmax_rows_kernel", "softmax_looped_kernel",
           "softmax_row", "softmax_rows", "softmax_looped", "Interpreted", "interpreted", "runs_in", "KERNELS",
           "GpuCompile", "compile_for_gpu"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The row kernels hold a whole row in one block, in registers on a GPU: at 2**15 float32 lanes and 16 warps that is
# 128 registers per thread (ptxas, sm_90), at 2**16 it spills. Longer rows: softmax_looped.
MAX_ROW_BLOCK = 2**15


@triton.jit
def softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # this program's row (int64: row * stride may pass 2**31)
    cols = tl.arange(0, BLOCK)  # BLOCK lanes, a power of two >= n_cols
    mask = cols < n_cols  # lanes past the row's end
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)  # fp32 math for fp16/bf16 inputs
    m = tl.max(x, axis=0)  # a masked lane holds -inf: it never wins the max...
    e = tl.exp(x - m)  # ...and adds exp(-inf) = 0 to the sum
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_rows_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_rows, n_cols,
                        ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # ROWS rows per program
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)  # a [ROWS, BLOCK] tile: last rows and last lanes
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    m = tl.max(x, axis=1)  # one max per row
    e = tl.exp(x - m[:, None])
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_looped_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK)
    m = -float("inf")  # running max of the row so far
    s = 0.0  # running sum of exp(x - m)
    for start in range(0, n_cols, BLOCK):  # pass 1: read each chunk once, merge its (max, sum) into (m, s)
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # the merge rule; while the row has seen only -inf, measure against 0 so that s stays 0, not exp(NaN)
        ref = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref), axis=0)
        m = m_new
    for start in range(0, n_cols, BLOCK):  # pass 2: read again, write exp(x - m) / s
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_row + start + cols, (tl.exp(x - m) / s).to(y_ptr.dtype.element_ty), mask=mask)


KERNELS = {"row": softmax_kernel, "rows": softmax_rows_kernel, "looped": softmax_looped_kernel}

_interpreted: dict = {}


class Interpreted:
    """A kernel run by Triton's interpreter, launched like the compiled one: ``kernel[grid](*args, **meta)``."""

    def __init__(self, fn):
        from triton.runtime.interpreter import InterpretedFunction

        self.fn = fn
        self._run = InterpretedFunction(fn)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            # -inf - (-inf) is NaN on purpose in a fully masked row (as in torch): no NumPy warning for it
            with _library_calls_interpreted(), numpy.errstate(invalid="ignore"):
                return self._run[grid](*args, **kwargs)

        return launch


def interpreted(kernel) -> Interpreted:
    """The same kernel, run by Triton's interpreter (lesson 06): give it a @triton.jit kernel or a plain function.

    The interpreter runs the programs of a grid one after another, each block operation in NumPy, on tensors in
    host memory (CUDA tensors are copied to the host and back). It checks indexing, masks and numerics; it says
    nothing about speed, and since programs never run at the same time it cannot show a race between them.
    """
    if isinstance(kernel, Interpreted):
        return kernel
    fn = getattr(kernel, "fn", kernel)  # a JITFunction (or InterpretedFunction) keeps the Python function in .fn
    if not callable(fn):
        raise TypeError(f"expected a @triton.jit kernel or a Python function, got {type(kernel).__name__}")
    if fn not in _interpreted:
        _interpreted[fn] = Interpreted(fn)
    return _interpreted[fn]


@contextlib.contextmanager
def _library_calls_interpreted():
    """While an interpreted kernel runs, let it call triton's own @triton.jit functions (tl.max and tl.sum are such
    functions in triton.language.standard) as the interpreter calls device functions.

    Under TRITON_INTERPRET=1 set before triton is imported, triton itself makes them interpreted functions. Here
    triton may have been imported in compiled mode (by torch.compile, say), so a call to one of them is routed to
    the interpreter for the duration of the launch, and every patch the interpreter makes for it is undone when it
    returns: compiled kernels launched later in the process see triton.language as it was.

    Also, older interpreters (triton 3.6) turn a loop bound such as ``range(0, n_cols, BLOCK)`` into a Python int
    with ``int()`` of a one-element array, which NumPy 2.5 refuses; triton 3.8 reshapes it to a scalar first, and so
    does this context, for the kernels it runs.
    """
    from triton.runtime import interpreter, jit

    original_call, original_patch = jit.JITFunction.__call__, interpreter._patch_lang_tensor
    if getattr(original_call, "_wb_interpreted", False):  # already inside a launch
        yield
        return

    def device_call(self, *args, **kwargs):
        scope = interpreter._patch_lang(self.fn)
        try:
            return interpreted(self)._run.rewrite()(*args, **kwargs)
        finally:
            scope.restore()

    def patch_lang_tensor(tensor, scope):
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

    device_call._wb_interpreted = True
    jit.JITFunction.__call__, interpreter._patch_lang_tensor = device_call, patch_lang_tensor
    try:
        yield
    finally:
        jit.JITFunction.__call__, interpreter._patch_lang_tensor = original_call, original_patch


def _interpret_forced() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in {"1", "true", "on", "yes"}


def runs_in(x: torch.Tensor) -> str:
    """"interpreter" or "compiled": how the wrappers run a kernel on `x` (lesson 06)."""
    return "compiled" if x.device.type == "cuda" and not _interpret_forced() else "interpreter"


def _launch(kernel, grid, x: torch.Tensor, *args, **meta) -> None:
    fn = kernel if runs_in(x) == "compiled" else interpreted(kernel)
    fn[grid](*args, **meta)


def _num_warps(block: int) -> int:
    """Warps per program for a block of `block` lanes (Triton's softmax tutorial: more warps for longer rows)."""
    return 4 if block < 2048 else 8 if block < 8192 else 16


def _rows_view(x, out, what: str):
    """Check x (and out) and return (x as 2-d, out as 2-d, the shape to return): rows may be strided, a row's
    elements must be contiguous."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"{what}: expected float32, float16 or bfloat16, got {x.dtype}; convert with .float()")
    if x.dim() not in (1, 2):
        raise ValueError(f"{what}: expected a 1-d row or a 2-d (rows, n) tensor, got shape {tuple(x.shape)}; "
                         "softmax over the last dimension of more dimensions: x.reshape(-1, x.shape[-1])")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: expected a CPU tensor (interpreter) or a CUDA tensor (compiled), got {x.device}")
    x2 = x.unsqueeze(0) if x.dim() == 1 else x
    if x2.shape[1] > 1 and x2.stride(1) != 1:
        raise ValueError(f"{what}: expected each row contiguous (stride 1 along the last dimension), got strides "
                         f"{tuple(x.stride())}; rows may be strided, elements within a row may not: pass "
                         "x.contiguous()")
    if out is None:
        out2 = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    else:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{what}: out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
            raise ValueError(f"{what}: out must match x: expected {tuple(x.shape)} {x.dtype} on {x.device}, got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}")
        out2 = out.unsqueeze(0) if out.dim() == 1 else out
        if (out2.shape[1] > 1 and out2.stride(1) != 1) or (out2.shape[0] > 1 and out2.stride(0) < out2.shape[1]):
            raise ValueError(f"{what}: out must have contiguous, non-overlapping rows, got strides {tuple(out.stride())}")
    return x2, out2


def _block(n: int, what: str) -> int:
    block = triton.next_power_of_2(n)
    if block > MAX_ROW_BLOCK:
        raise ValueError(f"{what}: a row of {n} needs a block of {block} lanes, more than MAX_ROW_BLOCK="
                         f"{MAX_ROW_BLOCK}; use softmax_looped, which walks long rows in chunks")
    return block


def softmax_row(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dimension with ``softmax_kernel``, one program per row (lesson 06)."""
    x2, y2 = _rows_view(x, out, "softmax_row")
    rows, n = x2.shape
    if rows and n:
        block = _block(n, "softmax_row")
        _launch(softmax_kernel, (rows,), x, x2, y2, x2.stride(0), y2.stride(0), n, BLOCK=block,
                num_warps=_num_warps(block))
    return y2.view(x.shape) if out is None else out


def softmax_rows(x: torch.Tensor, out: torch.Tensor | None = None, *, rows_per_program: int | None = None) -> torch.Tensor:
    """Softmax over the last dimension with ``softmax_rows_kernel``, several rows per program (lesson 06).

    `rows_per_program` must be a power of two; the default packs rows until a program holds about 4096 lanes.
    """
    x2, y2 = _rows_view(x, out, "softmax_rows")
    rows, n = x2.shape
    if rows_per_program is None:
        rows_per_program = max(1, min(64, 4096 // triton.next_power_of_2(max(n, 1))))
    if not isinstance(rows_per_program, int) or rows_per_program < 1 or rows_per_program & (rows_per_program - 1):
        raise ValueError(f"softmax_rows: rows_per_program must be a power of two >= 1, got {rows_per_program!r}")
    if rows and n:
        block = _block(n, "softmax_rows")
        if rows_per_program * block > MAX_ROW_BLOCK:
            raise ValueError(f"softmax_rows: {rows_per_program} rows x {block} lanes is more than MAX_ROW_BLOCK="
                             f"{MAX_ROW_BLOCK} lanes per program; pass fewer rows_per_program")
        grid = (triton.cdiv(rows, rows_per_program),)
        _launch(softmax_rows_kernel, grid, x, x2, y2, x2.stride(0), y2.stride(0), rows, n, ROWS=rows_per_program,
                BLOCK=block, num_warps=_num_warps(rows_per_program * block))
    return y2.view(x.shape) if out is None else out


def softmax_looped(x: torch.Tensor, out: torch.Tensor | None = None, *, block: int | None = None) -> torch.Tensor:
    """Softmax over the last dimension with ``softmax_looped_kernel``: rows walked in chunks of `block` lanes,
    (max, sum) merged online, then a second pass writes (lesson 06). `block`: a power of two, default
    min(4096, next power of two >= n)."""
    x2, y2 = _rows_view(x, out, "softmax_looped")
    rows, n = x2.shape
    if block is None:
        block = min(4096, triton.next_power_of_2(max(n, 1)))
    if not isinstance(block, int) or block < 1 or block & (block - 1) or block > MAX_ROW_BLOCK:
        raise ValueError(f"softmax_looped: block must be a power of two between 1 and {MAX_ROW_BLOCK}, got {block!r}")
    if rows and n:
        _launch(softmax_looped_kernel, (rows,), x, x2, y2, x2.stride(0), y2.stride(0), n, BLOCK=block,
                num_warps=_num_warps(block))
    return y2.view(x.shape) if out is None else out


@dataclasses.dataclass
class GpuCompile:
    """What Triton's compiler and ptxas made of one kernel for an NVIDIA GPU (lesson 06)."""

    kernel: str
    block: int
    num_warps: int
    target: str
    seconds: float
    registers: int | None  # per thread, from ptxas -v
    spill_bytes: int | None  # spill stores, from ptxas -v
    ptx: str

    def __str__(self) -> str:
        return (f"{self.kernel} BLOCK={self.block}, {self.num_warps} warps, {self.target}: {self.registers} registers "
                f"per thread, {self.spill_bytes} bytes spilled ({self.seconds:.1f} s)")


def compile_for_gpu(variant: str = "row", *, block: int = 1024, dtype: torch.dtype = torch.float32,
                    rows_per_program: int = 4, num_warps: int | None = None, arch: int = 90) -> GpuCompile:
    """Compile one of KERNELS (``"row"``, ``"rows"``, ``"looped"``) for an NVIDIA GPU of compute capability `arch`
    with Triton's own compiler, then run the ptxas that ships with triton on its PTX for the registers per thread and
    the spills: no GPU needed (lesson 06). The interpreter cannot see any of this; a kernel the compiler rejects
    raises here (triton.compiler.errors.CompilationError)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if variant not in KERNELS:
        raise ValueError(f"variant must be one of {sorted(KERNELS)}, got {variant!r}")
    if dtype not in DTYPES:
        raise TypeError(f"dtype must be one of {DTYPES}, got {dtype}")
    if _interpret_forced():
        raise RuntimeError("TRITON_INTERPRET=1 is set: this process runs triton.language in its interpreter, and the "
                           "interpreter's patches stay in place; compile in a process started without it")
    kernel = KERNELS[variant]
    element = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    constexprs = {"BLOCK": block, "ROWS": rows_per_program}
    signature = {p.name: "constexpr" if p.is_constexpr else "i32" for p in kernel.params}
    signature.update(x_ptr=f"*{element}", y_ptr=f"*{element}")
    warps = num_warps or _num_warps(block * (rows_per_program if variant == "rows" else 1))
    t0 = time.perf_counter()
    compiled = triton.compile(ASTSource(kernel, signature, constexprs={k: v for k, v in constexprs.items()
                                                                       if signature.get(k) == "constexpr"}),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})
    ptx = compiled.asm["ptx"]
    target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
    with tempfile.TemporaryDirectory() as folder:  # Triton ran ptxas too, but keeps its report only when asked
        path = os.path.join(folder, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        log = subprocess.run([triton.knobs.nvidia.ptxas.path, "-v", f"--gpu-name={target}", path, "-o", path + ".o"],
                             capture_output=True, text=True, timeout=300)
    text = log.stdout + log.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores", text)
    return GpuCompile(kernel.fn.__name__, block, warps, target, time.perf_counter() - t0,
                      int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else None, ptx)
