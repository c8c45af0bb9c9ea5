"""`lmprefs experiment label-efficiency` at tiny size: the whole command, a killed run resumed, bad input, --plan."""

from __future__ import annotations

import json

import pytest

from lmprefs.cli.dispatch import main
from tests.crash import killed

# rounds of 8 from a pool of 2x the largest budget, a 2-member choosing ensemble, PPO of 2 updates of 16
SMALL = ["--labels", "8,16", "--eval-queries", "4", "--eval-samples", "1", "--labels.select-round", "8",
         "--labels.pool-factor", "2", "--train-reward.ensemble", "2"]  # fmt: skip


def args(run_dir, *extra) -> list[str]:
    return ["experiment", "label-efficiency", "tiny", *SMALL, "--run-dir", str(run_dir), *extra]


def test_the_experiment_runs_both_arms_from_one_pool_and_reports_k(tmp_path, capsys):
    run_dir = tmp_path / "le"
    assert main(args(run_dir, "--seeds", "2", "--ppo.total-episodes", "16")) == 0
    res = json.loads((run_dir / "results.json").read_text())
    out = capsys.readouterr().out
    assert res["pool"] == {"candidates": 32, "heldout": 64}
    for s, suffix in ((0, ""), (1, "-seed1")):
        order = res[f"order-bald{suffix}"]
        assert [r["select"] for r in order["rounds"]] == ["random", "bald"] and len(set(order["items"])) == 16
        # the directed round asked what its ensemble ranked above the pool's mean
        assert order["rounds"][1]["acquisition_asked"] >= order["rounds"][1]["acquisition_pool"]
        # one round: the random arm's questions, not trained again
        assert res[f"bald-8{suffix}"]["same_as"] == "random-8"
        assert res[f"bald-8{suffix}"]["mean"] == res[f"random-8{suffix}"]["mean"]
        rms = [json.loads((run_dir / f"{a}-16{suffix}" / "reward_model.json").read_text()) for a in ("random", "bald")]
        assert [r["labels_train"] for r in rms] == [16, 16] and [r["labels_heldout"] for r in rms] == [64, 64]
        assert res[f"bald-16{suffix}"]["seed"] == res[f"random-16{suffix}"]["seed"] == res["random-8"]["seed"] + s
    # both pools' directed sequences begin with their seed's random round: the seeds' pools differ
    assert res["order-bald"]["items"][:8] != res["order-bald-seed1"]["items"][:8]
    k = res["summary"]["k"]["bald"]
    assert [r["labels"] for r in k] == [16] and k[0]["bound"] in ("=", "<=", ">=") and k[0]["k"] > 0
    arm = res["summary"]["arms"]["bald-16"]
    assert arm["seeds"] == 2 and 0 <= arm["accuracy"] <= 1 and arm["accuracy_ci95"] is not None
    report = (run_dir / "report.md").read_text()
    assert "**Verdict:** bald queries " in report and "at 16 labels (95% bootstrap interval" in report
    assert "verdict: bald queries" in out
    assert (run_dir / "label_efficiency.png").read_bytes()[:4] == b"\x89PNG"
    # run again: every arm is done
    assert main(args(run_dir, "--seeds", "2")) == 0
    out = capsys.readouterr().out
    assert "[bald-16-seed1] done" in out and "training" not in out and "round 1" not in out


def test_a_killed_experiment_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(args(full)) == 0
    # killed after the directed sequence's first round, then in the directed arm's PPO run
    killed(monkeypatch, args(cut), "label-efficiency:round")
    assert [r["round"] for r in json.loads((cut / "results.json").read_text())["order-bald"]["rounds"]] == [0]
    killed(monkeypatch, args(cut), "train:saved")
    assert "bald-16" not in json.loads((cut / "results.json").read_text())
    capsys.readouterr()
    assert main(args(cut)) == 0
    assert "[bald-16] resuming" in capsys.readouterr().out
    a, b = (json.loads((d / "results.json").read_text()) for d in (full, cut))
    assert a["order-bald"] == b["order-bald"]
    for key in ("random-8", "random-16", "bald-16"):
        assert (a[key]["accuracy"], a[key]["mean"], a[key]["kl"]) == (b[key]["accuracy"], b[key]["mean"], b[key]["kl"])


@pytest.mark.parametrize("extra,needle", [
    (["--acquisitions", "bald,maxvar"], "--acquisitions 'bald,maxvar': unknown acquisition 'maxvar'"),
    (["--acquisitions", "random"], "unknown acquisition 'random'"),
    (["--labels", "0,8"], "--labels '0,8': label budgets must be positive"),
    (["--labels", "4,8"], "--labels 4,8: every budget is at most labels.select_round=8"),
    (["--labels", "8,1000"], "--labels 1000: a shared pool of 2000 candidates"),
    (["--seeds", "0"], "--seeds 0: must be at least 1"),
    (["--eval-queries", "100000"], "--eval-queries 100000"),
    (["--betas", "1"], "--betas is not an option of `experiment label-efficiency`"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, extra, needle):
    run_dir = tmp_path / "le"
    assert main(args(run_dir, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not run_dir.exists()


def test_plan_prints_an_estimate_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "le"
    assert main(args(run_dir, "--plan", "--seeds", "3", "--acquisitions", "bald,spread")) == 0
    out = capsys.readouterr().out
    assert "random and bald,spread, 3 seed(s)" in out and "directed rounds: 2-member ensembles" in out
    assert "total (estimate)" in out and "against 60 min" in out and not run_dir.exists()
