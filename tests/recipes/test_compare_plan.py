"""`experiment compare --plan`: it prints an estimate and writes nothing; the estimate grows with seeds, settings and
arms as the work does; DPO's rate is the one its FLOP count gives the measured run; bad input is one line, exit 2."""

import dataclasses

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.models.flops import ModelFacts
from lmprefs.recipes.compare_arms import Plan, arm_list
from lmprefs.recipes.plan import Shape
from lmprefs.recipes.plan_compare import DPO_GFLOPS, Sizes, dpo_flops, online_dpo_flops, plan_compare

R = dataclasses.replace
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "num_hidden_layers": 30, "vocab_size": 49152}  # fmt: skip
SHAPE = Shape(q_len=32, train_queries=3627)
SIZES = Sizes(questions=889, labels_train=800, labels_heldout=89, n_eval=64)
PLAN = Plan(arms=("ppo", "grpo", "dpo-pairwise", "best-of-n"), kl_coefs=(0.1, 0.3), dpo_betas=(0.1, 0.3),
            best_of=(2, 4), seeds=3, samples=128)  # fmt: skip


def stages(plan=PLAN, cfg=None, sizes=SIZES):
    rows = plan_compare(cfg or preset("quickstart"), ModelFacts.from_config(SMOLLM2), SHAPE, plan, sizes)
    return {r["stage"].split(",")[0]: r for r in rows}


def total(p: dict) -> float:
    return sum(r["seconds"] for r in p.values())


def test_the_estimate_grows_with_seeds_settings_and_arms():
    base = stages()
    twice = stages(R(PLAN, seeds=6))
    for stage in ("ppo", "grpo", "DPO: dpo-pairwise", "best-of-n", "evaluations"):
        assert twice[stage]["gflop"] == pytest.approx(2 * base[stage]["gflop"]) and base[stage]["gflop"] > 0, stage
        assert twice[stage]["runs"] == 2 * base[stage]["runs"]
    for stage in ("label 889 questions", "frontier: 64 queries x 128 samples of rho", "reward model"):
        assert twice[stage] == base[stage], stage  # once for every seed
    assert base["ppo"]["runs"] == 3 * 2 and base["evaluations"]["runs"] == 3 * (2 + 2 + 2)
    # a group estimator samples each query once for its k samples and reads no values: less than PPO's run
    assert base["grpo"]["gflop"] < base["ppo"]["gflop"]
    more = stages(R(PLAN, kl_coefs=(0.03, 0.1, 0.3), best_of=(2, 4, 8)))
    assert more["ppo"]["gflop"] == pytest.approx(1.5 * base["ppo"]["gflop"])
    assert more["best-of-n"]["gflop"] > 2 * base["best-of-n"]["gflop"]  # n = 8 draws more than 2 and 4 together
    epochs = stages(cfg=R(preset("quickstart"), dpo=R(preset("quickstart").dpo, epochs=2)))
    assert base["DPO: dpo-pairwise"]["gflop"] < epochs["DPO: dpo-pairwise"]["gflop"] < 2 * base["DPO: dpo-pairwise"][
        "gflop"]  # the reference and the held-out passes run once  # fmt: skip
    # a beta-0 kind: one run per seed, evaluated after each of its lengths
    beta0 = stages(R(PLAN, arms=(*PLAN.arms, "dr-grpo-beta0"), lengths=(5, 10, 20)))
    assert beta0["dr-grpo-beta0"]["runs"] == 3 and beta0["dr-grpo-beta0"]["gflop"] == pytest.approx(
        base["grpo"]["gflop"] / 2)  # fmt: skip
    assert beta0["evaluations"]["runs"] == base["evaluations"]["runs"] + 3 * 3
    assert total(base) < total(twice) and total(base) < total(beta0) and total(base) < total(more)
    # a kind swept over its own KL coefficients: its runs and evaluations follow them, the other kinds keep theirs
    own = stages(R(PLAN, kind_kl_coefs=(("grpo", (0.1, 0.3, 1.0, 3.0)),)))
    assert own["grpo"]["runs"] == 2 * base["grpo"]["runs"] and own["ppo"] == base["ppo"]
    assert own["grpo"]["gflop"] == pytest.approx(2 * base["grpo"]["gflop"]) and own["grpo"]["stage"].startswith(
        "grpo, 4 kl_coef")  # fmt: skip
    assert own["evaluations"]["runs"] == base["evaluations"]["runs"] + 3 * 2
    names = [a[0] for a in arm_list(R(PLAN, kind_kl_coefs=(("grpo", (0.1, 1.0)),)))]
    assert names[:4] == ["ppo-beta0.1", "ppo-beta0.3", "grpo-beta0.1", "grpo-beta1"]  # the finished 0.1 arm is kept
    # an existing store (--db): nothing sampled and labeled
    assert "label 889 questions" not in stages(sizes=SIZES._replace(questions=0))


