"""The frozen blocks' outputs of labeled rows, kept across passes: with LoRA in the top blocks only, the blocks below
the adapters see the same inputs at every epoch (and for every reward model on one base), so they run once
(`label_prefixes`), within PREFIX_CACHE_BYTES, and a label set's questions look their rows up (`QuestionPrefixes`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmprefs.data.tasks import TaskContext
from lmprefs.models.loading import hidden_size
from lmprefs.models.trunk import FrozenPrefix, frozen_depth, frozen_prefix_shared
from lmprefs.training.comparisons import Comparisons

PREFIX_CACHE_BYTES = 4 << 30
"""Training on labels keeps the frozen blocks' outputs of every labeled row (`label_prefixes`) up to this size."""


def label_prefixes(lm, data: Comparisons, ctx: TaskContext, batch_size: int, bar=None) -> FrozenPrefix | None:
    """The frozen prefix of the LM `lm` (a reward model's or a policy's) for every (question, sample) row,
    [N * S, L, d], computed once so that each epoch runs only the adapted top blocks (None when every block trains).
    Row i * S + j is sample j of question i."""
    if frozen_depth(lm) == 0:
        return None
    S, parts = data.samples.shape[1], []
    with torch.no_grad():
        for i in range(0, len(data), batch_size):
            mb = data[i : i + batch_size]
            q = ctx.format(mb.queries)
            with ctx.autocast():  # each question's query runs once for its S samples
                part = frozen_prefix_shared(lm, q, mb.samples.flatten(0, 1).to(ctx.device), S)
                assert part is not None  # frozen_depth > 0, checked above
                parts.append(part)
            if bar is not None:
                bar.update(len(mb))
    return FrozenPrefix(lm, parts[0].start, torch.cat([p.hidden for p in parts]))


def prefix_rows(questions: Tensor, S: int) -> Tensor:
    """The rows [len(questions) * S] of a label_prefixes cache that hold these questions' S samples."""
    return (questions.unsqueeze(1) * S + torch.arange(S)).flatten()


@dataclass
class QuestionPrefixes:
    """The frozen prefixes of a label set's rows, looked up by question: `prefix` holds S rows per question of some
    questions (row i * S + j: sample j of question i, as `label_prefixes` lays them out) and the label set's question
    n is its question `index[n]`, so rows computed once for more questions (the labeling pass's, or several reward
    models', `SharedPrefixes`) serve a subset of them without a copy."""

    prefix: FrozenPrefix
    index: Tensor  # [N]
    samples: int  # S

    @classmethod
    def own(cls, prefix: FrozenPrefix, data: Comparisons) -> QuestionPrefixes:
        """label_prefixes(lm, data): the label set's own rows, in its order."""
        return cls(prefix, torch.arange(len(data)), data.samples.shape[1])

    def rows(self, questions: Tensor) -> FrozenPrefix:
        """[len(questions) * S, L, d]: the prefixes of the label set's `questions` [n], sample by sample."""
        rows = prefix_rows(self.index[questions], self.samples)
        return self.prefix[rows.to(self.prefix.hidden.device)]


def prefix_bytes(lm, data: Comparisons, ctx: TaskContext) -> int:
    """What label_prefixes(lm, data) would hold in memory (fp32 residual stream of every row)."""
    S = data.samples.shape[1]
    L = data.queries.shape[1] + len(ctx.prefix) + len(ctx.suffix) + data.samples.shape[2]
    return len(data) * S * L * hidden_size(lm) * 4
