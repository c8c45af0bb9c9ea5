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
import socket

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
        gloo_on_loopback()
    # the timeout bounds every collective: a rank that dies or hangs makes the others fail instead of waiting forever
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()))
    return True


def one_node() -> bool:
    """Whether every rank runs on this machine: the launcher's LOCAL_WORLD_SIZE (torchrun's, accelerate's) is the
    world size."""
    return os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")


def gloo_on_loopback() -> None:
    """Bind gloo to the loopback interface (GLOO_SOCKET_IFNAME) when every rank runs on this machine and the user set
    no interface. Left to itself gloo looks the machine's hostname up to pick an interface: where the hostname
    resolves to no address and no DNS server answers, each process group's creation waited for the resolver's
    timeout (10 s a rank) before gloo fell back to the loopback anyway."""
    if os.environ.get("GLOO_SOCKET_IFNAME") or not one_node():
        return
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:  # no interface list on this platform: gloo picks as it always did
        return
    loopback = next((n for n in ("lo", "lo0") if n in names), None)  # Linux's name, then macOS' and the BSDs'
    if loopback is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback


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


# --------------------------------------------------------------------------------------------------------------
# FSDP2 (torch.distributed.fsdp.fully_shard). Each transformer block is one FSDP unit and the root (embeddings, final
# norm, heads) another, the layout of torchtitan and of accelerate's transformer auto-wrap policy: a forward gathers
# one block at a time and frees it after, a backward reduce-scatters each block's gradients as it finishes. FSDP's
# hooks run on nn.Module.__call__; lmprefs also calls a trunk's parts outside the root's forward (the sampler, the
# reference's logprobs), which `gathered` covers.


def any_rank(flag: bool) -> bool:
    """Whether `flag` is true on at least one rank (the same answer everywhere)."""
    if world() == 1:
        return flag
    return all_reduce_sum({"f": float(flag)})["f"] > 0
