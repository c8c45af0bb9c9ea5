"""The DPO losses (Rafailov et al. 2023, "Direct Preference Optimization", arXiv:2305.18290), as plain functions of
log-probabilities: the policy is trained on the label store's judgments directly, with no reward model and no
sampling. Imports only torch, so the math can be read and tested on its own (tests/training/test_dpo_math.py).

The policy's implicit reward of a response is h(y) = beta * (log pi(y|x) - log pi_ref(y|x)) (the paper's eq. 5
rearranged; the partition function cancels in every loss below, which compare responses to one query).

    pairwise   -log sigmoid(h(y_w) - h(y_l))                     the paper's eq. 7; a best-of-N label gives N-1
                                                                pairs, the chosen sample against each other one
    listwise   -log softmax_i(h(y_i))[best]                      Plackett-Luce's top-1 likelihood (the paper's
                                                                appendix A.3): the original's best-of-N reward-model
                                                                loss (label_types.py:PickBest @cbfd210) with the
                                                                reward replaced by h
    full PL    -sum_k log softmax over the options not yet ranked, of h, at the k-th ranked option
                                                                (a whole ranking; top-1 is its first term)

Each loss is returned per question, [B], so that the caller weighs and averages (per-labeler weights, gradient
accumulation over microbatches).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def sequence_logprobs(token_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log pi(y|x) = the sum of the response tokens' log-probabilities [B, T] at the sampling temperature, [B]; mask
    [B, T] marks the response's real tokens (padding after a truncated response counts nothing)."""
    return (token_logprobs * mask).sum(-1)


def implicit_rewards(logp: Tensor, ref_logp: Tensor, beta: float) -> Tensor:
    """h = beta * (log pi - log pi_ref), any shape (here [B, N]: the N responses of B questions)."""
    return beta * (logp - ref_logp)


def pairwise_losses(logp: Tensor, ref_logp: Tensor, best: Tensor, beta: float) -> Tensor:
    """The pairwise DPO loss (eq. 7) of each question, [B]: the mean over its N-1 pairs (chosen, other) of
    -log sigmoid(h_chosen - h_other). logp, ref_logp [B, N]; best [B] in 0..N-1. N = 2 is a plain pair."""
    h = implicit_rewards(logp, ref_logp, beta)  # [B, N]
    chosen = h.gather(1, best.unsqueeze(1))  # [B, 1]
    others = torch.ones_like(h, dtype=torch.bool).scatter(1, best.unsqueeze(1), False)  # [B, N]
    each = -F.logsigmoid(chosen - h)  # [B, N]; the chosen's own column is log 2, masked out below
    return (each * others).sum(1) / others.sum(1)  # [B]


def plackett_luce_losses(scores: Tensor, ranking: Tensor) -> Tensor:
    """-log of the Plackett-Luce probability of a (partial) ranking, [B]: the product over positions k of the softmax
    of the scores over the options not ranked before k, at the k-th ranked option. scores [B, N]; ranking [B, K],
    K <= N distinct option indices, best first (K = 1: the top-1 choice; K = N - 1 or N: the full ranking, whose
    last position contributes log 1 = 0)."""
    taken = torch.zeros_like(scores, dtype=torch.bool)  # [B, N]: the options ranked so far
    out = scores.new_zeros(scores.shape[0])  # [B]
    for k in range(ranking.shape[1]):
        pick = ranking[:, k : k + 1]  # [B, 1]
        log_z = torch.logsumexp(scores.masked_fill(taken, float("-inf")), dim=1)  # [B]: over the options left
        out = out + log_z - scores.gather(1, pick).squeeze(1)
        taken = taken.scatter(1, pick, True)
    return out


def listwise_losses(logp: Tensor, ref_logp: Tensor, ranking: Tensor, beta: float) -> Tensor:
    """The listwise DPO loss of each question, [B]: plackett_luce_losses of the implicit rewards. ranking [B, K]
    (best first); ranking = best[:, None] is the top-1 loss, softmax cross-entropy of h against `best`, which is
    the original's best-of-N loss with h for the reward."""
    return plackett_luce_losses(implicit_rewards(logp, ref_logp, beta), ranking)


def preference_stats(h: Tensor, best: Tensor) -> dict[str, Tensor]:
    """What the logs report of implicit rewards h [B, N] and the chosen responses best [B], as 0-dim tensors:
    accuracy (the chosen response's h is strictly above every other's: ties, as at the start where h = 0, count
    as wrong), the chosen and the rejected responses' mean h, and the margin between them (per question: h of the
    chosen minus the mean h of the others)."""
    chosen = h.gather(1, best.unsqueeze(1)).squeeze(1)  # [B]
    others = torch.ones_like(h, dtype=torch.bool).scatter(1, best.unsqueeze(1), False)  # [B, N]
    rejected = (h * others).sum(1) / others.sum(1)  # [B]
    top_other = h.masked_fill(~others, float("-inf")).amax(1)  # [B]
    return {"accuracy": (chosen > top_other).float().mean(), "chosen_reward": chosen.mean(),
            "rejected_reward": rejected.mean(), "margin": (chosen - rejected).mean()}  # fmt: skip
