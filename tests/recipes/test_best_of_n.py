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
