"""`lmprefs evaluate` on a tiny train-policy run: the true reward and the KL from the reference as evaluate_policy
computes them, ~0 KL for the reference itself, a reward model's score (lmprefs' own, and one it did not train,
normalized or not as rewards.normalize says), and train-policy's curves.png."""

from __future__ import annotations

import json

import pytest

from lmprefs.cli.dispatch import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny train-policy run against a reward model trained in it from simulated labels."""
    d = tmp_path_factory.mktemp("evaluate")
    assert main(["label", "tiny", "--db", str(d / "labels.sqlite"), "--n", "24"]) == 0
    # four PPO epochs, not the tiny preset's one, so that the policy moves well beyond the KL estimate's noise
    args = ["train-policy", "tiny", "--db", str(d / "labels.sqlite"), "--run-dir", str(d / "run"),
            "--ppo.noptepochs", "4"]  # fmt: skip
    assert main(args) == 0
    return d / "run"


def _evaluate(run, out, *args) -> dict:
    # 32 held-out queries: the trained policy's KL, about 0.9 nats, then stands 6-7 standard errors above 0
    assert main(["evaluate", str(run), "--eval-queries", "32", "--out", str(out), *args]) == 0
    return json.loads((out / "results.json").read_text())


def test_train_policy_leaves_curves_png(run):
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_true_reward_and_kl_are_evaluate_policys(run, tmp_path, capsys):
    from lmprefs.labels.labelers import score_fn
    from lmprefs.models.artifacts import load_policy
    from lmprefs.pipeline.evaluation import evaluate_policy
    from lmprefs.pipeline.task import Task, setup_task
    from lmprefs.runtime.resolve import resolve_config

    s = _evaluate(run, tmp_path / "ev", "--reward", "vader")
    assert "KL(policy || reference)" in capsys.readouterr().out
    for f in ("report.md", "samples.jsonl", "evaluation.png"):
        assert (tmp_path / "ev" / f).is_file(), f
    pol, ref = s["policy_eval"], s["reference_eval"]
    assert pol["kl"] > 0 and pol["kl_stderr"] > 0 and ref["kl"] == 0, pol
    assert s["n_queries"] == 32 and s["samples_per_query"] == 2 and s["kind"] == "true"
    rows = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and all(len(r["policy_rewards"]) == 2 for r in rows)
    report = (tmp_path / "ev" / "report.md").read_text()
    assert f"{pol['kl']:.3f} +/- {pol['kl_stderr']:.3f}" in report and "- policy (" in report

    cfg = resolve_config("", config_file=run / "config.json")
    t = setup_task(cfg)
    policy = load_policy(run / "policy", t.device)
    e = evaluate_policy(Task(**{**t.__dict__, "model": policy.lm}), t.heldout_queries[:32], score_fn("vader"), None,
                        2, cfg.run.seed + 5, ref_model=t.model)  # fmt: skip
    assert (pol["mean"], pol["stderr"]) == (e["mean"], e["stderr"])
    assert pol["kl"] == pytest.approx(e["kl"], abs=1e-9)


def test_the_reference_itself_is_at_zero_kl(run, tmp_path):
    s = _evaluate(run, tmp_path / "ev", "--reward", "vader", "--reference", str(run / "policy"))
    assert abs(s["policy_eval"]["kl"]) < 1e-4 and s["policy_eval"]["kl_stderr"] < 1e-4
    assert s["policy_eval"]["mean"] == s["reference_eval"]["mean"]  # the same model, the same seed


def test_a_reward_models_score(run, tmp_path, capsys):
    s = _evaluate(run, tmp_path / "ev", "--reward-model", str(run / "reward_model"))
    assert s["kind"] == "proxy" and s["policy_eval"]["kl"] > 0, s["policy_eval"]
    assert "trained by lmprefs, normalized when it was trained" in capsys.readouterr().out


def test_a_foreign_reward_model_is_normalized_unless_told_not_to(run, tmp_path, capsys):
    from transformers import GPT2ForSequenceClassification

    from lmprefs.models.loading import load_lm

    lm, tok = load_lm("tiny-gpt2-austen")
    seq = GPT2ForSequenceClassification.from_pretrained(lm.config.name_or_path, num_labels=1, pad_token_id=50256)
    seq.save_pretrained(tmp_path / "trl_rm")
    tok.save_pretrained(tmp_path / "trl_rm")
    args = ["--reward-model", str(tmp_path / "trl_rm"), "--eval-samples", "1"]
    normalized = _evaluate(run, tmp_path / "a", *args)
    assert f"--reward-model {tmp_path / 'trl_rm'}: not trained by lmprefs (no lmprefs.json): normalized with " \
        "mean" in capsys.readouterr().out
    raw = _evaluate(run, tmp_path / "b", *args, "--rewards.normalize", "false")
    assert "not normalized (rewards.normalize=false); its scores have mean" in capsys.readouterr().out
    assert normalized["reference_eval"]["mean"] != raw["reference_eval"]["mean"]
    assert normalized["policy_eval"]["kl"] == raw["policy_eval"]["kl"]  # the same samples


def test_prompts_from_a_file_and_a_model_directory(run, tmp_path):
    """--queries FILE: its prompts in order; a model directory (here the run's policy/, evaluated with the run's
    config) is evaluated as its run is."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("It was a truth universally acknowledged\n\nShe smiled at him\n\nThe weather was\n")
    s = _evaluate(run / "policy", tmp_path / "ev", "--reward", "vader", "--queries", str(prompts), "--eval-queries",
                  "3", "--eval-samples", "1")  # fmt: skip
    assert s["queries"] == f"--queries {prompts}" and s["run"] == str(run) and s["n_queries"] == 3
    rows = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert [r["query"] for r in rows] == ["It was a truth universally acknowledged", "She smiled at him",
                                          "The weather was"]  # fmt: skip


def test_rows_that_stop_early_have_no_kl_from_their_padding(run, monkeypatch):
    """A policy against itself, with responses that stop at common tokens: the KL is ~0, the padding after each
    stop token being no token of either policy."""
    import dataclasses

    from lmprefs.data.tasks import PAD
    from lmprefs.labels.labelers import score_fn
    from lmprefs.pipeline import evaluation
    from lmprefs.pipeline.task import Task, setup_task
    from lmprefs.runtime.resolve import resolve_config

    drawn = []

    def sample(*args, **kwargs):
        out = real_sample(*args, **kwargs)
        drawn.append(out[0])
        return out

    real_sample = evaluation.sample
    monkeypatch.setattr(evaluation, "sample", sample)
    cfg = resolve_config("", config_file=run / "config.json")
    cfg = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, stop_at_eos=True, stop_tokens=(13, 11, 262)))
    t = setup_task(cfg)
    t = Task(**{**t.__dict__, "cfg": cfg})
    e = evaluation.evaluate_policy(t, t.heldout_queries[:8], score_fn("vader"), None, 4, 3, ref_model=t.model,
                                   batch_size=16, kl_batch_size=8)  # fmt: skip
    assert any((r == PAD).any() for r in drawn)  # some rows stopped early
    assert abs(e["kl"]) < 1e-4
