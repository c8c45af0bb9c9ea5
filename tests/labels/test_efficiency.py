"""The label-efficiency ratio k and its bootstrap interval against a NumPy transcription."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmprefs.labels.efficiency import bootstrap_rows, efficiency_ratio, labels_to_reach, percentile_interval


def np_labels_to_reach(budgets, curve, target):
    """Scalar transcription: the smallest n on the log-linear curve with curve(n) >= target."""
    if curve[0] >= target:
        return budgets[0], -1
    for i in range(1, len(budgets)):
        if curve[i] >= target:
            frac = (target - curve[i - 1]) / (curve[i] - curve[i - 1])
            return math.exp(np.log(budgets[i - 1]) + frac * (np.log(budgets[i]) - np.log(budgets[i - 1]))), 0
    return budgets[-1], 1


def test_labels_to_reach_matches_numpy_on_random_curves():
    rng = np.random.default_rng(0)
    budgets = np.array([16.0, 64.0, 128.0, 512.0])
    curves = rng.normal(size=(200, 4)).cumsum(1)  # not always increasing: the first crossing counts
    targets = rng.normal(scale=2.0, size=200)
    n, side = labels_to_reach(torch.tensor(budgets), torch.tensor(curves), torch.tensor(targets))
    want = [np_labels_to_reach(budgets, c, t) for c, t in zip(curves, targets, strict=True)]
    np.testing.assert_allclose(n.numpy(), [w[0] for w in want], rtol=1e-12)
    assert side.tolist() == [w[1] for w in want]
    assert {-1, 0, 1} <= set(side.tolist())  # every case is exercised


def test_k_is_the_ratio_of_labels_on_random_curve_and_a_bound_outside_it():
    budgets = torch.tensor([100.0, 200.0, 400.0])
    random = torch.tensor([[0.0, 1.0, 2.0]])
    # directed reaches 1.5 with 100 labels: random needs exp(mean of log 200, log 400) = 282.8, k = 2.83
    k, side = efficiency_ratio(budgets, random, torch.tensor([[1.5, 2.5, -1.0]]))
    assert k[0, 0].item() == pytest.approx(math.sqrt(200 * 400) / 100) and side[0, 0] == 0
    assert side[0, 1] == 1 and k[0, 1].item() == pytest.approx(2.0)  # beyond random's range: k >= 400 / 200
    assert side[0, 2] == -1 and k[0, 2].item() == pytest.approx(0.25)  # below its smallest: k <= 100 / 400
    # equal curves: k = 1 where the curve rises
    k, side = efficiency_ratio(budgets, random, random)
    assert k[0, 1:].tolist() == pytest.approx([1.0, 1.0]) and side[0, 1:].tolist() == [0, 0]


def test_bootstrap_matches_numpy():
    rng = np.random.default_rng(1)
    budgets = np.array([32.0, 64.0, 128.0])
    random = np.sort(rng.normal(size=(5, 3)), 1)
    directed = random + rng.normal(0.3, 0.3, size=(5, 3))
    rows = bootstrap_rows(5, 400, seed=3)
    k, side = efficiency_ratio(torch.tensor(budgets), torch.tensor(random), torch.tensor(directed), rows)
    idx = rows.numpy()
    for b in range(3):
        want = []
        for d in range(len(idx)):
            n, s = np_labels_to_reach(budgets, random[idx[d]].mean(0), directed[idx[d], b].mean())
            want.append(0.0 if s < 0 else math.inf if s > 0 else n / budgets[b])
        lo, hi = percentile_interval(k[:, b], side[:, b])
        np_lo, np_hi = np.percentile(np.array(want), [2.5, 97.5], method="inverted_cdf")
        assert (lo, hi) == pytest.approx((np_lo, np_hi), rel=1e-12)
