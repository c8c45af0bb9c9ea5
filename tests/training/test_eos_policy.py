"""train-policy with task.stop_at_eos: a tiny run whose responses stop early trains and logs their mean length; a
stop token the tokenizer cannot sample is refused in one line before anything is written."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.data.tasks import stop_tokens
from lmprefs.errors import UserError
from lmprefs.io.jsonl import read_jsonl
from lmprefs.runtime.runlog import read_metrics

STOP = ["--task.stop-at-eos", "true", "--task.stop-tokens", "13,11"]  # '.' and ',': frequent in the tiny Austen LM


def test_tiny_run_with_stop_tokens_trains_and_logs_the_response_length(tmp_path):
    run = tmp_path / "run"
    assert main(["train-policy", "tiny", "--reward", "vader", "--run-dir", str(run), *STOP]) == 0
    rows = read_metrics(run / "metrics.jsonl", "policy")
    assert len(rows) == preset("tiny").ppo.num_updates
    lengths = [r["objective/response_length"] for r in rows]
    assert all(1 <= n < preset("tiny").task.response_length for n in lengths), lengths  # rows did stop early
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    assert read_jsonl(run / "samples.jsonl") and (run / "policy" / "model.safetensors").is_file()


def test_a_stop_token_outside_the_vocabulary_is_refused_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train-policy", "tiny", "--reward", "vader", "--run-dir", str(run), "--task.stop-at-eos", "true",
                 "--task.stop-tokens", "13,99999"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "task.stop_tokens=13,99999" in lines[0] and "99999" in lines[0], err
    assert not run.exists()


def test_stop_tokens_resolve_from_the_config_or_the_tokenizer():
    task = preset("tiny").task
    tok = type("Tok", (), {"eos_token_id": 5, "__len__": lambda self: 10})()
    assert stop_tokens(task, tok) == ()  # off: the original's fixed length
    on = dataclasses.replace(task, stop_at_eos=True)
    assert stop_tokens(on, tok) == (5,)
    assert stop_tokens(dataclasses.replace(on, stop_tokens=(3, 9)), tok) == (3, 9)
    with pytest.raises(UserError, match=r"task.stop_tokens=3,10: 10 is outside the vocabulary"):
        stop_tokens(dataclasses.replace(on, stop_tokens=(3, 10)), tok)
    no_eos = type("Tok", (), {"eos_token_id": None, "__len__": lambda self: 10})()
    with pytest.raises(UserError, match=r"task.stop_at_eos=true: the tokenizer of task.initial_model=.* has no "):
        stop_tokens(on, no_eos)
    assert stop_tokens(dataclasses.replace(on, stop_tokens=(4,)), no_eos) == (4,)


def _rollout(t, cfg):
    import copy

    from lmprefs.data.queries import QueryStream
    from lmprefs.models.policy import Policy
    from lmprefs.training.policy_run import build_run
    from lmprefs.training.rollout import make_rollout

    run = build_run(cfg, Policy(copy.deepcopy(t.model), t.tok, cfg.task.temperature),
                    QueryStream(t.train_queries, cfg.run.seed), t.device)  # fmt: skip

    def score(queries, responses, prefix=None):  # any score that reads the responses
        return (responses.clamp(min=0) < 25000).float().mean(1)

    return make_rollout(run, score, run.stream.next(16), cfg, t.ctx)


def test_a_rollout_masks_what_follows_each_rows_stop_token(tiny_task):
    import torch

    from lmprefs.data.tasks import PAD

    cfg = tiny_task.cfg
    on = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, stop_at_eos=True, stop_tokens=(13, 11)))
    roll, stats, _ = _rollout(tiny_task, on)
    real = roll.responses != PAD
    assert roll.mask is not None and roll.mask.bool().equal(real) and not real.all() and real[:, 0].all()
    assert stats["objective/response_length"] == pytest.approx(real.sum(1).float().mean().item())
    for x in (roll.logprobs, roll.ref_logprobs, roll.values):
        assert (x[~real] == 0).all()
    last = real.sum(1) - 1  # the score sits on each row's stop token (or its last token)
    kl = roll.logprobs - roll.ref_logprobs
    torch.testing.assert_close(roll.rewards[torch.arange(16), last],
                               roll.scores - 0.15 * kl[torch.arange(16), last])  # fmt: skip
    assert (roll.rewards[~real] == 0).all()
    ended = (roll.responses == 13) | (roll.responses == 11)
    assert ended[torch.arange(16), last][real.sum(1) < cfg.task.response_length].all()

    # stop tokens that no row draws: the rollout is bitwise the fixed-length one
    off, off_stats, _ = _rollout(tiny_task, cfg)
    never = dataclasses.replace(cfg, task=dataclasses.replace(cfg.task, stop_at_eos=True, stop_tokens=(50255,)))
    same, same_stats, _ = _rollout(tiny_task, never)
    assert not (off.responses == 50255).any() and same.mask is None and off.mask is None
    for f in ("responses", "logprobs", "ref_logprobs", "values", "scores", "rewards"):
        assert getattr(same, f).equal(getattr(off, f)), f
    assert same_stats == off_stats and off_stats["objective/response_length"] == cfg.task.response_length


@pytest.fixture(scope="module")
def tiny_task():
    from lmprefs.pipeline.task import setup_task

    return setup_task(preset("tiny"), n_heldout=16)
