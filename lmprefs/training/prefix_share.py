"""The frozen prefix of labeled rows (the residual stream entering the lowest LoRA block of a reward model), computed
once and shared by every reward model that trains on a subset of the same labels with the same base model and the
same adapter placement: the arms and seeds of `experiment mock-sentiment`; or kept from the sampling pass that drew
the labeled rows (`pipeline.labeling.collect_labels` with keep_prefixes, the quickstart), which ran those blocks
over the same tokens already.

The bottom blocks carry no adapter and the base is frozen, so the prefix of a (query, sample) row depends on the row's
tokens, the base weights and the autocast dtype only, not on the reward model's init, its label subset or its seed
(the sampling pass's, computed a position at a time, equal the others up to float rounding).
`for_data` hands a reward model the rows of its own training set, in its order, or None when the store lacks one of
them or the tokens differ: the caller then computes its own, so sharing can never change which rows train."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmprefs.data.tasks import TaskContext
from lmprefs.models.ensemble import RewardEnsemble
from lmprefs.models.reward_model import RewardModel
from lmprefs.models.trunk import FrozenPrefix, frozen_depth
from lmprefs.training.comparisons import Comparisons
from lmprefs.training.question_prefixes import QuestionPrefixes, label_prefixes


@dataclass
class SharedPrefixes:
    """Prefixes of N labeled questions of S samples each: hidden [N * S, L, d] (row i * S + j: sample j of question
    i), the questions' item ids, and their tokens, against which a reward model's rows are checked."""

    start: int  # the frozen depth they were computed to
    items: dict[int, int]  # item id -> question index
    queries: Tensor  # [N, Q]
    samples: Tensor  # [N, S, T]
    hidden: Tensor

    @classmethod
    def compute(cls, rm: RewardModel | RewardEnsemble, data: Comparisons, ctx: TaskContext, batch_size: int,
                bar=None) -> SharedPrefixes | None:  # fmt: skip
        """label_prefixes of every row of `data` (None when every block of rm trains)."""
        pre = label_prefixes(rm.lm, data, ctx, batch_size, bar)
        if pre is None or data.items is None:
            return None
        items = {int(i): k for k, i in enumerate(data.items.tolist())}
        return cls(frozen_depth(rm.lm), items, data.queries, data.samples, pre.hidden)

    def nbytes(self) -> int:
        return self.hidden.numel() * self.hidden.element_size()

    def for_data(self, rm: RewardModel | RewardEnsemble, data: Comparisons) -> QuestionPrefixes | None:
        """The prefixes of `data`'s rows, as label_prefixes(rm.lm, data) gives them (looked up in place, not copied),
        or None when a row is missing, its tokens differ from the stored ones, or rm's adapters start at another
        block."""
        if frozen_depth(rm.lm) != self.start or len(data) == 0 or data.items is None:
            return None
        found = [self.items.get(int(i)) for i in data.items.tolist()]
        if any(k is None for k in found):
            return None
        idx = torch.tensor(found, dtype=torch.long)
        if not (torch.equal(self.queries[idx], data.queries) and torch.equal(self.samples[idx], data.samples)):
            return None
        return QuestionPrefixes(FrozenPrefix(rm.lm, self.start, self.hidden), idx, data.samples.shape[1])
