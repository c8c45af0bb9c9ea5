"""The GRPO family of group estimators, beside RLOO (rloo.py): each query is answered by k samples, consecutive in
the batch (rows i * k .. i * k + k - 1), and a sample's advantage is measured against its own group; no value model.

- `grpo` (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, eq. 3 with the outcome advantage of section 4.1.2):
  A_i = (r_i - mean(r)) / (std(r) + eps) over the group, the clipped ratio per token, each sequence's loss averaged
  over its own tokens (1/|o_i|) and then over sequences, and the KL to the reference as the k3 estimator
  pi_ref/pi - log(pi_ref/pi) - 1 added to the loss with coefficient beta (ppo.kl_in=loss, the paper's), or as
  lmprefs' k1 penalty in the reward, r_i = score_i - beta * sum_t log(pi/pi_ref) (ppo.kl_in=reward). std is the
  unbiased one and eps 1e-4, as TRL's GRPOTrainer computes them.
- `dr_grpo` (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783, eq. 4): A_i = r_i - mean(r),
  no division by the std, and each sequence's token sum divided by a constant (the response length T) instead of
  its own length.
- `reinforce_pp_baseline` (Hu 2025, REINFORCE++, arXiv 2501.03262, the "-baseline" variant as OpenRLHF computes
  it): the score minus its group's mean, the k1 KL penalty per token in the reward, the return-to-go of each token
  (gamma 1), then whitened over the whole batch's tokens; a token-mean loss.

Imports only torch; tests/training/test_grpo_math.py checks each against a NumPy transcription of its paper's
formula. Shapes: B = rollout batch (B / k queries), b = minibatch, T = response length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmprefs.training.masked import masked_mean, masked_var
from lmprefs.training.surrogate import clipped_surrogate

GRPO_EPS = 1e-4
# how each estimator reduces its per-token loss [b, T] to a scalar: over every token of the minibatch, over each
# sequence's own tokens and then over sequences (GRPO's 1/|o_i|), or each sequence's sum over the constant T
NORMALIZERS = {"grpo": "sequence", "dr_grpo": "constant", "reinforce_pp_baseline": "token"}


def _groups(x: Tensor, k: int) -> Tensor:
    if k < 2 or x.shape[0] % k:
        raise ValueError(f"a group estimator needs k >= 2 samples per query dividing the batch ({x.shape[0]}); "
                         f"got k={k}")  # fmt: skip
    return x.view(-1, k, *x.shape[1:])  # [B / k, k, ...]


def grpo_advantages(returns: Tensor, k: int, eps: float = GRPO_EPS) -> Tensor:
    """GRPO's group-normalized advantages [B] of returns [B]: (r_i - mean) / (std + eps) over the query's k."""
    r = _groups(returns, k)  # [B / k, k]
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).reshape(-1)


def dr_grpo_advantages(returns: Tensor, k: int) -> Tensor:
    """Dr. GRPO's advantages [B]: r_i minus the mean of its query's k returns, no std division."""
    r = _groups(returns, k)  # [B / k, k]
    return (r - r.mean(1, keepdim=True)).reshape(-1)


def reinforce_pp_baseline_advantages(scores: Tensor, kl: Tensor, kl_coef: float, k: int,
                                     mask: Tensor | None = None) -> Tensor:  # fmt: skip
    """REINFORCE++-baseline's per-token advantages [B, T].

    scores [B]; kl [B, T] the per-token log(pi/pi_ref), 0 on padding; mask [B, T] the real tokens (None: all).
    The score's group mean is its baseline; the per-token reward is -kl_coef * kl_t plus the centred score on the
    last token, its return-to-go (gamma 1) is sum_{s >= t} of that, i.e. centred score - kl_coef * sum_{s >= t} kl_s,
    and the returns are whitened (mean 0, std 1) over the batch's real tokens.
    """
    centred = dr_grpo_advantages(scores, k)  # [B]
    to_go = kl.flip(1).cumsum(1).flip(1)  # [B, T] sum_{s >= t} kl_s
    returns = centred[:, None] - kl_coef * to_go  # [B, T]
    if mask is None:
        mean, var = returns.mean(), returns.var(correction=0)
    else:
        mean, var = masked_mean(returns, mask), masked_var(returns, mask)
    whitened = (returns - mean) * torch.rsqrt(var + 1e-8)
    return whitened if mask is None else torch.where(mask.bool(), whitened, 0)


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """The k3 estimator of KL(pi || pi_ref) per token [b, T]: exp(x) - x - 1 with x = log pi_ref - log pi (>= 0)."""
    x = ref_logprobs - logprobs
    return torch.exp(x) - x - 1


def reduce_loss(per_token: Tensor, normalizer: str, mask: Tensor | None = None) -> Tensor:
    """A scalar from a per-token loss [b, T]: 'token' the mean over all real tokens; 'sequence' each row's mean over
    its real tokens, then the mean over rows; 'constant' each row's sum over its real tokens divided by T, then the
    mean over rows."""
    keep = torch.ones_like(per_token, dtype=torch.bool) if mask is None else mask.bool()
    sums = torch.where(keep, per_token, 0).sum(1)  # [b] padding is never read (masked.py)
    if normalizer == "token":
        return sums.sum() / keep.sum()
    if normalizer == "sequence":
        return (sums / keep.sum(1).clamp(min=1)).mean()
    if normalizer == "constant":
        return (sums / per_token.shape[1]).mean()
    raise ValueError(f"unknown loss normalizer {normalizer!r}")


def group_losses(logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, vpred: Tensor, advantages: Tensor,
                 cliprange: float, *, normalizer: str, kl_coef: Tensor | float | None = None,
                 mask: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:  # fmt: skip
    """The clipped policy loss of one minibatch for the group estimators, plus kl_coef times the k3 KL where the KL
    is in the loss (kl_coef None where it is in the reward; a 0-dim tensor keeps the device from syncing).

    logprobs (with gradients), old_logprobs, ref_logprobs: [b, T]; advantages [b] (one per sequence, broadcast over
    its tokens) or [b, T]; vpred [b, T], unused but for a zero-weighted term (every parameter takes part in the
    backward under DDP; a zero gradient leaves Adam and the head unchanged). mask [b, T]: the real tokens.
    Returns (loss, stats) under PPO's names for the shared stats.
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [b, 1] or [b, T]
    pg, clipped = clipped_surrogate(torch.exp(logprobs - old_logprobs), adv, cliprange)  # [b, T] each
    pg_loss = reduce_loss(pg, normalizer, mask)
    kl = k3(logprobs, ref_logprobs)  # [b, T]
    kl_loss = reduce_loss(kl, normalizer, mask)
    loss = pg_loss + 0.0 * vpred.sum()
    if kl_coef is not None:
        loss = loss + kl_coef * kl_loss
    with torch.no_grad():
        mean = (lambda x: x.mean()) if mask is None else (lambda x: masked_mean(x, mask))
        stats = {
            "ppo/loss/policy": pg_loss,
            "ppo/loss/kl": kl_loss,
            "ppo/loss/total": loss,
            "ppo/policy/approxkl": 0.5 * mean((logprobs - old_logprobs) ** 2),
            "ppo/policy/clipfrac": mean(clipped),
        }
    return loss, {k: v.detach() for k, v in stats.items()}
