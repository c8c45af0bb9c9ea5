"""`experiment mock-sentiment` with LoRA in the top block and several reward-model epochs: the reward models of every
count and seed take their frozen prefixes from the labeling pass (or, labels sampled before, from one pass over the
union of their labels), and the untrained model's figures from the seed's first count; an arm's reward model is
the one the same experiment trains with every reward model on its own, up to the float rounding in which the
sampler's position-at-a-time prefix may differ (the union's are bitwise: tests/pipeline/test_prefix_share.py)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmprefs.cli.dispatch import main

LORA = ["--lora.rank", "4", "--lora.layers", "1", "--train-reward.epochs", "2", "--labels.heldout-fraction", "0.2",
        "--ppo.total-episodes", "16"]  # fmt: skip


@pytest.mark.heavy
def test_arms_share_the_frozen_prefixes_and_train_what_they_would_alone(tmp_path, capsys, monkeypatch):
    from lmprefs.recipes import experiment

    args = ["experiment", "mock-sentiment", "tiny", "--eval-samples", "1", "--labels", "8,16", "--seeds", "2",
            "--eval-queries", "4", *LORA]  # fmt: skip
    collect = experiment.collect_labels
    monkeypatch.setattr(experiment, "shared_reward_prefixes", lambda *a: pytest.fail("the labeling pass kept them"))
    assert main([*args, "--run-dir", str(tmp_path / "shared")]) == 0
    out = capsys.readouterr().out
    assert "[prefixes] the frozen blocks' outputs of " in out and "shared by 4 reward models" in out
    # the same experiment with every arm's reward model on its own: no shared prefixes, no shared untrained model
    arm = experiment.train_arm
    monkeypatch.setattr(experiment, "shared_reward_prefixes", lambda *a: None)
    monkeypatch.setattr(experiment, "collect_labels", lambda *a, **k: collect(*a, **k) | {"prefixes": None})
    monkeypatch.setattr(experiment, "train_arm", lambda *a, **k: arm(*a, **(k | {"shared": None, "before": None})))
    assert main([*args, "--run-dir", str(tmp_path / "alone")]) == 0
    assert "[prefixes]" not in capsys.readouterr().out
    for key in ("rm-16", "rm-16-seed1"):  # each the second count of its seed: both kinds of shared work
        (a, sa), (b, sb) = (reward_model(tmp_path / d / key) for d in ("shared", "alone"))
        assert a.keys() == b.keys() and len(a) > 3, key
        for k in a:  # Adam steps lr-sized where a gradient is near 0: rounding, not a drift
            assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-4), (key, k, (a[k] - b[k]).abs().max())
        assert sa.keys() == sb.keys() and "heldout/accuracy" in sa and "norm_after" in sa
        assert sa["heldout/accuracy"] == sb["heldout/accuracy"]
        assert sa["heldout/loss"] == pytest.approx(sb["heldout/loss"], abs=1e-4)


def reward_model(run: Path) -> tuple[dict, dict]:
    """A run's exported reward model: its adapter and head (the norm folded in), and its summary but the seconds."""
    summary = json.loads((run / "reward_model" / "lmprefs.json").read_text())["summary"]
    summary.pop("seconds")
    return load_file(run / "reward_model" / "adapter_model.safetensors"), summary