def test_the_online_dpo_arm_costs_its_episode_budget():
    """dpo-online: one run per seed and dpo.beta, at PPO's rate, its FLOPs growing with ppo.total_episodes as PPO's
    do; it needs the reward model and adds its evaluations."""
    cfg, facts = preset("quickstart"), ModelFacts.from_config(SMOLLM2)
    plan = R(PLAN, arms=("dpo-online", "dpo-pairwise"))
    base = stages(plan)
    assert base["dpo-online"]["runs"] == 3 * 2 and base["dpo-online"]["gflop"] == pytest.approx(
        3 * 2 * online_dpo_flops(cfg, facts, SHAPE) / 1e9)  # fmt: skip
    assert "reward model" in base and base["evaluations"]["runs"] == 3 * 2 + 3 * 2
    twice = R(cfg, ppo=R(cfg.ppo, total_episodes=2 * cfg.ppo.total_episodes))
    assert online_dpo_flops(twice, facts, SHAPE) == pytest.approx(2 * online_dpo_flops(cfg, facts, SHAPE), rel=1e-3)
    four = R(cfg, dpo=R(cfg.dpo, online_samples=4))  # the same responses, half the queries: the prefill shared more
    assert online_dpo_flops(four, facts, SHAPE) < online_dpo_flops(cfg, facts, SHAPE)
    assert "reward model" not in stages(R(PLAN, arms=("dpo-pairwise",)))


def test_dpos_rate_is_the_measured_runs():
    """docs/results.md: train-dpo quickstart on 256 labels (105 held out) took 94.5 s, about 5 s of it loading, when
    its forwards still ran each response's last token: 1.07% of the FLOPs counted then."""
    seconds = dpo_flops(preset("quickstart"), ModelFacts.from_config(SMOLLM2), SHAPE, 256, 105) / 1e9 / DPO_GFLOPS
    assert seconds == pytest.approx(89.5 * (1 - 0.0107), rel=0.002)


def test_plan_prints_an_estimate_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["experiment", "compare", "tiny", "--plan", "--run-dir", "cmp", "--eval-queries", "8", "--samples", "16",
            "--arms", "ppo,grpo-beta0,dpo-pairwise,best-of-n", "--lengths", "1"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "total (estimate)" in out and "not a measurement" in out and "against 60 min: fits" in out
    assert "grpo-beta0, kl_coef 0, 2 updates of 16" in out and "evaluated after 1,2 updates" in out
    one = float(out.split("total (estimate)")[1].split()[1].replace(",", ""))  # GFLOP
    assert main([*args, "--seeds", "3"]) == 0
    three = float(capsys.readouterr().out.split("total (estimate)")[1].split()[1].replace(",", ""))
    assert three > 2 * one  # the arms triple; the store, frontier and reward model do not
    assert main([*args[:-4], "--arms", "ppo,grpo", "--kl-coefs", "0.1", "--kl-coefs-of", "grpo=0.1,1"]) == 0
    out = capsys.readouterr().out
    assert "kl_coef 0.1 (grpo: 0.1,1)" in out and "grpo, 2 kl_coef" in out and "ppo, 1 kl_coef" in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,needle", [
    (["--arms", "grpo-beta0", "--lengths", "9"], "--lengths 9: 9 is past the run's 2 updates"),
    (["--plan-minutes", "-1"], "--plan-minutes -1: must be a positive number of minutes"),
    (["--labels", "100000"], "--labels 100000: the task's"),
    (["--arms", "dpo-online", "--dpo.online-samples", "3"], "dpo.online_samples=3: the dpo-online arm samples "
     "ppo.batch_size=16 responses a step"),
])  # fmt: skip
def test_plan_bad_input_is_one_line(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    assert main(["experiment", "compare", "tiny", "--plan", "--run-dir", "cmp", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
