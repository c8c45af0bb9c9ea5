"""Parity of lmprefs.training.grpo with NumPy transcriptions of each paper's formula, written here without lmprefs'
helpers: loops over queries, samples and tokens, so a vectorization slip cannot hide in a shared formula. float64.

- GRPO (DeepSeekMath, arXiv 2402.03300, eq. 3): (1/G) sum_i (1/|o_i|) sum_t [min(ratio A, clip(ratio) A)
  - beta D_k3], A_i = (r_i - mean r) / std r over the group, D_k3 = pi_ref/pi - log(pi_ref/pi) - 1.
- Dr. GRPO (arXiv 2503.20783, eq. 4): A_i = r_i - mean r, (1/G) sum_i (1/T_max) sum_t [...].
- REINFORCE++-baseline (arXiv 2501.03262): r - group mean, per-token k1 KL in the reward, returns-to-go with gamma 1,
  whitened over the batch's tokens; a token-mean loss.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmprefs.training.grpo import (
    dr_grpo_advantages,
    group_losses,
    grpo_advantages,
    k3,
    reinforce_pp_baseline_advantages,
)

TOL = dict(rtol=1e-10, atol=1e-12)


def np_group_advantages(returns, k, normalize):
    adv = np.zeros_like(returns)
    for q in range(len(returns) // k):
        g = returns[q * k : (q + 1) * k]
        mean = sum(g) / k
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (k - 1))  # unbiased, as TRL's torch .std()
        for i in range(k):
            adv[q * k + i] = (g[i] - mean) / (std + 1e-4) if normalize else g[i] - mean
    return adv


def np_reinforce_pp(scores, kl, beta, k, mask):
    B, T = kl.shape
    centred = np_group_advantages(scores, k, normalize=False)
    ret = np.zeros((B, T))
    for i in range(B):
        for t in range(T):
            ret[i, t] = centred[i] - beta * sum(kl[i, s] for s in range(t, T))
    real = [ret[i, t] for i in range(B) for t in range(T) if mask[i, t]]
    mean = sum(real) / len(real)
    var = sum((x - mean) ** 2 for x in real) / len(real)
    return np.where(mask, (ret - mean) / math.sqrt(var + 1e-8), 0.0)


def np_group_loss(logp, old, ref, adv, clip, normalizer, beta, mask):
    """The per-token clipped surrogate plus beta times k3, reduced as each paper does."""
    B, T = logp.shape
    per_row, count = [], 0
    for i in range(B):
        total, n = 0.0, 0
        for t in range(T):
            if not mask[i, t]:
                continue
            a = adv[i] if adv.ndim == 1 else adv[i, t]
            ratio = math.exp(logp[i, t] - old[i, t])
            surrogate = min(ratio * a, min(max(ratio, 1 - clip), 1 + clip) * a)
            kl = math.exp(ref[i, t] - logp[i, t]) - (ref[i, t] - logp[i, t]) - 1
            total += -surrogate + beta * kl
            n += 1
        per_row.append((total, n))
        count += n
    if normalizer == "token":
        return sum(t for t, _ in per_row) / count
    if normalizer == "sequence":
        return sum(t / n for t, n in per_row) / B
    return sum(t / T for t, _ in per_row) / B


@pytest.mark.parametrize("k", [2, 3, 5])
def test_grpo_and_dr_grpo_advantages_match_numpy(k):
    g = torch.Generator().manual_seed(k)
    returns = torch.randn(4 * k, generator=g, dtype=torch.float64)
    np.testing.assert_allclose(grpo_advantages(returns, k).numpy(), np_group_advantages(returns.numpy(), k, True),
                               **TOL)  # fmt: skip
    np.testing.assert_allclose(dr_grpo_advantages(returns, k).numpy(),
                               np_group_advantages(returns.numpy(), k, False), **TOL)  # fmt: skip


def test_grpo_advantages_of_a_tied_group_are_zero_not_nan():
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 2.0, 0.0], dtype=torch.float64), 2)
    assert adv[:2].tolist() == [0.0, 0.0] and adv[2] > 0 > adv[3]


@pytest.mark.parametrize("with_mask", [False, True])
def test_reinforce_pp_baseline_advantages_match_numpy(with_mask):
    g = torch.Generator().manual_seed(3)
    B, T, k, beta = 8, 5, 4, 0.3
    scores = torch.randn(B, generator=g, dtype=torch.float64)
    kl = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    if with_mask:
        mask[1, 3:], mask[6, 1:] = False, False
        kl = torch.where(mask, kl, 0)  # the rollout's KL is 0 on padding
    got = reinforce_pp_baseline_advantages(scores, kl, beta, k, mask if with_mask else None)
    want = np_reinforce_pp(scores.numpy(), kl.numpy(), beta, k, mask.numpy())
    np.testing.assert_allclose(got.numpy(), want, **TOL)


def test_k3_is_the_papers_estimator_and_never_negative():
    g = torch.Generator().manual_seed(4)
    logp, ref = (torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(2))
    want = np.exp(ref.numpy() - logp.numpy()) - (ref.numpy() - logp.numpy()) - 1
    np.testing.assert_allclose(k3(logp, ref).numpy(), want, **TOL)
    assert (k3(logp, ref) >= 0).all() and k3(logp, logp).abs().max() == 0


@pytest.mark.parametrize("normalizer", ["token", "sequence", "constant"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("token_adv", [False, True])
def test_group_loss_matches_numpy(normalizer, beta, with_mask, token_adv):
    g = torch.Generator().manual_seed(5)
    B, T = 6, 7
    old = torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn((B, T) if token_adv else (B,), generator=g, dtype=torch.float64)
    vpred = torch.randn(B, T, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(B, T, dtype=torch.bool)
    if with_mask:
        mask[0, 2:], mask[4, 5:] = False, False
    coef = torch.tensor(beta, dtype=torch.float64) if beta else None
    loss, stats = group_losses(new, old, ref, vpred, adv, 0.2, normalizer=normalizer, kl_coef=coef,
                               mask=mask if with_mask else None)  # fmt: skip
    want = np_group_loss(new.detach().numpy(), old.numpy(), ref.numpy(), adv.numpy(), 0.2, normalizer, beta,
                         mask.numpy())  # fmt: skip
    np.testing.assert_allclose(loss.item(), want, **TOL)
    loss.backward()
    assert vpred.grad is not None and not vpred.grad.any()  # the value head takes part, with a zero gradient
    assert torch.isfinite(new.grad).all()


def test_sequence_and_constant_normalizers_differ_only_when_rows_stop_early():
    g = torch.Generator().manual_seed(6)
    B, T = 4, 5
    old = torch.randn(B, T, generator=g, dtype=torch.float64)
    new, adv = old + 0.1, torch.randn(B, generator=g, dtype=torch.float64)
    args = (new, old, old, torch.zeros(B, T, dtype=torch.float64), adv, 0.2)
    full = [group_losses(*args, normalizer=n)[0].item() for n in ("token", "sequence", "constant")]
    assert max(full) - min(full) < 1e-12  # every row T tokens long: one mean
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 1:] = False
    seq, const = (group_losses(*args, normalizer=n, mask=mask)[0].item() for n in ("sequence", "constant"))
    assert abs(seq - const) > 1e-6  # a short row weighs 1/1 per token under GRPO, 1/T under Dr. GRPO


@pytest.mark.parametrize("k", [1, 0, 3])
def test_bad_group_size_is_refused(k):
    with pytest.raises(ValueError, match=f"k={k}"):
        grpo_advantages(torch.zeros(4), k)
