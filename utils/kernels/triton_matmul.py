"""A tiled matrix multiply in the Triton language, and the bytes its programs load from global memory, counted in
Triton's interpreter (lesson 06: why tiles).

``matmul_kernel`` gives each program a ``TILE x TILE`` block of C. It walks K in steps of ``BK``: a ``TILE x BK``
tile of A and a ``BK x TILE`` tile of B per step, each loaded once and used ``TILE`` times by ``tl.dot``. With
``TILE = 1`` the same kernel is the untiled product: one program per element of C, reading a row of A and a column
of B, every value used once. For M x K times K x N in fp32 a program loads ``4 * K * 2 * TILE`` bytes and there are
``(M / TILE) * (N / TILE)`` programs: ``8 * M * N * K / TILE`` bytes in all, so tiles of 16 ask global memory for
1/16 of the untiled bytes.

``count_loads()`` checks that arithmetic against the kernel as it runs: inside it, every ``tl.load`` the interpreter
executes adds the bytes of its unmasked lanes to the count of the program that issued it. What it counts is what
the programs *request* from global memory. On a GPU some of those requests hit in L2 (a tile that a neighbouring
program loaded a moment ago), so DRAM sees less than this count, and more for the untiled kernel than the count
suggests it saves. The count is the reuse argument, not a profile. ``count_loads`` wraps the interpreter's load
(``triton.runtime.interpreter.interpreter_builder.create_masked_load``), an internal of triton 3.x.

Wrapper: ``matmul(a, b, tile=16, block_k=16)``: CPU tensors run in the interpreter, CUDA tensors compiled (see
utils.kernels.triton_softmax for how that is chosen; the compiler has shape rules of its own for ``tl.dot`` that the
interpreter does not apply, e.g. K of at least 8 for float32 in triton 3.8).
"""

import collections
import contextlib

import torch
import triton
import triton.language as tl

from utils.kernels.triton_softmax import interpreted, runs_in

__all__ = ["matmul_kernel", "matmul", "watch_loads", "count_loads", "predicted_load_bytes"]


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  TILE: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * TILE + tl.arange(0, TILE)  # this program's TILE rows of C...
    rn = tl.program_id(1) * TILE + tl.arange(0, TILE)  # ...and TILE columns
    rk = tl.arange(0, BK)
    acc = tl.zeros((TILE, TILE), dtype=tl.float32)
    for k in range(0, K, BK):  # K in steps of BK: one tile of A and one of B per step, each loaded once
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)  # TILE x BK
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)  # BK x TILE
        acc += tl.dot(a, b, input_precision="ieee")  # every value of a is used TILE times, every value of b too
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, *, tile: int = 16, block_k: int = 16) -> torch.Tensor:
    """a @ b (float32, 2-d) with ``matmul_kernel`` at `tile` x `tile` blocks of C and K steps of `block_k`."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 2:
            got = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"matmul: expected {name} a 2-d float32 tensor, got {got}")
    if a.shape[1] != b.shape[0] or a.device != b.device:
        raise ValueError(f"matmul: expected (M, K) @ (K, N) on one device, got {tuple(a.shape)} on {a.device} @ "
                         f"{tuple(b.shape)} on {b.device}")
    for name, v in (("tile", tile), ("block_k", block_k)):
        if not isinstance(v, int) or v < 1 or v & (v - 1):
            raise ValueError(f"matmul: {name} must be a power of two >= 1, got {v!r}")
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, dtype=torch.float32, device=a.device)
    if m and n:
        kernel = matmul_kernel if runs_in(a) == "compiled" else interpreted(matmul_kernel)
        kernel[(triton.cdiv(m, tile), triton.cdiv(n, tile))](
            a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            TILE=tile, BK=block_k)
    return c


def predicted_load_bytes(m: int, n: int, k: int, tile: int, itemsize: int = 4) -> int:
    """Bytes all programs of ``matmul_kernel`` load when `tile` divides m and n: 2 * K * tile values per program,
    (m / tile) * (n / tile) programs (the arithmetic count_loads checks)."""
    return (m // tile) * (n // tile) * 2 * k * tile * itemsize


@contextlib.contextmanager
def watch_loads(on_load, who: str = "watch_loads"):
    """Inside the block, call ``on_load(ptrs, mask, grid_idx)`` before every ``tl.load`` an interpreted kernel runs
    (``TRITON_INTERPRET=1``): the one hook behind ``count_loads`` here and lab 06's read count. `who` names the caller
    in the error raised when the interpreter has no such hook, or another watch is already running."""
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    original = getattr(builder, "create_masked_load", None)
    if original is None or "create_masked_load" in vars(builder):
        raise RuntimeError(f"{who} needs triton 3.x's interpreter (interpreter_builder.create_masked_load); "
                           f"triton {triton.__version__} has none, or a count is already running")

    def watched_load(ptrs, mask, other, *args, **kwargs):
        on_load(ptrs, mask, builder.grid_idx)
        return original(ptrs, mask, other, *args, **kwargs)

    builder.create_masked_load = watched_load  # an instance attribute: tl.load's path looks it up first
    try:
        yield
    finally:
        del builder.create_masked_load


@contextlib.contextmanager
def count_loads():
    """Inside the block, count the bytes each ``tl.load`` of an interpreted kernel fetches (its unmasked lanes x the
    element size), per program: yields a Counter {(pid0, pid1, pid2): bytes} that fills as kernels run."""
    counts: collections.Counter = collections.Counter()

    def count(ptrs, mask, grid_idx):
        counts[grid_idx] += int(mask.data.sum()) * (ptrs.get_element_ty().primitive_bitwidth // 8)

    with watch_loads(count, "count_loads"):
        yield counts
