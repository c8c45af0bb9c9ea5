"""Best-of-n and Gao et al.'s functional forms (lmprefs.training.scaling_laws) against enumeration, the closed form's
integral, and NumPy's least squares."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from lmprefs.training.scaling_laws import best_of_n, bon_kl, bon_weights, fit_gao, gao_reward


@pytest.mark.parametrize("m,n", [(5, 1), (5, 2), (6, 3), (7, 7)])
def test_best_of_n_is_the_mean_max_over_every_n_subset(m, n):
    gen = torch.Generator().manual_seed(m * 10 + n)
    r = torch.randn(3, m, generator=gen, dtype=torch.float64)
    want = [np.mean([max(c) for c in itertools.combinations(row.tolist(), n)]) for row in r]
    got = best_of_n(r, n)
    assert got["reward"] == pytest.approx(float(np.mean(want)), abs=1e-12)
    assert got["stderr"] == pytest.approx(float(np.std(want, ddof=1) / math.sqrt(3)), abs=1e-12)
    assert bon_weights(m, n).sum().item() == pytest.approx(1.0, abs=1e-12)


def test_weights_stay_finite_for_thousands_of_samples():
    w = bon_weights(4096, 64)
    assert torch.isfinite(w).all() and w.sum().item() == pytest.approx(1.0, abs=1e-9) and w[:63].eq(0).all()


@pytest.mark.parametrize("n", [1, 2, 4, 16, 256])
def test_bon_kl_is_the_kl_of_the_max_of_n_draws(n):
    # the best of n continuous draws has density n F^(n-1) f: KL = E[log(n U^(n-1))] with U ~ Beta(n, 1)
    u = (np.arange(200_000) + 0.5) / 200_000
    density = n * u ** (n - 1)
    kl = np.mean(density * np.log(np.maximum(density, 1e-300)))
    assert bon_kl(n) == pytest.approx(kl, abs=2e-3)


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_fit_recovers_the_form_and_predicts_beyond_the_cut(form):
    kl = np.linspace(0.1, 12, 25)
    gain = gao_reward(form, kl, 0.8, 0.12).numpy()
    fit = fit_gao(form, kl, gain, cut=6.0)
    assert (fit["alpha"], fit["beta"]) == (pytest.approx(0.8, abs=1e-10), pytest.approx(0.12, abs=1e-10))
    assert fit["fitted"] == int((kl <= 6).sum()) and fit["predicted"] == 25 - fit["fitted"]
    assert fit["rmse_beyond"] < 1e-10
    # with noise: NumPy's least squares on the same columns
    noisy = gain + np.random.default_rng(0).normal(0, 0.05, len(kl))
    fit = fit_gao(form, kl, noisy, cut=6.0)
    d = np.sqrt(kl[kl <= 6])
    x = np.stack([d, -d * d if form == "bon" else -d * np.log(d)], 1)
    coef = np.linalg.lstsq(x, noisy[kl <= 6], rcond=None)[0]
    assert [fit["alpha"], fit["beta"]] == pytest.approx(coef.tolist(), abs=1e-10)
    beyond = kl > 6
    pred = np.sqrt(kl[beyond]) * (coef[0] - coef[1] * (np.sqrt(kl[beyond]) if form == "bon"
                                                        else np.log(np.sqrt(kl[beyond]))))  # fmt: skip
    assert fit["rmse_beyond"] == pytest.approx(float(np.sqrt(np.mean((pred - noisy[beyond]) ** 2))), abs=1e-10)


def test_a_fit_needs_two_points_inside_the_cut():
    with pytest.raises(ValueError, match="at least 2 points with KL <= 0.5"):
        fit_gao("rl", [0.2, 1.0, 2.0], [0.1, 0.2, 0.3], cut=0.5)
    with pytest.raises(ValueError, match="best-of-9"):
        bon_weights(4, 9)


@pytest.mark.parametrize("form", ["bon", "rl"])
def test_a_measured_kl_a_hair_below_zero_fits_as_zero(form):
    # a PPO curve's first window can measure KL -0.001: its d is 0, so the fit equals the one with that KL at 0
    kl, gain = [-1e-3, 0.5, 1.5, 3.0, 6.0], [0.0, 0.3, 0.5, 0.6, 0.55]
    fit = fit_gao(form, kl, gain, cut=4.0)
    assert np.isfinite([fit["alpha"], fit["beta"], fit["rmse_beyond"]]).all()
    at_zero = fit_gao(form, [0.0, *kl[1:]], gain, cut=4.0)
    # equal up to LAPACK's rounding: MKL's least squares can differ in the last bit between two calls on equal inputs
    assert (fit["alpha"], fit["beta"]) == pytest.approx((at_zero["alpha"], at_zero["beta"]), rel=1e-12, abs=1e-12)
