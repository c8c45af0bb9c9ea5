"""Which questions to ask: acquisition functions of a reward-model ensemble's scores on candidate best-of-N
questions, and the choice of the top ones.

Every function takes the members' scores [K, Q, N]: K members, Q candidate questions, N responses per question.
A member's choice distribution on a question is the Bradley-Terry / best-of-N likelihood the reward model is
trained with (labels/types.py:PickBest, the original's softmax cross-entropy): p_k = softmax over the N scores.

- bald: the mutual information between the labeler's choice and the member (Houlsby et al. 2011, "Bayesian Active
  Learning for Classification and Preference Learning", eq. 3 with the ensemble as the posterior):
  H(mean_k p_k) - mean_k H(p_k). 0 when the members agree; at most log N, reached when equally many confident
  members pick each response.
- spread: the members' standard deviation of each response's score relative to its question's mean score,
  averaged over the N responses (Christiano et al. 2017 ask where the members' predictions vary most). Relative to
  the question's mean, because a member's scores on one question may all move together without changing its
  choice (the softmax ignores a shift), and such a shift is no disagreement about the answer.
- random: no scores; a uniform draw, as `lmprefs label` asks today.

`select` takes the top questions by an acquisition, optionally discounting each further question on a query
already chosen (a simple diversity term: the N responses to one query often share what the members disagree on).
Torch only: the label store and the web app read the stored scores, never these functions.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Acquisition = Literal["random", "bald", "spread"]
ACQUISITIONS: tuple[str, ...] = ("random", "bald", "spread")


def choice_probs(scores: Tensor) -> Tensor:
    """Each member's choice distribution on each question: softmax over the N responses. [K, Q, N] -> [K, Q, N]."""
    return torch.softmax(scores.double(), dim=-1)


def entropy(p: Tensor) -> Tensor:
    """Shannon entropy in nats over the last axis, 0 log 0 = 0: [..., N] -> [...]."""
    return -torch.special.xlogy(p, p).sum(-1)


def bald(scores: Tensor) -> Tensor:
    """BALD of each question (Houlsby et al. 2011, eq. 3): H(mean_k p_k) - mean_k H(p_k), p_k = softmax_N of
    member k's scores. scores [K, Q, N] -> [Q], in nats, in [0, log N]."""
    p = choice_probs(scores)  # [K, Q, N]
    mi = entropy(p.mean(0)) - entropy(p).mean(0)  # [Q]
    return mi.clamp_min(0.0)  # Jensen: >= 0; the clamp removes rounding below it


def spread(scores: Tensor) -> Tensor:
    """The members' disagreement on each question's scores: the std over members (population, 1/K) of each
    response's score minus the question's mean score, averaged over the N responses. [K, Q, N] -> [Q]."""
    s = scores.double()
    rel = s - s.mean(-1, keepdim=True)  # [K, Q, N]: a member's shift of a whole question is no disagreement
    return rel.std(0, unbiased=False).mean(-1)  # [Q]


def acquisition_scores(name: str, scores: Tensor) -> Tensor:
    """The acquisition `name` (bald or spread) of each question: [K, Q, N] -> [Q], float64."""
    if scores.dim() != 3:
        raise ValueError(f"member scores must be [members, questions, responses], got shape {tuple(scores.shape)}")
    fns = {"bald": bald, "spread": spread}
    if name not in fns:
        raise ValueError(f"unknown acquisition {name!r}; choose one of {', '.join(ACQUISITIONS)}")
    return fns[name](scores)


def select(acq: Tensor, k: int, *, groups: Tensor | None = None, diversity: float = 0.0) -> Tensor:
    """Indices [min(k, Q)] of the questions to ask, in the order chosen: greedily the highest acquisition
    (ties: the lower index), each question's acquisition multiplied by (1 - diversity)^m when m questions on its
    query (`groups` [Q], any ids) have been chosen before it. acq [Q] >= 0; diversity in [0, 1] (0: the top k)."""
    k = min(k, len(acq))
    if groups is None or diversity == 0.0:
        return torch.argsort(acq, descending=True, stable=True)[:k]
    value = acq.double().clone()
    chosen = torch.zeros(len(acq), dtype=torch.bool)
    out = []
    for _ in range(k):
        i = int(torch.argmax(torch.where(chosen, -torch.inf, value)))  # argmax returns the first of equal maxima
        out.append(i)
        chosen[i] = True
        value = torch.where(groups == groups[i], value * (1.0 - diversity), value)
    return torch.tensor(out, dtype=torch.long)


def random_select(num: int, k: int, gen: torch.Generator) -> Tensor:
    """k of `num` questions uniformly without replacement, in a random order: [min(k, num)]."""
    return torch.randperm(num, generator=gen)[: min(k, num)]
