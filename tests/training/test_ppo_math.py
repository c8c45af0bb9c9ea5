"""Parity of lmprefs.training.{ppo,optim} with NumPy transcriptions of the original TF code.

The `np_*` functions below are written independently of lmprefs, line for line after
openai/lm-human-preferences@cbfd210 (train_policy.py, utils/core.py) and TF1's AdamOptimizer kernel, so a bug in
the port cannot hide in a shared helper. Tolerances: rtol 1e-5 / atol 1e-6 or tighter; math tests run in float64.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from torch import nn

from lmprefs.config import PPOConfig, RewardsConfig
from lmprefs.training import ppo
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import (
    AdaptiveKLController,
    FixedKLController,
    Rollout,
    gae,
    kl_penalized_rewards,
    make_kl_controller,
    ppo_losses,
    ppo_update,
    whiten,
)

TOL = dict(rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- NumPy transcriptions
def np_whiten(values, shift_mean=True):  # utils/core.py#L336-L341
    mean = np.mean(values)
    var = np.mean((values - mean) ** 2)  # tf.nn.moments: biased
    whitened = (values - mean) * (1.0 / np.sqrt(var + 1e-8))  # tf.rsqrt
    if not shift_mean:
        whitened += mean
    return whitened


def np_compute_rewards(scores, logprobs, ref_logprobs, kl_coef):  # train_policy.py#L149-L154
    kl = logprobs - ref_logprobs
    non_score_reward = -kl_coef * kl
    rewards = non_score_reward.copy()
    rewards[:, -1] += scores
    return rewards, non_score_reward


def np_advantages(values, rewards, gamma, lam):  # train_policy.py#L327-L336
    lastgaelam = 0
    advantages_reversed = []
    gen_length = rewards.shape[1]
    for t in reversed(range(gen_length)):
        nextvalues = values[:, t + 1] if t < gen_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = np.stack(advantages_reversed[::-1], axis=1)
    returns = advantages + values
    return advantages, returns


def np_loss(values, old_logprob, advantages, returns, vpred, logprob, cliprange, cliprange_value, vf_coef):
    # train_policy.py#L343-L371 (advantages already whitened, #L338)
    vpredclipped = np.clip(vpred, values - cliprange_value, values + cliprange_value)
    vf_losses1 = np.square(vpred - returns)
    vf_losses2 = np.square(vpredclipped - returns)
    vf_loss = 0.5 * np.mean(np.maximum(vf_losses1, vf_losses2))
    vf_clipfrac = np.mean((vf_losses2 > vf_losses1).astype(np.float64))
    ratio = np.exp(logprob - old_logprob)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * np.clip(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_loss = np.mean(np.maximum(pg_losses, pg_losses2))
    pg_clipfrac = np.mean((pg_losses2 > pg_losses).astype(np.float64))
    loss = pg_loss + vf_coef * vf_loss
    approxkl = 0.5 * np.mean(np.square(logprob - old_logprob))
    return loss, {
        "ppo/loss/policy": pg_loss, "ppo/loss/value": vf_loss, "ppo/loss/total": loss,
        "ppo/policy/approxkl": approxkl, "ppo/policy/clipfrac": pg_clipfrac,
        "ppo/returns/mean": np.mean(returns), "ppo/returns/var": np.var(returns),
        "ppo/val/vpred": np.mean(vpred), "ppo/val/error": np.mean((vpred - returns) ** 2),
        "ppo/val/clipfrac": vf_clipfrac, "ppo/val/mean": np.mean(values), "ppo/val/var": np.var(values),
    }  # fmt: skip


class NpAdaptiveKLController:  # train_policy.py#L115-L124
    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target, self.horizon = target, horizon

    def update(self, current, n_steps):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


class NpTF1Adam:
    """tf.train.AdamOptimizer: _prepare/_apply_dense + the ApplyAdam kernel (beta powers updated in _finish)."""

    def __init__(self, var, beta1=0.9, beta2=0.999, epsilon=1e-5):
        self.var, self.m, self.v = var.copy(), np.zeros_like(var), np.zeros_like(var)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.beta1_power, self.beta2_power = beta1, beta2

    def apply(self, grad, lr):
        lr_t = lr * np.sqrt(1 - self.beta2_power) / (1 - self.beta1_power)
        self.m += (grad - self.m) * (1 - self.beta1)
        self.v += (grad * grad - self.v) * (1 - self.beta2)
        self.var -= lr_t * self.m / (np.sqrt(self.v) + self.epsilon)
        self.beta1_power *= self.beta1
        self.beta2_power *= self.beta2


def t64(x):
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------- whiten, rewards, GAE
@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_tf(shift_mean):
    x = np.random.default_rng(0).normal(3.0, 2.0, size=(6, 5))
    got = whiten(t64(x), shift_mean=shift_mean).numpy()
    np.testing.assert_allclose(got, np_whiten(x, shift_mean), rtol=1e-12, atol=1e-12)
    # pin the semantics: variance 1 (biased), mean 0 or the input's mean kept
    assert np.var(got) == pytest.approx(1.0, abs=1e-6)
    assert got.mean() == pytest.approx(0.0 if shift_mean else x.mean(), abs=1e-9)
    # the unbiased variance would give a different answer: the test would notice the swap
    unbiased = (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8)
    assert not np.allclose(got - (0 if shift_mean else x.mean()), unbiased, rtol=1e-5)


def test_kl_penalized_rewards_matches_tf():
    rng = np.random.default_rng(1)
    logp, ref, scores = rng.normal(size=(4, 7)), rng.normal(size=(4, 7)), rng.normal(size=4)
    rewards, non_score, kl = kl_penalized_rewards(t64(logp), t64(ref), t64(scores), 0.15)
    np_rewards, np_non_score = np_compute_rewards(scores, logp, ref, 0.15)
    np.testing.assert_allclose(rewards.numpy(), np_rewards, rtol=1e-12)
    np.testing.assert_allclose(non_score.numpy(), np_non_score, rtol=1e-12)
    np.testing.assert_allclose(kl.numpy(), logp - ref, rtol=1e-12)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.95), (0.9, 1.0), (1.0, 0.0), (0.5, 0.7)])
def test_gae_matches_tf(gamma, lam):
    rng = np.random.default_rng(2)
    values, rewards = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    adv, ret = gae(t64(values), t64(rewards), gamma, lam)
    np_adv, np_ret = np_advantages(values, rewards, gamma, lam)
    np.testing.assert_allclose(adv.numpy(), np_adv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), np_ret, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- KL controllers
def test_adaptive_kl_controller_matches_tf_and_resumes():
    kls = [0.0, 2.0, 5.9, 6.0, 6.5, 9.0, 40.0, 1.0, 7.2]
    ours, theirs = AdaptiveKLController(0.15, 6.0, 10000), NpAdaptiveKLController(0.15, 6.0, 10000)
    for kl in kls:
        ours.update(kl, 512)
        theirs.update(kl, 512)
        assert ours.value == pytest.approx(theirs.value, rel=1e-12)
    assert ours.value != 0.15
    resumed = AdaptiveKLController(0.15, 6.0, 10000)
    resumed.load_state_dict(ours.state_dict())
    for kl in [3.0, 12.0]:
        ours.update(kl, 64)
        resumed.update(kl, 64)
    assert resumed.value == ours.value


def test_fixed_kl_controller_and_factory():
    fixed = make_kl_controller(RewardsConfig(kl_coef=0.03, kl_target=None))
    assert isinstance(fixed, FixedKLController)
    fixed.update(100.0, 512)
    assert fixed.value == 0.03
    again = FixedKLController(1.0)
    again.load_state_dict(fixed.state_dict())
    assert again.value == 0.03
    adaptive = make_kl_controller(RewardsConfig(kl_coef=0.15, kl_target=6.0, kl_horizon=10000))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.target == 6.0 and adaptive.horizon == 10000


# ---------------------------------------------------------------------------------------------- losses
def test_ppo_losses_match_tf():
    rng = np.random.default_rng(3)
    shape = (6, 8)
    values, old_logp = rng.normal(size=shape), rng.normal(-2, 0.5, size=shape)
    logp = old_logp + rng.normal(0, 0.3, size=shape)  # some ratios outside [0.8, 1.2]
    vpred = values + rng.normal(0, 0.3, size=shape)  # some outside the value clip
    adv, ret = np_whiten(rng.normal(size=shape)), rng.normal(size=shape)
    loss, stats = ppo_losses(t64(logp), t64(old_logp), t64(vpred), t64(values), t64(adv), t64(ret), 0.2, 0.2, 0.1)
    np_loss_value, np_stats = np_loss(values, old_logp, adv, ret, vpred, logp, 0.2, 0.2, 0.1)
    assert loss.item() == pytest.approx(np_loss_value, rel=1e-12)
    assert set(stats) == set(np_stats)
    for k, v in np_stats.items():
        assert stats[k].item() == pytest.approx(v, rel=1e-12, abs=1e-12), k
    assert 0 < stats["ppo/policy/clipfrac"].item() < 1 and 0 < stats["ppo/val/clipfrac"].item() < 1


def test_ppo_losses_clip_edge_cases():
    # ratio e and 1/e against advantages +1 and -1, cliprange 0.2
    logp = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old, adv = torch.zeros(1, 4, dtype=torch.float64), t64([[1.0, -1.0, 1.0, -1.0]])
    zeros = torch.zeros(1, 4, dtype=torch.float64)
    loss, stats = ppo_losses(logp, old, zeros, zeros, adv, zeros, 0.2, 0.2, 0.0)
    e = math.e
    # +adv, ratio e: clipped at 1.2 | -adv, ratio e: unclipped | +adv, ratio 1/e: unclipped | -adv, 1/e: clipped 0.8
    assert loss.item() == pytest.approx((-1.2 + e - 1 / e + 0.8) / 4, rel=1e-12)
    assert stats["ppo/policy/clipfrac"].item() == 0.5
    assert stats["ppo/policy/approxkl"].item() == pytest.approx(0.5, rel=1e-12)
    loss.backward()
    np.testing.assert_allclose(logp.grad.numpy(), [[0.0, e / 4, -1 / (4 * e), 0.0]], rtol=1e-12, atol=1e-15)

    # value clip 0.2 around old value 0, return 1: at vpred 0.5 the clipped loss (0.2 - 1)^2 is the larger one
    vpred = t64([[0.5, 0.1]]).requires_grad_(True)
    old_values, returns = torch.zeros(1, 2, dtype=torch.float64), t64([[1.0, 1.0]])
    z = torch.zeros(1, 2, dtype=torch.float64)
    loss, stats = ppo_losses(z, z, vpred, old_values, z, returns, 0.2, 0.2, 1.0)
    # entry 0: max((0.5-1)^2, (0.2-1)^2) = 0.64 (clipped, no gradient); entry 1: inside the clip, 0.81
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81) / 2, rel=1e-12)
    assert stats["ppo/val/clipfrac"].item() == 0.5
    loss.backward()
    np.testing.assert_allclose(vpred.grad.numpy(), [[0.0, 0.5 * 2 * (0.1 - 1.0) / 2]], rtol=1e-12)


# ---------------------------------------------------------------------------------------------- TF-style Adam
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_tfadam_matches_tf1_adam_with_lr_schedule(layout):
    # contiguous: torch's fused Adam kernel; a transposed (strided) parameter: the foreach ops
    rng = np.random.default_rng(4)
    init = rng.normal(size=(3, 4))
    grads = [rng.normal(0, 1e-3 * (i + 1), size=(3, 4)) for i in range(6)]
    lrs = [1e-2 * (1 - i / 6) for i in range(6)]  # linear decay, set by the caller
    for dtype, tol in [(torch.float64, dict(rtol=1e-12, atol=1e-14)), (torch.float32, TOL)]:
        start = torch.tensor(init, dtype=dtype)
        p = nn.Parameter(start if layout == "contiguous" else start.t().contiguous().t())
        assert p.is_contiguous() == (layout == "contiguous")
        opt, ref = TFAdam([p], lr=lrs[0]), NpTF1Adam(init)
        for g, lr in zip(grads, lrs, strict=True):
            opt.param_groups[0]["lr"] = lr
            p.grad = torch.tensor(g, dtype=dtype)
            opt.step()
            ref.apply(g, lr)
            np.testing.assert_allclose(p.detach().double().numpy(), ref.var, **tol)


def test_tfadam_parameters_at_different_steps():
    # A parameter with no gradient in a step is not stepped, so its bias corrections run behind the others'.
    rng = np.random.default_rng(5)
    inits = [rng.normal(size=(2, 3)), rng.normal(size=(4,))]
    params = [nn.Parameter(t64(x)) for x in inits]
    opt, refs = TFAdam(params, lr=1e-2), [NpTF1Adam(x) for x in inits]
    for i in range(5):
        for k, (p, ref) in enumerate(zip(params, refs, strict=True)):
            p.grad = None
            if k == 0 or i % 2:
                g = rng.normal(0, 1e-3, size=p.shape)
                p.grad = t64(g)
                ref.apply(g, 1e-2)
        opt.step()
    assert [opt.state[p]["step"] for p in params] == [5, 2]
    for p, ref in zip(params, refs, strict=True):
        np.testing.assert_allclose(p.detach().numpy(), ref.var, rtol=1e-12, atol=1e-14)


def test_tfadam_differs_from_torch_adam_early():
    # Blog item 12: with the same eps, torch's effective epsilon hat is eps*sqrt(1-b2^t), so its first steps on
    # small gradients are much larger. At t=1: torch moves lr*g/(|g|+eps), TF lr*g/(|g|+eps/sqrt(1-b2)).
    g, lr, eps = 1e-4, 1e-3, 1e-5
    moved = {}
    for name, cls in [("tf", TFAdam), ("torch", torch.optim.Adam)]:
        p = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        opt = cls([p], lr=lr, eps=eps)
        p.grad = torch.full_like(p, g)
        opt.step()
        moved[name] = -p.item()
    assert moved["torch"] == pytest.approx(lr * g / (g + eps), rel=1e-9)
    assert moved["tf"] == pytest.approx(lr * g / (g + eps / math.sqrt(1 - 0.999)), rel=1e-9)
    assert moved["torch"] > 3.5 * moved["tf"]


def test_tfadam_state_dict_round_trip():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x = torch.randn(8, 4)

    def train(m, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            (m(x) ** 2).mean().backward()
            opt.step()

    opt = TFAdam(model.parameters(), lr=1e-2)
    train(model, opt, 3)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    clone = nn.Linear(4, 3)
    clone.load_state_dict(saved["model"])
    clone_opt = TFAdam(clone.parameters(), lr=123.0)
    clone_opt.load_state_dict(saved["opt"])
    assert clone_opt.param_groups[0]["lr"] == 1e-2 and clone_opt.state[clone.weight]["step"] == 3
    train(model, opt, 2)
    train(clone, clone_opt, 2)
    for a, b in zip(model.parameters(), clone.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- ppo_update
B, Q, T, V, TEMPERATURE = 8, 3, 5, 11, 0.7


class TinyPolicy(nn.Module):
    """Logits and a value for each response position, from the token before it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, 8)
        self.lm_head = nn.Linear(8, V)
        self.value_head = nn.Linear(8, 1)

    def forward(self, mb: Rollout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        context = torch.cat([mb.queries[:, -1:], mb.responses[:, :-1]], dim=1)  # [b, T]
        h = torch.tanh(self.emb(context))  # [b, T, 8]
        logp_all = (self.lm_head(h) / TEMPERATURE).log_softmax(-1)  # [b, T, V]
        logprobs = logp_all.gather(-1, mb.responses.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logprobs, self.value_head(h).squeeze(-1), entropy


def make_rollout(policy: TinyPolicy, seed: int = 0) -> Rollout:
    g = torch.Generator().manual_seed(seed)
    queries, responses = torch.randint(0, V, (B, Q), generator=g), torch.randint(0, V, (B, T), generator=g)
    empty = torch.zeros(B, T)
    stub = Rollout(queries, responses, empty, empty, empty, torch.zeros(B), empty)
    with torch.no_grad():  # old logprobs/values from the very forward used in training: ratio must be 1
        logprobs, values, _ = policy(stub)
    ref_logprobs = logprobs + 0.1 * torch.randn(B, T, generator=g)
    scores = torch.randn(B, generator=g)
    rewards, _, _ = kl_penalized_rewards(logprobs, ref_logprobs, scores, 0.15)
    values = values + 0.3 * torch.randn(B, T, generator=g)  # a non-trivial value head for the value stats
    return Rollout(queries, responses, logprobs, ref_logprobs, values, scores, rewards)


def test_rollout_indexing_is_a_view_of_the_batch():
    roll = make_rollout(TinyPolicy())
    idx = torch.tensor([5, 1])
    sub = roll[idx]
    assert len(sub) == 2 and sub.scores.shape == (2,) and sub.queries.shape == (2, Q)
    torch.testing.assert_close(sub.rewards, roll.rewards[idx])


def test_ppo_update_first_minibatch_has_ratio_one():
    torch.manual_seed(0)
    policy = TinyPolicy()
    roll = make_rollout(policy)
    before = [p.detach().clone() for p in policy.parameters()]
    with torch.no_grad():
        vpred = policy(roll)[1].double().numpy()  # what the single minibatch sees before its step
    cfg = PPOConfig(batch_size=B, nminibatches=1, noptepochs=1, lr=1e-2)
    stats = ppo_update(policy, TFAdam(policy.parameters(), lr=cfg.lr), roll, cfg, torch.Generator().manual_seed(0))

    assert stats["ppo/policy/approxkl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["ppo/policy/clipfrac"] == pytest.approx(0.0, abs=1e-6)
    assert all(math.isfinite(v) for v in stats.values())
    assert all(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    # the single minibatch is the whole batch (in a shuffled order, which the stats do not see)
    np_rewards = np_whiten(roll.rewards.double().numpy(), shift_mean=False)
    adv, ret = np_advantages(roll.values.double().numpy(), np_rewards, cfg.gamma, cfg.lam)
    old_logp, values = roll.logprobs.double().numpy(), roll.values.double().numpy()
    _, np_stats = np_loss(values, old_logp, np_whiten(adv), ret, vpred, old_logp, 0.2, 0.2, 0.1)
    for k, v in np_stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert stats["ppo/val/var_explained"] == pytest.approx(1 - np_stats["ppo/val/error"] / np.var(ret), rel=1e-5)
    expected = set(np_stats) | {"ppo/policy/entropy", "ppo/val/var_explained"}
    assert set(stats) == expected


@pytest.mark.parametrize("whiten_rewards", [True, False])
def test_ppo_update_whitens_per_minibatch(monkeypatch, whiten_rewards):
    torch.manual_seed(1)
    policy = TinyPolicy()
    roll = make_rollout(policy, seed=1)
    calls = []

    def spy(x, shift_mean=True, mask=None):
        calls.append((tuple(x.shape), shift_mean))
        return whiten(x, shift_mean, mask)

    monkeypatch.setattr(ppo, "whiten", spy)
    cfg = PPOConfig(batch_size=B, nminibatches=2, noptepochs=1, lr=1e-3, whiten_rewards=whiten_rewards)
    stats = ppo_update(policy, TFAdam(policy.parameters(), lr=cfg.lr), roll, cfg, torch.Generator().manual_seed(7))
    per_mb = [((B // 2, T), False), ((B // 2, T), True)] if whiten_rewards else [((B // 2, T), True)]
    assert calls == per_mb * 2

    # The returns stats are functions of the rollout and the shuffle only: recompute them per minibatch in NumPy
    order = torch.randperm(B, generator=torch.Generator().manual_seed(7)).numpy()
    rewards, values = roll.rewards.double().numpy(), roll.values.double().numpy()
    means, variances = [], []
    for idx in (order[: B // 2], order[B // 2 :]):
        mb_rewards = np_whiten(rewards[idx], shift_mean=False) if whiten_rewards else rewards[idx]
        _, ret = np_advantages(values[idx], mb_rewards, cfg.gamma, cfg.lam)
        means.append(ret.mean())
        variances.append(ret.var())
    assert stats["ppo/returns/mean"] == pytest.approx(np.mean(means), rel=1e-5, abs=1e-6)
    assert stats["ppo/returns/var"] == pytest.approx(np.mean(variances), rel=1e-5, abs=1e-6)
    if whiten_rewards:  # whitening the full batch instead would give another answer
        _, full_ret = np_advantages(values, np_whiten(rewards, shift_mean=False), cfg.gamma, cfg.lam)
        assert abs(full_ret.var() - np.mean(variances)) > 1e-3


def test_ppo_update_shuffles_afresh_each_epoch_and_checks_divisibility():
    policy = TinyPolicy()
    roll = make_rollout(policy, seed=2)
    seen = []
    cfg = PPOConfig(batch_size=B, nminibatches=4, noptepochs=3, lr=1e-3)

    def forward(mb: Rollout):
        seen.append(mb.queries)
        return policy(mb)

    ppo_update(forward, TFAdam(policy.parameters(), lr=cfg.lr), roll, cfg, torch.Generator().manual_seed(0))
    assert len(seen) == 12
    epochs = [torch.cat(seen[i : i + 4]) for i in (0, 4, 8)]
    for e in epochs:  # each epoch visits every episode once
        assert sorted(map(tuple, e.tolist())) == sorted(map(tuple, roll.queries.tolist()))
    assert not (torch.equal(epochs[0], epochs[1]) and torch.equal(epochs[1], epochs[2]))
    with pytest.raises(ValueError, match="nminibatches"):
        ppo_update(policy, TFAdam(policy.parameters(), lr=1e-3), roll[:6], cfg, torch.Generator())
