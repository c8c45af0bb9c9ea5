"""The fixed-length sampler (language/sample.py): exactly `length` tokens, no EOS stop, plain categorical sampling
at a temperature (top_k=0, top_p=1), logits limited to the real vocabulary, with a KV cache.

Queries may be padded anywhere (PAD = -1); position ids skip the pads, so a padded and an unpadded query sample
alike. Draws use one uniform per row and step (inverse CDF), so batches that differ only in padding draw the same
tokens under the same generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmprefs.models.lm import PAD, lm_head, model_inputs


@torch.no_grad()
def sample(model, queries: Tensor, length: int, temperature: float, vocab: int,
           generator: torch.Generator | None = None, return_hidden: bool = False):  # fmt: skip
    """Sample responses [B, length] and their logprobs [B, length] at `temperature` given queries [B, Q].
    With return_hidden, also the hidden states that predicted each token [B, length, d]: the value head reads
    them, so a rollout needs no second forward pass (the original's policy.respond returns values this way)."""
    ids, mask, positions = model_inputs(queries)
    B = queries.shape[0]
    rows = torch.arange(B, device=queries.device)
    out = model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    past = out.past_key_values
    last = (queries != PAD).long().cumsum(-1).argmax(-1)  # index of each row's last real token
    h = out.last_hidden_state[rows, last]  # [B, d]
    next_pos = mask.sum(-1)  # [B] position of the first response token
    head = lm_head(model)
    responses, logprobs, hidden = [], [], []
    for t in range(length):
        if return_hidden:
            hidden.append(h)
        logp = torch.log_softmax(head(h)[:, :vocab].float() / temperature, dim=-1)  # [B, V]
        cdf = logp.exp().cumsum(-1)
        u = torch.rand(B, 1, generator=generator, device=cdf.device) * cdf[:, -1:]
        tok = torch.searchsorted(cdf, u).clamp(max=vocab - 1)  # [B, 1]
        responses.append(tok)
        logprobs.append(logp.gather(-1, tok))
        if t == length - 1:
            break
        mask = torch.cat([mask, torch.ones_like(tok)], dim=1)
        out = model.base_model(input_ids=tok, attention_mask=mask, position_ids=(next_pos + t).unsqueeze(-1),
                               past_key_values=past, use_cache=True)  # fmt: skip
        past = out.past_key_values
        h = out.last_hidden_state[:, -1]
    if return_hidden:
        return torch.cat(responses, 1), torch.cat(logprobs, 1), torch.stack(hidden, 1)
    return torch.cat(responses, 1), torch.cat(logprobs, 1)
