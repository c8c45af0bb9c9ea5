"""The PPO math over responses that stop at EOS (task.stop_at_eos), against NumPy transcriptions written here.

The transcriptions do not mask anything: they treat each row as the original's fixed-length episode of its own
length (GAE per row over its real tokens), and the means as means over the list of every real token, which is what
the masked functions of lmprefs.training.ppo must reproduce. A batch whose rows all run to T must compute bitwise as
the fixed-length code does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from lmprefs.config import PPOConfig
from lmprefs.training.masked import masked_mean, masked_var, partial_mask
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import Rollout, gae, kl_penalized_rewards, ppo_losses, ppo_update, whiten
from lmprefs.training.rloo import rloo_losses

B, T = 6, 7


def lengths_and_mask(seed: int, b: int = B, t: int = T):
    """Random lengths in 1..t, at least one 1 and one t; the mask [b, t] they give."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=b)
    lengths[0], lengths[-1] = 1, t
    mask = np.arange(t)[None, :] < lengths[:, None]
    return lengths, mask


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------- NumPy transcriptions
def np_whiten_real(values, mask, shift_mean=True):  # utils/core.py#L336-L341 on the real tokens only
    real = values[mask]
    mean = np.mean(real)
    var = np.mean((real - mean) ** 2)
    out = np.zeros_like(values)
    out[mask] = (real - mean) / np.sqrt(var + 1e-8) + (0.0 if shift_mean else mean)
    return out


def np_rewards_per_row(scores, logprobs, ref_logprobs, kl_coef, lengths):  # train_policy.py#L149-L154, row by row
    rewards = np.zeros_like(logprobs)
    for i, n in enumerate(lengths):
        kl = logprobs[i, :n] - ref_logprobs[i, :n]
        rewards[i, :n] = -kl_coef * kl
        rewards[i, n - 1] += scores[i]
    return rewards


def np_gae_per_row(values, rewards, gamma, lam, lengths):  # train_policy.py#L327-L336, each row its own episode
    advantages, returns = np.zeros_like(values), np.zeros_like(values)
    for i, n in enumerate(lengths):
        lastgaelam, rev = 0.0, []
        for t in reversed(range(n)):
            nextvalues = values[i, t + 1] if t < n - 1 else 0.0
            delta = rewards[i, t] + gamma * nextvalues - values[i, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            rev.append(lastgaelam)
        advantages[i, :n] = rev[::-1]
        returns[i, :n] = advantages[i, :n] + values[i, :n]
    return advantages, returns


def np_loss_real(values, old_logprob, advantages, returns, vpred, logprob, cliprange, cliprange_value, vf_coef):
    """train_policy.py#L343-L371 on 1-D arrays of every real token of the minibatch."""
    vpredclipped = np.clip(vpred, values - cliprange_value, values + cliprange_value)
    vf_losses1, vf_losses2 = np.square(vpred - returns), np.square(vpredclipped - returns)
    vf_loss = 0.5 * np.mean(np.maximum(vf_losses1, vf_losses2))
    ratio = np.exp(logprob - old_logprob)
    pg_losses, pg_losses2 = -advantages * ratio, -advantages * np.clip(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_loss = np.mean(np.maximum(pg_losses, pg_losses2))
    loss = pg_loss + vf_coef * vf_loss
    return loss, {
        "ppo/loss/policy": pg_loss, "ppo/loss/value": vf_loss, "ppo/loss/total": loss,
        "ppo/policy/approxkl": 0.5 * np.mean(np.square(logprob - old_logprob)),
        "ppo/policy/clipfrac": np.mean(pg_losses2 > pg_losses), "ppo/returns/mean": np.mean(returns),
        "ppo/returns/var": np.var(returns), "ppo/val/vpred": np.mean(vpred),
        "ppo/val/error": np.mean((vpred - returns) ** 2), "ppo/val/clipfrac": np.mean(vf_losses2 > vf_losses1),
        "ppo/val/mean": np.mean(values), "ppo/val/var": np.var(values),
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- (a) parity
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_moments_and_whitening_match_numpy_over_the_real_tokens(seed):
    _, mask = lengths_and_mask(seed)
    x = np.random.default_rng(seed + 10).normal(2.0, 3.0, size=(B, T))
    m = torch.tensor(mask)
    assert masked_mean(t64(x), m).item() == pytest.approx(x[mask].mean(), rel=1e-12)
    assert masked_var(t64(x), m).item() == pytest.approx(x[mask].var(), rel=1e-12)
    for shift_mean in (True, False):
        got = whiten(t64(x), shift_mean, mask=m).numpy()
        np.testing.assert_allclose(got, np_whiten_real(x, mask, shift_mean), rtol=1e-12, atol=1e-12)
    # the padding's values must not count: moments over all b * T would differ
    assert not np.allclose(whiten(t64(x), mask=m).numpy()[mask], whiten(t64(x)).numpy()[mask], rtol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kl_penalty_puts_the_score_on_the_last_real_token(seed):
    lengths, mask = lengths_and_mask(seed)
    rng = np.random.default_rng(seed + 20)
    logp, ref, scores = rng.normal(size=(B, T)), rng.normal(size=(B, T)), rng.normal(size=B)
    rewards, non_score, kl = kl_penalized_rewards(t64(logp), t64(ref), t64(scores), 0.15, torch.tensor(mask))
    np.testing.assert_allclose(rewards.numpy(), np_rewards_per_row(scores, logp, ref, 0.15, lengths), rtol=1e-12)
    assert (kl.numpy()[~mask] == 0).all() and (non_score.numpy()[~mask] == 0).all()
    np.testing.assert_allclose(kl.sum(1).numpy(), [(logp[i, :n] - ref[i, :n]).sum() for i, n in enumerate(lengths)])


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.7), (1.0, 0.0)])
def test_masked_gae_is_each_rows_own_episode(gamma, lam):
    lengths, mask = lengths_and_mask(3)
    rng = np.random.default_rng(4)
    values, rewards = rng.normal(size=(B, T)), rng.normal(size=(B, T))  # garbage on the padding too
    adv, ret = gae(t64(values), t64(rewards), gamma, lam, torch.tensor(mask))
    np_adv, np_ret = np_gae_per_row(values, rewards, gamma, lam, lengths)
    np.testing.assert_allclose(adv.numpy(), np_adv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), np_ret, rtol=1e-12, atol=1e-12)


