"""`lmprefs experiment overoptimization` at tiny size: the whole command, a killed run resumed, bad input, --plan, and
the best-of-n estimate and verdict against hand computations."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from refusals import assert_refused

from lmprefs.cli.dispatch import main
from tests.crash import killed

# 2-member ensembles on 8 labels, best-of-n up to 8 on 4 held-out queries, PPO of 4 updates of 16
SMALL = ["--labels", "8", "--queries", "4", "--samples", "8", "--eval-samples", "1", "--members", "2",
         "--ppo.total-episodes", "64"]  # fmt: skip


def args(run_dir, *extra) -> list[str]:
    return ["experiment", "overoptimization", "tiny", *SMALL, "--run-dir", str(run_dir), *extra]


@pytest.mark.heavy
def test_the_experiment_traces_every_proxy_over_kl_and_reports(tmp_path, capsys):
    run_dir = tmp_path / "ovo"
    assert main(args(run_dir, "--seeds", "2", "--methods", "bon,ppo", "--proxies", "single,mean,min")) == 0
    res = json.loads((run_dir / "results.json").read_text())
    out = capsys.readouterr().out
    for suffix in ("", "-seed1"):
        bon = {p: res[f"bon-{p}-8{suffix}"]["curve"] for p in ("single", "mean", "min")}
        assert [x["n"] for x in bon["mean"]] == [1, 2, 4, 8]
        assert [x["kl"] for x in bon["mean"]] == pytest.approx([np.log(n) - (n - 1) / n for n in (1, 2, 4, 8)])
        # n = 1 takes every sample alike whatever ranks them: one pool, the same initial-policy reward
        firsts = [bon[p][0]["true"] for p in ("single", "mean", "min")]
        assert firsts == pytest.approx([firsts[0]] * 3)
        # the worst member scores a chosen sample at most as the mean does, in every subset
        assert all(a["proxy"] <= b["proxy"] + 1e-6 for a, b in zip(bon["min"], bon["mean"], strict=True))
        ppo = res[f"ppo-mean-8{suffix}"]
        assert len(ppo["curve"]) == 4 and [x["update"] for x in ppo["curve"]] == [1, 2, 3, 4]
        assert "kl" in ppo["heldout"] and res[f"rm-8{suffix}"]["labels_train"] == 8
    rewards = {p: json.loads((run_dir / f"ppo-{p}-8" / "config.json").read_text())["rewards"]
               for p in ("single", "mean", "min")}  # fmt: skip
    assert rewards["single"]["kl_coef"] == 0.01 and rewards["single"]["kl_target"] is None
    assert rewards["single"]["trained_model"].endswith("rm-8/member-0")
    assert rewards["mean"]["trained_model"].endswith("rm-8") and rewards["mean"]["ensemble_reduce"] == "mean"
    assert rewards["min"]["trained_model"].endswith("rm-8") and rewards["min"]["ensemble_reduce"] == "min"
    arm = res["summary"]["arms"]["bon-mean-8"]
    assert arm["seeds"] == 2 and arm["curve"][0]["true_ci95"] is not None and arm["gao"]["form"] == "bon"
    assert set(res["summary"]["lines"]) == {"bon-8", "ppo-8"}
    report = (run_dir / "report.md").read_text()
    assert "**Verdict:** " in report and "| bon-min-8 | 2 |" in report and "verdict: " in out
    assert (run_dir / "overoptimization.png").read_bytes()[:4] == b"\x89PNG"
    assert main(args(run_dir, "--seeds", "2", "--methods", "bon,ppo", "--proxies", "single,mean,min")) == 0
    out = capsys.readouterr().out
    assert "[ppo-mean-8-seed1] done" in out and "training" not in out
    assert "sampling" not in out and "scoring" not in out


def test_best_of_n_draws_one_pool_per_seed_for_every_label_count(tmp_path, capsys):
    run_dir = tmp_path / "ovo"
    assert main(args(run_dir, "--methods", "bon", "--labels", "8,16", "--proxies", "single,uwo")) == 0
    res = json.loads((run_dir / "results.json").read_text())
    assert capsys.readouterr().out.count("[samples] sampling 8 responses") == 1
    assert (run_dir / "pool-8.json").is_file() and (run_dir / "pool-16.json").is_file()
    # the same samples under another count's proxies: the same initial-policy reward at n = 1
    assert res["bon-uwo-16"]["curve"][0]["true"] == pytest.approx(res["bon-single-8"]["curve"][0]["true"])
    assert not any(k.startswith("ppo-") for k in res) and set(res["summary"]["lines"]) == {"bon-8", "bon-16"}


@pytest.mark.heavy
def test_a_killed_experiment_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, capsys):
    grid = ["--proxies", "single,mean"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(args(full, *grid)) == 0
    killed(monkeypatch, args(cut, *grid), "overoptimization:reward-model")
    killed(monkeypatch, args(cut, *grid), "overoptimization:samples")
    killed(monkeypatch, args(cut, *grid), "overoptimization:pool")
    assert "bon-mean-8" not in json.loads((cut / "results.json").read_text())
    killed(monkeypatch, args(cut, *grid), "train:saved", nth=2)  # the first PPO arm, after its second update
    capsys.readouterr()
    assert main(args(cut, *grid)) == 0
    assert "[ppo-single-8] resuming" in capsys.readouterr().out
    a, b = (json.loads((d / "results.json").read_text()) for d in (full, cut))
    for key in ("bon-single-8", "bon-mean-8", "ppo-single-8", "ppo-mean-8"):
        assert a[key]["curve"] == b[key]["curve"], key
    steps = [json.loads(x)["step"] for x in (cut / "ppo-single-8" / "metrics.jsonl").read_text().splitlines()
             if json.loads(x).get("phase", "policy") == "policy"]  # fmt: skip
    assert steps == sorted(set(steps)), "a logged update written twice"


@pytest.mark.parametrize("extra,needle", [
    (["--uwo-lambda", "-0.5"], "--uwo-lambda -0.5: must be a finite number >= 0"),
    (["--members", "1"], "--members 1: an ensemble needs at least 2 members"),
    (["--proxies", "mean,max"], "--proxies 'mean,max': unknown 'max'"),
    (["--methods", "dpo"], "--methods 'dpo': unknown 'dpo'"),
    (["--kl-coef", "0"], "--kl-coef 0: must be a positive number"),
    (["--labels", "0,8"], "--labels '0,8': label counts must be positive"),
    (["--samples", "1", "--methods", "bon"], "--samples 1: best-of-n needs at least 2"),
    (["--ppo.total-episodes", "32"], "2 PPO update(s) of 16; a PPO arm's curve needs at least 3"),
    (["--labels", "100000"], "--labels 100000: 100000 labeled questions"),
    (["--queries", "100000"], "--queries 100000"),
    (["--betas", "1"], "--betas is not an option of `experiment overoptimization`"),
    (["--labels.select", "bald", "--train-reward.ensemble", "2"],
     "labels.select=bald: experiment overoptimization asks random questions"),
    (["--rewards.ensemble-reduce", "min", "--train-reward.ensemble", "2"],
     "rewards.ensemble_reduce=min: experiment overoptimization optimizes each reduction itself"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, extra, needle):
    monkeypatch.chdir(tmp_path)
    assert_refused(args(tmp_path / "ovo", *extra), needle, tmp_path, capsys)


def test_plan_prints_an_estimate_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "ovo"
    assert main(args(run_dir, "--plan", "--seeds", "3", "--plan-minutes", "120")) == 0
    out = capsys.readouterr().out
    assert "3 seed(s), 2-member ensembles, best-of-n up to 8 on 4 held-out queries" in out
    assert "best-of-n pool: score by 2 members" in out and "PPO, 4 updates of 16" in out
    assert "total (estimate)" in out and "against 120 min" in out and not run_dir.exists()


def test_best_of_n_is_the_expected_true_reward_of_the_proxys_pick_over_every_subset():
    from lmprefs.recipes.overoptimization import bon_curve

    rng = np.random.default_rng(0)
    true, proxy = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    curve = bon_curve(torch.tensor(true), torch.tensor(proxy), [1, 2, 3, 6])
    for point in curve:
        subsets = list(itertools.combinations(range(6), point["n"]))
        pick = [[max(s, key=lambda i: proxy[q, i]) for s in subsets] for q in range(3)]
        assert point["true"] == pytest.approx(np.mean([[true[q, i] for i in p] for q, p in enumerate(pick)]))
        assert point["proxy"] == pytest.approx(np.mean([[proxy[q, i] for i in p] for q, p in enumerate(pick)]))


def test_proxies_reduce_the_members_as_coste_et_al_write_them():
    from lmprefs.recipes.overoptimization import proxy_scores

    m = np.random.default_rng(1).normal(size=(3, 2, 4))
    t = torch.tensor(m)
    assert np.allclose(proxy_scores(t, "single", 1.0).numpy(), m[0])
    assert np.allclose(proxy_scores(t, "min", 1.0).numpy(), m.min(0))
    assert np.allclose(proxy_scores(t, "uwo", 0.5).numpy(), m.mean(0) - 0.5 * m.var(0))


def test_a_ppo_curve_is_its_updates_averaged_in_windows():
    from lmprefs.recipes.overoptimization import ppo_curve

    rows = [{"step": i + 1, "objective/kl": float(i), "objective/score": 2.0 * i, "objective/true_reward": -i}
            for i in range(25)]  # fmt: skip
    curve = ppo_curve(rows, chunks=5)
    assert [p["update"] for p in curve] == [5, 10, 15, 20, 25]
    assert [p["kl"] for p in curve] == [2.0, 7.0, 12.0, 17.0, 22.0]
    assert curve[0]["proxy"] == 4.0 and curve[0]["true"] == -2.0
    assert len(ppo_curve(rows[:3], chunks=10)) == 3


def curve(trues: list[float]) -> list[dict]:
    return [{"kl": float(i), "true": t, "proxy": float(i)} for i, t in enumerate(trues)]


def test_the_verdict_says_where_the_true_reward_fell_and_whether_min_held_it_up():
    from lmprefs.recipes.overoptimization import Plan
    from lmprefs.recipes.overoptimization_report import summarize

    plan = Plan(labels=(8,), proxies=("mean", "min"), methods=("bon",), seeds=3, samples=8)
    data = {"initial": {"mean": 0.0, "std": 1.0}}
    for s, shift in enumerate((-0.01, 0.0, 0.01)):
        suffix = f"-seed{s}" if s else ""
        data[f"bon-mean-8{suffix}"] = {"curve": curve([0.0, 0.5 + shift, 0.8, 0.4 - shift])}  # peaks, then falls
        data[f"bon-min-8{suffix}"] = {"curve": curve([0.0, 0.3 + shift, 0.5, 0.6 - shift])}  # rises to the end
    out = summarize(data, plan)
    mean, mn = out["arms"]["bon-mean-8"], out["arms"]["bon-min-8"]
    assert (mean["peak_kl"], mean["overoptimized"], mn["overoptimized"]) == (2.0, True, False)
    assert mean["fall"] == pytest.approx(0.4) and mean["fall_ci95"] > 0
    assert out["holds"]["bon-min-vs-mean-8"]["diff"] == pytest.approx(0.2)
    assert out["verdict"].startswith("over-optimization appeared at this scale in bon-mean-8 (3 seeds")
    assert out["verdict"].endswith("the conservative rewards removed it in bon-mean-8")
    assert "min did not fall (last true reward +0.2000 vs mean)" in out["lines"]["bon-8"]
    for name in list(data):
        if name.startswith("bon-mean"):
            data[name] = {"curve": curve([0.0, 0.2, 0.4, 0.6])}
    out = summarize(data, plan)
    assert out["verdict"].startswith("over-optimization did not appear at this scale")
    assert "proxy and true reward part" in out["lines"]["bon-8"]
