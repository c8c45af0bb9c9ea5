"""What earlier versions of lmprefs wrote still loads: a run directory and a reward model saved before directories
were versioned behind a symlink with a manifest (plain directories, nothing to verify), and a config.json saved
before a field existed (tests/config/test_overrides.py).
Each is made from today's artifacts by undoing what came later."""

from __future__ import annotations

import json
import shutil

import torch

from lmprefs.cli.dispatch import main


def as_written_before_manifests(d):
    """NAME -> NAME.000001/ becomes a plain NAME/ directory without manifest.json, as lmprefs wrote it then."""
    version = d.resolve()
    d.unlink()
    shutil.copytree(version, d)
    (d / "manifest.json").unlink()
    for v in d.parent.glob(f"{d.name}.0*"):
        shutil.rmtree(v)


def test_a_run_directory_written_before_versioned_directories_samples(tmp_path, tiny_lm, capsys):
    """A run directory as train-policy leaves it (config.json, policy/) with its policy laid out as then."""
    from lmprefs.config import preset
    from lmprefs.io.config_file import save_config
    from lmprefs.models.artifacts import save_policy
    from lmprefs.models.policy import Policy

    model, tok = tiny_lm
    run = tmp_path / "run"
    save_config(preset("tiny"), run / "config.json")
    save_policy(Policy(model, tok, temperature=1.0), run / "policy")
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "2", "--seed", "1"]) == 0
    now = capsys.readouterr().out
    as_written_before_manifests(run / "policy")
    assert main(["sample", str(run), "--n", "2", "--seed", "1"]) == 0
    assert capsys.readouterr().out == now and now.strip()


def test_a_reward_model_written_before_versioned_directories_scores_as_before(tmp_path, tiny_lm):
    from lmprefs.models.artifacts import load_reward_model, save_reward_model
    from lmprefs.models.reward_model import RewardModel
    from lmprefs.recipes.score import reward_model_task, score_texts

    model, tok = tiny_lm
    torch.manual_seed(0)
    rm_dir = tmp_path / "reward_model"
    save_reward_model(RewardModel(model, tok), rm_dir)
    texts = [("", "What a lovely day."), ("", "A dreadful storm.")]
    now = score_texts(load_reward_model(rm_dir).eval(), reward_model_task(rm_dir), texts, torch.device("cpu"))[0]
    as_written_before_manifests(rm_dir)
    assert not (rm_dir / "manifest.json").exists() and not rm_dir.is_symlink()
    then = score_texts(load_reward_model(rm_dir).eval(), reward_model_task(rm_dir), texts, torch.device("cpu"))[0]
    assert then == now
    meta = json.loads((rm_dir / "lmprefs.json").read_text())
    assert meta["kind"] == "reward_model"
