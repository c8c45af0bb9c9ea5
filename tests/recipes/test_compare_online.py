"""`experiment compare`'s online-DPO arm (dpo-online) on the tiny preset: swept over --dpo-betas, judged by the
experiment's one reward model, ppo.total_episodes responses sampled and judged (the PPO-family arms' budget), in the
table, report and matched-KL comparison; killed after a checkpoint, the rerun resumes it to bitwise the policy,
figures and metrics of an uninterrupted compare, each step logged once."""

import json
import math

import torch
from crash import killed
from safetensors.torch import load_file

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

# ppo.total_episodes 48 of ppo.batch_size 16: 3 online steps of 8 queries x 2 samples, a checkpoint after each
ONLINE = ["--preset", "tiny", "--eval-samples", "1", "--labels", "16", "--eval-queries", "4", "--samples", "8",
          "--best-of", "2,4", "--betas", "0.1,1", "--min-ess", "2", "--ppo.total-episodes", "48",
          "--labels.heldout-fraction", "0.2"]  # fmt: skip
KEY = "dpo-online-beta0.1"


def rows(arm_dir):
    return [{k: v for k, v in r.items() if k != "elapsed/time"} for r in read_jsonl(arm_dir / "metrics.jsonl")]


def test_the_online_dpo_arm_resumes_bitwise_and_is_compared(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "cmp"
    args = ["experiment", "compare", *ONLINE, "--arms", "dpo-online,best-of-n", "--dpo-betas", "0.1,0.3",
            "--run-dir", str(run_dir)]  # fmt: skip
    killed(monkeypatch, args, "dpo:logged", 3)  # its third step logged, the checkpoint after its second
    assert KEY not in json.loads((run_dir / "results.json").read_text())
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"[{KEY}] resuming (online DPO pairwise, beta 0.1, 3 steps of 8 queries x 2 samples)" in out
    assert "[reward model]" not in out and "| dpo-online | dpo.beta 0.3 |" in out
    res = json.loads((run_dir / "results.json").read_text())
    for key in (KEY, "dpo-online-beta0.3"):
        d = res[key]
        assert d["episodes"] == 48 and d["n_queries"] == 4 and math.isfinite(d["kl"]) and math.isfinite(d["mean"])
    cfg = json.loads((run_dir / KEY / "config.json").read_text())
    assert cfg["rewards"]["trained_model"] == str(run_dir / "reward_model")  # the PPO-family arms' reward model
    assert (cfg["dpo"]["batch_size"], cfg["dpo"]["online_steps"], cfg["dpo"]["beta"]) == (8, 3, 0.1)
    assert json.loads((run_dir / KEY / "run.json").read_text()) == {"online": True, "reward": "model"}
    assert "dpo-online" in json.dumps(res["matched_kl"])  # a curve of its own: a range, or the rows at matched KL
    assert "| dpo-online | dpo.beta 0.1 |" in (run_dir / "report.md").read_text()
    logged = [r["step"] for r in rows(run_dir / KEY) if "dpo/loss" in r]
    assert logged == [0, 1, 2]  # the step redone after the checkpoint logged once
    # an uninterrupted compare of the same arm: bitwise the same policy, figures and metrics
    whole = tmp_path / "whole"
    assert main(["experiment", "compare", *ONLINE, "--arms", "dpo-online", "--dpo-betas", "0.1",
                 "--run-dir", str(whole)]) == 0  # fmt: skip
    again = json.loads((whole / "results.json").read_text())[KEY]
    assert {k: again[k] for k in ("mean", "kl", "stderr")} == {k: res[KEY][k] for k in ("mean", "kl", "stderr")}
    assert rows(whole / KEY) == rows(run_dir / KEY)
    a, b = (load_file(d / KEY / "policy" / "model.safetensors") for d in (whole, run_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
