"""run_owner: the command a run directory belongs to, from its command.json or, for one an earlier lmprefs wrote,
from what it holds."""

from __future__ import annotations

import json

import pytest

from lmprefs.errors import UserError
from lmprefs.io.run_owner import claim, inferred_owner, owner, refuse_other

LAYOUTS = [  # (files: name -> JSON content or None for a folder / an empty file, the command they tell)
    ({"experiment-config.json": {}, "experiment-args.json": {"arms": "ppo", "dpo_betas": None, "betas": None}},
     "experiment compare"),
    ({"experiment-config.json": {}, "experiment-args.json": {"betas": None, "queries": 64}}, "experiment kl-frontier"),
    ({"experiment-config.json": {}, "experiment-args.json": {"labels": None}}, "experiment mock-sentiment"),
    ({"experiment-config.json": {}, "experiment-args.json": {"demo_prompts": 256}}, "experiment writing-prompts"),
    ({"experiment-config.json": {}}, "experiment"),
    ({"results.json": {"reference_eval": {}, "policy_eval": {}}, "report.md": None}, "evaluate"),
    ({"config.json": {}, "run.json": {"reward": "model", "online": False}, "checkpoint": None}, "train-policy"),
    ({"config.json": {}, "run.json": {"store": "/x/labels.sqlite"}}, "train-dpo"),
    ({"config.json": {}, "sft_model": None}, "train-sft"),
    ({"config.json": {}, "metrics.jsonl": {"phase": "sft", "step": 0}, "checkpoint": None}, "train-sft"),
    ({"config.json": {}, "labels.sqlite": None, "reward_model": None, "checkpoint": None}, "quickstart"),
    ({"config.json": {}, "metrics.jsonl": {"phase": "reward", "step": 8}, "reward_model": None}, "train-reward"),
    ({"notes.txt": None}, None),
    ({"labels.sqlite": None}, None),  # a store kept in a folder of the user's: no config.json, no run
]


def _make(d, files):
    d.mkdir()
    for name, content in files.items():
        if name in ("checkpoint", "reward_model", "sft_model"):
            (d / name).mkdir()
        else:
            (d / name).write_text("" if content is None else json.dumps(content) + "\n")
    return d


@pytest.mark.parametrize("files,command", LAYOUTS)
def test_the_command_of_a_directory_without_a_record_is_told_by_its_files(tmp_path, files, command):
    assert inferred_owner(_make(tmp_path / "run", files)) == command


def test_a_record_decides_and_is_written_once_by_the_command_that_claims_a_directory(tmp_path):
    d = tmp_path / "a" / "run"
    assert owner(d) is None
    claim(d, "train-dpo")
    assert json.loads((d / "command.json").read_text()) == {"command": "train-dpo"} and owner(d) == "train-dpo"
    claim(d, "train-dpo")  # its own command again: nothing changes
    refuse_other(d, "train-dpo", "--run-dir")
    with pytest.raises(UserError, match=r"--out .*/run: holds a run of `lmprefs train-dpo`, and `lmprefs evaluate`"):
        refuse_other(d, "evaluate", "--out")
    with pytest.raises(UserError, match="holds a run of `lmprefs train-dpo`"):
        claim(d, "quickstart")
    assert json.loads((d / "command.json").read_text()) == {"command": "train-dpo"}


def test_an_experiment_whose_name_is_not_told_is_taken_by_any_experiment(tmp_path):
    d = _make(tmp_path / "run", {"experiment-config.json": {}})
    refuse_other(d, "experiment compare", "--run-dir")
    with pytest.raises(UserError):
        refuse_other(d, "quickstart", "--run-dir")


def test_a_damaged_record_is_one_line(tmp_path):
    (tmp_path / "command.json").write_text("{not json")
    with pytest.raises(UserError, match="command.json: not the record of the command that made"):
        owner(tmp_path)
