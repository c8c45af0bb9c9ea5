"""lmprefs.training.dpo against NumPy transcriptions of the losses (Rafailov et al. 2023, eq. 7; Plackett-Luce), and
on a problem small enough to enumerate: the minimizer of each expected loss under its choice model is the closed
form pi*(y) = pi_ref(y) exp(r(y) / beta) / Z (the paper's eq. 4)."""

import itertools

import numpy as np
import pytest
import torch

from lmprefs.labels.types import PickBest
from lmprefs.models.token_logprobs import token_logprobs
from lmprefs.training.dpo import (
    implicit_rewards,
    listwise_losses,
    pairwise_losses,
    plackett_luce_losses,
    preference_stats,
    sequence_logprobs,
)


def _np_log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def _np_logsumexp(x):
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def np_pairwise(logp, ref, best, beta):
    out = []
    for b in range(len(logp)):
        h = beta * (logp[b] - ref[b])
        out.append(np.mean([-_np_log_sigmoid(h[best[b]] - h[j]) for j in range(len(h)) if j != best[b]]))
    return np.array(out)


def np_plackett_luce(scores, ranking):
    out = []
    for s, order in zip(scores, ranking, strict=True):
        left, nll = list(range(len(s))), 0.0
        for i in order:
            nll += _np_logsumexp(s[left]) - s[i]
            left.remove(i)
        out.append(nll)
    return np.array(out)


def _batch(B=5, N=4, seed=0):
    g = np.random.default_rng(seed)
    logp, ref = -10 + 3 * g.standard_normal((B, N)), -10 + 3 * g.standard_normal((B, N))
    return logp, ref, g.integers(0, N, B), g


@pytest.mark.parametrize("N", [2, 4])
def test_pairwise_loss_matches_numpy(N):
    logp, ref, best, _ = _batch(N=N)
    got = pairwise_losses(torch.tensor(logp), torch.tensor(ref), torch.tensor(best), 0.3)
    np.testing.assert_allclose(got.numpy(), np_pairwise(logp, ref, best, 0.3), rtol=1e-12)
    if N == 2:  # one pair: TRL's sigmoid loss, -log sigmoid(h_w - h_l)
        h = 0.3 * (logp - ref)
        w, lose = h[np.arange(5), best], h[np.arange(5), 1 - best]
        np.testing.assert_allclose(got.numpy(), -_np_log_sigmoid(w - lose), rtol=1e-12)


def test_top1_plackett_luce_is_the_originals_best_of_n_loss_on_the_implicit_reward():
    logp, ref, best, _ = _batch()
    lp, rf, b = torch.tensor(logp), torch.tensor(ref), torch.tensor(best)
    got = listwise_losses(lp, rf, b[:, None], 0.5)
    np.testing.assert_allclose(got.numpy(), np_plackett_luce(0.5 * (logp - ref), best[:, None]), rtol=1e-12)
    original = PickBest(4).loss(implicit_rewards(lp, rf, 0.5), {"best": b})["loss"]
    assert torch.allclose(got.mean(), original, rtol=1e-12)


def test_full_plackett_luce_matches_numpy_and_sums_its_positions():
    _, _, _, g = _batch()
    scores = g.standard_normal((6, 5)) * 2
    ranking = np.stack([g.permutation(5) for _ in range(6)])
    for k in (1, 3, 4, 5):  # a top-k ranking, up to the whole one (its last position adds log 1)
        got = plackett_luce_losses(torch.tensor(scores), torch.tensor(ranking[:, :k]))
        np.testing.assert_allclose(got.numpy(), np_plackett_luce(scores, ranking[:, :k]), rtol=1e-12)
    full = plackett_luce_losses(torch.tensor(scores), torch.tensor(ranking))
    assert torch.allclose(full, plackett_luce_losses(torch.tensor(scores), torch.tensor(ranking[:, :4])))
    # the probabilities of all 5! rankings of one question sum to 1
    perms = torch.tensor(list(itertools.permutations(range(5))))
    s = torch.tensor(scores[:1]).expand(len(perms), 5)
    assert abs(torch.exp(-plackett_luce_losses(s, perms)).sum().item() - 1) < 1e-12


