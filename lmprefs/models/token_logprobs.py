"""log pi(token) and the entropy of pi from an LM head's logits, on the CPU a few rows at a time (policy.py:logprobs
and entropy of the original's @cbfd210 in one pass).

Written as torch ops on the whole [N, V] logits, the log-softmax at a temperature is a chain of passes over a tensor
of N x V fp32 numbers (the cast, the division, the log-softmax, the entropy's exp and product, and as many again in
backward); at SmolLM2's 49,152-token vocabulary and a PPO minibatch of 16 x 24 response tokens that is 75 MB a pass,
far past the CPU's caches, and those passes took a fifth of a minibatch's forward and backward. Here each chunk of
rows runs all of them while it is in cache, and backward recomputes a chunk's softmax from the logits instead of
keeping [N, V] fp32 tensors alive between forward and backward. tests/models/test_token_logprobs.py compares
values and gradients with the unfused ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ROWS = 16
"""Rows per chunk on the CPU: 16 x 49,152 fp32 logits are 3 MB, and a chunk's few temporaries stay in its L3 cache.
On a GPU the whole batch is one chunk: there a chunk costs kernel launches, not cache misses."""


def chunk_rows(logits: Tensor) -> int:
    """Rows of logits [N, V'] to take at a time (CHUNK_ROWS on the CPU, all of them elsewhere)."""
    return CHUNK_ROWS if logits.device.type == "cpu" else max(1, logits.shape[0])


def scaled_logits(logits: Tensor, rows: slice, vocab: int, temperature: float) -> Tensor:
    """z = logits[rows, :vocab] / temperature as a new fp32 tensor [c, V], which the caller may change in place.
    fp32 logits are divided into a new tensor, one pass where a copy and an in-place division take two (the same
    values); others are cast first, so the division is in fp32 as for fp32 logits."""
    z = logits[rows, :vocab]
    if z.dtype == torch.float32:
        return z / temperature
    return z.to(torch.float32).div_(temperature)


class _TokenLogprobs(torch.autograd.Function):
    """(log pi(token) [N], entropy [N]) of logits [N, V'] (any float dtype; columns from `vocab` on are ignored).
    Per row the same torch ops as the unfused code (log_softmax, gather, exp, product, sum), so the values are
    bitwise those of the unfused code. The log-probabilities' gradient, softmax(z) - onehot scaled by -g / T, takes
    the softmax in one pass where exp(log_softmax) takes two, and the temperature's division into that product: it
    equals the unfused gradient within float32 rounding."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, temperature: float, vocab: int) -> tuple[Tensor, Tensor]:
        n, c = logits.shape[0], chunk_rows(logits)
        lp, ent = (logits.new_empty(n, dtype=torch.float32) for _ in range(2))
        for i in range(0, n, c):
            rows = slice(i, i + c)
            logp = torch.log_softmax(scaled_logits(logits, rows, vocab, temperature), dim=-1)  # [c, V]
            lp[rows] = logp.gather(-1, tokens[rows, None]).squeeze(-1)
            ent[rows] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, tokens)
        ctx.temperature, ctx.vocab = temperature, vocab
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp: Tensor | None, g_ent: Tensor | None):
        logits, tokens = ctx.saved_tensors
        t, vocab = ctx.temperature, ctx.vocab
        grad = torch.empty_like(logits)  # [N, V']
        grad[:, vocab:] = 0  # the head's columns past the vocabulary
        c = chunk_rows(logits)
        for i in range(0, logits.shape[0], c):
            rows = slice(i, i + c)
            z = scaled_logits(logits, rows, vocab, t)  # [c, V], recomputed
            if g_ent is None:  # the log-probabilities' gradient alone (PPO, DPO, SFT): softmax, scaled in place
                gz = torch.zeros_like(z) if g_lp is None else torch.softmax(z, dim=-1).mul_(g_lp[rows, None] / -t)
            else:
                logp = torch.log_softmax(z, dim=-1)
                p = logp.exp()
                gz = p * (g_lp[rows, None] / -t) if g_lp is not None else torch.zeros_like(p)
                # d H / d z_j = -p_j (log p_j + H)
                gz -= p * (logp + (-(p * logp).sum(-1, keepdim=True))) * (g_ent[rows, None] / t)
            if g_lp is not None:  # d log p_k / d z_j = [j = k] - p_j
                gz.scatter_add_(-1, tokens[rows, None], g_lp[rows, None] / t)
            grad[rows, :vocab] = gz
        return grad, None, None, None


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float, vocab: int) -> tuple[Tensor, Tensor]:
    """(log pi(token), entropy of pi), each [B, T] fp32, of logits [B, T, V'] at the sampling temperature over the
    first `vocab` columns (the real vocabulary) and tokens [B, T] (pads, < 0, read token 0)."""
    B, T, V = logits.shape
    lp, ent = _TokenLogprobs.apply(logits.reshape(B * T, V), tokens.clamp(min=0).reshape(B * T), temperature, vocab)
    return lp.view(B, T), ent.view(B, T)
