"""Frozen weights cast to the autocast dtype once for a decode loop, not at every step.

Autocast caches its casts only for leaf tensors that require grad, so under bf16 autocast every frozen weight (a LoRA
base, a reference model) is cast from fp32 again in each forward: once per token when sampling. On a CPU those casts
read and write more bytes than the decode step's matmuls compute with (measured in docs/results.md). `precast`
gives each frozen linear layer a forward that uses a copy made on entry; autocast would have cast the weight to the
same values, so the results are bitwise the same. Embeddings stay as they are (autocast does not cast a lookup),
and so does a weight that trains, which autocast caches itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


def _conv1d_class():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # a transformers without GPT-2's Conv1D: nothing of that kind to cast
        return None
    return Conv1D


def _frozen_linears(model: nn.Module) -> Iterator[tuple[nn.Module, torch.Tensor]]:
    """(layer, weight) of the linear layers (nn.Linear, GPT-2's Conv1D) whose weight is a plain frozen tensor and
    whose forward is the class's own (hooks of other libraries that replace it are left alone)."""
    kinds = tuple(k for k in (nn.Linear, _conv1d_class()) if k is not None)
    for m in model.modules():
        w = getattr(m, "weight", None)
        if not isinstance(m, kinds) or not isinstance(w, torch.Tensor) or "forward" in m.__dict__:
            continue
        if not w.requires_grad and type(w.data) is torch.Tensor:  # not a sharded DTensor
            yield m, w


def _forward_with(m: nn.Module, w: torch.Tensor):
    if isinstance(m, nn.Linear):
        return lambda x: F.linear(x, w, m.bias)

    def conv1d(x):  # GPT-2's Conv1D: x @ W + b with W [in, out]
        return torch.addmm(m.bias, x.view(-1, x.size(-1)), w).view(*x.shape[:-1], w.shape[1])

    return conv1d


@contextlib.contextmanager
def precast(model: nn.Module, device_type: str):
    """Within it, frozen linear weights of `model` are used as copies in the autocast dtype of `device_type`; a no-op
    when autocast is off there."""
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    dtype = torch.get_autocast_dtype(device_type)
    patched = []
    try:
        for m, w in _frozen_linears(model):
            # an instance attribute: Module.__call__ finds it before the class's forward
            m.__dict__["forward"] = _forward_with(m, w.detach().to(dtype))
            patched.append(m)
        yield
    finally:
        for m in patched:
            del m.__dict__["forward"]
