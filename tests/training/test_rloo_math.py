"""Parity of lmprefs.training.rloo with a NumPy transcription of the RLOO estimator (Ahmadian et al. 2024, eq. for
the leave-one-out baseline; TRL's RLOOTrainer for the clipped token-level loss), written here without lmprefs'
helpers: loops over queries and samples, so a vectorization slip cannot hide in a shared formula. float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmprefs.config import PPOConfig
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import Rollout, kl_penalized_rewards, ppo_update
from lmprefs.training.rloo import rloo_advantages, rloo_losses, rloo_returns

TOL = dict(rtol=1e-10, atol=1e-12)


def np_rloo_advantages(scores, kl, beta, k):
    """For each query's k samples: return_i = score_i - beta * sum_t kl_it; A_i = return_i - mean_{j != i} return_j."""
    returns = scores - beta * kl.sum(1)
    adv = np.zeros_like(returns)
    for q in range(len(returns) // k):
        group = returns[q * k : (q + 1) * k]
        for i in range(k):
            others = [group[j] for j in range(k) if j != i]
            adv[q * k + i] = group[i] - sum(others) / (k - 1)
    return returns, adv


def np_rloo_loss(logprobs, old_logprobs, adv, cliprange):
    """Per-token clipped surrogate with the sequence's advantage on every token, mean over all tokens."""
    B, T = logprobs.shape
    total, clipped = 0.0, 0
    for i in range(B):
        for t in range(T):
            ratio = np.exp(logprobs[i, t] - old_logprobs[i, t])
            a = -adv[i] * ratio
            b = -adv[i] * np.clip(ratio, 1 - cliprange, 1 + cliprange)
            total += max(a, b)
            clipped += b > a
    return total / (B * T), clipped / (B * T)


def np_rloo_sequence_loss(logprobs, old_logprobs, adv, cliprange, mask=None):
    """TRL's RLOOTrainer (1.12): one ratio per response, exp of its summed log-ratio over real tokens, clipped; the
    mean over responses."""
    B, T = logprobs.shape
    mask = np.ones((B, T)) if mask is None else mask
    total, clipped = 0.0, 0
    for i in range(B):
        ratio = np.exp(sum((logprobs[i, t] - old_logprobs[i, t]) * mask[i, t] for t in range(T)))
        a = -adv[i] * ratio
        b = -adv[i] * np.clip(ratio, 1 - cliprange, 1 + cliprange)
        total += max(a, b)
        clipped += b > a
    return total / B, clipped / B


@pytest.mark.parametrize("k", [2, 3, 4])
def test_leave_one_out_advantages_match_numpy(k):
    g = torch.Generator().manual_seed(k)
    B, T, beta = 4 * k, 6, 0.13
    scores, kl = torch.randn(B, generator=g, dtype=torch.float64), torch.randn(B, T, generator=g, dtype=torch.float64)
    returns = rloo_returns(scores, kl, beta)
    adv = rloo_advantages(returns, k)
    np_ret, np_adv = np_rloo_advantages(scores.numpy(), kl.numpy(), beta, k)
    np.testing.assert_allclose(returns.numpy(), np_ret, **TOL)
    np.testing.assert_allclose(adv.numpy(), np_adv, **TOL)
    np.testing.assert_allclose(adv.view(-1, k).sum(1).numpy(), 0.0, atol=1e-12)  # a query's advantages cancel


def test_returns_are_the_kl_penalized_rewards_summed():
    g = torch.Generator().manual_seed(0)
    logp, ref = (torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(2))
    scores = torch.randn(6, generator=g, dtype=torch.float64)
    rewards, _, kl = kl_penalized_rewards(logp, ref, scores, 0.2)
    torch.testing.assert_close(rloo_returns(scores, kl, 0.2), rewards.sum(1))


@pytest.mark.parametrize("k,B", [(1, 4), (3, 4), (0, 4)])
def test_bad_k_is_refused(k, B):
    with pytest.raises(ValueError, match=f"k={k}"):
        rloo_advantages(torch.zeros(B), k)


def test_clipped_loss_and_its_stats_match_numpy():
    g = torch.Generator().manual_seed(1)
    B, T = 6, 7
    old = torch.randn(B, T, generator=g, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    vpred = torch.randn(B, T, dtype=torch.float64, requires_grad=True)
    loss, stats = rloo_losses(new, old, vpred, adv, 0.2)
    np_loss, np_clip = np_rloo_loss(new.detach().numpy(), old.numpy(), adv.numpy(), 0.2)
    assert loss.item() == pytest.approx(np_loss, rel=1e-10)
    assert stats["ppo/policy/clipfrac"].item() == pytest.approx(np_clip, rel=1e-10)
    assert stats["ppo/policy/approxkl"].item() == pytest.approx(0.5 * np.mean((new - old).detach().numpy() ** 2))
    loss.backward()
    assert vpred.grad is not None and not vpred.grad.any()  # in the graph (DDP), but no signal to the value head


def test_ppo_update_with_advantages_trains_the_policy_and_leaves_the_value_head():
    from torch import nn

    V, B, T = 11, 8, 5

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lm_head, self.value_head = nn.Embedding(V, 8), nn.Linear(8, V), nn.Linear(8, 1)

        def forward(self, mb):
            h = torch.tanh(self.emb(mb.responses))  # [b, T, 8]
            logp_all = self.lm_head(h).log_softmax(-1)
            logp = logp_all.gather(-1, mb.responses.unsqueeze(-1)).squeeze(-1)
            return logp, self.value_head(h).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)

    torch.manual_seed(0)
    pol = Tiny()
    responses = torch.randint(0, V, (B, T))
    empty = torch.zeros(B, T)
    with torch.no_grad():
        logp = pol(Rollout(responses[:, :1], responses, empty, empty, empty, torch.zeros(B), empty))[0]
    adv = rloo_advantages(torch.randn(B), 2)
    roll = Rollout(responses[:, :1], responses, logp, logp, empty, torch.zeros(B), empty, None, adv)
    head = [p.detach().clone() for p in pol.value_head.parameters()]
    lm = pol.lm_head.weight.detach().clone()
    cfg = PPOConfig(batch_size=B, nminibatches=2, noptepochs=2, lr=1e-2, estimator="rloo")
    stats = ppo_update(pol, TFAdam(pol.parameters(), lr=cfg.lr), roll, cfg, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(head, pol.value_head.parameters(), strict=True))
    assert not torch.equal(lm, pol.lm_head.weight)
    assert "ppo/loss/value" not in stats and "ppo/val/var_explained" not in stats
    assert set(stats) == {"ppo/loss/policy", "ppo/loss/total", "ppo/policy/approxkl", "ppo/policy/clipfrac",
                          "ppo/policy/entropy"}


@pytest.mark.parametrize("masked", [False, True], ids=["whole", "stopped-early"])
def test_the_sequence_level_ratio_matches_trls_loss_in_numpy(masked):
    g = torch.Generator().manual_seed(2)
    B, T = 8, 5
    old = torch.randn(B, T, generator=g, dtype=torch.float64)
    new = (old + 0.08 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.arange(T) < torch.tensor([5, 3, 5, 1, 4, 5, 2, 5])[:, None]).double() if masked else None
    loss, stats = rloo_losses(new, old, torch.zeros(B, T, dtype=torch.float64), adv, 0.2, mask, level="sequence")
    np_loss, np_clip = np_rloo_sequence_loss(new.detach().numpy(), old.numpy(), adv.numpy(), 0.2,
                                             None if mask is None else mask.numpy())  # fmt: skip
    assert loss.item() == pytest.approx(np_loss, rel=1e-10)
    assert stats["ppo/policy/clipfrac"].item() == pytest.approx(np_clip, rel=1e-10) and 0 < np_clip < 1
    token, _ = rloo_losses(new, old, torch.zeros(B, T, dtype=torch.float64), adv, 0.2, mask)
    assert token.item() != pytest.approx(loss.item(), rel=1e-3)  # the two levels are two losses


def test_on_policy_the_sequence_level_gradient_is_reinforce_and_the_token_level_its_share_per_token():
    """At ratio 1 the sequence level's gradient is the published RLOO's REINFORCE, -mean_i A_i grad sum_t log pi;
    the token level's is the same summed over tokens and divided by B * T."""
    g = torch.Generator().manual_seed(3)
    B, T = 6, 4
    logits = torch.randn(B, T, 7, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, 7, (B, T), generator=g)
    adv = torch.randn(B, generator=g, dtype=torch.float64)

    def logp():
        return logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)  # [B, T]

    old = logp().detach()
    grads = {}
    for level in ("sequence", "token"):
        logits.grad = None
        rloo_losses(logp(), old, torch.zeros(B, T, dtype=torch.float64), adv, 0.2, level=level)[0].backward()
        grads[level] = logits.grad.clone()
    logits.grad = None
    (-(adv[:, None] * logp()).sum(1).mean()).backward()  # REINFORCE with the leave-one-out advantage
    torch.testing.assert_close(grads["sequence"], logits.grad)
    torch.testing.assert_close(grads["token"], logits.grad / T)


def test_ppo_update_takes_the_ratio_level_from_the_config():
    from lmprefs.training.ppo import _minibatch_loss

    g = torch.Generator().manual_seed(4)
    B, T = 4, 3
    old = torch.randn(B, T, generator=g)
    new = old + 0.5 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    mb = Rollout(torch.zeros(B, 1), torch.zeros(B, T), old, old, torch.zeros(B, T), torch.zeros(B), torch.zeros(B, T),
                 None, adv)  # fmt: skip
    for level in ("token", "sequence"):
        loss, _ = _minibatch_loss(mb, new, torch.zeros(B, T), PPOConfig(estimator="rloo", rloo_ratio=level))
        assert loss.item() == pytest.approx(rloo_losses(new, old, torch.zeros(B, T), adv, 0.2, level=level)[0].item())
