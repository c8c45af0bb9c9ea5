"""`train-policy --ppo.estimator rloo` end to end on the tiny preset: k samples per query, RLOO's metrics logged, no
value head trained, and a run killed after a checkpoint resumes bitwise, as PPO's do (test_crash_safety.py)."""

from __future__ import annotations

import torch
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl

ARGS = ["train-policy", "tiny", "--reward", "vader", "--ppo.estimator", "rloo", "--ppo.rloo-k", "4",
        "--run.log-interval", "100", "--task.truncate-token", "none", "--ppo.total-episodes", str(16 * 3)]  # fmt: skip


def metrics(run_dir):
    return [{k: v for k, v in r.items() if k not in ("elapsed/fps", "elapsed/time")}
            for r in read_jsonl(run_dir / "metrics.jsonl")]  # fmt: skip


def tensors(run_dir, name):
    from safetensors.torch import load_file

    return load_file(run_dir / "policy" / name)


def test_rloo_trains_logs_and_resumes_bitwise_without_a_value_head(tmp_path, monkeypatch):
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(ARGS + ["--run-dir", str(full)]) == 0
    rows = metrics(full)
    assert len(rows) == 3
    for r in rows:
        assert {"objective/score", "objective/kl", "objective/kl_coef", "rloo/advantage_std"} <= set(r)
        assert not any(k.startswith("ppo/val/") or k == "ppo/loss/value" for k in r)
    assert all(not v.any() for v in tensors(full, "value_head.safetensors").values())  # still its zero init

    killed(monkeypatch, ARGS + ["--run-dir", str(d)], "train:saved", 2)
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(d)]) == 0
    assert metrics(d) == rows
    a, b = tensors(full, "model.safetensors"), tensors(d, "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rloo_k_must_divide_the_batch(capsys):
    assert main(["train-policy", "tiny", "--reward", "vader", "--ppo.estimator", "rloo", "--ppo.rloo-k", "3"]) == 2
    assert "ppo.rloo_k=3 must divide ppo.batch_size=16" in capsys.readouterr().err
