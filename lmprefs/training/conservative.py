"""Conservative rewards from an ensemble's members (Coste et al. 2023, "Reward Model Ensembles Help Mitigate
Overoptimization", ICLR 2024, section 3.2):

- mean: R(x, y) = 1/K sum_k R_k(x, y), the ensemble's reward as lmprefs scores it everywhere else;
- min (WCO, worst-case optimization): R(x, y) = min_k R_k(x, y);
- uwo (uncertainty-weighted optimization): R(x, y) = mean_k R_k - lambda * 1/K sum_k (R_k - mean)^2, the members'
  population variance, as the paper writes it.

With one member every reduction is that member's score (the variance is 0), so a one-member ensemble scores as the
reward model it holds. Imports only torch; tests/training/test_conservative_math.py checks each against NumPy.
"""

from __future__ import annotations

from torch import Tensor

REDUCTIONS = ("mean", "min", "uwo")


def ensemble_reduce(scores: Tensor, how: str = "mean", uwo_lambda: float = 1.0) -> Tensor:
    """scores [K, B] (each member's normalized reward) -> the reduced reward [B]."""
    if how == "mean":
        return scores.mean(0)
    if how == "min":
        return scores.min(0).values
    if how == "uwo":
        return scores.mean(0) - uwo_lambda * scores.var(0, unbiased=False)
    raise ValueError(f"unknown ensemble reduction {how!r}; one of {', '.join(REDUCTIONS)}")


def members_std(scores: Tensor) -> Tensor:
    """scores [K, B] -> [B]: the members' population standard deviation, the disagreement that UWO penalizes."""
    return scores.std(0, unbiased=False)


def reduced_scores(out: Tensor, how: str = "mean", uwo_lambda: float = 1.0) -> tuple[Tensor, Tensor | None]:
    """A score function's output -> (the reward [B], the members' scores [K, B] or None), both float32: a reward
    model's (or a reward function's) scores [B] as they are; an ensemble's member scores [K, B] reduced by
    `ensemble_reduce`. With one member every reduction is that member's score, bitwise what the ensemble's forward
    (the members' mean) gives."""
    if out.dim() == 1:
        return out.float(), None
    members = out.float()  # [K, B]
    return ensemble_reduce(members, how, uwo_lambda), members
