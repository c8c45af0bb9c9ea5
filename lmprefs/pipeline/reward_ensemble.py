"""An ensemble of reward models trained in one command (train_reward.ensemble K > 1): K members that differ by their
initialization seed and, with train_reward.bootstrap, by a bootstrap resample of the training labels. Everything
that does not depend on a member is done once for all of them: the frozen prefix of every labeled row (with LoRA
the members are adapters on one frozen base, so the blocks below the adapters see the same inputs for each), and
the initial policy's samples that normalization scores. Saved as one ensemble directory (`save_reward_ensemble`).
Each member is staged as it finishes (`ensemble_staging`), so a run killed while a later one trains keeps it."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from lmprefs.errors import UserError
from lmprefs.models.ensemble import RewardEnsemble, member_seed, save_reward_ensemble
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.trunk import frozen_depth
from lmprefs.pipeline.ensemble_staging import (
    drop_staging,
    load_member_tensors,
    member_identity,
    stage_member,
    staged_member,
    staging_dir,
)
from lmprefs.pipeline.reward_model import (
    TrainingLabels,
    member_frame,
    member_meta,
    reward_model_card,
    train_member,
    training_label_type,
)
from lmprefs.pipeline.task import Task
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.runlog import progress
from lmprefs.training.comparisons import Comparisons
from lmprefs.training.prefix_share import SharedPrefixes
from lmprefs.training.question_prefixes import PREFIX_CACHE_BYTES, prefix_bytes
from lmprefs.training.reward import evaluate


def bootstrap_rows(n: int, seed: int, member: int) -> torch.Tensor:
    """[n] row indices drawn with replacement: member `member`'s bootstrap resample of n training labels, from a
    generator of its own (not the one its initialization or its batch order draws from)."""
    s = int.from_bytes(hashlib.sha1(f"bootstrap:{seed}:{member}".encode()).digest()[:7], "big")
    return torch.randint(n, (n,), generator=torch.Generator().manual_seed(s))


class _MemberLog:
    """A run logger seen by member k: its steps (labels seen) follow the earlier members' (offset), so that the
    reward phase's steps stay distinct; its training curves keep their names (train_reward/...) with the member's
    index beside them, its summary figures are named memberK/... (the ensemble's own go under the plain names).
    `rows`: what it wrote, (row, step, phase), kept with the staged member."""

    def __init__(self, log, member: int, offset: int):
        self.log, self.member, self.offset = log, member, offset
        self.rows: list[tuple[dict, int, str]] = []

    def scalars(self, stats: dict[str, float], step: int, phase: str = "policy") -> None:
        # a member's wall-clock seconds are left out: the ensemble's row has the whole (elapsed/time)
        row = {(k if k.startswith("train_reward/") else f"member{self.member}/{k}"): v for k, v in stats.items()
               if k != "elapsed/time"}  # fmt: skip
        row |= {"train_reward/member": float(self.member)}
        self.rows.append((row, step + self.offset, phase))
        self.log.scalars(row, step + self.offset, phase)


def ensemble_prefixes(t: Task, labels: TrainingLabels) -> SharedPrefixes | None:
    """The frozen prefix of every training and held-out row, computed once for all members; None where the members
    share none (no LoRA, adapters in every block, FSDP) or it would not fit in PREFIX_CACHE_BYTES."""
    cfg = t.cfg
    if cfg.lora.rank <= 0 or cfg.run.parallel == "fsdp":
        return None
    rm = member_frame(t, 0)
    parts = [labels.train, labels.held]
    if frozen_depth(rm.lm) == 0 or any(p.items is None for p in parts):
        return None
    data = Comparisons(torch.cat([p.queries for p in parts]), torch.cat([p.samples for p in parts]), None,
                       torch.cat([p.items for p in parts if p.items is not None]))  # fmt: skip
    if prefix_bytes(rm.lm, data, t.ctx) > PREFIX_CACHE_BYTES:
        return None
    bar = progress(len(data), "reward ensemble: frozen blocks, once for all members")
    shared = SharedPrefixes.compute(rm, data, t.ctx, cfg.train_reward.microbatch or cfg.train_reward.batch_size, bar)
    bar.close()
    return shared


def train_ensemble(t: Task, labels: TrainingLabels, out_dir: Path, log=None) -> tuple[RewardEnsemble, dict]:
    """Train train_reward.ensemble members one after another on the shared frozen prefix and normalization
    samples, evaluate their mean on the held-out labels, save the ensemble to out_dir. -> (ensemble, summary):
    the held-out figures are the mean reward's, `members` holds each member's own summary."""
    cfg = t.cfg
    K, tr = cfg.train_reward.ensemble, cfg.train_reward
    if cfg.run.parallel == "fsdp":
        raise UserError(f"train_reward.ensemble={K}: an ensemble is not trained under run.parallel=fsdp")
    t0 = time.time()
    caller_prefixes = t.shared_prefixes
    if caller_prefixes is None:
        t.shared_prefixes = ensemble_prefixes(t, labels)
    memo: dict = {}  # the normalization samples, drawn once for all members
    staging = staging_dir(out_dir)  # members finished by an earlier attempt that was killed
    members, summaries = [], []
    total = len(labels.train) * tr.epochs
    try:
        for k in range(K):
            rm, summary = _member(t, labels, k, log, memo, staging, k * total)
            members.append(rm.freeze())
            summaries.append(summary)
        ens = RewardEnsemble(members).eval()
        held_cache = t.shared_prefixes.for_data(members[0], labels.held) if t.shared_prefixes is not None else None
        lt = training_label_type(cfg)
        figures = evaluate(ens, labels.held, lt, t.ctx, min_gap=cfg.labels.min_score_gap, prefixes=held_cache)
    finally:
        t.shared_prefixes = caller_prefixes
    summary = {"labels_train": len(labels.train), "labels_heldout": len(labels.held),
               "heldout/split": labels.split, "labelers": labels.by_labeler, "ensemble": K,
               "bootstrap": tr.bootstrap, **figures}  # fmt: skip
    for key in {k for s in summaries for k in s if k.startswith("initial_") and isinstance(s[k], float)}:
        summary[key] = sum(s[key] for s in summaries if key in s) / len(summaries)  # the members' mean
    summary |= {"seconds": time.time() - t0, "members": summaries}
    if log is not None:
        row = {("elapsed/time" if k == "seconds" else k): float(v) for k, v in summary.items()
               if isinstance(v, float | int) and not isinstance(v, bool)}  # fmt: skip
        log.scalars(row, K * total, phase="reward")
    seeds = [member_seed(cfg.run.seed, k) for k in range(K)]
    norms = [{n: s[n] for n in ("norm_before", "norm_after") if n in s} for s in summaries]
    manifest = {"seeds": seeds, "bootstrap": tr.bootstrap, "normalization": norms,
                "summary": {k: v for k, v in summary.items() if k != "members"}}  # fmt: skip
    if dist.is_main():
        save_reward_ensemble(members, out_dir, [member_meta(t, s) for s in summaries], manifest,
                             merged=cfg.lora.merged_reward_model,
                             cards=[reward_model_card(cfg, s) for s in summaries])  # fmt: skip
    drop_staging(staging)
    dist.barrier()
    return ens, summary


def _member(t: Task, labels: TrainingLabels, k: int, log, memo: dict, staging: Path,
            offset: int) -> tuple[RewardModel, dict]:  # fmt: skip
    """Member k, trained and staged, or as an earlier attempt staged it (its log rows written again): the same
    weights and summary; `offset`: the steps of the members before it, where its logged steps begin. Nothing an
    earlier member leaves behind changes a later one: its init, batch order and normalization draws follow its own
    seed and fresh generators, and `memo` only spares drawing samples again."""
    cfg = t.cfg
    identity = member_identity(cfg, labels, k, log is not None)
    found = staged_member(staging, k, identity)
    if found is not None:
        rm = member_frame(t, k)
        load_member_tensors(rm, found.tensors)
        for row, step, phase in found.rows if log is not None else []:
            log.scalars(row, step, phase)
        return rm.eval(), found.summary
    train = labels.train[bootstrap_rows(len(labels.train), cfg.run.seed, k)] if cfg.train_reward.bootstrap else None
    member_log = _MemberLog(log, k, offset) if log is not None else None
    rm, summary = train_member(t, labels, member_log, member=k, norm_memo=memo, train=train)
    stage_member(staging, k, identity, rm, summary, member_log.rows if member_log is not None else [])
    return rm, summary
