"""The policy: the LM and its value function (policy.py @cbfd210), and the scalar head that the value function and
the reward model put on a trunk."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from lmprefs.models.loading import hidden_size, vocab_size
from lmprefs.models.lora import lora_modules, using
from lmprefs.models.token_logprobs import token_logprobs
from lmprefs.models.trunk import FrozenPrefix, response_hidden, response_logits_hidden


class ScalarHead(nn.Module):
    """A linear map d -> 1 (language/model.py:fc_layer). Value heads start at 0; reward heads at N(0, 1/sqrt(d+1))."""

    def __init__(self, d: int, init_std: float, seed: int | None = None):
        super().__init__()
        self.linear = nn.Linear(d, 1)
        # a generator of its own: the draw must not depend on what else ran in the process before
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            self.linear.weight.normal_(0.0, init_std, generator=g) if init_std > 0 else self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, h: Tensor) -> Tensor:  # [..., d] -> [...]
        return self.linear(h.to(self.linear.weight.dtype)).squeeze(-1)


class Policy(nn.Module):
    """The policy LM and its value function (policy.py): a zero-init value head on the same trunk (the original),
    or, with value_model='separate', a second trunk with its own head (the later summarization work).
    With LoRA, `lm` is the shared frozen base and `adapter` / `value_adapter` name this policy's adapters on it.
    """

    def __init__(self, lm, tokenizer, temperature: float, value_lm=None, adapter: str | None = None,
                 value_adapter: str | None = None):  # fmt: skip
        super().__init__()
        self.lm, self.tokenizer, self.temperature = lm, tokenizer, temperature
        self.value_lm, self.adapter, self.value_adapter = value_lm, adapter, value_adapter
        self.value_head = ScalarHead(hidden_size(lm), init_std=0.0)
        self.vocab = vocab_size(tokenizer)

    def forward(self, queries: Tensor, responses: Tensor,
                prefix: FrozenPrefix | None = None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """(logprobs, values, entropy), each [B, T], for responses given queries."""

        with using(self.lm, self.adapter):
            h, logits = response_logits_hidden(self.lm, queries, responses, prefix)
        logprobs, entropy = token_logprobs(logits, responses, self.temperature, self.vocab)
        if self.value_adapter is not None:
            with using(self.lm, self.value_adapter):
                h = response_hidden(self.lm, queries, responses, prefix)
        elif self.value_lm is not None:
            h = response_hidden(self.value_lm, queries, responses)
        return logprobs, self.value_head(h), entropy

    def values_from(self, queries: Tensor, responses: Tensor, hidden: Tensor,
                    prefix: FrozenPrefix | None = None) -> Tensor:  # fmt: skip
        """Values [B, T] given the policy trunk's hidden states at the response positions (from the sampler);
        a separate value trunk runs its own forward."""

        if self.value_adapter is not None:
            with using(self.lm, self.value_adapter):
                hidden = response_hidden(self.lm, queries, responses, prefix)
        elif self.value_lm is not None:
            hidden = response_hidden(self.value_lm, queries, responses)
        return self.value_head(hidden)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The value head and the trunk, or only this policy's adapters when the trunk is a shared LoRA base."""

        if self.adapter is None:
            return [p for p in self.parameters() if p.requires_grad]
        names = cast("set[str]", {self.adapter, self.value_adapter} - {None})
        adapters = [m[n] for mod in lora_modules(self.lm) for m in (mod.A, mod.B) for n in names]
        return adapters + list(self.value_head.parameters())

    def value_parameters(self) -> list[nn.Parameter]:
        """What the value model alone trains: its head and, when separate, its trunk or adapter (these take no
        gradient from the policy loss, and a separate value model has an optimizer of its own)."""

        head = list(self.value_head.parameters())
        if self.value_adapter is not None:
            return [m[self.value_adapter] for mod in lora_modules(self.lm) for m in (mod.A, mod.B)] + head
        if self.value_lm is not None:
            return [p for p in self.value_lm.parameters() if p.requires_grad] + head
        return head
