"""`experiment kl-frontier` and `experiment mock-sentiment --seeds`: the optimal frontier against an exact answer on
a model whose responses can be enumerated, the held-out KL against the exact KL, and the commands' mechanics on the
tiny preset."""

import dataclasses
import itertools
import json
import math
import types

import numpy as np
import pytest
import torch
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.training.frontier import exact_point, frontier, optimal_point

V, T = 5, 2  # a 5-token vocabulary and 2-token responses: 25 responses per query
LETTER_VALUE = {"a": -1.0, "b": -0.3, "c": 0.0, "d": 0.4, "e": 1.0}


class LetterTokenizer:
    """Token i is the letter 'abcde'[i]: all the sampler, the evaluation and the true reward need of a tokenizer."""

    def __len__(self):
        return V

    def decode(self, ids):
        return "".join("abcde"[i] for i in ids)


def letter_reward(texts):
    return [sum(LETTER_VALUE[c] for c in s) for s in texts]


def enumerable_task(seed: int):
    """A Task on a 1-layer GPT-2 with a 5-token vocabulary (weights scaled up so rho is far from uniform), three
    queries of 3 tokens, responses of 2 tokens at temperature 0.7."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lmprefs.config import preset
    from lmprefs.pipeline.task import Task

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=1, n_head=2, initializer_range=0.5,
                        bos_token_id=None, eos_token_id=None)  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    cfg = preset("tiny")
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, response_length=T, temperature=0.7))
    queries = torch.tensor([[0, 1, 2], [3, 3, 4], [4, 0, 1]])
    return Task(cfg, torch.device("cpu"), torch.float32, model, LetterTokenizer(), queries, queries, [], [])


def exact_logprobs(model, query):
    """log rho(y|x) [V**T] of every response, in itertools.product order, by the package's own scoring pass."""
    from lmprefs.training.rollout import ref_logprobs

    ys = torch.tensor(list(itertools.product(range(V), repeat=T)))
    with torch.no_grad():
        lp = ref_logprobs(model, query.expand(len(ys), -1), ys, 0.7, V).sum(1)
    return ys, lp


def test_sampled_frontier_agrees_with_the_exact_optimal_policy():
    from lmprefs.pipeline.evaluation import evaluate_policy

    t = enumerable_task(0)
    M, betas = 4000, [0.25, 0.5, 1.0, 4.0]
    scores = torch.tensor(evaluate_policy(t, t.heldout_queries, letter_reward, None, M, 11)["scores"])  # [Q, M]
    assert scores.shape == (3, M)
    est = frontier(scores, betas, min_ess=10)
    for row, beta in zip(est, betas, strict=True):
        exact_r, exact_kl = [], []
        for q in t.heldout_queries:
            ys, lp = exact_logprobs(t.model, q[None])
            assert abs(torch.logsumexp(lp, 0).item()) < 1e-4  # the 25 responses are the whole distribution
            r = torch.tensor(letter_reward([t.tok.decode(y) for y in ys.tolist()]))
            er, ek = exact_point(lp, r, beta)
            exact_r.append(er)
            exact_kl.append(ek)
        er, ek = sum(exact_r) / 3, sum(exact_kl) / 3
        assert row["trusted"] and row["ess_mean"] > 20
        assert 0 < row["reward_mc_stderr"] < 0.1 and 0 < row["kl_mc_stderr"] < 0.1
        assert abs(row["reward"] - er) < 3 * row["reward_mc_stderr"], (beta, row, er)
        assert abs(row["kl"] - ek) < 3 * row["kl_mc_stderr"], (beta, row, ek)
    # a real frontier: more KL buys more reward, and the smallest beta moves far from rho
    assert [r["kl"] for r in est] == sorted([r["kl"] for r in est], reverse=True)
    assert est[0]["kl"] > 1.0 and est[0]["reward"] > scores.mean().item() + 0.5


def test_heldout_kl_on_policy_samples_agrees_with_the_exact_kl():
    from lmprefs.pipeline.evaluation import evaluate_arm

    rho, pi = enumerable_task(0), enumerable_task(1)  # another random model plays the trained policy
    ev = evaluate_arm(rho, types.SimpleNamespace(adapter=None, lm=pi.model), rho.heldout_queries, letter_reward, 3000,
                      5, "kl")  # fmt: skip
    exact = []
    for q in rho.heldout_queries:
        _, lp_rho = exact_logprobs(rho.model, q[None])
        _, lp_pi = exact_logprobs(pi.model, q[None])
        exact.append((lp_pi.exp() * (lp_pi - lp_rho)).sum().item())
    kl = sum(exact) / 3
    assert kl > 0.3 and 0 < ev["kl_stderr"] < 0.2
    assert abs(ev["kl"] - kl) < 3 * ev["kl_stderr"], (ev, kl)