def test_masked_losses_are_the_losses_of_the_real_tokens():
    _, mask = lengths_and_mask(5)
    rng = np.random.default_rng(6)
    values, old_logp = rng.normal(size=(B, T)), rng.normal(-2, 0.5, size=(B, T))
    logp, vpred = old_logp + rng.normal(0, 0.3, size=(B, T)), values + rng.normal(0, 0.3, size=(B, T))
    adv, ret = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    logp_t = t64(logp).requires_grad_(True)
    loss, stats = ppo_losses(logp_t, t64(old_logp), t64(vpred), t64(values), t64(adv), t64(ret), 0.2, 0.2, 0.1,
                             torch.tensor(mask))  # fmt: skip
    np_value, np_stats = np_loss_real(values[mask], old_logp[mask], adv[mask], ret[mask], vpred[mask], logp[mask],
                                      0.2, 0.2, 0.1)  # fmt: skip
    assert loss.item() == pytest.approx(np_value, rel=1e-12)
    assert set(stats) == set(np_stats)
    for k, v in np_stats.items():
        assert stats[k].item() == pytest.approx(v, rel=1e-12, abs=1e-12), k
    loss.backward()
    assert (logp_t.grad.numpy()[~mask] == 0).all() and (logp_t.grad.numpy()[mask] != 0).any()
    rl, rstats = rloo_losses(t64(logp), t64(old_logp), t64(vpred), t64(adv[:, 0]), 0.2, torch.tensor(mask))
    a = np.broadcast_to(adv[:, :1], (B, T))
    ratio = np.exp(logp - old_logp)
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2))[mask].mean()
    assert rl.item() == pytest.approx(pg, rel=1e-12) and rstats["ppo/loss/policy"].item() == pytest.approx(pg)


# ---------------------------------------------------------------------------------------------- ppo_update
V, Q = 11, 3


class TinyPolicy(nn.Module):
    """Logits and a value for each response position from the token before it (PAD read as token 0)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.lm_head, self.value_head = nn.Embedding(V, 8), nn.Linear(8, V), nn.Linear(8, 1)

    def forward(self, mb: Rollout):
        r = mb.responses.clamp(min=0)
        h = torch.tanh(self.emb(torch.cat([mb.queries[:, -1:], r[:, :-1]], dim=1)))  # [b, T, 8]
        logp_all = self.lm_head(h).log_softmax(-1)
        logprobs = logp_all.gather(-1, r.unsqueeze(-1)).squeeze(-1)
        return logprobs, self.value_head(h).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


def rollout_for(policy: TinyPolicy, mask: np.ndarray | None, seed: int = 0) -> Rollout:
    """A rollout as make_rollout builds one: PAD past each row's end, logprobs, ref and values 0 there."""
    g = torch.Generator().manual_seed(seed)
    queries, responses = torch.randint(0, V, (B, Q), generator=g), torch.randint(0, V, (B, T), generator=g)
    m = None if mask is None else torch.tensor(mask)
    if m is not None:
        responses = torch.where(m, responses, -1)
    empty = torch.zeros(B, T)
    with torch.no_grad():
        logprobs, values, _ = policy(Rollout(queries, responses, empty, empty, empty, torch.zeros(B), empty))
    ref = logprobs + 0.1 * torch.randn(B, T, generator=g)
    values = values + 0.3 * torch.randn(B, T, generator=g)
    if m is not None:
        logprobs, ref, values = (torch.where(m, x, 0) for x in (logprobs, ref, values))
    scores = torch.randn(B, generator=g)
    rewards, _, _ = kl_penalized_rewards(logprobs, ref, scores, 0.15, m)
    return Rollout(queries, responses, logprobs, ref, values, scores, rewards, mask=m)


