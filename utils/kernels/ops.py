"""The fused softmax as a real PyTorch operator, and the older autograd.Function form (lesson 06).

``softmax(x)`` is ``torch.ops.workbook.softmax``: a ``torch.library.custom_op`` over the last dimension. The kernels
are C++ ops already (TORCH_LIBRARY, one namespace per build); the Python custom_op gives them one stable name across
builds and devices, at the price of a Python call per op. (For a C++ kernel PyTorch documents the other way round:
keep the op defined in C++ and register its fake and autograd from Python with torch.library.register_fake /
register_autograd on "<namespace>::softmax_forward"; lesson 06 shows that too. custom_op is meant for kernels written
in Python.) The op has

- a fake (meta) kernel, so torch.compile and torch.export can trace it without running it;
- autograd through ``register_autograd``: the backward is another custom op, ``workbook::softmax_backward``, that
  computes ``y * (g - sum(g * y))`` in C++ (or CUDA);
- the compiled kernels from utils.kernels, built on first use (CPU always; CUDA with a GPU and nvcc).

Importing this module registers the two operators (once per process) and needs torch; building happens on the
first call.
"""

from __future__ import annotations

import torch

from utils import kernels

__all__ = ["softmax", "softmax_backward", "fused_softmax", "autograd_function", "naive_softmax", "extension_for"]


_extensions: dict[str, kernels.Extension] = {}


def extension_for(device: torch.device) -> kernels.Extension:
    """The build that holds kernels for `device`: the CPU build, or the CPU+CUDA build on a GPU (lesson 06).

    Looked up once per process (hashing the sources on every call would cost more than a small softmax); restart
    the kernel after editing softmax.cpp or softmax.cu.
    """
    ext = _extensions.get(device.type)
    if ext is None:
        if device.type == "cpu":
            ext = kernels.build()
        elif device.type == "cuda":
            ext = kernels.build(cuda=True)
        else:
            raise RuntimeError(f"the fused softmax has kernels for cpu and cuda tensors, got a tensor on {device}")
        _extensions[device.type] = ext
    return ext


@torch.library.custom_op("workbook::softmax", mutates_args=())
def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension with the fused C++/CUDA kernel (any strides: non-contiguous input is copied)."""
    return extension_for(x.device).ops.softmax_forward(x.contiguous(), 0)


@softmax.register_fake
def _softmax_fake(x: torch.Tensor) -> torch.Tensor:
    # Shape, dtype and device of the result, no data: what torch.compile and torch.export need to trace the op.
    # The kernel always returns a contiguous tensor, so the fake does too (empty_like would copy x's strides).
    torch._check(x.dim() >= 1, lambda: f"fused softmax needs at least 1 dimension, got {x.dim()}")
    return x.new_empty(x.shape)


@torch.library.custom_op("workbook::softmax_backward", mutates_args=())
def softmax_backward(grad_y: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gradient of softmax over the last dimension: y * (grad_y - sum(grad_y * y, -1))."""
    return extension_for(y.device).ops.softmax_backward(grad_y.contiguous(), y.contiguous())


@softmax_backward.register_fake
def _softmax_backward_fake(grad_y: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch._check(grad_y.shape == y.shape, lambda: f"grad_y {tuple(grad_y.shape)} and y {tuple(y.shape)} differ")
    return y.new_empty(y.shape)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)  # the backward needs y only, not x


def _backward(ctx, grad_y):
    (y,) = ctx.saved_tensors
    return softmax_backward(grad_y, y)


softmax.register_autograd(_backward, setup_context=_setup_context)


def fused_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch.softmax(x, dim) through the fused operator: other dimensions are moved last and back (lesson 06)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fused_softmax expects a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError("fused_softmax needs a tensor with at least 1 dimension, got a 0-d tensor")
    dim = dim % x.dim()
    if dim == x.dim() - 1:
        return softmax(x)
    return softmax(x.movedim(dim, -1)).movedim(-1, dim)


def autograd_function(ext: kernels.Extension) -> type[torch.autograd.Function]:
    """The classic torch.autograd.Function form from the source material, calling `ext`'s kernels (lesson 06).

    It works in eager mode and under gradcheck. Dynamo traces autograd.Function well; what a full-graph compile
    trips on is the raw TORCH_LIBRARY op inside forward(), which has no fake kernel, so compile cannot tell the shape
    of its output. ``torch.library.register_fake("<namespace>::softmax_forward")`` on the raw op fixes it (lesson 06
    shows the error and the fix).
    """
    raw = ext.ops

    class FusedSoftmaxFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = raw.softmax_forward(x.contiguous(), 0)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad_y):
            (y,) = ctx.saved_tensors
            return raw.softmax_backward(grad_y.contiguous(), y)

    return FusedSoftmaxFunction


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """The unfused composite (lesson 06): five PyTorch ops, each a full pass over memory with its own output."""
    m = x.amax(dim=-1, keepdim=True)
    z = x - m
    e = z.exp()
    s = e.sum(dim=-1, keepdim=True)
    return e / s