def test_frontier_estimator_edges():
    r = torch.tensor([[0.0, 1.0, 2.0, 3.0]], dtype=torch.float64)
    big = optimal_point(r, 1e6)  # beta -> infinity: pi* = rho, KL 0, reward the plain mean, every sample counts
    assert big["kl"].item() == pytest.approx(0.0, abs=1e-6) and big["reward"].item() == pytest.approx(1.5)
    assert big["ess"].item() == pytest.approx(4.0)
    small = optimal_point(r, 1e-3)  # beta -> 0: all weight on the best sample; the KL estimate reaches log M
    assert small["reward"].item() == pytest.approx(3.0) and small["kl"].item() == pytest.approx(math.log(4))
    assert small["ess"].item() == pytest.approx(1.0)
    rows = frontier(r, [1e-3, 1e6], min_ess=2)
    assert [x["trusted"] for x in rows] == [False, True]
    assert all(math.isfinite(x[k]) for x in rows for k in ("reward", "kl", "reward_mc_stderr", "kl_mc_stderr"))
    rows = frontier(torch.tensor([[1e4, -1e4, 0.0]]), [0.01])  # no overflow at extreme r / beta
    assert rows[0]["reward"] == pytest.approx(1e4) and math.isfinite(rows[0]["kl"])
    import lmprefs  # the public API takes plain lists

    assert lmprefs.optimal_frontier(r.tolist(), [1e-3, 1e6], min_ess=2) == frontier(r, [1e-3, 1e6], min_ess=2)


TINY = ["--preset", "tiny", "--eval-samples", "1"]


def test_kl_frontier_runs_resumes_and_writes_its_figure(tmp_path, capsys):
    run_dir = tmp_path / "f"
    args = ["experiment", "kl-frontier", *TINY, "--run-dir", str(run_dir), "--queries", "4", "--samples", "16",
            "--kl-targets", "3", "--kl-coefs", "0.5", "--betas", "0.05,0.2,1,5", "--min-ess", "2"]  # fmt: skip
    assert main(args + ["--ppo.total-episodes", "16"]) == 0
    res = json.loads((run_dir / "results.json").read_text())
    assert {"initial", "frontier", "kl-target-3", "kl-coef-0.5"} <= set(res)
    fr = res["frontier"]
    assert fr["queries"] == 4 and fr["samples_per_query"] == 16 and [p["beta"] for p in fr["points"]] == [
        0.05, 0.2, 1, 5]
    for p in fr["points"]:
        assert 1 <= p["ess_min"] <= p["ess_mean"] <= 16 and 0 <= p["kl"] <= math.log(16) + 1e-9
    for arm in ("kl-target-3", "kl-coef-0.5"):
        assert res[arm]["n_queries"] == 4 and math.isfinite(res[arm]["kl"]) and res[arm]["kl_stderr"] > 0
    assert res["kl-coef-0.5"]["kl_target"] is None and res["kl-target-3"]["kl_target"] == 3
    assert len(json.loads((run_dir / "frontier_scores.json").read_text())) == 4
    assert (run_dir / "figure3.png").read_bytes()[:4] == b"\x89PNG"
    # interrupted: one arm's result lost; the rerun samples nothing again and trains only that arm (resumed)
    del res["kl-coef-0.5"]
    (run_dir / "results.json").write_text(json.dumps(res))
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[frontier] sampling" not in out and "[kl-target-3] done" in out and "[kl-coef-0.5] resuming" in out
    # a resumed run cannot silently change the frontier's sample size
    assert main(args[:-8] + ["--samples", "8"]) == 2
    # rerunning the very first command line (its overrides included) resumes, and so does the bare command: a
    # finished run's flags are its own (256 samples, the default, would be another frontier)
    capsys.readouterr()
    assert main(args + ["--ppo.total-episodes", "16"]) == 0
    assert "[kl-target-3] done" in capsys.readouterr().out
    assert main(["experiment", "kl-frontier", *TINY, "--run-dir", str(run_dir)]) == 0
    assert "[kl-coef-0.5] done" in capsys.readouterr().out
    assert json.loads((run_dir / "results.json").read_text())["frontier"]["samples_per_query"] == 16
    # an override that changes what the experiment computes is refused, naming it
    assert main(args + ["--ppo.total-episodes", "32"]) == 2
    assert "ppo.total_episodes 16 -> 32 would change what it computes" in capsys.readouterr().err


