"""fp32 linear layers on the CPU through oneDNN, where no weight gradient is needed and this CPU runs it faster.

PyTorch runs an fp32 `F.linear` on the CPU as a BLAS gemm (MKL in the x86 wheels) and a bf16 one through oneDNN. Which
fp32 kernel is faster depends on the CPU: on one AMD EPYC oneDNN's fp32 linear took under half of MKL's time, on
another nearly as long (docs/results.md, "fp32 linear layers through oneDNN"). So `use(model)` gives each linear layer
(nn.Linear, GPT-2's Conv1D) a forward that, for an fp32 input on the CPU outside autocast, calls oneDNN's linear; with
autograd only while no weight or bias of the layer trains (a frozen LoRA base, a reference model, sampling), and then
its backward computes the input's gradient through oneDNN too. Everything else (a weight that trains, autocast, a GPU,
a compiled graph, a sharded weight) takes the layer's own forward. The two kernels sum in different orders: outputs
agree to float32 rounding (about 1e-7 relative), not bitwise.

It does so only where `chosen()`: LMPREFS_CPU_LINEAR=onednn or torch decides, and auto (the default) routes where
oneDNN took at most `FASTER` of MKL's time on a training-sized projection. oneDNN keeps a kernel with its buffers for
each input shape and takes large scratch buffers while it runs, which costs peak memory (a few hundred MiB in a
quickstart), so a small gain is not worth taking. The measurement is made once per CPU model, torch version and thread
count and kept in the asset cache: a run and its resumption, or two runs compared, compute with the same kernels.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmprefs.assets.cache import cache_dir
from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.runtime.device import cpu_info

ENV = "LMPREFS_CPU_LINEAR"
FASTER = 0.6  # route where oneDNN takes at most this share of MKL's time
PROBE = (512, 576, 1536)  # rows, in, out: an MLP projection of a SmolLM2 training forward


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


def chosen() -> bool:
    """Whether `use` routes: LMPREFS_CPU_LINEAR (environment) onednn or torch, or auto (unset): oneDNN's time over
    MKL's on this machine at most FASTER, measured once and kept in the asset cache's cpu-linear.json."""
    mode = os.environ.get(ENV) or "auto"
    if mode not in ("auto", "onednn", "torch"):
        raise UserError(f"{ENV}={mode!r} (environment): expected auto, onednn or torch")
    if not available() or mode == "torch":
        return False
    return mode == "onednn" or onednn_share() <= FASTER


def onednn_share() -> float:
    """oneDNN's fp32 linear time over F.linear's on PROBE at this process's thread count: from the asset cache's
    cpu-linear.json where this machine's entry is, else measured now and added to it."""
    key = f"{_cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    return _shares(key)


@functools.cache
def _shares(key: str) -> float:
    path = cache_dir() / "cpu-linear.json"
    known = _read(path)
    if key not in known:
        share = round(_measure(), 4)
        known = {**_read(path), key: share}  # read again after measuring: another process may have added its own
        try:
            atomic_write_text(path, json.dumps(known, indent=1, sort_keys=True) + "\n")
        except (OSError, UserError):  # a read-only cache: measured again by the next process
            pass
    return float(known[key])


def _read(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}


def _cpu_model() -> str:
    """The CPU's model name and its AVX-512 extensions: CPUs sold under one name differ (a VM's "AMD EPYC" may be
    any generation)."""
    name, flags = cpu_info()
    return f"{name or platform.machine()} [{','.join(sorted(f for f in flags if f.startswith('avx512')))}]"


def _measure(reps: int = 7) -> float:
    """Best of `reps` interleaved calls of each kernel, after one warm-up of each."""
    g = torch.Generator().manual_seed(0)
    rows, d_in, d_out = PROBE
    x, w = torch.randn(rows, d_in, generator=g), torch.randn(d_out, d_in, generator=g)
    best = {"onednn": math.inf, "torch": math.inf}
    kernels = {"onednn": lambda: _onednn(x, w, None), "torch": lambda: F.linear(x, w)}
    with torch.no_grad():
        for f in kernels.values():
            f()
        for _ in range(reps):
            for name, f in kernels.items():
                t0 = time.perf_counter()
                f()
                best[name] = min(best[name], time.perf_counter() - t0)
    return best["onednn"] / best["torch"]


def use(model: nn.Module) -> nn.Module:
    """Give `model`'s linear layers the routed forward where `chosen()` (a no-op elsewhere, and where oneDNN is
    missing or not on x86). A bound method in the instance's dict: copy.deepcopy rebinds it to the copy's layer, and
    state dicts do not see it."""
    if not chosen():
        return model
    for m in model.modules():
        if isinstance(m, linear_classes()) and "forward" not in m.__dict__:
            m.forward = types.MethodType(_forward, m)
    return model

