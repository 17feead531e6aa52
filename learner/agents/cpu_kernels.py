"""CPU kernel workarounds behind the plain layers of ``learner.agents.models``.

Why this module exists: on small CPU hosts the learner's training step is a handful of
small dense layers, and there a few of torch's CPU kernels are far slower than they
need to be (MKL's generic tanh on AMD CPUs, a thin weight-gradient product, a row-wise
log-softmax over a short last dim, a conv input in the slower memory layout). Each class
or function here is a drop-in for the torch op it replaces (same parameters, same results
within float rounding, checkpoints interchangeable), takes the faster path only where it
measured faster, and falls back to torch's own everywhere else (accelerators, other
shapes, no gradient). The networks in ``learner.agents.models`` read as plain torch; the kernel
choices live here.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

ACTION_MAJOR_MAX_ACTIONS = 16
ACTION_MAJOR_MIN_ROWS = 256


def log_softmax_last(logits: torch.Tensor) -> torch.Tensor:
    """``F.log_softmax(logits, -1)``, over an action-major copy when that is faster.

    Why: on the CPU, torch takes a short last dim row by row at a fixed cost per row,
    while along the leading dim of an action-major copy the kernel runs across rows, copy
    included faster for a training batch of few actions. Small batches (inference), wide
    action sets and other devices keep the direct call.
    """
    rows = logits.numel() // max(logits.shape[-1], 1)
    if (
        logits.device.type != "cpu"
        or logits.shape[-1] >= ACTION_MAJOR_MAX_ACTIONS
        or rows < ACTION_MAJOR_MIN_ROWS
    ):
        return F.log_softmax(logits, dim=-1)
    action_major = logits.movedim(-1, 0).contiguous()
    return F.log_softmax(action_major, dim=0).movedim(0, -1)


CHANNELS_LAST_MIN_ROWS = 128
CHANNELS_LAST_MIN_PIXELS = 36 * 36
"""Frames at least this large (the Nature CNN's, not MinAtar's 10x10 grids) take the
channels-last layout in a training-sized batch."""


def conv_input_layout(images: torch.Tensor) -> torch.Tensor:
    """``images`` ``[N, C, H, W]`` in the memory layout the CPU convolutions run fastest on.

    Why: oneDNN trains the strided convolutions of a large-frame encoder markedly faster on
    channels-last input, while small inference batches and small grids run faster on plain
    NCHW (a permuted channels-last observation would otherwise pick the slower path). Other
    devices keep the layout they were given.
    """
    if images.device.type != "cpu":
        return images
    height, width = images.shape[-2:]
    if images.shape[0] >= CHANNELS_LAST_MIN_ROWS and height * width >= CHANNELS_LAST_MIN_PIXELS:
        return images.contiguous(memory_format=torch.channels_last)
    return images.contiguous()


NUMPY_TANH_MARGIN = 2.0
"""How many times faster numpy's tanh must be before :class:`Tanh` uses it: a clear win
only, so machines where the two are close keep torch's kernel on every run."""
NUMPY_TANH_MIN_ELEMENTS = 8192
"""Smaller tensors keep ``torch.tanh``: there the autograd function's own overhead costs
more than MKL's slow kernel."""


@functools.cache
def numpy_tanh_is_faster() -> bool:
    """True when ``np.tanh`` beats ``torch.tanh`` on the CPU by :data:`NUMPY_TANH_MARGIN`.

    Measured once per process (a few milliseconds), on a training-sized float32 block
    with the torch threads in force at the first forward pass.
    """
    x = torch.randn(4096, 64)
    x_np = x.numpy()
    out = torch.empty_like(x)
    out_np = out.numpy()

    def best_of(run) -> float:
        times = []
        for _ in range(5):
            began = time.perf_counter()
            run()
            times.append(time.perf_counter() - began)
        return min(times)

    torch_s = best_of(lambda: torch.tanh(x, out=out))
    numpy_s = best_of(lambda: np.tanh(x_np, out=out_np))
    return numpy_s * NUMPY_TANH_MARGIN < torch_s


class _NumpyTanh(torch.autograd.Function):
    """tanh computed by numpy, differentiated by torch's own ``tanh_backward``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape, dtype=x.dtype)
        np.tanh(x.detach().numpy(), out=y.numpy())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad_y, y)


class Tanh(nn.Tanh):
    """``nn.Tanh`` that takes numpy's kernel for CPU float tensors where it is much faster.

    Why: torch hands a CPU tanh to MKL's VML, and on AMD CPUs MKL runs a generic kernel
    for it (``mkl_vml_kernel_sTanh_EX*``), many times slower than numpy's, which made
    the tanh layers a large share of a training step. Where MKL's kernel is fast (Intel
    CPUs), the tensor is small or on an accelerator, this is ``torch.tanh``. No
    parameters: checkpoints and ``nn.Tanh`` models load into each other.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.float64)
            and x.numel() >= NUMPY_TANH_MIN_ELEMENTS
            and numpy_tanh_is_faster()
        ):
            return _NumpyTanh.apply(x)
        return torch.tanh(x)