@pytest.mark.heavy
def test_mock_sentiment_seeds_give_error_bars_and_kl(tmp_path, capsys):
    run_dir = tmp_path / "exp"
    args = ["experiment", "mock-sentiment", *TINY, "--labels", "16", "--seeds", "2", "--run-dir", str(run_dir),
            "--eval-queries", "4"]  # fmt: skip
    assert main(args + ["--labels.heldout-fraction", "0.2", "--ppo.total-episodes", "16"]) == 0
    res = json.loads((run_dir / "results.json").read_text())
    assert {"initial", "rm-16", "rm-16-seed1", "direct", "direct-seed1", "summary"} <= set(res)
    assert res["labels"]["questions"] == math.ceil(16 * 1.5 / 0.8)  # a pool larger than the arm, so subsets differ
    seed = res["rm-16"]["seed"]
    assert [res[k]["seed"] for k in ("rm-16-seed1", "direct", "direct-seed1")] == [seed + 1, seed, seed + 1]
    s = res["summary"]["rm-16"]
    a, b = res["rm-16"]["mean"], res["rm-16-seed1"]["mean"]
    assert s["seeds"] == 2 and math.isfinite(s["kl"]) and s["mean"] == pytest.approx((a + b) / 2)
    assert s["stderr"] == pytest.approx(abs(a - b) / 2)  # the s.e. across seeds (of two: half their difference)
    assert s["ci95"] == pytest.approx(12.706 * s["stderr"], rel=1e-4)  # t with one degree of freedom
    # the seeds trained different reward models on different label subsets
    from safetensors.torch import load_file

    heads = [load_file(run_dir / k / "reward_model" / "model.safetensors") for k in ("rm-16", "rm-16-seed1")]
    key = next(k for k in heads[0] if "score" in k or "head" in k)
    assert not torch.equal(heads[0][key], heads[1][key])
    assert (run_dir / "figure2.png").read_bytes()[:4] == b"\x89PNG"
    assert (run_dir / "overoptimization.png").read_bytes()[:4] == b"\x89PNG"  # proxy and true reward over KL
    out = capsys.readouterr().out
    assert "rm-16" in out and "(2 seeds)" in out and "95% interval" in out
    # an interrupted experiment: forget one arm's result; rerunning resumes it and skips the finished arms
    del res["rm-16-seed1"]
    (run_dir / "results.json").write_text(json.dumps(res))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[rm-16] done" in out and "[rm-16-seed1] resuming" in out and "[direct-seed1] done" in out
    # a resumed experiment whose store is too small for a larger --labels says so instead of training on fewer
    assert main([x if x != "16" else "64" for x in args]) == 2
    assert "--labels 64 --seeds 2: the label store of" in capsys.readouterr().err
    # the Figure 2 arms as points on Figure 3
    f3 = tmp_path / "f3"
    assert main(["experiment", "kl-frontier", *TINY, "--run-dir", str(f3), "--queries", "4", "--samples", "4",
                 "--kl-targets", "", "--figure2", str(run_dir)]) == 0  # fmt: skip
    assert set(json.loads((f3 / "results.json").read_text())["figure2"]) == {"rm-16", "direct"}


