"""PPO's pessimistic clipped surrogate (Schulman et al. 2017, eq. 7; lm-human-preferences train_policy.py#L350-L355),
the policy term every estimator here shares: PPO's per token, RLOO's per token or per sequence, the GRPO family's per
token.

Imports only torch; tests/training/test_ppo_math.py checks it against a NumPy transcription through ppo_losses.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(ratio: Tensor, advantages: Tensor, cliprange: float) -> tuple[Tensor, Tensor]:
    """max(-A * r, -A * clip(r, 1 - eps, 1 + eps)) per term, and where the clipped term is the larger (clipfrac's
    indicator, as a float of the loss's dtype).

    ratio: [b, T] (or [b] for a whole-sequence ratio); advantages broadcast to it ([b, 1], [b, T] or [b]).
    Returns (losses, clipped), both of the broadcast shape.
    """
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    return torch.max(pg_losses, pg_losses2), (pg_losses2 > pg_losses).to(pg_losses.dtype)
