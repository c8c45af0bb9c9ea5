"""Ensemble members kept as they finish: each trained member of train_reward.ensemble K is published at once into a
staging directory beside the ensemble's (`staging_dir`: OUT.members/member-K/, a published directory with a sha256
manifest), with what identifies its training (`member_identity`: the config's math, its seed, the labels it trained
and was evaluated on), its exact weights (`RewardState`'s, plus its LoRA adapter), its summary and the log rows it
wrote. A run killed while a later member trains loads the finished ones from there instead of training them again
(their rows are written to the log again, the log having dropped the killed attempt's reward rows), and only a
member whose identity matches is taken: one of another config or other labels, or a damaged one, is trained again.
The staging directory goes once the ensemble is published."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from lmprefs.config import Config
from lmprefs.config.diff import config_meta
from lmprefs.io.publish import DamagedDirectory, latest_good, publish_dir
from lmprefs.models.ensemble import member_name, member_seed
from lmprefs.models.reward_model import RewardModel
from lmprefs.pipeline.reward_model import RewardState, TrainingLabels
from lmprefs.runtime import distributed as dist

WEIGHTS, RECORD = "weights.pt", "member.json"


def staging_dir(out_dir: Path) -> Path:
    """Where the finished members of the ensemble published at `out_dir` wait: its sibling OUT.members."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".members")


def member_identity(cfg: Config, labels: TrainingLabels, member: int, logged: bool) -> str:
    """A digest of what member `member`'s training depends on: the config's values that change the math (and
    run.log_interval, which decides the rows it logs), its seed, the number of ranks, whether it logs, and every
    tensor of its training and held-out labels."""
    h = hashlib.sha256()
    head = {"config": config_meta(cfg)["fingerprint"], "log_interval": cfg.run.log_interval, "member": member,
            "seed": member_seed(cfg.run.seed, member), "world": dist.world(), "logged": logged}  # fmt: skip
    h.update(json.dumps(head, sort_keys=True).encode())
    for data in (labels.train, labels.held):
        for f in fields(data):
            v = getattr(data, f.name)
            h.update(f"{f.name}:{None if v is None else (v.dtype, tuple(v.shape))}".encode())
            if v is not None:
                h.update(v.detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def member_tensors(rm: RewardModel) -> dict[str, torch.Tensor]:
    """A member's exact weights: RewardState's (head, gain, bias, and the trunk unless it is an adapter) and, under
    LoRA, its own adapter's matrices (adapter.NAME)."""
    own = RewardState(rm).state_dict()
    if rm.adapter is not None:
        own |= {f"adapter.{n}": p.detach().cpu().clone() for n, p in rm.lm.named_parameters()
                if n.endswith((f".A.{rm.adapter}", f".B.{rm.adapter}"))}  # fmt: skip
    return own


def load_member_tensors(rm: RewardModel, tensors: dict[str, torch.Tensor]) -> None:
    """member_tensors' weights into the frame `rm` (pipeline.reward_model.member_frame of the same member)."""
    RewardState(rm).load_state_dict(tensors)
    params = dict(rm.lm.named_parameters())
    with torch.no_grad():
        for k, v in tensors.items():
            if k.startswith("adapter."):
                params[k[len("adapter.") :]].copy_(v)


@dataclass
class StagedMember:
    """A finished member as staged: its weights, its summary and the (row, step, phase) it logged."""

    tensors: dict[str, torch.Tensor]
    summary: dict
    rows: list[tuple[dict, int, str]]


def stage_member(staging: Path, member: int, identity: str, rm: RewardModel, summary: dict,
                 rows: list[tuple[dict, int, str]]) -> None:  # fmt: skip
    """Publish a finished member into `staging` (rank 0 writes; every rank waits for it)."""
    if dist.is_main():
        with publish_dir(staging / member_name(member), {"identity": identity}) as tmp:
            torch.save(member_tensors(rm), tmp / WEIGHTS)
            (tmp / RECORD).write_text(json.dumps({"summary": summary, "rows": rows}))
    dist.barrier()


def staged_member(staging: Path, member: int, identity: str) -> StagedMember | None:
    """Member `member` as staged by an earlier attempt, or None: none staged, another identity, or damaged."""
    out = staging / member_name(member)
    try:
        found = latest_good(out, announce=lambda line: print(line, flush=True) if dist.is_main() else None)
    except DamagedDirectory:
        return None
    if found is None or found[1].get("identity") != identity:
        return None
    record = json.loads((found[0] / RECORD).read_text())
    rows = [(dict(r), int(s), str(p)) for r, s, p in record["rows"]]
    return StagedMember(torch.load(found[0] / WEIGHTS, weights_only=True), record["summary"], rows)


def drop_staging(staging: Path) -> None:
    """The staging directory removed, once the ensemble it served is published."""
    if dist.is_main():
        shutil.rmtree(staging, ignore_errors=True)