def test_sequence_logprobs_sum_the_response_tokens_at_the_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 7, (3, 4), generator=g)
    tokens[1, 2:] = -1  # a truncated response: padding after its last token
    mask = tokens >= 0
    token_lp, _ = token_logprobs(logits, tokens, 0.7, 7)  # what train-dpo sums, in fp32
    got = sequence_logprobs(token_lp, mask)
    lp = torch.log_softmax(logits / 0.7, -1)
    want = [sum(lp[b, t, tokens[b, t]].item() for t in range(4) if mask[b, t]) for b in range(3)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)  # the float32 softmax of the forward


def test_preference_stats_count_ties_as_wrong():
    h = torch.tensor([[0.0, 0.0, 0.0], [2.0, 1.0, -1.0], [0.0, 3.0, 1.0]])
    s = preference_stats(h, torch.tensor([0, 0, 2]))
    assert s["accuracy"].item() == pytest.approx(1 / 3)
    assert s["chosen_reward"].item() == pytest.approx((0 + 2 + 1) / 3)
    assert s["margin"].item() == pytest.approx((0 + 2.0 + (1 - 1.5)) / 3)


# -- the optimum on an enumerable problem: K responses to one query, a free logits vector for the policy ----------

K, BETA = 4, 0.5
REF = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
R = torch.tensor([1.0, -0.5, 0.3, 2.0], dtype=torch.float64)


PAIRS = torch.tensor([(i, j) for i in range(K) for j in range(K) if i != j])  # ordered pairs (first, second)


def _pairwise_objective(logp):
    """E over ordered pairs (i, j), i != j, with i preferred with Bradley-Terry probability sigmoid(r_i - r_j)."""
    p = torch.sigmoid(R[PAIRS[:, 0]] - R[PAIRS[:, 1]])
    loss = pairwise_losses(logp[PAIRS], torch.log(REF)[PAIRS], torch.zeros(len(PAIRS), dtype=torch.long), BETA)
    return (p * loss).sum()


def _top1_objective(logp):
    """One question of all K responses, the best chosen with Luce's probability softmax(r)."""
    best = torch.arange(K)
    loss = listwise_losses(logp.expand(K, K), torch.log(REF).expand(K, K), best[:, None], BETA)
    return (torch.softmax(R, 0) * loss).sum()


def _full_pl_objective(logp):
    """One question of all K responses, ranked with Plackett-Luce probabilities of r."""
    perms = torch.tensor(list(itertools.permutations(range(K))))
    p = torch.exp(-plackett_luce_losses(R.expand(len(perms), K), perms))
    loss = listwise_losses(logp.expand(len(perms), K), torch.log(REF).expand(len(perms), K), perms, BETA)
    return (p * loss).sum()


@pytest.mark.parametrize("objective", [_pairwise_objective, _top1_objective, _full_pl_objective],
                         ids=["pairwise", "plackett-luce-top1", "plackett-luce-full"])  # fmt: skip
def test_gradient_descent_reaches_the_closed_form_optimum(objective):
    theta = torch.zeros(K, dtype=torch.float64, requires_grad=True)  # the policy: softmax(theta), uniform at first
    opt = torch.optim.SGD([theta], lr=4.0)
    for _ in range(200):
        opt.zero_grad()
        objective(torch.log_softmax(theta, 0)).backward()
        opt.step()
    pi = torch.softmax(theta.detach(), 0)
    closed = REF * torch.exp(R / BETA)
    closed = closed / closed.sum()
    assert torch.allclose(pi, closed, atol=1e-6), (pi, closed)
    # the optimum is the closed form, not just near it: the gradient vanishes there
    at = torch.log(closed).requires_grad_(True)
    objective(at).backward()
    assert at.grad.abs().max() < 1e-10, at.grad
