"""Several processes on torch.distributed: the launcher's environment, the process group, and the few collectives
lmprefs needs (the original's utils/core.py MPI helpers, on torch.distributed instead of mpi4py).

`torchrun --nproc-per-node N -m lmprefs CMD ...` and `accelerate launch` set RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_ADDR/PORT; `init()` then joins the group: NCCL with `cuda:LOCAL_RANK` when CUDA is present, gloo on CPU.
Without a launcher nothing here creates a group and every helper is the identity, so one process runs exactly as it
always did. Conventions, as the original's: config batch sizes are global totals split evenly over the ranks; rank r
seeds its sampling with `run.seed + r * 100003` (`set_mpi_seed`); gradients are averaged by DDP; metrics
are averaged over ranks (`mpi_allreduce_mean`) before anything decides on them; only rank 0 writes files.
"""

from __future__ import annotations

import datetime
import os
import warnings
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from lmprefs.errors import UserError

RANK_SEED_STRIDE = 100003  # utils/core.py:set_mpi_seed
DEFAULT_TIMEOUT_S = 600.0  # how long a collective waits for a rank that stopped answering (LMPREFS_DIST_TIMEOUT)


def launched() -> bool:
    """Whether a launcher (torchrun, accelerate, mpirun with the torch variables) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def rank_seed(seed: int) -> int:
    """This rank's seed: `seed + rank * 100003` (set_mpi_seed); rank 0 keeps `seed`, so one process is unchanged."""
    return seed + rank() * RANK_SEED_STRIDE


def timeout_s() -> float:
    raw = os.environ.get("LMPREFS_DIST_TIMEOUT", str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UserError(f"LMPREFS_DIST_TIMEOUT={raw!r}: expected a positive number of seconds")
    return value


def init() -> bool:
    """Join the launcher's process group (idempotent); False when no launcher is present."""
    if not launched() or active():
        return active()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        raw = os.environ.get(name, "0")
        if not raw.isdigit():
            raise UserError(f"environment variable {name}={raw!r}: expected a non-negative integer (set by torchrun)")
    if int(os.environ["WORLD_SIZE"]) < 1 or int(os.environ["RANK"]) >= int(os.environ["WORLD_SIZE"]):
        raise UserError(f"RANK={os.environ['RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']}: the rank must be below "
                        "the world size")  # fmt: skip
    if torch.cuda.is_available():
        backend = "nccl"
        torch.cuda.set_device(local_rank())
    else:
        backend = "gloo"
    # the timeout bounds every collective: a rank that dies or hangs makes the others fail instead of waiting forever
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()))
    return True


def teardown() -> None:
    if active():
        dist.destroy_process_group()


def device_for(device: torch.device) -> torch.device:
    """The device this rank trains on: `cuda:LOCAL_RANK` for CUDA under a launcher, else `device` unchanged."""
    if active() and device.type == "cuda":
        return torch.device("cuda", local_rank())
    return device


def _comm_device() -> torch.device:
    return torch.device("cuda", local_rank()) if dist.get_backend() == "nccl" else torch.device("cpu")


def barrier() -> None:
    if active():
        dist.barrier()


def all_reduce_mean(stats: dict[str, float]) -> dict[str, float]:
    """The mean over ranks of each value (mpi_allreduce_mean), one collective for the whole dict; every rank gets
    the same numbers, so every rank takes the same decisions. Keys must be the same on all ranks."""
    if world() == 1:
        return stats
    out = all_reduce_sum(stats)
    return {k: v / world() for k, v in out.items()}


def all_reduce_sum(stats: dict[str, float]) -> dict[str, float]:
    if world() == 1:
        return stats
    keys = sorted(stats)
    t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


def all_gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled; for small things: states, sampled ids)."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows [n_r, ...] of every rank concatenated in rank order (rank 0's first), on every rank, on x's device."""
    if world() == 1:
        return x
    return torch.cat([p.to(x.device) for p in all_gather_objects(x.cpu())])


def interleave(parts: list[torch.Tensor]) -> torch.Tensor:
    """Undo a strided shard: parts[r] holds rows r, r + W, r + 2W, ... of the whole; -> the whole in order."""
    W, n = len(parts), sum(len(p) for p in parts)
    out = parts[0].new_empty((n, *parts[0].shape[1:]))
    for r, p in enumerate(parts):
        out[r::W] = p
    return out


def shard(x, r: int | None = None, w: int | None = None):
    """This rank's strided share of a sequence: rows rank, rank + W, ... (the whole when there is one process)."""
    r, w = rank() if r is None else r, world() if w is None else w
    return x if w == 1 else x[r::w]


def broadcast_object(obj):
    """Rank 0's `obj` on every rank (e.g. a run directory named after the clock)."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def split_global(total: int, name: str, multiple: int = 1) -> int:
    """A global batch size's share per rank; refuses sizes the ranks cannot split evenly."""
    W = world()
    if total % (W * multiple):
        extra = f" x {multiple}" if multiple > 1 else ""
        raise UserError(f"{name}={total} is a global total and must be a multiple of the {W} ranks{extra}; "
                        f"choose a multiple of {W * multiple} or launch another number of processes")  # fmt: skip
    return total // W


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
    # FrozenPrefix); buffers hold nothing trained, so they are synced once at construction, not every forward
    return DDP(module, device_ids=None, forward_sync_buffers=False)


def no_sync(model: torch.nn.Module, skip: bool):
    """Gradients accumulate locally (the last microbatch's backward averages the sum) when `skip`: DDP's no_sync,
    FSDP2's set_requires_gradient_sync(False)."""
    if skip and is_sharded(model):
        return _fsdp_no_sync(model)
    return model.no_sync() if skip and hasattr(model, "no_sync") else nullcontext()


@contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


# --------------------------------------------------------------------------------------------------------------
# FSDP2 (torch.distributed.fsdp.fully_shard). Each transformer block is one FSDP unit and the root (embeddings, final
# norm, heads) another, the layout of torchtitan and of accelerate's transformer auto-wrap policy: a forward gathers
# one block at a time and frees it after, a backward reduce-scatters each block's gradients as it finishes. FSDP's
# hooks run on nn.Module.__call__; lmprefs also calls a trunk's parts outside the root's forward (the sampler, the
# reference's logprobs), which `gathered` covers.


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

    from lmprefs.models.lm import trunk_blocks

    if is_sharded(module):
        return module
    # FSDP warns once that the root returns a view (Policy's values); lmprefs modifies no forward output in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 else None
    kw = {"mp_policy": mp} if mp is not None else {}
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
    module.lmprefs_call = lambda fn: fn()
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
    units = [m for m in module.modules() if is_sharded(m) and m is not module]
    for m in units:  # gathered here by every rank at once: the ranks may then run different numbers of forwards
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        return module.lmprefs_call(fn)
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


def any_rank(flag: bool) -> bool:
    """Whether `flag` is true on at least one rank (the same answer everywhere)."""
    if world() == 1:
        return flag
    return all_reduce_sum({"f": float(flag)})["f"] > 0
