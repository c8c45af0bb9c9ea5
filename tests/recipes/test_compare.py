"""`experiment compare` on the tiny preset: every arm kind runs from one store and one reward model and lands in
results.json with finite figures, the figure is a PNG, a rerun skips finished arms; bad input is one line, exit 2,
nothing written."""

import json
import math

import pytest
from crash import killed

from lmprefs.cli.dispatch import main

SMALL = ["--preset", "tiny", "--eval-samples", "1", "--labels", "16", "--eval-queries", "4", "--samples", "8",
         "--kl-coefs", "0.1", "--dpo-betas", "0.1", "--best-of", "4", "--betas", "0.1,1",
         "--min-ess", "2"]  # fmt: skip
# one DPO step per arm (16 labels), so the second logged DPO step is the listwise arm's
CONFIG = ["--ppo.total-episodes", "16", "--labels.heldout-fraction", "0.2", "--dpo.batch-size", "16"]
KEYS = ["ppo-beta0.1", "ppo-separate-beta0.1", "rloo-beta0.1", "dpo-pairwise-beta0.1", "dpo-listwise-beta0.1",
        "best-of-4"]  # fmt: skip
GRPO_KEYS = ["grpo-beta0.1", "grpo-kl-reward-beta0.1", "dr-grpo-beta0.1", "reinforce-pp-baseline-beta0.1"]


