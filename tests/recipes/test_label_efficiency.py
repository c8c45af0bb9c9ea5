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


@pytest.mark.heavy
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


@pytest.mark.heavy
def test_a_killed_experiment_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(args(full)) == 0
    # killed while the pool is labeled (made again from the start), after the directed sequence's first round,
    # then in the directed arm's PPO run
    killed(monkeypatch, args(cut), "labeling:stored")
    assert "questions" not in json.loads((cut / "results.json").read_text())
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
    (["--labels.select", "bald"], "labels.select=bald: experiment label-efficiency runs the random control"),
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


def row(k, low, high, low_bound="=", high_bound="=", labels=256):
    return {"labels": labels, "k": k, "bound": "=", "low": low, "low_bound": low_bound, "high": high,
            "high_bound": high_bound}  # fmt: skip


def test_the_verdict_reads_k_and_its_interval():
    from lmprefs.recipes.label_efficiency_report import outcome, verdict

    assert outcome(row(2.0, 1.3, 3.0), 3) == "helped"
    assert outcome(row(1.5, 0.8, 3.0), 3) == "did not beat random"  # the interval includes 1
    assert outcome(row(0.5, 0.3, 0.9), 3) == "did worse than random"
    assert outcome(row(2.0, 1.0, 1.0, ">=", ">="), 3) == "helped"  # beyond random's largest budget in every draw
    assert outcome(row(0.5, 0.5, 1.0, "<="), 3) == "did not beat random"
    assert outcome(row(2.0, 1.3, 3.0), 1) == "one seed, no interval"
    line = verdict("bald", [row(1.2, 0.7, 2.0, labels=128), row(2.0, 1.3, 3.0)], 3)
    assert line.startswith("bald queries helped: random queries need 2.00x the labels")
    assert "k = 2.00 at 256 labels (95% bootstrap interval 1.30 to 3.00 over 3 seeds)" in line
    assert "k = 1.20 at 128 labels (95% bootstrap interval 0.70 to 2.00 over 3 seeds): did not beat random" in line


def test_the_summary_reads_k_off_randoms_curve_across_seeds():
    from lmprefs.config import preset
    from lmprefs.recipes.label_efficiency import Plan
    from lmprefs.recipes.label_efficiency_report import summarize

    cfg = preset("tiny")  # rounds of 64: k at 128 and 256
    plan = Plan(budgets=(64, 128, 256), seeds=3)
    data = {}
    for s, shift in enumerate((-0.1, 0.0, 0.1)):
        for acq, rewards in (("random", (0.0, 1.0, 2.0)), ("bald", (0.0, 1.5, 2.5))):
            for b, r in zip(plan.budgets, rewards, strict=True):
                key = f"{acq}-{b}" + (f"-seed{s}" if s else "")
                data[key] = {"mean": r + shift, "stderr": 0.1, "kl": 1.0, "n_queries": 4, "labels": b, "accuracy": 0.5}
    k = summarize(data, plan, cfg)["k"]["bald"]
    assert [r["labels"] for r in k] == [128, 256]
    # 1.5 lies halfway between random's 128 and 256 in log(labels): 181 labels, k = 1.41; the same shift in every
    # seed leaves every resample's k there
    assert k[0]["k"] == pytest.approx(2**0.5) and k[0]["bound"] == "="
    assert (k[0]["low"], k[0]["high"]) == pytest.approx((2**0.5, 2**0.5))
    # 2.5 lies above random's whole curve: random needs more than 256, k >= 1
    assert (k[1]["k"], k[1]["bound"], k[1]["low_bound"]) == (1.0, ">=", ">=")
