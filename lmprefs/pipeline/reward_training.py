"""Training the reward model of a command or a run: one model (`reward_model.train_member`), or with
train_reward.ensemble K > 1 an ensemble of K (`reward_ensemble.train_ensemble`), saved to its directory."""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

from lmprefs.models.artifacts import save_reward_model, whole_for_saving
from lmprefs.models.ensemble import RewardEnsemble
from lmprefs.models.reward_model import RewardModel
from lmprefs.pipeline.reward_ensemble import train_ensemble
from lmprefs.pipeline.reward_model import (
    TrainingLabels,
    member_meta,
    reward_model_card,
    train_member,
    training_labels,
)
from lmprefs.pipeline.task import Task
from lmprefs.runtime import distributed as dist


def train_reward_model(t: Task, store, out_dir: Path, log=None, exclude_items: Set[int] = frozenset(),
                       labels: TrainingLabels | None = None) -> tuple[RewardModel | RewardEnsemble, dict]:  # fmt: skip
    """Normalize, train (train_reward.epochs passes), normalize, evaluate on the held-out labels, save to out_dir.
    -> (rm, summary). `labels`: training_labels(t, store, exclude_items), when the caller has them already.
    With train_reward.ensemble K > 1, K members (`reward_ensemble.train_ensemble`), saved as an ensemble directory
    and returned as a RewardEnsemble."""
    labels = labels or training_labels(t, store, exclude_items)
    if t.cfg.train_reward.ensemble > 1:
        return train_ensemble(t, labels, out_dir, log)
    rm, summary = train_member(t, labels, log)
    whole = whole_for_saving(rm)  # under FSDP the shards gathered on rank 0 (a collective)
    if dist.is_main():
        assert whole is not None  # rank 0's (plain, or gathered above)
        save_reward_model(whole, out_dir, extra=member_meta(t, summary), merged=t.cfg.lora.merged_reward_model,
                          card=reward_model_card(t.cfg, summary))  # fmt: skip
    dist.barrier()  # every rank may read it once this returns
    return rm, summary
