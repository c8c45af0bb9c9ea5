"""Label types for reward-model training: what a question looks like, what a label looks like, and the loss that turns
the reward model's outputs on a question into a training signal. A port of `lm_human_preferences/label_types.py`
@cbfd210 with one change of interface: the original's `loss(reward_model, labels)` called the reward model once per
sample; here the caller scores every sample first and passes `rewards` [B, N] (the same numbers, and the reward
model's batching stays the caller's business).

    best_of_N       PickBest(N)        softmax cross-entropy of the N rewards against `best`   (used for every task)
    ranking_K       Ranking(K)         Plackett-Luce: -log P(ranking) of the K rewards; its first term, the top
                                       choice alone, is best_of_K's loss                     (not in the original)
    scalar_rating   ScalarRating()     MSE between the reward of `sample` and `score`
    scalar_compare  ScalarComparison() MSE between r(sample1) - r(sample0) and `difference`

Only torch is imported: the store and the label server never need this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F

from lmprefs.config import label_type_shape

Tensor = torch.Tensor


class LabelType(Protocol):
    """What `train_reward` needs from a label type (the original's `LabelType` ABC, as a Protocol)."""

    name: str
    num_samples: int

    @property
    def question_schemas(self) -> dict[str, torch.dtype]: ...

    @property
    def label_schemas(self) -> dict[str, torch.dtype]: ...

    def loss(self, rewards: Tensor, labels: dict[str, Tensor]) -> dict[str, Tensor]: ...

    def target_scales(self, labels: dict[str, Tensor]) -> tuple[Tensor, Tensor] | None: ...


def _moments(x: Tensor) -> tuple[Tensor, Tensor]:
    # tf.nn.moments: mean and *biased* variance
    mean = x.mean(dim=0)
    return mean, ((x - mean) ** 2).mean(dim=0)


def pearson_r(x: Tensor, y: Tensor) -> Tensor:
    """Pearson correlation of two [B] vectors (lm_human_preferences/utils/core.py:pearson_r @cbfd210)."""
    x_mean, x_var = _moments(x)
    y_mean, y_var = _moments(y)
    cov = ((x - x_mean) * (y - y_mean)).mean(dim=0)
    return cov / torch.sqrt(x_var * y_var)


def _check_rewards(name: str, rewards: Tensor, num_samples: int) -> None:
    if rewards.dim() != 2 or rewards.shape[1] != num_samples:
        raise ValueError(f"{name}: rewards must be [batch, {num_samples}], got shape {tuple(rewards.shape)}")


def _question_schemas(sample_fields: list[str]) -> dict[str, torch.dtype]:
    # questions are token ids: the query and each sample (the original's int32 Schemas; torch indexes with int64)
    return {"query": torch.long, **{f: torch.long for f in sample_fields}}


@dataclass(frozen=True)
class PickBest:
    """Pick the best of N responses (label_types.py:PickBest @cbfd210). Label: `best` in 0..N-1."""

    num_samples: int

    @property
    def name(self) -> str:
        return f"best_of_{self.num_samples}"

    @property
    def question_schemas(self) -> dict[str, torch.dtype]:
        return _question_schemas([f"sample{i}" for i in range(self.num_samples)])

    @property
    def label_schemas(self) -> dict[str, torch.dtype]:
        return {"best": torch.long}

    def target_scales(self, labels: dict[str, Tensor]) -> tuple[Tensor, Tensor] | None:
        # a choice carries no scale: train_reward normalizes to mean 0, std 1
        return None

    def loss(self, rewards: Tensor, labels: dict[str, Tensor]) -> dict[str, Tensor]:
        """rewards [B, N] (the N rewards are the logits); labels["best"] [B]; optional labels["weight"] [B], each
        label's weight in the loss (per-labeler weights, mean 1 over the training set; `error` stays unweighted)."""
        _check_rewards(self.name, rewards, self.num_samples)
        best = labels["best"].long()  # [B]
        # tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=best, logits=rewards));
        # for N=2 this is TRL's -logsigmoid(r_chosen - r_rejected)
        each = F.cross_entropy(rewards, best, reduction="none")  # [B]
        error = each.mean()
        loss = error if labels.get("weight") is None else (each * labels["weight"].to(each.dtype)).mean()
        # not in the original: how often the reward model ranks the chosen sample first (ties count as wrong
        # unless the chosen sample is the first of the tied ones)
        accuracy = (rewards.argmax(dim=1) == best).float().mean()
        return {"loss": loss, "error": error, "accuracy": accuracy}


def plackett_luce(rewards: Tensor, ranking: Tensor) -> Tensor:
    """-log of the Plackett-Luce probability of each (partial) ranking, [B]: the sum over positions k of
    -log softmax(rewards over the options not ranked before k)[ranking[:, k]]. rewards [B, N]; ranking [B, K], K <= N
    distinct options, best first. K = 1 is softmax cross-entropy against the top choice, PickBest's loss. The same
    function of scores as training/dpo.py:plackett_luce_losses, which imports nothing of lmprefs (and this layer may
    not import training), so a test holds the two equal."""
    taken = torch.zeros_like(rewards, dtype=torch.bool)  # [B, N]: the options ranked so far
    out = rewards.new_zeros(rewards.shape[0])  # [B]
    for k in range(ranking.shape[1]):
        pick = ranking[:, k : k + 1]  # [B, 1]
        log_z = torch.logsumexp(rewards.masked_fill(taken, float("-inf")), dim=1)  # [B]: over the options left
        out = out + log_z - rewards.gather(1, pick).squeeze(1)
        taken = taken.scatter(1, pick, True)
    return out


@dataclass(frozen=True)
class Ranking:
    """Order all K responses, best first. Label: `ranking` [K], the stored samples' indices. Trained with the
    Plackett-Luce listwise loss (a ranking is K-1 successive best-of choices among the options left)."""

    num_samples: int

    @property
    def name(self) -> str:
        return f"ranking_{self.num_samples}"

    @property
    def question_schemas(self) -> dict[str, torch.dtype]:
        return _question_schemas([f"sample{i}" for i in range(self.num_samples)])

    @property
    def label_schemas(self) -> dict[str, torch.dtype]:
        return {"ranking": torch.long}

    def target_scales(self, labels: dict[str, Tensor]) -> tuple[Tensor, Tensor] | None:
        return None  # an order carries no scale, like a choice

    def loss(self, rewards: Tensor, labels: dict[str, Tensor]) -> dict[str, Tensor]:
        """rewards [B, K]; labels["ranking"] [B, K]; optional labels["weight"] [B] as in PickBest.loss."""
        _check_rewards(self.name, rewards, self.num_samples)
        ranking = labels["ranking"].long()
        each = plackett_luce(rewards, ranking)  # [B]
        error = each.mean()
        loss = error if labels.get("weight") is None else (each * labels["weight"].to(each.dtype)).mean()
        # how often the reward model's best is the labeler's top choice (comparable with best_of_K's accuracy)
        accuracy = (rewards.argmax(dim=1) == ranking[:, 0]).float().mean()
        return {"loss": loss, "error": error, "accuracy": accuracy}


@dataclass(frozen=True)
class ScalarRating:
    """Rate one response with a scalar (label_types.py:ScalarRating @cbfd210). Label: `score`."""

    num_samples: ClassVar[int] = 1
    name: ClassVar[str] = "scalar_rating"

    @property
    def question_schemas(self) -> dict[str, torch.dtype]:
        return _question_schemas(["sample"])

    @property
    def label_schemas(self) -> dict[str, torch.dtype]:
        return {"score": torch.float32}

    def target_scales(self, labels: dict[str, Tensor]) -> tuple[Tensor, Tensor] | None:
        # train_reward.py:target_mean_std: moments of the scores themselves (biased std, as tf.nn.moments)
        mean, var = _moments(labels["score"].float())
        return mean, torch.sqrt(var)

    def loss(self, rewards: Tensor, labels: dict[str, Tensor]) -> dict[str, Tensor]:
        """rewards [B, 1]; labels["score"] [B]."""
        _check_rewards(self.name, rewards, 1)
        predicted = rewards[:, 0]
        score = labels["score"].to(predicted.dtype)
        error = ((score - predicted) ** 2).mean(dim=0)
        label_mean, label_var = _moments(score)
        return {
            "loss": error,
            "error": error,
            "label_mean": label_mean,
            "label_var": label_var,
            "corr": pearson_r(score, predicted),
        }


@dataclass(frozen=True)
class ScalarComparison:
    """A scalar saying how much better sample1 is than sample0 (label_types.py:ScalarComparison @cbfd210).
    Label: `difference`."""

    num_samples: ClassVar[int] = 2
    name: ClassVar[str] = "scalar_compare"

    @property
    def question_schemas(self) -> dict[str, torch.dtype]:
        return _question_schemas(["sample0", "sample1"])

    @property
    def label_schemas(self) -> dict[str, torch.dtype]:
        return {"difference": torch.float32}

    def target_scales(self, labels: dict[str, Tensor]) -> tuple[Tensor, Tensor] | None:
        # "Divide by two to get something with the same variance as the trained reward model output" (original)
        mean, var = _moments(labels["difference"].float() / 2)
        return mean, torch.sqrt(var)

    def loss(self, rewards: Tensor, labels: dict[str, Tensor]) -> dict[str, Tensor]:
        """rewards [B, 2]; labels["difference"] [B] = how much better sample1 is than sample0."""
        _check_rewards(self.name, rewards, 2)
        predicted = rewards[:, 1] - rewards[:, 0]
        difference = labels["difference"].to(predicted.dtype)
        error = ((difference - predicted) ** 2).mean(dim=0)
        # not in the original: how often the predicted difference has the label's sign
        accuracy = (torch.sign(predicted) == torch.sign(difference)).float().mean()
        return {"loss": error, "error": error, "accuracy": accuracy}


def get(label_type: str) -> PickBest | Ranking | ScalarRating | ScalarComparison:
    """Parse a label-type name (label_types.py:get @cbfd210): "best_of_N" (N >= 2), "ranking_K" (K 2 to 9),
    "scalar_rating", "scalar_compare" (the one parser of those names is config.label_type_shape; its ValueError
    names them)."""
    field, n = label_type_shape(label_type)
    if field == "score":
        return ScalarRating()
    if field == "difference":
        return ScalarComparison()
    return Ranking(n) if field == "ranking" else PickBest(n)
