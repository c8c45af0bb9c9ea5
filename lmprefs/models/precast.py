"""Frozen weights cast to the autocast dtype once for a decode loop, not at every step.

Autocast caches its casts only for leaf tensors that require grad, so under bf16 autocast every frozen weight (a LoRA
base, a reference model) is cast from fp32 again in each forward: once per token when sampling. On a CPU those casts
read and write more bytes than the decode step's matmuls compute with (measured in docs/results.md). `precast`
gives each frozen linear layer a forward that uses a copy made on entry; autocast would have cast the weight to the
same values, so the results are bitwise the same. Embeddings stay as they are (autocast does not cast a lookup),
and so does a weight that trains, which autocast caches itself.

Without autograd (sampling), the norm in front of a block's attention and the one in front of its MLP also return
their output in the autocast dtype: it feeds only that sublayer's input projections (q, k and v; gate and up; GPT-2's
c_attn; c_fc), which autocast would cast to the same values one by one. With autograd the projections' gradients
would then be summed in that dtype instead of fp32, so it is left alone there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from lmprefs.models import cpu_linear
from lmprefs.models.cpu_linear import linear_classes
from lmprefs.models.flops import LLAMA_LIKE
from lmprefs.models.loading import trunk_blocks

# model_type -> the block norms whose output feeds only input projections, for the trunks whose blocks are known
BLOCK_NORMS: dict[str, tuple[str, str]] = {
    "gpt2": ("ln_1", "ln_2"),
    **dict.fromkeys(LLAMA_LIKE, ("input_layernorm", "post_attention_layernorm")),
}


def _frozen_linears(model: nn.Module) -> Iterator[tuple[nn.Module, torch.Tensor]]:
    """(layer, weight) of the linear layers (nn.Linear, GPT-2's Conv1D) whose weight is a plain frozen tensor and
    whose forward is the class's own or `cpu_linear`'s (hooks of other libraries that replace it are left alone)."""
    for m in model.modules():
        w = getattr(m, "weight", None)
        if not isinstance(m, linear_classes()) or not isinstance(w, torch.Tensor):
            continue
        if "forward" in m.__dict__ and not cpu_linear.routed(m):
            continue
        if not w.requires_grad and type(w.data) is torch.Tensor:  # not a sharded DTensor
            yield m, w


def _forward_with(m: nn.Module, w: torch.Tensor):
    if isinstance(m, nn.Linear):
        return lambda x: F.linear(x, w, m.bias)

    def conv1d(x):  # GPT-2's Conv1D: x @ W + b with W [in, out]
        return torch.addmm(m.bias, x.view(-1, x.size(-1)), w).view(*x.shape[:-1], w.shape[1])

    return conv1d


def _block_norms(model: nn.Module) -> Iterator[nn.Module]:
    """The norms BLOCK_NORMS names in each block of a known trunk, with their class's own forward."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in BLOCK_NORMS:
        return
    names = BLOCK_NORMS[kind]
    for block in trunk_blocks(model):
        for name in names:
            m = getattr(block, name, None)
            if isinstance(m, nn.Module) and "forward" not in m.__dict__:
                yield m


def _cast_output(forward, dtype: torch.dtype):
    return lambda x: forward(x).to(dtype)


@contextlib.contextmanager
def precast(model: nn.Module, device_type: str):
    """Within it, frozen linear weights of `model` are used as copies in the autocast dtype of `device_type`; a no-op
    when autocast is off there."""
    if not torch.is_autocast_enabled(device_type):
        yield
        return
    dtype = torch.get_autocast_dtype(device_type)
    patched: list[tuple[nn.Module, object]] = []  # (module, the forward in its dict before, or None)
    try:
        for m, w in _frozen_linears(model):
            # an instance attribute: Module.__call__ finds it before the class's forward
            patched.append((m, m.__dict__.get("forward")))
            m.__dict__["forward"] = _forward_with(m, w.detach().to(dtype))
        if not torch.is_grad_enabled():
            for m in _block_norms(model):
                patched.append((m, m.__dict__.get("forward")))
                m.__dict__["forward"] = _cast_output(m.forward, dtype)
        yield
    finally:
        for m, before in reversed(patched):
            if before is None:
                del m.__dict__["forward"]
            else:
                m.__dict__["forward"] = before
