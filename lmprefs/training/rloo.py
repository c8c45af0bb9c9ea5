"""The REINFORCE leave-one-out estimator (RLOO; Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs"), as an alternative to PPO's value model and GAE.

Each query is answered by k samples, consecutive in the batch (rows i * k .. i * k + k - 1). A sample's return is its
score minus beta times its summed KL from the reference (the same penalty and controller as PPO), and its advantage
is that return minus the mean return of the query's k - 1 other samples: an unbiased baseline that needs no value
model. The policy loss keeps PPO's clipped ratio over tokens, each token weighted by its sequence's advantage, as
the paper's RLOO and TRL's RLOOTrainer do. Imports only torch; tests/training/test_rloo_math.py checks it against a
NumPy transcription.

Shapes: B = rollout batch (B / k queries), b = minibatch, T = response length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmprefs.training.masked import masked_mean


def rloo_returns(scores: Tensor, kl: Tensor, kl_coef: float) -> Tensor:
    """Sequence returns [B]: scores [B] minus kl_coef times the summed per-token KL [B, T]."""
    return scores - kl_coef * kl.sum(1)


def rloo_advantages(returns: Tensor, k: int) -> Tensor:
    """Leave-one-out advantages [B] of returns [B] (k consecutive samples per query): R_i minus the mean of the
    other k - 1 returns of its query, i.e. (k R_i - sum_j R_j) / (k - 1)."""
    if k < 2 or returns.shape[0] % k:
        raise ValueError(f"RLOO needs k >= 2 samples per query dividing the batch ({returns.shape[0]}); got k={k}")
    r = returns.view(-1, k)  # [B / k, k]
    baseline = (r.sum(1, keepdim=True) - r) / (k - 1)  # [B / k, k] the mean of the others
    return (r - baseline).reshape(-1)


def rloo_losses(logprobs: Tensor, old_logprobs: Tensor, vpred: Tensor, advantages: Tensor,
                cliprange: float, mask: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """Clipped policy loss on one minibatch with a sequence-level advantage broadcast to every token.

    logprobs (with gradients), old_logprobs: [b, T]; advantages: [b]; vpred [b, T] is the value head's output, unused
    but for a zero-weighted term: under DDP every parameter must take part in the backward, and a zero gradient
    leaves Adam's moments, and so the head, unchanged. Returns (loss, stats) under PPO's names for the shared ones.
    mask [b, T]: with task.stop_at_eos, the real tokens of rows that stopped early; the means are over those.
    """
    mean = (lambda x: x.mean()) if mask is None else (lambda x: masked_mean(x, mask))
    adv = advantages[:, None]  # [b, 1] -> broadcast over T
    ratio = torch.exp(logprobs - old_logprobs)  # [b, T]
    pg_losses = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_loss = mean(torch.max(pg_losses, pg_losses2))
    loss = pg_loss + 0.0 * vpred.sum()
    with torch.no_grad():
        stats = {
            "ppo/loss/policy": pg_loss,
            "ppo/loss/total": pg_loss,
            "ppo/policy/approxkl": 0.5 * mean((logprobs - old_logprobs) ** 2),
            "ppo/policy/clipfrac": mean((pg_losses2 > pg_losses).to(pg_losses.dtype)),
        }
    return loss, {k: v.detach() for k, v in stats.items()}