class _WideLinear(torch.autograd.Function):
    """``F.linear`` whose weight gradient is computed as ``(input.T @ grad).T``."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y: torch.Tensor):
        x, weight = ctx.saved_tensors
        needs_x, needs_weight, needs_bias = ctx.needs_input_grad
        grad_x = grad_y.mm(weight) if needs_x else None
        grad_weight = x.t().mm(grad_y).t().contiguous() if needs_weight else None
        grad_bias = grad_y.sum(0) if needs_bias else None
        return grad_x, grad_weight, grad_bias


class Linear(nn.Linear):
    """``nn.Linear`` that keeps MKL off its slow kernel for a wide layer's weight gradient.

    Why: autograd computes the ``[out, in]`` weight gradient as ``grad.T @ input``, and
    with few inputs (a CartPole MLP's first layer has 4) MKL runs that thin product
    several times slower than the same numbers as ``(input.T @ grad).T``. So a layer
    with fewer inputs than outputs, training on the CPU, takes that order.
    Everything else (narrow layers, no-grad passes, other devices) is ``nn.Linear``'s own
    path. Same parameters: checkpoints and ``nn.Linear`` models load into each other.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.in_features < self.out_features
            and x.dim() == 2
            and x.device.type == "cpu"
            and torch.is_grad_enabled()
            and self.weight.requires_grad
            and not torch.is_autocast_enabled("cpu")  # its backward assumes one dtype
        ):
            return _WideLinear.apply(x, self.weight, self.bias)
        return super().forward(x)


class _NumpyTanhMLP(torch.autograd.Function):
    """A stack of Linear -> tanh layers as one autograd node, computed with numpy.

    Inputs: ``x``, then each layer's weight and bias. Forward keeps every layer's
    output; backward runs the chain rule over them layer by layer (tanh' = 1 - y^2).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        layers = [
            (w.detach().numpy(), b.detach().numpy())
            for w, b in zip(params[::2], params[1::2], strict=True)
        ]
        outputs = [x.detach().numpy()]
        for weight, bias in layers:
            y = outputs[-1] @ weight.T
            y += bias
            np.tanh(y, out=y)
            outputs.append(y)
        ctx.layers, ctx.outputs = layers, outputs
        return torch.from_numpy(outputs[-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        layers, outputs = ctx.layers, ctx.outputs
        grad = grad_out.numpy()
        grads: list[torch.Tensor | None] = []
        for i in range(len(layers) - 1, -1, -1):
            weight, _ = layers[i]
            x, y = outputs[i], outputs[i + 1]
            slope = y * y  # tanh' = 1 - y^2, formed in place: no temporaries per layer
            np.subtract(1.0, slope, out=slope)
            slope *= grad
            grad = slope
            # The [out, in] weight gradient as (x.T @ grad).T: for a layer with few
            # inputs BLAS runs the thin product much faster in this order.
            grads += [torch.from_numpy(grad.sum(0)), torch.from_numpy((x.T @ grad).T)]
            if i > 0 or ctx.needs_input_grad[0]:
                grad = grad @ weight
        grad_x = torch.from_numpy(grad) if ctx.needs_input_grad[0] else None
        return (grad_x, *grads[::-1])


class TanhMLP(nn.Sequential):
    """``nn.Sequential`` of (Linear, Tanh) pairs whose training pass is one numpy node.

    Why: a CartPole-sized MLP trains on a thousand-odd rows, where each layer's matmul
    and tanh take tens of microseconds and torch's per-module, per-op and per-node
    overhead as much again; computed in numpy as one autograd node, forward and backward
    cost about their arithmetic. Taken on the CPU in float32 with gradients on; anything
    else (inference, autocast, other devices) runs the layers one by one. Same modules
    and parameters: checkpoints and ``nn.Sequential`` MLPs load into each other.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.dim() == 2
            and x.device.type == "cpu"
            and x.dtype == torch.float32
            and torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
        ):
            params = self._layer_params()
            if params is not None:
                return _NumpyTanhMLP.apply(x.contiguous(), *params)
        return super().forward(x)

    def _layer_params(self) -> list[torch.Tensor] | None:
        """Weight and bias of each (Linear, Tanh) pair, or None if it is not such a stack."""
        modules = list(self)
        params: list[torch.Tensor] = []
        for linear, activation in zip(modules[::2], modules[1::2], strict=False):
            if not isinstance(linear, nn.Linear) or linear.bias is None:
                return None
            if not isinstance(activation, nn.Tanh):
                return None
            if linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu":
                return None
            params += [linear.weight, linear.bias]
        return params if params and len(modules) == len(params) else None