@pytest.mark.parametrize("argv,needle", [
    (["--betas", "0.1,0,1"], "--betas '0.1,0,1': every beta must be a positive number (not 0)"),
    (["--betas", "0.1,-2"], "not -2"),
    (["--betas", "x"], "--betas 'x'"),
    (["--samples", "1"], "--samples 1: must be at least 2"),
    (["--queries", "1"], "--queries 1: must be at least 2"),
    (["--true-reward", "nope"], "--true-reward 'nope'"),
    (["--kl-targets", "2,-1"], "--kl-targets '2,-1': every value must be a positive number"),
    (["--fit-cut", "0"], "--fit-cut 0: must be a positive number of nats"),
    (["--figure2", "missing-dir"], "--figure2 missing-dir"),
    (["--queries", "100000"], "--queries 100000"),
    (["--seeds", "0"], "--seeds 0: must be at least 1"),
    (["--labels", "3"], "--labels is not an option of `experiment kl-frontier`"),
])  # fmt: skip
def test_kl_frontier_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, needle):
    run_dir = tmp_path / "f"
    assert main(["experiment", "kl-frontier", "tiny", "--run-dir", str(run_dir), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not run_dir.exists()


def test_mock_sentiment_label_count_beyond_the_store_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "exp"
    assert main(["experiment", "mock-sentiment", "tiny", "--labels", "16,100000", "--eval-queries", "8",
                 "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lmprefs") and "--labels 100000: the label store can provide at most" in err, err
    assert len(err.splitlines()) == 1 and not run_dir.exists()


def test_an_arm_killed_while_its_reward_model_trains_is_resumed_by_rerunning_the_experiment(tmp_path, monkeypatch):
    run_dir = tmp_path / "exp"
    args = ["experiment", "mock-sentiment", *TINY, "--labels", "16", "--run-dir", str(run_dir), "--eval-queries", "4",
            "--labels.heldout-fraction", "0.2", "--ppo.total-episodes", "16"]  # fmt: skip
    killed(monkeypatch, args, "reward:logged")
    assert (run_dir / "rm-16" / "run.json").is_file() and not (run_dir / "rm-16" / "reward_model").exists()
    assert main(args) == 0
    assert {"rm-16", "direct"} <= set(json.loads((run_dir / "results.json").read_text()))


@pytest.mark.heavy
def test_mock_sentiment_runs_with_the_tiny_presets_defaults(tmp_path, capsys):
    # the bundled passages hold too few queries for 4,000 labels or 256 held-out queries: the defaults shrink to
    # what the task can give, and say so
    run_dir = tmp_path / "exp"
    assert main(["experiment", "mock-sentiment", "tiny", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "label counts " in out and "evaluating on all " in out
    res = json.loads((run_dir / "results.json").read_text())
    arms = sorted((k for k in res if k.startswith("rm-")), key=lambda k: int(k[3:]))
    counts = [int(k[3:]) for k in arms]
    assert len(counts) == 3 and counts[-1] >= 16 * counts[0] // 2 and "direct" in res
    assert res["initial"]["n_queries"] == res["direct"]["n_queries"] > 64


def test_kl_frontier_default_arms_differ_where_kl_targets_would_not(tmp_path):
    # two updates: the adaptive controller cannot move beta apart, so the default arms use fixed betas
    run_dir = tmp_path / "f"
    assert main(["experiment", "kl-frontier", *TINY, "--run-dir", str(run_dir), "--queries", "4",
                 "--samples", "8"]) == 0  # fmt: skip
    res = json.loads((run_dir / "results.json").read_text())
    arms = [k for k in res if k.startswith("kl-coef-")]
    assert len(arms) == 4 and not any(k.startswith("kl-target-") for k in res)
    assert len({(res[k]["mean"], res[k]["kl"]) for k in arms}) == 4


def test_kl_frontier_seeds_give_each_beta_error_bars_across_runs(tmp_path, capsys):
    run_dir = tmp_path / "f"
    assert main(["experiment", "kl-frontier", *TINY, "--run-dir", str(run_dir), "--queries", "4", "--samples", "8",
                 "--kl-coefs", "0.05,1", "--seeds", "2", "--ppo.total-episodes", "32"]) == 0  # fmt: skip
    res = json.loads((run_dir / "results.json").read_text())
    runs = ["kl-coef-0.05", "kl-coef-0.05-seed1", "kl-coef-1", "kl-coef-1-seed1"]
    assert [res[k]["seed"] - res["kl-coef-0.05"]["seed"] for k in runs] == [0, 1, 0, 1]
    # another seed samples other rollouts, and trains another policy
    assert res["kl-coef-0.05"]["kl"] != res["kl-coef-0.05-seed1"]["kl"]
    s = res["summary"]["kl-coef-1"]
    a, b = res["kl-coef-1"]["mean"], res["kl-coef-1-seed1"]["mean"]
    assert s["seeds"] == 2 and s["mean"] == pytest.approx((a + b) / 2) and s["stderr"] == pytest.approx(abs(a - b) / 2)
    assert len(res["gao_fits"]["rl"]["points"]) == 4  # every run's own point
    assert "(s.e. across 2 seeds)" in capsys.readouterr().out


def test_kl_frontier_draws_best_of_n_and_fits_gaos_forms(tmp_path, capsys):
    run_dir = tmp_path / "f"
    args = ["experiment", "kl-frontier", *TINY, "--run-dir", str(run_dir), "--queries", "4", "--samples", "16",
            "--kl-coefs", "0.01,0.1,1", "--fit-cut", "1.2"]  # fmt: skip
    assert main(args) == 0
    res = json.loads((run_dir / "results.json").read_text())
    bon = res["best_of_n"]
    assert [p["n"] for p in bon] == [1, 2, 4, 8, 16]
    assert [p["kl"] for p in bon] == pytest.approx([math.log(n) - (n - 1) / n for n in (1, 2, 4, 8, 16)])
    assert bon[0]["reward"] == pytest.approx(res["initial"]["mean"])  # the best of one is rho itself
    assert all(a["reward"] <= b["reward"] + 1e-12 for a, b in itertools.pairwise(bon))
    fit = res["gao_fits"]["bon"]
    assert fit["cut"] == 1.2 and fit["fitted"] == 3 and fit["predicted"] == 2 and math.isfinite(fit["rmse_beyond"])
    assert "Gao bon form" in capsys.readouterr().out
    # a cut beyond every best-of-n point leaves nothing to predict: refused before anything is written
    assert main(["experiment", "kl-frontier", *TINY, "--run-dir", str(tmp_path / "g"), "--samples", "16",
                 "--fit-cut", "5"]) == 2  # fmt: skip
    assert "--fit-cut 5: beyond every best-of-n point" in capsys.readouterr().err and not (tmp_path / "g").exists()


def test_the_95_percent_interval_is_students_t_at_every_seed_count():
    from lmprefs.recipes.experiment import ci95, interval_count, t975

    # published 97.5% quantiles: 12 and 40 seeds stay wider than the normal's 1.96
    assert ci95(1.0, 12) == pytest.approx(2.201, abs=1e-3) and ci95(1.0, 40) == pytest.approx(2.023, abs=1e-3)
    assert ci95(1.0, 2) == pytest.approx(12.706, abs=1e-3) and ci95(2.0, 25) == pytest.approx(2 * 2.064, abs=1e-3)
    # NumPy parity: the t density integrated from -t975 to t975 holds 95% of the mass
    for df in (1, 4, 11, 39, 200):
        x = np.linspace(-t975(df), t975(df), 400_001)
        density = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2)) * (1 + x**2 / df) ** (
            -(df + 1) / 2)
        assert np.trapezoid(density, x) == pytest.approx(0.95, abs=1e-8)
    assert all(t975(d) > t975(d + 1) > 1.96 for d in range(1, 300))
    # the count an arm's interval is over: its seeds, or one seed's queries; unknown: the normal's 1.96
    assert interval_count({"seeds": 5, "n_queries": 128}) == 5 and interval_count({"seeds": 1, "n_queries": 16}) == 16
    assert ci95(1.0, interval_count({"n_queries": 16})) == pytest.approx(2.131, abs=1e-3) and ci95(1.0, 0) == 1.96


def test_the_finding_is_read_from_95_percent_intervals():
    from lmprefs.recipes.experiment import ci95, finding

    assert ci95(1.0, 3) == pytest.approx(4.303, abs=1e-3) and ci95(1.0, 0) == 1.96

    def arm(mean, half):
        return {"mean": mean, "ci95": half}

    names = ["rm-100", "rm-400", "direct"]
    shows = {"rm-100": arm(0.2, 0.05), "rm-400": arm(0.5, 0.05), "direct": arm(0.55, 0.05)}
    assert finding(shows, names).startswith("the paper's finding shows: rm-400 above rm-100")
    flat = shows | {"rm-400": arm(0.24, 0.05)}  # the intervals of the two counts overlap
    assert "does not show" in finding(flat, names) and "overlapping" in finding(flat, names)
    far = shows | {"direct": arm(0.9, 0.05)}  # more labels help, but stay far below direct access
    assert "does not show" in finding(far, names) and "apart from direct access" in finding(far, names)
    assert finding({"rm-100": arm(0.2, 0.1), "direct": arm(0.5, 0.1)}, ["rm-100", "direct"]) is None