def run_update(mask, nminibatches=1, noptepochs=2):
    policy = TinyPolicy()
    roll = rollout_for(policy, mask)
    cfg = PPOConfig(batch_size=B, nminibatches=nminibatches, noptepochs=noptepochs, lr=1e-2)
    stats = ppo_update(policy, TFAdam(policy.parameters(), lr=cfg.lr), roll, cfg, torch.Generator().manual_seed(0))
    return policy, roll, stats


def test_ppo_update_with_a_mask_matches_numpy_on_the_first_minibatch():
    lengths, mask = lengths_and_mask(7)
    policy, roll, stats = run_update(mask, noptepochs=1)
    # the one minibatch is the whole batch before its step: vpred is the rollout's forward, the ratio 1
    fresh = TinyPolicy()
    with torch.no_grad():
        vpred = fresh(roll)[1].double().numpy()
    rewards = np_whiten_real(roll.rewards.double().numpy(), mask, shift_mean=False)
    values, old = roll.values.double().numpy(), roll.logprobs.double().numpy()
    adv, ret = np_gae_per_row(values, rewards, 1.0, 0.95, lengths)
    adv = np_whiten_real(adv, mask)
    _, np_stats = np_loss_real(values[mask], old[mask], adv[mask], ret[mask], vpred[mask], old[mask], 0.2, 0.2, 0.1)
    for k, v in np_stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert all(math.isfinite(v) for v in stats.values())


# ---------------------------------------------------------------------------------------------- (b) full length
def test_full_length_rows_with_the_mask_on_compute_bitwise_as_without():
    rng = np.random.default_rng(8)
    values, rewards = t64(rng.normal(size=(B, T))), t64(rng.normal(size=(B, T)))
    full = torch.ones(B, T, dtype=torch.bool)
    for a, b in zip(gae(values, rewards, 1.0, 0.95, full), gae(values, rewards, 1.0, 0.95), strict=True):
        assert torch.equal(a, b)
    lp, ref, sc = t64(rng.normal(size=(B, T))), t64(rng.normal(size=(B, T))), t64(rng.normal(size=B))
    for a, b in zip(kl_penalized_rewards(lp, ref, sc, 0.2, full), kl_penalized_rewards(lp, ref, sc, 0.2), strict=True):
        assert torch.equal(a, b)
    assert partial_mask(full) is None and partial_mask(None) is None
    # a whole update: a rollout that carries an all-ones mask trains exactly as one without
    with_mask, _, stats_mask = run_update(np.ones((B, T), dtype=bool), nminibatches=2)
    without, _, stats = run_update(None, nminibatches=2)
    assert stats_mask == stats
    for p, q in zip(with_mask.parameters(), without.parameters(), strict=True):
        assert torch.equal(p, q)


# ---------------------------------------------------------------------------------------------- (c) one-token rows
def test_a_row_whose_first_token_is_eos_learns_from_that_token_only():
    mask = np.ones((B, T), dtype=bool)
    mask[2, 1:] = False  # row 2: EOS first
    policy = TinyPolicy()
    roll = rollout_for(policy, mask)
    assert roll.rewards[2, 0] == pytest.approx(roll.scores[2] - 0.15 * (roll.logprobs[2, 0] - roll.ref_logprobs[2, 0]))
    assert (roll.rewards[2, 1:] == 0).all()
    adv, ret = gae(roll.values, roll.rewards, 1.0, 0.95, roll.mask)
    assert adv[2, 0] == pytest.approx(roll.rewards[2, 0] - roll.values[2, 0]) and (adv[2, 1:] == 0).all()
    logprobs, vpred, _ = policy(roll)
    loss, stats = ppo_losses(logprobs, roll.logprobs, vpred, roll.values, whiten(adv, mask=roll.mask), ret,
                             0.2, 0.2, 0.1, roll.mask)  # fmt: skip
    grad = torch.autograd.grad(loss, logprobs)[0]
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in stats.values())
    assert grad[2, 0] != 0 and (grad[2, 1:] == 0).all()
    # every row one token long: GAE, whitening and the update stay finite
    one = np.zeros((B, T), dtype=bool)
    one[:, 0] = True
    _, _, stats = run_update(one)
    assert all(math.isfinite(v) for v in stats.values()), stats
