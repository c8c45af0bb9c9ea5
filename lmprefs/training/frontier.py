"""The KL-reward frontier of the paper's Figure 3: the best true reward any policy can reach at each KL from the
initial policy rho. For a reward r and a coefficient beta, the policy maximizing E[r] - beta KL(pi, rho) is
pi*(y|x) = rho(y|x) exp(r(x,y)/beta) / Z(x), Z(x) = E_rho[exp(r/beta)], with

    E*[r] = E_rho[r exp(r/beta)] / Z        KL(pi*, rho) = E*[r] / beta - log Z

(the paper estimates it "by importance-reweighting samples from rho"; section 3.1.1). From M samples y_i ~ rho(.|x)
with rewards r_i, the self-normalized weights w_i = exp(r_i/beta) / sum_j exp(r_j/beta) give

    E*[r] ~ sum_i w_i r_i                   KL ~ E*[r] / beta - log mean_i exp(r_i/beta)   (a logsumexp)

per query, averaged over queries. The estimate is biased at finite M: log of a mean underestimates log Z (Jensen),
the rewards in the upper tail of rho that pi* leans on are rarely drawn, and the estimated KL can never exceed
log M (all weight on one sample: pi* becomes "the best of the M samples"). So at small beta (large KL) the estimated
frontier is the best-of-M curve, short of the true one in KL and in reward; it is trustworthy where the effective
sample size ESS = 1 / sum_i w_i^2 is large, and `frontier` marks betas whose mean ESS over queries is under
`min_ess`. `mc_stderr` is the Monte Carlo standard error of each averaged estimate (the delta method for a ratio
and a log of means), the sampling error the test against an enumerated model measures; it does not cover the bias.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

DEFAULT_BETAS = tuple(round(10 ** (-2 + 3 * i / 24), 5) for i in range(25))  # 0.01 .. 10, geometric


def optimal_point(r: Tensor, beta: float) -> dict[str, Tensor]:
    """Per-query estimates at one beta from rewards r [Q, M] of M samples of rho per query: reward, kl, ess, and
    their Monte Carlo variances var_reward, var_kl, all [Q]."""
    r = r.double()
    M = r.shape[1]
    a = r / beta  # [Q, M]
    log_e = a - a.max(1, keepdim=True).values  # exp(r/beta) up to a per-query factor, <= 1
    e = log_e.exp()
    w = e / e.sum(1, keepdim=True)  # [Q, M] self-normalized weights
    reward = (w * r).sum(1)  # [Q]
    log_z = torch.logsumexp(a, 1) - math.log(M)  # log mean_i exp(r_i / beta)
    kl = reward / beta - log_z
    ess = 1.0 / (w**2).sum(1)
    # influence of each sample on the two ratio-of-means estimates (each has mean 0 over the samples); the
    # estimator's variance is mean(influence^2) / M
    e_bar = e.mean(1, keepdim=True)
    psi_r = e * (r - reward[:, None]) / e_bar
    psi_kl = psi_r / beta - (e - e_bar) / e_bar
    return {"reward": reward, "kl": kl, "ess": ess, "var_reward": (psi_r**2).mean(1) / M,
            "var_kl": (psi_kl**2).mean(1) / M}  # fmt: skip


def frontier(r: Tensor, betas, min_ess: float = 10.0) -> list[dict]:
    """The estimated optimal frontier from rewards r [Q, M] (M samples of rho for each of Q queries): one row per
    beta, sorted by beta, with reward and kl averaged over queries, their Monte Carlo standard errors, the mean and
    smallest per-query ESS, and trusted = mean ESS >= min_ess."""
    Q = r.shape[0]
    rows = []
    for beta in sorted(float(b) for b in betas):
        p = optimal_point(r, beta)
        ess = p["ess"].mean().item()
        rows.append({"beta": beta, "reward": p["reward"].mean().item(), "kl": p["kl"].mean().item(),
                     "reward_mc_stderr": p["var_reward"].sum().sqrt().item() / Q,
                     "kl_mc_stderr": p["var_kl"].sum().sqrt().item() / Q, "ess_mean": ess,
                     "ess_min": p["ess"].min().item(), "trusted": ess >= min_ess})  # fmt: skip
    return rows


def exact_point(logp: Tensor, r: Tensor, beta: float) -> tuple[float, float]:
    """(E*[r], KL(pi*, rho)) of one query by enumeration: logp [K] the log-probabilities under rho of all K
    responses (summing to 1), r [K] their rewards."""
    logp, r = logp.double(), r.double()
    log_pi = logp + r / beta
    log_pi = log_pi - torch.logsumexp(log_pi, 0)  # log pi*(y) = log rho(y) + r/beta - log Z
    pi = log_pi.exp()
    return (pi * r).sum().item(), (pi * (log_pi - logp)).sum().item()
