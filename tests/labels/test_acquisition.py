"""Parity of lmprefs.labels.acquisition with a NumPy transcription of BALD for best-of-N questions (Houlsby et al.
2011, eq. 3) and of the members' score spread, written with loops over members and responses; the limits BALD must
reach; and that directed selection picks the questions the members disagree on. float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmprefs.labels.acquisition import acquisition_scores, bald, random_select, select, spread

TOL = dict(rtol=1e-10, atol=1e-12)


def np_softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def np_entropy(p):
    return -sum(pi * math.log(pi) for pi in p if pi > 0)


def np_bald(scores):
    """For each question: entropy of the members' mean choice distribution minus the mean of their entropies."""
    K, Q, N = scores.shape
    out = np.zeros(Q)
    for q in range(Q):
        ps = [np_softmax(scores[k, q]) for k in range(K)]
        mean = [sum(p[n] for p in ps) / K for n in range(N)]
        out[q] = np_entropy(mean) - sum(np_entropy(p) for p in ps) / K
    return out


def np_spread(scores):
    """For each question: over responses, the mean of the members' population std of (score - question mean)."""
    K, Q, N = scores.shape
    out = np.zeros(Q)
    for q in range(Q):
        rel = [[scores[k, q, n] - sum(scores[k, q]) / N for n in range(N)] for k in range(K)]
        stds = []
        for n in range(N):
            col = [rel[k][n] for k in range(K)]
            m = sum(col) / K
            stds.append(math.sqrt(sum((c - m) ** 2 for c in col) / K))
        out[q] = sum(stds) / N
    return out


@pytest.mark.parametrize(("K", "N"), [(2, 2), (3, 4), (5, 3)])
def test_bald_and_spread_match_numpy(K, N):
    g = torch.Generator().manual_seed(K * 10 + N)
    scores = torch.randn(K, 7, N, generator=g, dtype=torch.float64) * 2
    np.testing.assert_allclose(bald(scores).numpy(), np_bald(scores.numpy()), **TOL)
    np.testing.assert_allclose(spread(scores).numpy(), np_spread(scores.numpy()), **TOL)


def test_bald_is_zero_when_members_agree():
    g = torch.Generator().manual_seed(0)
    one = torch.randn(1, 6, 4, generator=g, dtype=torch.float64)
    # the same choice distribution in every member, also when a member shifts a whole question's scores
    scores = torch.cat([one, one + 3.0, one - torch.arange(6.0, dtype=torch.float64).view(1, 6, 1)])
    np.testing.assert_allclose(bald(scores).numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(spread(scores).numpy(), 0.0, atol=1e-12)


@pytest.mark.parametrize("N", [2, 4])
def test_bald_is_log_n_when_confident_members_split_evenly(N):
    # N members, member k sure that response k is best: the mean choice is uniform, each member's entropy ~0
    scores = torch.eye(N, dtype=torch.float64).unsqueeze(1) * 60.0  # [K=N, Q=1, N]
    assert bald(scores).item() == pytest.approx(math.log(N), abs=1e-12)
    assert np_bald(scores.numpy())[0] == pytest.approx(math.log(N), abs=1e-12)
    # and never above log N, whatever the scores
    g = torch.Generator().manual_seed(1)
    assert (bald(torch.randn(8, 50, N, generator=g) * 10) <= math.log(N) + 1e-9).all()


def test_bald_needs_disagreement_not_uncertainty():
    # every member uncertain (uniform) but agreeing: no information in the answer about the members
    uniform = torch.zeros(4, 1, 3)
    assert bald(uniform).item() == pytest.approx(0.0, abs=1e-12)


def test_directed_selection_picks_the_questions_members_disagree_on():
    g = torch.Generator().manual_seed(7)
    K, Q, N = 5, 40, 4
    base = torch.randn(1, Q, N, generator=g).expand(K, Q, N)  # members agree...
    noise = torch.randn(K, Q, N, generator=g)
    disputed = torch.randperm(Q, generator=g)[:8]
    scores = base + 0.01 * noise
    scores[:, disputed] = base[:, disputed] + 3.0 * noise[:, disputed]  # ...except on these 8
    for name in ("bald", "spread"):
        picked = select(acquisition_scores(name, scores), 8)
        assert set(picked.tolist()) == set(disputed.tolist()), name
    # a random choice of 8 of 40 would hit all 8 with probability 1 / C(40, 8)
    assert set(random_select(Q, 8, torch.Generator().manual_seed(0)).tolist()) != set(disputed.tolist())


def test_select_order_ties_and_diversity():
    acq = torch.tensor([0.5, 0.9, 0.9, 0.1, 0.8])
    assert select(acq, 3).tolist() == [1, 2, 4]  # ties go to the lower index
    assert select(acq, 10).tolist() == [1, 2, 4, 0, 3]
    groups = torch.tensor([0, 1, 1, 2, 3])  # questions 1 and 2 share a query
    assert select(acq, 3, groups=groups, diversity=0.5).tolist() == [1, 4, 0]  # 2 discounted to 0.45
    assert select(acq, 3, groups=groups, diversity=0.0).tolist() == [1, 2, 4]
    assert select(acq, 5, groups=groups, diversity=1.0).tolist() == [1, 4, 0, 3, 2]


def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match="'maxent'"):
        acquisition_scores("maxent", torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"\(3, 4\)"):
        acquisition_scores("bald", torch.zeros(3, 4))
