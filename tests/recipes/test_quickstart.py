import json
import math

import pytest

from lmprefs.cli.dispatch import main


def test_quickstart_pipeline_end_to_end_on_tiny(tmp_path, capsys):
    run_dir = tmp_path / "qs"
    # four PPO epochs, not the tiny preset's one, and 32 held-out queries: the KL, 1.0-2.4 nats, then stands 3.9-5.7
    # standard errors above 0 (the tiny preset runs fp32; measured with AVX-512 and with AVX2 kernels)
    args = ["quickstart", "--preset", "tiny", "--run-dir", str(run_dir), "--eval-queries", "32",
            "--ppo.noptepochs", "4"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "report:" in out and "held-out accuracy" in out
    assert "resuming" not in out  # a fresh run says nothing of resuming
    for f in ["report.md", "report.json", "curves.png", "labels.sqlite", "metrics.jsonl", "reward_model/lmprefs.json",
              "policy/model.safetensors"]:  # fmt: skip
        assert (run_dir / f).is_file(), f
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    rep = json.loads((run_dir / "report.json").read_text())
    nums = [rep["figures"]["rm_accuracy"], rep["figures"]["kl"], rep["figures"]["beta"],
            *rep["true_reward_before"].values(), *rep["true_reward_after"].values(),
            *rep["stages"].values()]  # fmt: skip
    assert all(math.isfinite(x) for x in nums), rep
    # KL of the trained policy from the initial one on the held-out samples: a mean of sums of logp - logp_ref
    assert rep["kl_after"]["kl"] > 0 and rep["kl_after"]["kl_stderr"] > 0 and rep["figures"]["kl_heldout"] > 0
    text = (run_dir / "report.md").read_text()
    assert "true reward, final policy" in text and "before (" in text and "after (" in text
    # one layout for both phases: tagged rows, one TensorBoard folder (step axis) per phase
    from lmprefs.io.jsonl import read_jsonl

    phases = [r["phase"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert phases == sorted(phases, key=["reward", "policy"].index) and set(phases) == {"reward", "policy"}
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == ["policy", "reward"]
    assert not list(run_dir.glob("events.out.tfevents.*"))
    # a second quickstart into the same directory is refused rather than mixed in
    assert main(["quickstart", "--preset", "tiny", "--run-dir", str(run_dir)]) == 2


@pytest.mark.slow
def test_quickstart_on_smollm2_reduced(tmp_path):
    """The real preset, reduced: SmolLM2 + Austen + VADER through every stage (minutes)."""
    run_dir = tmp_path / "qs"
    args = ["quickstart", "--run-dir", str(run_dir), "--eval-queries", "32", "--eval-samples", "1",
            "--labels.num-train", "64", "--ppo.total-episodes", "64", "--ppo.batch-size", "32"]  # fmt: skip
    assert main(args) == 0
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["true_reward_after"]["n_queries"] == 32 and math.isfinite(rep["true_reward_after"]["mean"])
