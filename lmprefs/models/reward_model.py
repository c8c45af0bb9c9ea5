"""The reward model: the LM trunk, a scalar head on the last token, and the gain and bias of normalization
(rewards.py @cbfd210)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmprefs.data.tasks import PAD
from lmprefs.models.loading import hidden_size
from lmprefs.models.lora import lora_modules, using
from lmprefs.models.policy import ScalarHead
from lmprefs.models.trunk import FrozenPrefix, query_response_hidden


class RewardModel(nn.Module):
    """A trunk plus a scalar head read at the last real token, then reward = gain * r + bias (rewards.py:47-57)."""

    def __init__(self, lm, tokenizer, adapter: str | None = None, seed: int | None = None):
        super().__init__()
        self.lm, self.tokenizer, self.adapter = lm, tokenizer, adapter
        d = hidden_size(lm)
        self.head = ScalarHead(d, init_std=1.0 / (d + 1) ** 0.5, seed=seed)
        self.gain = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, queries: Tensor, responses: Tensor, prefix: FrozenPrefix | None = None,
                repeats: int = 1) -> Tensor:  # fmt: skip
        """Rewards [B] of query+response; responses may end in PAD after truncation. repeats=k: queries [B / k, Q]
        each answered by k consecutive responses (a best-of-k question), run once per query where the attention
        allows (`shared_query_trunk`)."""

        tokens = torch.cat([queries.repeat_interleave(repeats, 0), responses], dim=1)
        last = (tokens != PAD).long().cumsum(-1).argmax(-1, keepdim=True)  # [B, 1] index of the last real token
        with using(self.lm, self.adapter):
            h = query_response_hidden(self.lm, queries, responses, prefix, repeats, read=last)  # [B, 1, d]
        r = self.head(h[:, 0])
        return self.gain * r + self.bias

    def trainable_parameters(self) -> list[nn.Parameter]:
        extra = [self.gain, self.bias, *self.head.parameters()]
        if self.adapter is None:
            return [p for p in self.lm.parameters() if p.requires_grad] + extra
        return [m[self.adapter] for mod in lora_modules(self.lm) for m in (mod.A, mod.B)] + extra

    def freeze(self) -> RewardModel:
        """Stop training this reward model's own parameters; with LoRA the policy's adapters on the same base
        are left alone."""
        for p in self.trainable_parameters():
            p.requires_grad_(False)
        return self

    @torch.no_grad()
    def set_norm(self, mean: float, std: float, target_mean: float = 0.0, target_std: float = 1.0) -> None:
        """Given the current rewards' mean and std, set gain and bias so they become (target_mean, target_std)
        (rewards.py:set_reward_norm). `mean`/`std` are of rewards computed with the current gain/bias."""
        # raw r has mean (mean - bias)/gain and std std/gain; solve for the new gain/bias
        g, b = float(self.gain), float(self.bias)
        raw_mean, raw_std = (mean - b) / g, std / abs(g)
        new_gain = target_std / raw_std
        self.gain.fill_(new_gain)
        self.bias.fill_(target_mean - new_gain * raw_mean)
