"""The Chooser on fake member scores (any callable [Q, Lq], [Q, N, T] -> [K, Q, N]): it asks the questions the members
disagree on, questions on one query count as one for labels.select_diversity, and the pool is pool_factor times the
questions wanted."""

from __future__ import annotations

import dataclasses

import torch

from lmprefs.config import LabelsConfig
from lmprefs.pipeline.selection import Chooser, pool_size


def fake_members(disputed: set[int], K: int = 4):
    """Members that agree on every question but `disputed` (by the question's first sample token), where each is sure
    of a different response."""

    def scores(queries, samples):
        Q, N = samples.shape[:2]
        out = torch.zeros(K, Q, N)
        for q in range(Q):
            if int(samples[q, 0, 0]) in disputed:
                for k in range(K):
                    out[k, q, k % N] = 20.0
            else:
                out[:, q, 0] = 5.0
        return out

    return scores


def test_the_chooser_asks_what_the_members_disagree_on_and_spreads_over_queries():
    queries = torch.tensor([[1, 1], [2, 2], [2, 2], [3, 3], [4, 4]])  # questions 1 and 2 share a query
    samples = torch.arange(5).view(5, 1, 1).expand(5, 4, 3).clone()  # question q's tokens are all q
    labels = LabelsConfig(select="bald")
    choose = Chooser(labels, fake_members({1, 2, 4}), "fake")
    chosen, acq = choose(queries, samples, 2)
    assert chosen.tolist() == [1, 2] and acq.shape == (5,) and acq[[0, 3]].abs().max() < 1e-9
    diverse = Chooser(dataclasses.replace(labels, select_diversity=1.0), fake_members({1, 2, 4}), "fake")
    assert diverse(queries, samples, 2)[0].tolist() == [1, 4]  # the same query again only when others are taken
    assert Chooser(dataclasses.replace(labels, select="spread"), fake_members({3}), "f")(queries, samples, 1)[0] == 3


def test_the_pool_is_pool_factor_times_the_questions_rounded_up():
    assert pool_size(LabelsConfig(pool_factor=4.0), 16) == 64
    assert pool_size(LabelsConfig(pool_factor=1.5), 5) == 8
    assert pool_size(LabelsConfig(pool_factor=1.0), 7) == 7
    assert pool_size(LabelsConfig(pool_factor=1.1), 10) == 11  # 11.000000000000002, not 12
