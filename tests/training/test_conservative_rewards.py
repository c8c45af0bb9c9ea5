"""Conservative ensemble rewards where a policy meets them (rewards.ensemble_reduce, Coste et al. 2023): a one-member
ensemble scores a policy exactly as the reward model it holds, min and uwo reduce the members' scores as
training/conservative.py does, and the andon cord's ensemble signal (objective/score_members_std) pulls on a rising
disagreement and not on a flat or falling one."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.io.jsonl import read_jsonl
from lmprefs.models.artifacts import save_reward_model
from lmprefs.models.ensemble import RewardEnsemble, save_reward_ensemble
from lmprefs.models.loading import load_lm
from lmprefs.models.reward_model import RewardModel
from lmprefs.training.conservative import ensemble_reduce, reduced_scores
from lmprefs.training.policy import overoptimized
from lmprefs.training.rollout import rm_score_fn


@pytest.fixture(scope="module")
def members():
    """Three reward models on the tiny preset's base, each with its own head and normalization."""
    lm, tok = load_lm(preset("tiny").task.initial_model, torch.device("cpu"))
    out = []
    for k in range(3):
        rm = RewardModel(copy.deepcopy(lm), tok, seed=k).eval().freeze()
        rm.set_norm(0.1 * k, 0.5 + k)
        out.append(rm)
    return out


def _batch(n: int = 6):
    g = torch.Generator().manual_seed(0)
    return torch.randint(100, 1000, (n, 5), generator=g), torch.randint(100, 1000, (n, 7), generator=g)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_a_one_member_ensemble_scores_as_its_reward_model_bitwise_under_every_reduction(members, bf16):
    q, r = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        plain = rm_score_fn(members[0])(q, r)  # [B]: today's reward
        out = rm_score_fn(RewardEnsemble(members[:1]))(q, r)  # [1, B]
    assert out.shape == (1, len(r)) and plain.shape == (len(r),)
    for how in ("mean", "min", "uwo"):
        reward, kept = reduced_scores(out, how, 0.7)
        assert torch.equal(reward, plain), how
        assert kept is not None and torch.equal(kept[0], plain)
    assert torch.equal(reduced_scores(plain, "mean")[0], plain)  # a plain reward model's scores pass as they are
    assert reduced_scores(plain, "mean")[1] is None


def test_an_ensemble_reward_is_its_members_scores_reduced(members):
    q, r = _batch()
    ens = RewardEnsemble(members)
    out = rm_score_fn(ens)(q, r)
    want = torch.stack([m(q, r) for m in members]).float()  # [3, B]
    assert torch.equal(out, want)
    assert len({round(float(x), 4) for x in want[:, 0]}) == 3  # the members differ
    for how in ("mean", "min", "uwo"):
        assert torch.equal(reduced_scores(out, how, 2.0)[0], ensemble_reduce(want, how, 2.0))
    low = reduced_scores(out, "min")[0]
    assert torch.all(low <= want.mean(0)) and torch.all(low < want.max(0).values)


def _run_alarm(series, stop):
    run = SimpleNamespace(watched={})
    for u, x in enumerate(series, 1):
        reason = overoptimized(run, {"objective/score_members_std": x}, stop)
        if reason:
            return u, reason, run.watched
    return None, None, run.watched


def test_the_cord_pulls_when_the_members_disagreement_rises_and_not_when_it_is_flat_or_falls():
    rising = [0.20, 0.21, 0.19, 0.20, 0.30, 0.45, 0.60, 0.80, 1.00, 1.20]
    flat = [0.20 + 0.02 * (-1) ** u for u in range(40)]
    falling = [1.0 - 0.05 * u for u in range(15)]
    update, reason, watched = _run_alarm(rising, 0.25)
    assert update is not None and 5 < update <= len(rising)
    assert "disagreement" in reason and "above its lowest" in reason and "ppo.overoptimization_stop = 0.25" in reason
    ema, lowest = watched["objective/score_members_std"]
    assert ema - lowest > 0.25 and lowest == pytest.approx(0.198, abs=0.01)
    assert _run_alarm(flat, 0.25)[0] is None
    assert _run_alarm(falling, 0.25)[0] is None
    assert _run_alarm(rising, None)[0] is None  # off by default
    # the falling signals are watched as before: a true reward that falls pulls, one that rises does not
    run = SimpleNamespace(watched={})
    assert not any(overoptimized(run, {"objective/true_reward": x}, 0.2) for x in (0.0, 0.3, 0.6, 0.9))
    assert any(overoptimized(run, {"objective/true_reward": x}, 0.2) for x in (0.5, 0.0, -0.5, -1.0))


def _trained_dirs(tmp_path, members):
    """A saved reward model and a one-member ensemble directory holding the same model."""
    task = {"task": {}}
    save_reward_model(members[0], tmp_path / "single", extra=task)
    save_reward_ensemble(members[:1], tmp_path / "ensemble", [task], {"seeds": [0]})
    return tmp_path / "single", tmp_path / "ensemble"


def test_a_policy_trained_against_a_one_member_ensemble_is_todays_bitwise(tmp_path, members):
    single, ensemble = _trained_dirs(tmp_path, members)
    args = ["train-policy", "tiny", "--run.log-interval", "100", "--task.truncate-token", "none",
            "--ppo.total-episodes", str(16 * 2)]  # fmt: skip
    assert main([*args, "--rewards.trained-model", str(single), "--run-dir", str(tmp_path / "a")]) == 0
    assert main([*args, "--rewards.trained-model", str(ensemble), "--run-dir", str(tmp_path / "b")]) == 0
    a, b = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    clock = ("elapsed/fps", "elapsed/time")
    assert [{k: v for k, v in r.items() if k not in clock} for r in a] == [
        {k: v for k, v in r.items() if k not in clock and "score_member" not in k} for r in b]
    for row in b:  # the ensemble's own tags: its one member's mean is the score, and it disagrees with no one
        assert row["objective/score_members_mean"] == row["objective/score"]
        assert row["objective/score_members_std"] == 0.0
        assert row["objective/score_member_0"] == row["objective/score"]
    assert all("objective/score_members_std" not in r for r in a)


def test_best_of_n_ranks_by_the_reduced_ensemble_score(tmp_path, members):
    """sample --best-of N --reward-model ENSEMBLE with rewards.ensemble_reduce min: from the same draws, each
    sample's score is the lower of the two members' (each scored alone), and the pick is the highest of those."""
    import dataclasses

    from lmprefs.recipes.sample import best_of_n

    for k in range(2):
        save_reward_model(members[k], tmp_path / f"m{k}", extra={"task": {}})
    save_reward_ensemble(members[:2], tmp_path / "ens", [{"task": {}}] * 2, {"seeds": [0, 1]})
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, truncate_token=None))  # no penalty scores
    alone = [best_of_n(cfg, 2, 4, seed=7, reward_model=tmp_path / f"m{k}") for k in range(2)]
    cfg = dataclasses.replace(cfg, rewards=dataclasses.replace(cfg.rewards, ensemble_reduce="min"))
    both = best_of_n(cfg, 2, 4, seed=7, reward_model=tmp_path / "ens")
    for row, a, b in zip(both, *alone, strict=True):
        assert row["responses"] == a["responses"] == b["responses"]
        assert row["scores"] == [min(x, y) for x, y in zip(a["scores"], b["scores"], strict=True)]
        assert all(x != y for x, y in zip(a["scores"], b["scores"], strict=True))  # so min is not their mean
        assert row["score"] == max(row["scores"])
