"""Means and variances over the real tokens of responses that stop early (task.stop_at_eos): what PPO's and RLOO's
`.mean()` over [b, T] become when a row ends before T. Imports only torch.

A mask is [b, T], 1 (or True) on a real token, up to and including the row's stop token, and 0 on the padding
after it. Padding values are never read (`torch.where`, not a product), so a NaN or inf computed there stays out.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x [b, T] over the real tokens: the token-level mean the original's .mean() is over b * T tokens."""
    keep = mask.bool()
    return torch.where(keep, x, 0).sum() / keep.sum()


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Biased variance (divides by the count, as tf.nn.moments) of x [b, T] over the real tokens."""
    return masked_mean((x - masked_mean(x, mask)) ** 2, mask)


def partial_mask(mask: Tensor | None) -> Tensor | None:
    """The mask where some row stopped early, None where every token is real: a batch of full-length rows then runs
    the fixed-length math itself, bitwise as with task.stop_at_eos off (one host sync)."""
    return None if mask is None or bool(mask.bool().all()) else mask
