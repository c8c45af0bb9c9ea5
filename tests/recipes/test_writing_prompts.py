"""The writing-prompts pipeline at fixture size: `lmprefs experiment writing-prompts --data`
runs SFT, a reward model from the scores, PPO from the SFT model with a separate value model and the evaluation, in
one command that resumes where it stopped."""

import json

import torch
from crash import killed
from score_data import score_rows, write

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

# the tiny preset with the writing-prompts settings: whole prompts, scores compared within a prompt, separate value
TINY = ["experiment", "writing-prompts", "--preset", "tiny", "--eval-queries", "8", "--labels.type", "scalar_rating",
        "--labels.scores-as", "comparisons", "--ppo.value-model", "separate", "--ppo.vf-lr", "3e-4",
        "--task.start-text", "none", "--task.end-text", "none", "--sft.lr", "1e-3"]  # fmt: skip


def write_scores(path, n_prompts=24):
    """The scores test's rows (four scored responses per prompt; ' good' ones score high) written to `path`."""
    rows = score_rows(n_prompts)
    write(path, rows)
    return rows


def test_writing_prompts_pipeline_end_to_end_and_resumed(tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    rows = write_scores(tmp_path / "scores.jsonl")
    run_dir = tmp_path / "run"
    args = TINY + ["--data", str(tmp_path / "scores.jsonl"), "--run-dir", str(run_dir)]

    killed(monkeypatch, args, "reward:logged")  # while the reward model trains: stage 3 starts over on the next run
    killed(monkeypatch, args, "writing:reward")  # once the reward model is done
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "train_reward/minibatch/loss" in r]
    assert steps and len(steps) == len(set(steps))  # the retrained reward model's rows, each step once
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results) == ["data", "sft", "reward"]
    sft_version, rm_version = (run_dir / "sft" / "sft_model").resolve(), (run_dir / "reward_model").resolve()
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "[1/5]" not in out and "[2/5]" not in out and "[3/5]" not in out and "[4/5]" in out
    assert "[5/5] evaluating the SFT and the PPO policy on 8 held-out prompts" in out  # the count it evaluates
    # the stages done before were not done again
    assert (run_dir / "sft" / "sft_model").resolve() == sft_version
    assert (run_dir / "reward_model").resolve() == rm_version
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results) == ["data", "sft", "reward", "ppo", "evaluate"]

    # 1. data: every scored response stored; SFT pairs = the top-scored response of each prompt
    assert results["data"]["responses"] == len(rows) and results["data"]["prompts"] == 24
    sft_pairs = read_jsonl(run_dir / "sft.jsonl")
    best = {}
    for r in rows:
        if r["prompt"] not in best or r["score"] > best[r["prompt"]]["score"]:
            best[r["prompt"]] = r
    assert [(p["prompt"], p["response"]) for p in sft_pairs] == [(r["prompt"], r["response"]) for r in best.values()]
    # 2. SFT: a Hugging Face model that learned its pairs
    assert results["sft"]["final_loss"] < results["sft"]["initial_loss"]
    AutoModelForCausalLM.from_pretrained(run_dir / "sft" / "sft_model")
    # 3. a reward model from the scores, on the SFT model, compared within prompts
    meta = json.loads((run_dir / "reward_model" / "lmprefs.json").read_text())
    assert meta["label_type"] == "best_of_2" and meta["scores_as"] == "comparisons"
    # 4. PPO from the SFT model: it is also the reference (the first rollout's KL is 0), the value model is separate
    ppo_rows = read_jsonl(run_dir / "ppo" / "metrics.jsonl")
    assert len(ppo_rows) == 2 and abs(ppo_rows[0]["objective/kl"]) < 1e-4 and "ppo/vf_lr" in ppo_rows[0]
    cfg = json.loads((run_dir / "ppo" / "config.json").read_text())
    assert cfg["task"]["initial_model"] == str(run_dir / "sft" / "sft_model")
    assert cfg["ppo"]["value_model"] == "separate"
    assert (run_dir / "ppo" / "policy" / "value_model" / "model.safetensors").is_file()
    state = torch.load(run_dir / "ppo" / "checkpoint" / "state.pt", weights_only=True)
    assert state["value_optimizer"]["state"]
    # 5. the evaluation and the report
    assert results["evaluate"]["n_queries"] == 8
    report = (run_dir / "report.md").read_text()
    assert "held-out pair accuracy" in report and "## Samples on the same held-out prompts" in report
    # a finished run asked again does nothing but write the report
    assert main(args) == 0 and "[4/5]" not in capsys.readouterr().out


def test_a_bad_score_is_one_line_and_no_run_directory(tmp_path, capsys):
    rows = write_scores(tmp_path / "scores.jsonl", n_prompts=3)
    rows[5]["score"] = "lots"
    write(tmp_path / "bad.jsonl", rows)
    run_dir = tmp_path / "run"
    assert main(TINY + ["--data", str(tmp_path / "bad.jsonl"), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.jsonl line 6: field 'score' = 'lots' is not a number" in err, err
    assert not run_dir.exists()
    assert main(TINY + ["--data", str(tmp_path / "none.jsonl"), "--run-dir", str(run_dir)]) == 2
    capsys.readouterr()
    assert main(TINY + ["--data", str(tmp_path / "scores.jsonl"), "--true-reward", "nope", "--run-dir",
                        str(run_dir)]) == 2  # fmt: skip
    assert "--true-reward 'nope'" in capsys.readouterr().err  # the flag that gave it (it said --reward)
    assert not run_dir.exists()
    # a label type the scores cannot train: refused before any stage, where stage 3 refused it after SFT
    assert main(TINY + ["--data", str(tmp_path / "scores.jsonl"), "--labels.type", "best_of_4", "--labels.scores-as",
                        "rating", "--run-dir", str(run_dir)]) == 2  # fmt: skip
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "labels.type=best_of_4: writing-prompts stores its per-response scores as scalar_rating labels" in line
    assert not run_dir.exists()
