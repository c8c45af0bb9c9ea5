"""Models across ranks: DDP and FSDP2 wrappers, gradient sync control, and full state dicts gathered on rank 0
for saving and scattered on load."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, TypedDict, cast

import torch
import torch.distributed as dist

from lmprefs.models.loading import trunk_blocks
from lmprefs.runtime.distributed import active, is_main, world

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.nn.parallel import DistributedDataParallel

    class _ShardOptions(TypedDict, total=False):
        """The keyword arguments fsdp_shard gives every fully_shard call."""

        mp_policy: MixedPrecisionPolicy


def wrap(module: torch.nn.Module, parallel: str = "ddp", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The module whose forward and backward average gradients over the ranks: DistributedDataParallel (ddp), or
    the module itself sharded in place by FSDP2 (fsdp, see `fsdp_shard`); the module itself without a process group.
    Under ddp, parameters that do not require grad (a frozen base under LoRA, the frozen prefix's blocks) are left
    out by DDP and need nothing here."""
    if not active():
        return module
    if parallel == "fsdp":
        return fsdp_shard(module, dtype)
    from torch.nn.parallel import DistributedDataParallel as DDP

    # device_ids=None: the module is already on this rank's device and inputs are not moved (our inputs include a
    # FrozenPrefix); buffers hold nothing trained and load alike on every rank, so no forward syncs them. torch 2.13
    # names that forward_sync_buffers and deprecates broadcast_buffers, which older torch has alone
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return DDP(module, device_ids=None, forward_sync_buffers=False)
    return DDP(module, device_ids=None, broadcast_buffers=False)


def no_sync(model: torch.nn.Module, skip: bool):
    """Gradients accumulate locally (the last microbatch's backward averages the sum) when `skip`: DDP's no_sync,
    FSDP2's set_requires_gradient_sync(False)."""
    if skip and is_sharded(model):
        return _fsdp_no_sync(model)
    return cast("DistributedDataParallel", model).no_sync() if skip and hasattr(model, "no_sync") else nullcontext()


@contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def fsdp_shard(module: torch.nn.Module, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Shard `module` in place over the ranks with FSDP2: every transformer block of every HF trunk inside it, then
    the module itself as the root; bf16 `dtype` gathers parameters in bf16 and reduces gradients in fp32 (FSDP's
    MixedPrecisionPolicy), as autocast computes. Scalar parameters (a reward model's gain and bias), which FSDP2
    cannot shard, stay replicated with their gradients averaged by a hook. Create optimizers after this: the
    parameters are replaced by sharded DTensors. Idempotent."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method
    from transformers import PreTrainedModel

    if is_sharded(module):
        return module
    # FSDP warns once that the root returns a view (Policy's values); lmprefs modifies no forward output in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else None
    kw: _ShardOptions = {"mp_policy": mp} if mp is not None else {}
    trunks = [m for m in module.modules() if isinstance(m, PreTrainedModel)]
    for trunk in trunks:
        for block in trunk_blocks(trunk):
            if not is_sharded(block):
                fully_shard(block, **kw)
    scalars = {p for p in module.parameters() if p.dim() == 0}
    fully_shard(module, ignored_params=scalars or None, **kw)
    for p in scalars:
        if p.requires_grad:
            p.register_hook(_mean_over_ranks)  # per backward, before accumulation: linear, so no_sync stays exact
    # `gathered` runs a function between the root's pre- and post-forward hooks (FSDP's own hook for such methods)
    # nn.Module takes any attribute; torch's stub types __setattr__'s value as Tensor | Module only
    module.lmprefs_call = lambda fn: fn()  # type: ignore[assignment]
    register_fsdp_forward_method(module, "lmprefs_call")
    return module


def _mean_over_ranks(grad: torch.Tensor) -> torch.Tensor:
    out = grad.clone()
    dist.all_reduce(out)
    return out / world()


def gathered(module: torch.nn.Module, fn):
    """fn() with `module`'s parameters gathered on every rank, for work that calls a sharded model's parts rather
    than its forward (sampling: many forwards of the trunk, one gather per block instead of one per token; the
    reference's logprobs). A plain fn() when the module is not sharded. Every rank must call it (collective)."""
    if not is_sharded(module):
        return fn()
    units = [cast("FSDPModule", m) for m in module.modules() if is_sharded(m) and m is not module]
    for m in units:  # gathered here by every rank at once: the ranks may then run different numbers of forwards
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        return cast("Callable[[Callable[[], object]], object]", module.lmprefs_call)(fn)
    finally:
        for m in units:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def _state_options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_state_dict(module: torch.nn.Module) -> dict | None:
    """The whole unsharded state dict of a sharded module on rank 0, in CPU memory (None on the other ranks);
    torch.distributed.checkpoint's helper, a collective. An unsharded module's own state_dict() elsewhere."""
    if not is_sharded(module):
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(module, options=_state_options(cpu_offload=True))
    return sd if is_main() else None


def load_full_state_dict(module: torch.nn.Module, state: dict) -> None:
    """Load a whole state dict (every rank holds it) into a sharded module: each rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(module, state, options=_state_options())


def full_optimizer_state(module: torch.nn.Module, optimizer) -> dict | None:
    """The optimizer's unsharded state keyed by parameter name on rank 0 (None elsewhere); a collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    sd = get_optimizer_state_dict(module, optimizer, options=_state_options(cpu_offload=True))
    return sd if is_main() else None


def load_full_optimizer_state(module: torch.nn.Module, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(module, optimizer, state, options=_state_options())
