"""The conservative ensemble rewards against a NumPy transcription of Coste et al. 2023, section 3.2."""

import numpy as np
import pytest
import torch

from lmprefs.training.conservative import ensemble_reduce, members_std


def _numpy(scores: np.ndarray, how: str, lam: float) -> np.ndarray:
    k = scores.shape[0]
    mean = scores.sum(0) / k
    if how == "mean":
        return mean
    if how == "min":
        return np.array([min(scores[:, b]) for b in range(scores.shape[1])])
    var = ((scores - mean) ** 2).sum(0) / k
    return mean - lam * var


@pytest.mark.parametrize("how", ["mean", "min", "uwo"])
@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0])
def test_reductions_match_numpy(how, lam):
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(5, 11))
    got = ensemble_reduce(torch.tensor(scores), how, lam).numpy()
    np.testing.assert_allclose(got, _numpy(scores, how, lam), rtol=1e-12, atol=1e-12)


def test_conservative_rewards_lie_below_the_mean_where_members_disagree():
    scores = torch.tensor([[1.0, 0.0], [1.0, 2.0], [1.0, -2.0]])  # column 0: agreement, column 1: disagreement
    mean = ensemble_reduce(scores, "mean")
    assert torch.equal(ensemble_reduce(scores, "min")[0], mean[0])
    assert torch.equal(ensemble_reduce(scores, "uwo", 1.0)[0], mean[0])
    assert ensemble_reduce(scores, "min")[1] < mean[1]
    assert ensemble_reduce(scores, "uwo", 1.0)[1] < mean[1]
    np.testing.assert_allclose(members_std(scores).numpy(), [0.0, np.sqrt(8 / 3)], rtol=1e-6)


@pytest.mark.parametrize("how", ["mean", "min", "uwo"])
def test_one_member_is_its_score_bitwise(how):
    scores = torch.randn(1, 17, dtype=torch.float32)
    assert torch.equal(ensemble_reduce(scores, how, 0.7), scores[0])


def test_unknown_reduction_is_refused():
    with pytest.raises(ValueError, match="median"):
        ensemble_reduce(torch.zeros(2, 3), "median")
