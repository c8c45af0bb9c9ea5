"""Labeled questions as tensors (`Comparisons`): what reward-model training, DPO and the frozen-prefix cache read."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class Comparisons:
    """Labeled questions as tensors: queries [N, Q] (unformatted, PAD right), samples [N, S, T], the labels [N]
    (`best` for best_of_N questions, `score` for scalar_rating ones), the store's item id of each question [N] (None
    when they did not come from a store), optional loss weights [N] (per-labeler weights from
    labels.weight_by_gold) and, for per-response scores, the prompt of each question [N] (a hash of its text): the
    held-out split and the comparisons derived from scores go by prompt. ranking_K questions carry `ranking` [N, K]
    (the stored samples best first) and its top choice as `best`."""

    queries: Tensor
    samples: Tensor
    best: Tensor | None
    items: Tensor | None = None
    weights: Tensor | None = None
    score: Tensor | None = None
    groups: Tensor | None = None
    ranking: Tensor | None = None

    def __len__(self) -> int:
        return len(self.queries)

    def __getitem__(self, idx) -> Comparisons:
        rest = (self.best, self.items, self.weights, self.score, self.groups, self.ranking)
        return Comparisons(self.queries[idx], self.samples[idx], *(None if v is None else v[idx] for v in rest))

    def labels(self, device=None) -> dict[str, Tensor]:
        """The label tensors the label type's loss reads: {"best"}, {"score"} or {"ranking", "best"}, and "weight"
        when weighted."""
        pairs = (("best", self.best), ("score", self.score), ("weight", self.weights), ("ranking", self.ranking))
        return {k: v.to(device) for k, v in pairs if v is not None}

    def split_keys(self) -> Tensor | None:
        """What the held-out split hashes: the prompt for per-response scores (all responses to one prompt, and
        every comparison derived from them, fall on the same side), else the store's item."""
        return self.groups if self.groups is not None else self.items
