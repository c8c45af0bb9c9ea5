"""Reward-model ensembles through the commands: train-reward trains K members, score prints each text's mean and
spread, the Python API scores by the mean, train-policy trains against an ensemble and evaluate takes one, and a
train-reward killed while members train is started again and logs each step once."""

from __future__ import annotations

import json
import math

import pytest
import torch
from crash import killed

import lmprefs
from lmprefs.cli.dispatch import main

LORA = ["--lora.rank", "4", "--lora.layers", "1"]


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("ensemble")
    assert main(["label", "tiny", "--db", str(d / "labels.sqlite"), "--n", "40", "--labeler", "vader"]) == 0
    return d / "labels.sqlite"


@pytest.fixture(scope="module")
def ensemble(db, tmp_path_factory):
    run = tmp_path_factory.mktemp("ens") / "run"
    args = ["train-reward", "tiny", "--db", str(db), "--run-dir", str(run), "--train-reward.ensemble", "3", *LORA]
    assert main(args) == 0
    return run / "reward_model"


def test_score_prints_each_texts_mean_and_spread(ensemble, tmp_path, capsys):
    texts = ["She smiled.", "He wept bitterly.", "The rain fell on the town."]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    capsys.readouterr()
    assert main(["score", "--reward-model", str(ensemble), str(tmp_path / "texts.txt")]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[2] for r in rows] == texts
    members = torch.tensor([lmprefs.score(ensemble / f"member-{k}", texts, device="cpu") for k in range(3)])  # [3, N]
    mean, spread = (torch.tensor([float(r[i]) for r in rows]) for i in (0, 1))
    assert torch.allclose(mean, members.mean(0), atol=1e-4)
    assert torch.allclose(spread, members.std(0, unbiased=False), atol=1e-4) and bool((spread > 0).all())
    api = torch.tensor(lmprefs.score(ensemble, texts, device="cpu"))  # the API: the members' mean
    assert torch.allclose(api, members.mean(0), atol=1e-4)  # the same math batched otherwise: rounding differs


def test_train_reward_names_the_ensemble(db, tmp_path, capsys):
    args = ["train-reward", "tiny", "--db", str(db), "--run-dir", str(tmp_path / "r"), "--train-reward.ensemble", "2",
            "--train-reward.bootstrap", "true"]  # fmt: skip
    assert main(args) == 0  # full fine-tuning: two copies of the model
    out = capsys.readouterr().out
    assert "an ensemble of 2" in out and "held-out" in out
    manifest = json.loads((tmp_path / "r" / "reward_model" / "ensemble.json").read_text())
    assert manifest["bootstrap"] is True and manifest["members"] == ["member-0", "member-1"]


def test_train_policy_against_an_ensemble_and_evaluate_takes_one(db, ensemble, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train-policy", "tiny", "--db", str(db), "--run-dir", str(run), "--train-reward.ensemble", "2",
                 *LORA]) == 0  # fmt: skip
    assert (run / "reward_model" / "ensemble.json").is_file() and (run / "policy").is_dir()
    capsys.readouterr()
    out = tmp_path / "ev"
    assert main(["evaluate", str(run), "--eval-queries", "8", "--out", str(out), "--reward-model", str(ensemble)]) == 0
    assert "an ensemble of 3 reward models" in capsys.readouterr().out
    s = json.loads((out / "results.json").read_text())
    # the policy barely moved (LoRA on one layer, one PPO epoch): its KL estimate is noise around a small positive
    # value, so only its presence is asserted here; its sign is asserted where the policy moves (test_quickstart)
    ev = s["policy_eval"]
    assert s["kind"] == "proxy" and math.isfinite(ev["kl"]) and ev["kl"] != 0 and ev["kl_stderr"] > 0, ev


def test_a_train_reward_killed_while_members_train_logs_each_step_once(db, tmp_path, monkeypatch):
    from lmprefs.io.jsonl import read_jsonl
    from lmprefs.models.ensemble import load_reward

    args = ["train-reward", "tiny", "--db", str(db), "--run.log-interval", "1", "--train-reward.ensemble", "2", *LORA]
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    steps = len([r for r in read_jsonl(full / "metrics.jsonl") if r.get("train_reward/member") == 0.0])
    # killed while the second member trains: the first is done, no ensemble is published
    killed(monkeypatch, args + ["--run-dir", str(d)], "reward:logged", steps + 1)
    assert not (d / "reward_model").exists()
    assert main(args + ["--run-dir", str(d)]) == 0

    def rows(run):
        return [{k: v for k, v in r.items() if not k.endswith("elapsed/time")}
                for r in read_jsonl(run / "metrics.jsonl")]  # fmt: skip

    assert rows(d) == rows(full)  # each step once
    # the second member's minibatches follow the first's on one step axis (labels seen by the ensemble)
    steps = [r["step"] for r in read_jsonl(d / "metrics.jsonl") if "train_reward/minibatch/loss" in r]
    assert steps == sorted(set(steps)) and len(steps) > 4
    a, b = load_reward(full / "reward_model"), load_reward(d / "reward_model")
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y)
