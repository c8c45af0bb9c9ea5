"""Best-of-n as a policy (`lmprefs sample --best-of N`): the chosen sample is the argmax of the N drawn, N=1 is plain
sampling, and the command prints the analytic KL."""

from __future__ import annotations

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.recipes.sample import best_of_n, sample_texts


def _letters(texts: list[str]) -> list[float]:
    """A reward that tells the tiny model's samples apart: how many letters 'e' a response has, plus its length."""
    return [t.count("e") + 0.01 * len(t) for t in texts]


def test_the_chosen_sample_is_the_argmax_of_the_n_drawn():
    rows = best_of_n(preset("tiny"), 3, 4, seed=7, reward=_letters)
    assert len(rows) == 3
    for row in rows:
        assert len(row["responses"]) == len(row["scores"]) == 4
        assert all(abs(a - b) < 1e-5 for a, b in zip(row["scores"], _letters(row["responses"]), strict=True))
        best = max(range(4), key=lambda j: (row["scores"][j], -j))  # the first of the highest
        assert row["response"] == row["responses"][best] and row["score"] == row["scores"][best]
    assert len({r for row in rows for r in row["responses"]}) > 3  # the N samples of a query differ


def test_best_of_one_is_plain_sampling_at_the_same_seed():
    cfg = preset("tiny")
    plain = sample_texts(cfg, 3, seed=11)
    rows = best_of_n(cfg, 3, 1, seed=11, reward=_letters)
    assert [(r["query"], r["response"]) for r in rows] == plain


def test_the_command_prints_the_best_and_the_analytic_kl(capsys):
    assert main(["sample", "--preset", "tiny", "--n", "2", "--best-of", "4", "--reward", "vader", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("score ") for line in out.splitlines()) == 2 and "(best of 4: " in out
    assert "best-of-4: KL from the sampled model = log 4 - (4 - 1)/4 = 0.6363 nats (analytic" in out


def test_a_reward_model_directory_picks_by_its_rewards(tmp_path):
    """--reward-model: the N drawn samples are scored by the saved reward model. A copy with its gain negated scores
    every sample as exactly minus the first, so from the same draws it picks the first's lowest-scored sample."""
    import copy
    import dataclasses

    import pytest
    import torch

    from lmprefs.models.artifacts import save_reward_model
    from lmprefs.models.loading import load_lm
    from lmprefs.models.reward_model import RewardModel

    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, truncate_token=None))  # no penalty scores
    lm, tok = load_lm(cfg.task.initial_model, torch.device("cpu"))
    for name, gain in (("up", 1.0), ("down", -1.0)):
        rm = RewardModel(copy.deepcopy(lm), tok, seed=0).eval()
        with torch.no_grad():
            rm.gain.fill_(gain)
        save_reward_model(rm, tmp_path / name, extra={"task": {}})
    up, down = (best_of_n(cfg, 3, 4, seed=7, reward_model=tmp_path / n) for n in ("up", "down"))
    plain = best_of_n(cfg, 3, 4, seed=7, reward=_letters)
    for u, d, p in zip(up, down, plain, strict=True):
        assert u["responses"] == d["responses"] == p["responses"]  # the same draws, whatever scores them
        assert len(set(u["scores"])) > 1  # the reward model tells the samples apart
        assert d["scores"] == pytest.approx([-s for s in u["scores"]], abs=1e-6)
        # the first of the highest (ties are possible in bf16)
        best = max(range(4), key=lambda j: (u["scores"][j], -j))
        worst = min(range(4), key=lambda j: (u["scores"][j], j))
        assert u["response"] == u["responses"][best] and d["response"] == u["responses"][worst]
