"""The REINFORCE leave-one-out estimator (RLOO; Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
Optimization for Learning from Human Feedback in LLMs"), as an alternative to PPO's value model and GAE.

Each query is answered by k samples, consecutive in the batch (rows i * k .. i * k + k - 1). A sample's return is its
score minus beta times its summed KL from the reference (the same penalty and controller as PPO), and its advantage
is that return minus the mean return of the query's k - 1 other samples: an unbiased baseline that needs no value
model. The policy loss keeps PPO's clipped importance ratio, at one of two levels (ppo.rloo_ratio):

- token (the default): each token's ratio pi/pi_old, clipped, weighted by its sequence's advantage and averaged over
  tokens: PPO's own loss with the advantage broadcast along the response. lmprefs uses it because it is PPO's: each
  token's step is bounded as PPO bounds it, the mask of responses that stop early weighs tokens as PPO's does, and
  the loss keeps PPO's scale, so ppo.lr and ppo.cliprange carry over from a PPO run. On-policy (ratio 1) its
  gradient is REINFORCE's divided by the response length.
- sequence: the whole response's ratio exp(sum_t (log pi - log pi_old)), clipped, one term per sequence averaged over
  sequences, as TRL's RLOOTrainer (1.12) does. On-policy its gradient is -A grad sum_t log pi, the REINFORCE
  estimator of Ahmadian et al. with the response as one action; after the first step a long response's summed
  log-ratio leaves the clip range sooner than any one token's, so more of the batch is clipped.

Imports only torch; tests/training/test_rloo_math.py checks both against NumPy transcriptions.

Shapes: B = rollout batch (B / k queries), b = minibatch, T = response length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmprefs.training.masked import masked_mean
from lmprefs.training.surrogate import clipped_surrogate


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


def rloo_losses(logprobs: Tensor, old_logprobs: Tensor, vpred: Tensor, advantages: Tensor, cliprange: float,
                mask: Tensor | None = None, level: str = "token") -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """Clipped policy loss on one minibatch with a sequence-level advantage, the ratio per token or per sequence.

    logprobs (with gradients), old_logprobs: [b, T]; advantages: [b]; vpred [b, T] is the value head's output, unused
    but for a zero-weighted term: under DDP every parameter must take part in the backward, and a zero gradient
    leaves Adam's moments, and so the head, unchanged. Returns (loss, stats) under PPO's names for the shared ones.
    mask [b, T]: with task.stop_at_eos, the real tokens of rows that stopped early; the token means are over those,
    a sequence's log-ratio sums them. level: "token" or "sequence" (ppo.rloo_ratio; see the module docstring).
    """
    mean = (lambda x: x.mean()) if mask is None else (lambda x: masked_mean(x, mask))
    diff = logprobs - old_logprobs  # [b, T]
    if level == "sequence":  # TRL's RLOOTrainer: one ratio per response
        ratio = torch.exp((diff if mask is None else diff * mask).sum(1))  # [b]
        adv, term_mean = advantages, (lambda x: x.mean())
    else:
        ratio, adv, term_mean = torch.exp(diff), advantages[:, None], mean  # [b, T]; adv [b, 1] broadcast over T
    pg_losses, clipped = clipped_surrogate(ratio, adv, cliprange)
    pg_loss = term_mean(pg_losses)
    loss = pg_loss + 0.0 * vpred.sum()
    with torch.no_grad():
        stats = {
            "ppo/loss/policy": pg_loss,
            "ppo/loss/total": pg_loss,
            "ppo/policy/approxkl": 0.5 * mean(diff**2),
            "ppo/policy/clipfrac": term_mean(clipped),
        }
    return loss, {k: v.detach() for k, v in stats.items()}