@pytest.mark.heavy
def test_every_arm_runs_lands_in_results_and_a_rerun_skips_them(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "cmp"
    arms = "ppo,ppo-separate,rloo,grpo,grpo-kl-reward,dr-grpo,reinforce-pp-baseline,dpo-pairwise,dpo-listwise," \
           "best-of-n"
    args = ["experiment", "compare", *SMALL, "--arms", arms, "--run-dir", str(run_dir)]
    killed(monkeypatch, args + CONFIG, "dpo:logged", 2)  # the second DPO arm (listwise), after its first logged step
    assert (run_dir / "dpo-listwise-beta0.1" / "run.json").is_file()
    assert "dpo-listwise-beta0.1" not in json.loads((run_dir / "results.json").read_text())
    capsys.readouterr()
    # rerunning the command: the finished arms are skipped, the killed one resumes, the rest run
    assert main(args + CONFIG) == 0
    out = capsys.readouterr().out
    assert all(f"[{k}] done" in out for k in KEYS[:4] + GRPO_KEYS), out
    assert "[dpo-listwise-beta0.1] resuming" in out and "[best-of-4] sampling" in out
    assert "[labels]" not in out and "[frontier]" not in out and "[reward model]" not in out
    assert "| rloo | kl_coef 0.1 |" in out
    assert "Matched KL: no comparison (matched KL needs two or more arm kinds" in out  # one setting per kind
    res = json.loads((run_dir / "results.json").read_text())
    assert {"labels", "initial", "frontier", "reward_model", "summary", *KEYS, *GRPO_KEYS} <= set(res)
    grpo = json.loads((run_dir / "grpo-beta0.1" / "config.json").read_text())["ppo"]
    assert (grpo["estimator"], grpo["kl_in"]) == ("grpo", "loss")
    for key in KEYS + GRPO_KEYS:
        d = res[key]
        assert d["n_queries"] == 4 and d["seconds"] > 0 and d["episodes"] > 0, (key, d)
        assert all(math.isfinite(d[k]) for k in ("mean", "stderr", "kl", "kl_stderr", "episodes_per_s")), (key, d)
    assert res["best-of-4"]["kl"] == pytest.approx(math.log(4) - 3 / 4) and res["best-of-4"]["kl_analytic"]
    assert res["ppo-beta0.1"]["episodes"] == 16 and res["dpo-pairwise-beta0.1"]["episodes"] == 16
    # the PPO-family arms read the one reward model instead of training their own
    assert not any((run_dir / k / "reward_model").exists() for k in KEYS[:3])
    assert (run_dir / "compare.png").read_bytes()[:4] == b"\x89PNG"
    report = (run_dir / "report.md").read_text()
    assert "| dpo-listwise | dpo.beta 0.1 |" in report and "(analytic)" in report
    # the same command again: every arm is done
    assert main(args) == 0
    out = capsys.readouterr().out
    assert all(f"[{k}] done" in out for k in KEYS), out
    # one kind swept over its own coefficients: its finished setting kept, the new one trained, the others untouched;
    # once it has finished the flag is the run's own, and a bare rerun reports that arm too
    assert main([*args, "--kl-coefs-of", "grpo=0.1,0.3"]) == 0
    out = capsys.readouterr().out
    assert "[grpo-beta0.1] done" in out and "[grpo-beta0.3] training" in out and "[ppo-beta0.3]" not in out
    assert "grpo-beta0.3" in json.loads((run_dir / "results.json").read_text())
    assert main(["experiment", "compare", "--run-dir", str(run_dir)]) == 0
    assert "[grpo-beta0.3] done" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["--arms", "ppo,sft"], "--arms 'ppo,sft': unknown arm 'sft'"),
    (["--kl-coefs", "0.1,0"], "--kl-coefs '0.1,0': every KL coefficient must be a positive number (not 0)"),
    (["--dpo-betas", "-0.1"], "--dpo-betas '-0.1': every beta must be a positive number (not -0.1)"),
    (["--seeds", "0"], "--seeds 0: must be at least 1"),
    (["--best-of", "0"], "--best-of '0': every n must be a positive number (not 0)"),
    (["--labels", "8,16"], "--labels '8,16': one positive label count"),
    (["--eval-queries", "1"], "--eval-queries 1: must be at least 2"),
    (["--db", "missing.sqlite"], "missing.sqlite"),
    (["--db", "scores.jsonl"], "the label store holds no best-of-N or pairwise labels"),
    (["--fit-cut", "1"], "--fit-cut is not an option of `experiment compare`"),
    (["--match-kl", "1", "--kl-coefs", "0.1", "--dpo-betas", "0.1", "--best-of", "4"],
     "--match-kl 1: matched KL needs two or more arm kinds with two or more KL settings"),
    (["--match-kl", "0.3,9", "--best-of", "2,16"], "best-of-n reaches KL 0.19-1.84 nats only (--best-of 2,16), not 9"),
    (["--match-kl", "nan"], "--match-kl 'nan': every KL value must be a positive number"),
    (["--arms", "ppo", "--lengths", "1"], "--lengths 1: no arm is swept over training length"),
    (["--arms", "grpo-beta0", "--lengths", "1,9"], "--lengths 1,9: 9 is past the run's 2 updates"),
    (["--arms", "grpo-beta0", "--lengths", "0"], "--lengths '0': every update count must be a positive number"),
    (["--arms", "dpo-online", "--dpo.online-samples", "3"], "dpo.online_samples=3: the dpo-online arm samples "
     "ppo.batch_size=16 responses a step, as the PPO-family arms do"),
    (["--arms", "ppo,grpo", "--kl-coefs-of", "grpo:1,3"], "--kl-coefs-of 'grpo:1,3': is not KIND=C1,C2,..."),
    (["--arms", "ppo,grpo", "--kl-coefs-of", "dpo-online=1"], "'dpo-online' is not a PPO-family kind"),
    (["--arms", "ppo", "--kl-coefs-of", "grpo=1"], "--kl-coefs-of 'grpo=1': grpo is not in --arms"),
    (["--arms", "grpo", "--kl-coefs-of", "grpo=1", "--kl-coefs-of", "grpo=3"], "grpo is given twice"),
    (["--arms", "grpo", "--kl-coefs-of", "grpo=1,-3"], "--kl-coefs-of grpo '1,-3': every KL coefficient must be a "
     "positive number (not -3)"),
    (["--arms", "ppo,grpo-beta0", "--kl-coefs", "0.1", "--lengths", "2", "--match-kl", "1"],
     "--match-kl 1: matched KL needs two or more arm kinds with two or more KL settings"),
])  # fmt: skip
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scores.jsonl").write_text(json.dumps({"prompt": "q", "response": "a", "score": 1.0}) + "\n")
    assert main(["experiment", "compare", "tiny", "--run-dir", "cmp", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "cmp").exists()


def test_an_arm_that_did_not_move_the_policy_is_named_in_the_report(tmp_path):
    """A DPO arm at the paper's lr 1e-6 on a small model ends at KL -4e-6 nats: its figures are the initial
    policy's, and the report says so in one line, with what moves it; arms that moved, and best-of-n, are not named."""
    from lmprefs.config import preset
    from lmprefs.recipes.compare_arms import Plan
    from lmprefs.recipes.compare_report import unmoved, write_report

    plan = Plan(arms=("ppo", "dpo-pairwise", "best-of-n"), kl_coefs=(0.1,), dpo_betas=(0.1, 0.3), best_of=(4,),
                n_eval=4, eval_samples=1)  # fmt: skip
    arm = {"mean": 0.1, "stderr": 0.01, "kl_stderr": 0.0, "seed": 1, "seconds": 1.0, "episodes_per_s": 1.0}
    data = {"initial": {"mean": 0.1, "stderr": 0.01}, "labels": {"store": "s", "num_train": 8},
            "frontier": {"queries": 4, "samples_per_query": 8, "min_ess": 2},
            "ppo-beta0.1": arm | {"kl": 0.8}, "dpo-pairwise-beta0.1": arm | {"kl": -4e-6},
            "dpo-pairwise-beta0.3": arm | {"kl": 0.002}, "best-of-4": arm | {"kl": 0.0, "kl_analytic": True}}
    cfg = preset("quickstart")
    line = unmoved(data, plan, cfg)
    assert line.startswith("did not move the policy") and "dpo-pairwise-beta0.1, dpo-pairwise-beta0.3;" in line
    assert "ppo-beta0.1" not in line and "best-of-4" not in line and "--dpo.lr (now 1e-06)" in line
    report = write_report(tmp_path, data, plan, cfg).read_text()
    assert f"**Arms that {line}.**" in report
    assert unmoved({**data, "dpo-pairwise-beta0.1": arm | {"kl": 0.4}, "dpo-pairwise-beta0.3": arm | {"kl": 0.3}},
                   plan, cfg) is None  # fmt: skip


BETA0 = [*SMALL, "--arms", "grpo-beta0,best-of-n", "--best-of", "2,4", "--lengths", "1,2",
         "--ppo.total-episodes", "64", "--labels.heldout-fraction", "0.2"]  # fmt: skip


def test_a_beta0_kind_is_one_run_evaluated_along_the_way_and_resumes(tmp_path, capsys, monkeypatch):
    """grpo-beta0: rewards.kl_coef 0, one run of the 4 updates, its policy evaluated after 1, 2 and 4 of them: three
    points of one curve. Killed after its third checkpoint, the rerun resumes it and keeps the points already saved;
    the evaluations along the way leave the training as it was (the same end as a run evaluated at its end only);
    a rerun with other --lengths is refused, nothing written."""
    run_dir = tmp_path / "cmp"
    args = ["experiment", "compare", *BETA0, "--run-dir", str(run_dir)]
    killed(monkeypatch, args, "train:saved", 3)
    res = json.loads((run_dir / "results.json").read_text())
    assert {"grpo-beta0-u1", "grpo-beta0-u2"} <= set(res) and "grpo-beta0-u4" not in res
    assert json.loads((run_dir / "grpo-beta0" / "config.json").read_text())["rewards"]["kl_coef"] == 0
    early = res["grpo-beta0-u1"]
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[grpo-beta0] resuming" in out and "| grpo-beta0 | kl_coef 0, 2 updates |" in out
    res = json.loads((run_dir / "results.json").read_text())
    assert res["grpo-beta0-u1"] == early and res["lengths"] == [1, 2, 4]
    for u in (1, 2, 4):
        d = res[f"grpo-beta0-u{u}"]
        assert d["episodes"] == 16 * u and d["value"] == u and math.isfinite(d["kl"]), d
    assert "grpo-beta0" in json.dumps(res["matched_kl"])  # a curve of its own: a range, or the rows at matched KL
    # evaluated at its end only: the same training, so the same end
    assert main(["experiment", "compare", *BETA0[:-6], "--lengths", "4", *BETA0[-4:], "--run-dir",
                 str(tmp_path / "end")]) == 0  # fmt: skip
    end = json.loads((tmp_path / "end" / "results.json").read_text())
    assert {k: end["grpo-beta0-u4"][k] for k in ("mean", "kl")} == {k: res["grpo-beta0-u4"][k] for k in ("mean", "kl")}
    assert "grpo-beta0-u1" not in end
    before = (run_dir / "results.json").read_text()
    capsys.readouterr()
    assert main([*args[:-2], "--lengths", "2", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "were evaluated after 1,2,4 updates; rerun with --lengths 1,2,4" in err and len(err.splitlines()) == 1
    assert (run_dir / "results.json").read_text() == before


def test_a_match_kl_value_outside_a_finished_kinds_range_is_refused():
    from lmprefs.errors import UserError
    from lmprefs.recipes.compare_arms import Plan, arm_list
    from lmprefs.recipes.matched import check_reach

    plan = Plan(arms=("ppo", "grpo-beta0"), kl_coefs=(0.1, 0.3), lengths=(2, 4), seeds=2)
    kls = {"ppo-beta0.1": 3.0, "ppo-beta0.3": 1.0, "grpo-beta0-u2": 0.5, "grpo-beta0-u4": 2.5}
    data = {f"{k}-seed1" if s else k: {"kl": v + 0.1 * s, "mean": 0.1} for k, v in kls.items() for s in range(2)}
    check_reach(data, arm_list(plan), plan.arms, 2, (1.5, 2.5))
    with pytest.raises(UserError, match=r"--match-kl 1.5,2.7: grpo-beta0, finished, reached 0.60-2.50 nats in every "
                       r"seed, not 2.7 \(ranges: ppo 1.10-3.00, grpo-beta0 0.60-2.50 nats\)"):  # fmt: skip
        check_reach(data, arm_list(plan), plan.arms, 2, (1.5, 2.7))
    del data["ppo-beta0.1-seed1"]  # ppo not finished: its range may still grow
    check_reach(data, arm_list(plan), plan.arms, 2, (1.5, 2.5))
