"""Best-of-n and the functional forms of Gao, Schulman and Hilton (2022, "Scaling Laws for Reward Model
Overoptimization", section 3): yardsticks beside the optimal frontier of Figure 3.

Best-of-n draws n samples of the initial policy rho and keeps the one the reward ranks first. Its KL from rho is
known in closed form when the n rewards are distinct (Stiennon et al. 2020, appendix G.3):

    KL_bon(n) = log n - (n - 1) / n

and its expected reward can be estimated from M >= n samples per query without bias: over every n-subset of the M
samples, the largest of r_(1) <= ... <= r_(M) is r_(i) in C(i-1, n-1) of the C(M, n) subsets, so

    E[max of n] ~ sum_i C(i-1, n-1) / C(M, n) r_(i)                                         (Gao et al., eq. in 3.1)

With d = sqrt(KL) and R the true (gold) reward gained over rho, Gao et al. found

    best-of-n:  R(d) = d (alpha - beta d)          RL:  R(d) = d (alpha - beta log d)

Both are linear in (alpha, beta), so a least-squares fit to the points with KL up to a cut is exact linear algebra;
its prediction for the points beyond the cut is how well the form extrapolates (theirs, fitted up to 6 nats,
predicted best-of-n to 10). Imports only torch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FORMS = ("bon", "rl")


def bon_kl(n: int) -> float:
    """KL(best-of-n || rho) in nats for distinct rewards: log n - (n - 1) / n."""
    return math.log(n) - (n - 1) / n


def bon_weights(m: int, n: int) -> Tensor:
    """[M] the probability that the i-th smallest of M samples is the largest of a uniformly random n-subset:
    C(i-1, n-1) / C(M, n), zero for i < n; sums to 1."""
    if not 1 <= n <= m:
        raise ValueError(f"best-of-{n} needs 1 <= n <= M = {m}")
    i = torch.arange(1, m + 1, dtype=torch.float64)
    # log C(i-1, n-1) - log C(M, n) through lgamma: the binomials overflow doubles for M in the thousands
    log_w = (torch.lgamma(i) - math.lgamma(n) - torch.lgamma(i - n + 1).where(i >= n, torch.zeros_like(i))
             - (math.lgamma(m + 1) - math.lgamma(n + 1) - math.lgamma(m - n + 1)))  # fmt: skip
    return torch.where(i >= n, log_w.exp(), torch.zeros_like(i))


def best_of_n(r: Tensor, n: int) -> dict[str, float]:
    """Best-of-n from rewards r [Q, M] of M samples of rho per query: the expected reward of the best of n (the
    unbiased estimate per query, mean and standard error over queries) and its analytic KL."""
    q, m = r.shape
    per_query = (r.double().sort(1).values * bon_weights(m, n)).sum(1)  # [Q]
    se = per_query.std().item() / math.sqrt(q) if q > 1 else float("nan")
    return {"n": n, "reward": per_query.mean().item(), "stderr": se, "kl": bon_kl(n)}


def _features(form: str, d: Tensor) -> Tensor:
    """[P, 2] the columns that multiply (alpha, beta) in R(d) for d [P]."""
    if form == "bon":
        return torch.stack([d, -d * d], 1)
    if form == "rl":
        return torch.stack([d, -d * torch.log(d.clamp_min(1e-300))], 1)  # d log d -> 0 as d -> 0
    raise ValueError(f"unknown form {form!r}: expected one of {', '.join(FORMS)}")


def gao_reward(form: str, kl, alpha: float, beta: float) -> Tensor:
    """R at KL (a number or a tensor of nats) under `form` with coefficients alpha, beta."""
    d = torch.as_tensor(kl, dtype=torch.float64).clamp_min(0).sqrt()
    return _features(form, d.reshape(-1)) @ torch.tensor([alpha, beta], dtype=torch.float64)


def fit_gao(form: str, kl, gain, cut: float) -> dict:
    """Least-squares (alpha, beta) of `form` on the points (kl [P] nats, gain [P]: reward over rho's) with
    kl <= cut, and the fitted form's prediction for the points beyond the cut: each point's prediction and the
    root-mean-square error of those beyond it (nan when none is)."""
    kl = torch.as_tensor(kl, dtype=torch.float64).reshape(-1)
    gain = torch.as_tensor(gain, dtype=torch.float64).reshape(-1)
    inside = kl <= cut
    if int(inside.sum()) < 2:
        raise ValueError(f"a fit needs at least 2 points with KL <= {cut:g}; {int(inside.sum())} are")
    # a measured KL can be a hair below 0 (the estimator's noise at the start of a run): its d is 0, not nan
    x = _features(form, kl[inside].clamp_min(0).sqrt())  # [P_in, 2]
    coef = torch.linalg.lstsq(x, gain[inside][:, None]).solution[:, 0]  # [2]
    pred = gao_reward(form, kl, coef[0].item(), coef[1].item())  # [P]
    beyond = ~inside
    rmse = ((pred[beyond] - gain[beyond]) ** 2).mean().sqrt().item() if bool(beyond.any()) else float("nan")
    return {"form": form, "alpha": coef[0].item(), "beta": coef[1].item(), "cut": cut,
            "fitted": int(inside.sum()), "predicted": int(beyond.sum()), "rmse_beyond": rmse,
            "prediction": pred.tolist()}  # fmt: skip
