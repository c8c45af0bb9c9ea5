"""Label-type losses against hand-computed values (label_types.py @cbfd210) and TRL's pairwise loss."""

import math

import pytest
import torch
import torch.nn.functional as F

from lmprefs.config import label_type_shape
from lmprefs.labels import types


def test_pick_best_loss_is_softmax_cross_entropy_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0]])
    best = torch.tensor([1, 3])
    stats = types.PickBest(4).loss(rewards, {"best": best})
    # -log softmax(r)[best] per row, then the mean (tf.reduce_mean of sparse_softmax_cross_entropy_with_logits)
    row0 = -(2.0 - math.log(math.exp(1) + math.exp(2) + math.exp(0) + math.exp(-1)))
    row1 = -(0.0 - math.log(2 * math.exp(0.5) + math.exp(3) + math.exp(0)))
    assert stats["loss"].item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    assert stats["error"].item() == stats["loss"].item()
    assert stats["accuracy"].item() == 0.5  # row 0 ranks sample 1 first, row 1 does not rank sample 3 first


def test_best_of_2_equals_trl_logsigmoid_loss():
    torch.manual_seed(0)
    rewards = torch.randn(64, 2, dtype=torch.float64)
    best = torch.randint(0, 2, (64,))
    chosen = rewards.gather(1, best[:, None])[:, 0]
    rejected = rewards.gather(1, 1 - best[:, None])[:, 0]
    trl = -F.logsigmoid(chosen - rejected).mean()  # trl/trainer/reward_trainer.py
    ours = types.get("best_of_2").loss(rewards, {"best": best})["loss"]
    torch.testing.assert_close(ours, trl, rtol=1e-12, atol=1e-12)


def test_pick_best_gradient_flows_to_rewards():
    rewards = torch.zeros(3, 4, requires_grad=True)
    types.PickBest(4).loss(rewards, {"best": torch.tensor([0, 1, 2])})["loss"].backward()
    # d/dr of CE at uniform logits: (softmax - onehot) / B = (1/4 - [i == best]) / 3
    expected = torch.full((3, 4), 0.25 / 3)
    expected[[0, 1, 2], [0, 1, 2]] = -0.75 / 3
    torch.testing.assert_close(rewards.grad, expected)


def test_scalar_rating_by_hand():
    rewards = torch.tensor([[1.0], [2.0], [4.0]])
    score = torch.tensor([2.0, 2.0, 2.0 + 1.0])
    stats = types.ScalarRating().loss(rewards, {"score": score})
    assert stats["loss"].item() == pytest.approx((1 + 0 + 1) / 3)
    assert stats["label_mean"].item() == pytest.approx(7 / 3)
    assert stats["label_var"].item() == pytest.approx(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 3)  # biased, tf.nn.moments
    # pearson r of (1, 2, 4) and (2, 2, 3): cov / sqrt(var x * var y)
    x, y = [1, 2, 4], [2, 2, 3]
    mx, my = sum(x) / 3, sum(y) / 3
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / 3
    vx, vy = sum((a - mx) ** 2 for a in x) / 3, sum((b - my) ** 2 for b in y) / 3
    assert stats["corr"].item() == pytest.approx(cov / math.sqrt(vx * vy), rel=1e-6)
    mean, std = types.ScalarRating().target_scales({"score": score})
    assert (mean.item(), std.item()) == pytest.approx((7 / 3, math.sqrt(2 / 9)), rel=1e-6)


def test_scalar_compare_by_hand():
    rewards = torch.tensor([[0.0, 1.0], [2.0, 1.0]])  # predicted differences r1 - r0: +1, -1
    difference = torch.tensor([3.0, -1.0])
    stats = types.ScalarComparison().loss(rewards, {"difference": difference})
    assert stats["loss"].item() == pytest.approx(((3 - 1) ** 2 + 0) / 2)
    assert stats["accuracy"].item() == 1.0
    mean, std = types.ScalarComparison().target_scales({"difference": difference})
    # moments of difference / 2 = (1.5, -0.5): mean 0.5, biased std 1
    assert (mean.item(), std.item()) == pytest.approx((0.5, 1.0))


def test_schemas_and_target_scales():
    pb = types.get("best_of_4")
    assert pb.name == "best_of_4" and pb.num_samples == 4
    assert list(pb.question_schemas) == ["query", "sample0", "sample1", "sample2", "sample3"]
    assert list(pb.label_schemas) == ["best"] and pb.target_scales({"best": torch.tensor([0])}) is None
    assert list(types.get("scalar_rating").question_schemas) == ["query", "sample"]
    assert list(types.get("scalar_compare").question_schemas) == ["query", "sample0", "sample1"]
    assert types.get("scalar_rating").name == "scalar_rating" and types.get("scalar_compare").num_samples == 2


@pytest.mark.parametrize("bad", ["best_of_", "best_of_1", "best_of_x", "best_of_4 ", "scalar", ""])
def test_get_rejects_unknown_names(bad):
    with pytest.raises(ValueError, match=repr(bad).replace("[", r"\[")):
        types.get(bad)
    with pytest.raises(ValueError):
        label_type_shape(bad)


@pytest.mark.parametrize("name", ["best_of_2", "best_of_4", "best_of_16", "scalar_rating", "scalar_compare"])
def test_store_parser_agrees_with_types(name):
    t = types.get(name)
    assert label_type_shape(name) == (next(iter(t.label_schemas)), t.num_samples)


def test_wrong_reward_shape_is_rejected():
    with pytest.raises(ValueError, match=r"\[batch, 4\]"):
        types.PickBest(4).loss(torch.zeros(3, 2), {"best": torch.zeros(3, dtype=torch.long)})
