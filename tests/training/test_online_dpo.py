"""`train-dpo --online` on the tiny preset: the current policy's samples judged by a reward and trained on with the
DPO loss, each step logged once, the policy moved from its reference; a run killed after a checkpoint resumes to
bitwise the same policy and metrics; a judge is required, and what the run was started with cannot change."""

from __future__ import annotations

import json

import pytest
import torch
from crash import killed
from safetensors.torch import load_file

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

ARGS = ["train-dpo", "tiny", "--online", "--reward", "vader", "--dpo.online-steps", "5", "--dpo.batch-size", "4",
        "--dpo.lr", "1e-3", "--run.log-interval", "1", "--run.save-interval", "2"]  # fmt: skip


def rows(run_dir):
    return [{k: v for k, v in r.items() if k != "elapsed/time"} for r in read_jsonl(run_dir / "metrics.jsonl")]


def weights(run_dir):
    return load_file(run_dir / "policy" / "model.safetensors")


@pytest.fixture(scope="module")
def online_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("online") / "run"
    assert main(ARGS + ["--run-dir", str(d)]) == 0
    return d


def test_online_dpo_judges_its_own_samples_and_moves_the_policy(online_run):
    logged = [r for r in rows(online_run) if "dpo/loss" in r]  # the steps, without the summary row
    assert [r["step"] for r in logged] == [0, 1, 2, 3, 4]  # each step once
    first = logged[0]
    assert first["dpo/loss"] == pytest.approx(0.6931, abs=1e-3)  # the policy starts at its reference: log 2
    assert {"objective/score", "objective/score_best", "objective/kl", "dpo/accuracy"} <= set(first)
    assert all(r["objective/score_best"] >= r["objective/score"] - 1e-6 for r in logged)
    assert json.loads((online_run / "run.json").read_text()) == {"online": True, "reward": "vader"}
    assert logged[-1]["dpo/chosen_reward"] != 0  # beta * log(pi / pi_ref): the policy left its reference


def test_a_killed_online_run_resumes_to_bitwise_the_same_policy(online_run, tmp_path, monkeypatch):
    d = tmp_path / "killed"
    killed(monkeypatch, ARGS + ["--run-dir", str(d)], "dpo:logged", 4)  # steps 0..3 logged, checkpoint at 2
    assert main(["train-dpo", "tiny", "--online", "--resume", "--run-dir", str(d)]) == 0
    assert rows(d) == rows(online_run)
    a, b = weights(online_run), weights(d)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_best_of_4_listwise_online_runs(tmp_path):
    d = tmp_path / "listwise"
    assert main(ARGS + ["--dpo.online-samples", "4", "--dpo.loss", "listwise", "--dpo.online-steps", "2",
                        "--run-dir", str(d)]) == 0  # fmt: skip
    assert rows(d)[0]["dpo/loss"] == pytest.approx(1.3863, abs=1e-3)  # -log(1/4) at the reference


@pytest.mark.parametrize("argv,needle", [
    (["train-dpo", "tiny", "--online"], "judges its samples with --reward NAME"),
    (["train-dpo", "tiny", "--online", "--reward", "vader", "--db", "x.sqlite"], "--db x.sqlite: train-dpo --online"),
    (["train-dpo", "tiny", "--reward", "vader"], "--reward vader: judges the samples of --online"),
    (["train-dpo", "tiny", "--online", "--reward", "nope"], "--reward 'nope'"),
    (["train-dpo", "tiny", "--online", "--reward", "vader", "--dpo.online-samples", "1"], "dpo.online_samples=1"),
])  # fmt: skip
def test_bad_online_input_is_one_line_and_writes_nothing(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "run"
    assert main(argv + ["--run-dir", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not d.exists()


def test_resume_keeps_the_judge_and_the_kind_of_run(online_run, capsys):
    run = ["train-dpo", "tiny", "--resume", "--run-dir", str(online_run)]
    assert main(run) == 0  # finished: nothing to train
    assert "finished already" in capsys.readouterr().out
    killed_dir = online_run.parent / "partial"
    killed_dir.mkdir()
    (killed_dir / "config.json").write_text((online_run / "config.json").read_text())
    for name in ("run.json", "command.json"):  # what a run killed before its first checkpoint holds
        (killed_dir / name).write_text((online_run / name).read_text())
    assert main(["train-dpo", "tiny", "--resume", "--run-dir", str(killed_dir)]) == 2
    assert "is an online DPO run; resume it with --online" in capsys.readouterr().err
    assert main(["train-dpo", "tiny", "--online", "--reward", "descriptiveness", "--resume", "--run-dir",
                 str(killed_dir)]) == 2  # fmt: skip
    assert "was judged with --reward vader, not descriptiveness" in capsys.readouterr().err
