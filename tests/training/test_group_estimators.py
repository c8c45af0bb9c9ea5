"""The group estimators (`train-policy --ppo.estimator rloo|grpo|dr_grpo|reinforce_pp_baseline`) end to end on the
tiny preset: k samples per query, the estimator's metrics logged, no value head trained, and a run killed after a
checkpoint resumes bitwise, as PPO's do (test_crash_safety.py)."""

from __future__ import annotations

import pytest
import torch
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

ARGS = ["train-policy", "tiny", "--reward", "vader", "--ppo.rloo-k", "4", "--run.log-interval", "100",
        "--task.truncate-token", "none", "--ppo.total-episodes", str(16 * 3)]  # fmt: skip
# (estimator, flags, a stat it logs, whether to kill and resume it too: the resume path is the same for all)
ESTIMATORS = [("rloo", [], "rloo/advantage_std", True), ("grpo", [], "grpo/advantage_std", True),
              ("grpo", ["--ppo.kl-in", "reward"], "grpo/advantage_std", False),
              ("dr_grpo", [], "dr_grpo/advantage_std", False),
              ("reinforce_pp_baseline", [], "reinforce_pp_baseline/score_group_std", True)]  # fmt: skip


def metrics(run_dir):
    return [{k: v for k, v in r.items() if k not in ("elapsed/fps", "elapsed/time")}
            for r in read_jsonl(run_dir / "metrics.jsonl")]  # fmt: skip


def tensors(run_dir, name):
    from safetensors.torch import load_file

    return load_file(run_dir / "policy" / name)


@pytest.mark.parametrize("estimator,extra,stat,resume", ESTIMATORS)
def test_group_estimator_trains_logs_and_resumes_bitwise_without_a_value_head(tmp_path, monkeypatch, estimator,
                                                                              extra, stat, resume):  # fmt: skip
    args = ARGS + ["--ppo.estimator", estimator] + extra
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0
    rows = metrics(full)
    assert len(rows) == 3
    for r in rows:
        assert {"objective/score", "objective/kl", "objective/kl_coef", stat} <= set(r)
        assert not any(k.startswith("ppo/val/") or k == "ppo/loss/value" for k in r)
    assert all(not v.any() for v in tensors(full, "value_head.safetensors").values())  # still its zero init
    assert rows[-1]["objective/kl"] != 0  # the policy moved
    if not resume:
        return
    killed(monkeypatch, args + ["--run-dir", str(d)], "train:saved", 2)
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert metrics(d) == rows
    a, b = tensors(full, "model.safetensors"), tensors(d, "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_kl_in_the_loss_and_in_the_reward_train_differently(tmp_path):
    """grpo's k3 term in the loss (its default) and the k1 penalty in the reward are different objectives: the same
    seed gives different policies, and only with the KL in the reward does the return carry the penalty."""
    runs = {}
    for kl_in in ("loss", "reward"):
        d = tmp_path / kl_in
        assert main(ARGS + ["--ppo.estimator", "grpo", "--ppo.kl-in", kl_in, "--rewards.kl-coef", "0.5",
                            "--run-dir", str(d)]) == 0  # fmt: skip
        runs[kl_in] = metrics(d)
    loss, reward = runs["loss"], runs["reward"]
    assert loss[0]["objective/score"] == reward[0]["objective/score"]  # the first rollout is the same
    for r in loss:
        assert r["grpo/return_mean"] == r["objective/score"]  # the return is the score alone
    for r in reward:  # the return is the score minus beta times the summed KL
        want = r["objective/score"] - r["objective/kl_coef"] * r["objective/kl"]
        assert r["grpo/return_mean"] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert loss[-1]["objective/kl"] != reward[-1]["objective/kl"]
    assert all(r["ppo/loss/kl"] >= 0 for r in loss)


def test_rloo_k_must_divide_the_batch(capsys):
    assert main(["train-policy", "tiny", "--reward", "vader", "--ppo.estimator", "rloo", "--ppo.rloo-k", "3"]) == 2
    assert "ppo.rloo_k=3 must divide ppo.batch_size=16" in capsys.readouterr().err
