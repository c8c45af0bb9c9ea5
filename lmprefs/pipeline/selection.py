"""Directed query selection where the models are: a reward-model ensemble scores candidate best-of-N questions
(`member_scores` [K, Q, N]), an acquisition function of labels/acquisition.py ranks them, and the top ones are asked.
Used by `lmprefs label` (pipeline/label_rounds.py), the online loop's requests (pipeline/online.py) and `lmprefs
rank-queue` (`rank_queue`: the web app's pending items get the scores, the app only sorts by them).

Anything that maps (queries [Q, Lq] unformatted, samples [Q, N, T]) to member scores [K, Q, N] can rank: the
ensemble's (`ensemble_scores`), or a test's fake.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lmprefs.config import LabelsConfig
from lmprefs.labels.acquisition import acquisition_scores, select
from lmprefs.training.reward import member_rewards, question_tensors, tokenizer_id

MemberScores = Callable[[Tensor, Tensor], Tensor]
"""(queries [Q, Lq] unformatted, PAD right; samples [Q, N, T]) -> each member's score of each response [K, Q, N]."""


def ensemble_scores(ens, ctx, batch_size: int = 64) -> MemberScores:
    """The member scores of a RewardEnsemble (models/ensemble.py), in batches of about `batch_size` rows, without
    gradients, under the task's autocast (training.reward.member_rewards)."""

    def scores(queries: Tensor, samples: Tensor) -> Tensor:
        Q, N = samples.shape[:2]
        # a question's N responses in a row, its query formatted and run once for them
        flat = member_rewards(ens, queries, samples.flatten(0, 1), ctx, batch_size, repeats=N)  # [K, Q * N]
        return flat.view(-1, Q, N)

    return scores


def pool_size(labels: LabelsConfig, n: int) -> int:
    """Candidate questions sampled to ask `n` of them: labels.pool_factor times n, rounded up."""
    return math.ceil(labels.pool_factor * n - 1e-9)


@dataclass
class Chooser:
    """Picks questions by labels.select of an ensemble's member scores. `describe`: what ranked them (for the
    store and the admin's item browser)."""

    labels: LabelsConfig
    member_scores: MemberScores
    describe: str

    def __call__(self, queries: Tensor, samples: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """(chosen [min(k, Q)] in the order chosen, acquisition [Q] of every candidate) among candidate questions
        queries [Q, Lq] and samples [Q, N, T]. Questions on the same query (equal rows of `queries`) share a
        group for labels.select_diversity."""
        acq = self.acquisition(queries, samples)
        groups = torch.unique(queries, dim=0, return_inverse=True)[1] if len(queries) else None
        return select(acq, k, groups=groups, diversity=self.labels.select_diversity), acq

    def acquisition(self, queries: Tensor, samples: Tensor) -> Tensor:
        """[Q] float64: labels.select's acquisition of each candidate question."""
        if len(queries) == 0:
            return torch.zeros(0, dtype=torch.float64)
        return acquisition_scores(self.labels.select, self.member_scores(queries, samples))


def rank_queue(store, chooser: Chooser, tok, task) -> dict:
    """Score every pending item of labels.type that the web app serves as real work (not gold, held or an anchor)
    with `chooser`'s acquisition and store the scores at once (the queue serves them largest first). -> counts."""
    questions = store.rankable_items(chooser.labels.type, tokenizer=tokenizer_id(tok))
    queries, samples = question_tensors(questions, tok, task)
    acq = chooser.acquisition(queries, samples)
    scored = store.set_acquisition({q.item_id: float(a) for q, a in zip(questions, acq.tolist(), strict=True)},
                                   by=chooser.describe)  # fmt: skip
    top = sorted(acq.tolist(), reverse=True)
    return {"items": scored, "max": top[0] if top else None, "median": top[len(top) // 2] if top else None}
