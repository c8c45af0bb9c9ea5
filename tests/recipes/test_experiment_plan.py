"""`experiment mock-sentiment --plan`: the estimate reproduces the quickstart stages it was calibrated on, scales with
the work as the FLOP counts say, and refuses bad input in one line without writing anything."""

import dataclasses

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.models.flops import ModelFacts
from lmprefs.recipes.plan import (
    MEASURED_GFLOPS,
    Counts,
    Shape,
    plan_label_efficiency,
    plan_mock_sentiment,
    stage_flops,
)

R = dataclasses.replace
# SmolLM2-135M's config.json (the quickstart's model), and its quickstart task: 32-token formatted queries
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "num_hidden_layers": 30, "vocab_size": 49152}  # fmt: skip
SHAPE = Shape(q_len=32, train_queries=3627)


def plan(cfg=None, counts=(250, 500, 1000), seeds=3, n_eval=256, samples=2, **kw):
    rows = plan_mock_sentiment(cfg or preset("quickstart"), ModelFacts.from_config(SMOLLM2), SHAPE, list(counts),
                               seeds, n_eval, samples, **kw)  # fmt: skip
    return {r["stage"].split(",")[0] if "labels" not in r["stage"] else r["stage"]: r for r in rows}


# docs/results.md, the SmolLM2 quickstart against its floor: each stage's seconds and GFLOP, measured
QUICKSTART = {"evaluate initial": (19.22, 4999.4), "sample and label": (114.19, 29182.9),
              "train reward model": (141.45, 34719.7), "PPO": (168.95, 35799.2), "evaluate final": (26.03, 6912.0)}
# the count since the policy's, value head's and reference's forwards stopped running each response's last token
COUNTED_SINCE = {"PPO": 35495.3, "evaluate final": 6885.7}


def test_the_rates_reproduce_the_measured_quickstart_stages():
    """The FLOP count of the quickstart's own sizes gives the GFLOP the roofline measured, and the planner's rates
    the seconds: 889 questions (784 labels trained, 105 held out), 20 updates, 256 held-out queries x 2."""
    facts = ModelFacts.from_config(SMOLLM2)
    stages = stage_flops(preset("quickstart"), facts, Counts(32, 3627, 256, 2, 889, 784, 105, 20))
    for stage, (seconds, gflop) in QUICKSTART.items():
        assert sum(stages[stage].values()) / 1e9 == pytest.approx(COUNTED_SINCE.get(stage, gflop), rel=1e-4), stage
        assert gflop / MEASURED_GFLOPS[stage] == pytest.approx(seconds, rel=0.01), stage


def test_an_ensembles_members_share_sampling_and_the_frozen_prefix_in_the_count():
    """K members: K times the training, scoring and evaluation above the adapters; the normalization samples once;
    the frozen blocks once (here computed by the ensemble over the training and held-out rows, not the labeling
    pass's)."""
    facts = ModelFacts.from_config(SMOLLM2)
    n = Counts(32, 3627, 256, 2, 889, 784, 105, 20, labeling_prefixes=False)
    one, four = (stage_flops(R(preset("quickstart"), train_reward=R(preset("quickstart").train_reward, ensemble=k)),
                             facts, n)["train reward model"] for k in (1, 4))  # fmt: skip
    assert four["normalize: sample"] == one["normalize: sample"]
    assert four["training"] == 4 * one["training"] and four["normalize: score"] == 4 * one["normalize: score"]
    assert one["frozen prefix, once"] < four["frozen prefix, once"] < 2 * one["frozen prefix, once"]
    assert sum(one.values()) < sum(four.values()) < 4 * sum(one.values())


def test_one_arm_reproduces_the_measured_quickstart_stages():
    """One arm of 800 labels is the quickstart (its reward model's frozen prefixes kept by the labeling pass), plus
    the direct arm's PPO run and final evaluation."""
    p = plan(counts=(800,), seeds=1)
    assert p["label 889 questions"]["seconds"] == pytest.approx(114.19, rel=0.01)
    assert p["evaluate the initial policy"]["seconds"] == pytest.approx(19.22, rel=0.01)
    # the plan trains on 800 labels; the quickstart's hashed split left 784 of its 889 questions for training
    assert p["reward model, 800 labels"]["seconds"] == pytest.approx(141.45, rel=0.02)
    assert p["final evaluation"]["seconds"] == pytest.approx(2 * 26.03, rel=0.01)  # the RM arm and the direct arm
    # PPO 169.0 s at the FLOPs measured then (COUNTED_SINCE: fewer now); the direct arm's scores no reward model, so
    # the two runs are a little under twice that
    since = COUNTED_SINCE["PPO"] / QUICKSTART["PPO"][1]
    assert p["PPO"]["seconds"] == pytest.approx(2 * 168.95 * since, rel=0.03)


