"""fp32 linear layers on the CPU through oneDNN, where no weight gradient is needed.

PyTorch runs an fp32 `F.linear` on the CPU as a BLAS gemm (MKL in the x86 wheels) and a bf16 one through oneDNN.
For the shapes lmprefs runs, oneDNN's fp32 kernel was the faster one on an AMD EPYC: a decode step's projections
(32 rows) in 0.66-0.72 of MKL's time and SmolLM2's LM head in 0.56, a training step's forward and input gradient in
0.81-0.93, GPT-2's Conv1D projections in 0.37-0.91 (docs/results.md, "fp32 linear layers through oneDNN"). So
`use(model)` gives each linear layer (nn.Linear, GPT-2's Conv1D) a forward that, for an fp32 input on the CPU
outside autocast, calls oneDNN's linear; with autograd only while no weight or bias of the layer trains (a frozen
LoRA base, a reference model, sampling), and then its backward computes the input's gradient through oneDNN too.
Everything else (a weight that trains, autocast, a GPU, a compiled graph, a sharded weight) takes the layer's own
forward. The two kernels sum in different orders: outputs agree to float32 rounding (about 1e-7 relative), not
bitwise.
"""

from __future__ import annotations

import functools
import platform
import types
from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor, nn


@functools.cache
def available() -> bool:
    """oneDNN's linear is in this torch build, on an x86 CPU (the CPUs it was measured on)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    return hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _onednn(x: Tensor, a: Tensor, b: Tensor | None) -> Tensor:
    """x [..., in] @ a [out, in]^T + b [out]."""
    return torch.ops.mkldnn._linear_pointwise(x, a, b, "none", [], "")


class _FrozenLinear(torch.autograd.Function):
    """y = x @ a^T + b with a gradient for x only: gx [..., in] = gy [..., out] @ a, also through oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, a: Tensor, b: Tensor | None) -> Tensor:
        ctx.save_for_backward(a)
        return _onednn(x, a, b)

    @staticmethod
    def backward(ctx, gy: Tensor):  # type: ignore[override]
        (a,) = ctx.saved_tensors
        return _onednn(gy, a.t(), None), None, None


@functools.cache
def linear_classes() -> tuple[type[nn.Module], ...]:
    """The linear layers of the models lmprefs loads: nn.Linear, and GPT-2's Conv1D (x @ W + b, W [in, out])."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # a transformers without GPT-2's Conv1D: nothing of that kind to route
        return (nn.Linear,)
    return (nn.Linear, Conv1D)


def _routable(x: Tensor, w: Tensor) -> bool:
    return (x.dtype == torch.float32 and w.dtype == torch.float32 and x.device.type == "cpu"
            and type(w.data) is torch.Tensor and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling())  # fmt: skip


def _forward(self: nn.Module, x: Tensor) -> Tensor:
    w, b = cast(Tensor, self.weight), cast("Tensor | None", self.bias)
    own: Callable[[nn.Module, Tensor], Tensor] = type(self).forward
    if not _routable(x, w):
        return own(self, x)
    grad = torch.is_grad_enabled()
    if grad and (w.requires_grad or (b is not None and b.requires_grad)):
        return own(self, x)
    a = w if isinstance(self, nn.Linear) else w.t()  # Conv1D keeps W [in, out]: y = x @ W + b
    if grad and x.requires_grad:
        return _FrozenLinear.apply(x, a, b)
    return _onednn(x, a, b)


def routed(m: nn.Module) -> bool:
    """Whether `use` gave `m` its forward."""
    f = m.__dict__.get("forward")
    return isinstance(f, types.MethodType) and f.__func__ is _forward


def use(model: nn.Module) -> nn.Module:
    """Give `model`'s linear layers the routed forward (no-op where oneDNN is missing or not on x86). A bound
    method in the instance's dict: copy.deepcopy rebinds it to the copy's layer, and state dicts do not see it."""
    if not available():
        return model
    for m in model.modules():
        if isinstance(m, linear_classes()) and "forward" not in m.__dict__:
            m.forward = types.MethodType(_forward, m)
    return model