def test_the_estimate_scales_with_the_work():
    cfg = preset("quickstart")
    base = plan(cfg)
    twice = plan(R(cfg, ppo=R(cfg.ppo, total_episodes=2 * cfg.ppo.total_episodes)))
    assert twice["PPO"]["gflop"] == pytest.approx(2 * base["PPO"]["gflop"], rel=1e-3)  # all but the export merge
    assert twice["reward model, 1000 labels"] == base["reward model, 1000 labels"]
    more = plan(cfg, seeds=6)
    for stage in ("PPO", "final evaluation", "reward model, 500 labels"):
        assert more[stage]["gflop"] == pytest.approx(2 * base[stage]["gflop"])
        assert more[stage]["runs"] == 2 * base[stage]["runs"]
    assert more["label 1667 questions"] == base["label 1667 questions"]  # one store for every seed
    # larger counts cost more to train on; the estimate is FLOPs over each stage's rate
    assert base["reward model, 250 labels"]["gflop"] < base["reward model, 500 labels"]["gflop"]
    fast = plan(cfg, rates={k: 2 * v for k, v in MEASURED_GFLOPS.items()})
    assert fast["PPO"]["seconds"] == pytest.approx(base["PPO"]["seconds"] / 2)
    # the labeling pass's frozen prefixes and the untrained models' figures shared: less than every arm on its own
    alone = plan(cfg, share=False)
    assert not any("frozen" in k for k in [*base, *alone])  # kept by the labeling pass, or each arm's own
    assert sum(r["seconds"] for r in base.values()) < sum(r["seconds"] for r in alone.values())
    assert alone["reward model, 500 labels"]["gflop"] > base["reward model, 500 labels"]["gflop"]
    assert alone["label 1667 questions"]["gflop"] < base["label 1667 questions"]["gflop"]  # the last-token pass


def test_plan_prints_an_estimate_and_writes_nothing(tmp_path, capsys):
    run_dir = tmp_path / "exp"
    assert main(["experiment", "mock-sentiment", "tiny", "--plan", "--labels", "8,16", "--seeds", "2",
                 "--eval-queries", "8", "--run-dir", str(run_dir)]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "total (estimate)" in out and "not a measurement" in out and "reward model, 16 labels" in out
    assert "every reward model on its own instead" in out
    assert not run_dir.exists()


@pytest.mark.parametrize("argv,needle", [
    (["--labels", "0"], "--labels '0': label counts must be positive"),
    (["--seeds", "0"], "--seeds 0: must be at least 1"),
    (["--eval-samples", "0"], "--eval-samples 0: must be at least 1"),
    (["--plan-minutes", "-5"], "--plan-minutes -5: must be a positive number of minutes"),
    (["--labels", "100000"], "--labels 100000: the label store can provide at most"),
])  # fmt: skip
def test_plan_bad_input_is_one_line(tmp_path, capsys, argv, needle):
    assert main(["experiment", "mock-sentiment", "tiny", "--plan", "--run-dir", str(tmp_path / "e"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "e").exists()


def test_plan_is_an_option_of_mock_sentiment_only(capsys):
    assert main(["experiment", "kl-frontier", "tiny", "--plan"]) == 2
    assert "--plan is an option of `experiment mock-sentiment`" in capsys.readouterr().err


def le_plan(cfg=None, budgets=(64, 128, 256), directed=1, seeds=3, pool=1024, members=4):
    rows = plan_label_efficiency(cfg or preset("quickstart"), ModelFacts.from_config(SMOLLM2), SHAPE, list(budgets),
                                 directed=directed, seeds=seeds, n_eval=64, samples=1, pool=pool, held=64,
                                 members=members)  # fmt: skip
    names = {"ensembles": "ensembles", "left": "scoring", "PPO": "PPO"}
    return {next((v for k, v in names.items() if k in r["stage"]), r["stage"]): r for r in rows}


def test_the_label_efficiency_estimate_scales_with_the_work():
    cfg = preset("quickstart")
    base = le_plan(cfg)
    ens, score = base["ensembles"], base["scoring"]
    # directed rounds after 64, 128 and 192 labels per seed; budget 64 is the random arm's (5 arms per seed)
    assert ens["runs"] == score["runs"] == 3 * 3 and base["PPO"]["runs"] == 3 * 5
    both = le_plan(cfg, directed=2)
    assert both["ensembles"]["gflop"] == pytest.approx(2 * ens["gflop"])
    assert both["PPO"]["runs"] == 3 * 7
    # members share the frozen prefix: twice the members cost less than twice the scoring
    more = le_plan(cfg, members=8)
    assert score["gflop"] < more["scoring"]["gflop"] < 2 * score["gflop"]
    # a larger pool leaves more candidates to score each round; larger rounds mean fewer of them
    assert le_plan(cfg, pool=2048)["scoring"]["gflop"] > score["gflop"]
    wide = le_plan(R(cfg, labels=R(cfg.labels, select_round=128)))
    assert wide["ensembles"]["runs"] == 3 and wide["PPO"]["runs"] == 3 * 4
