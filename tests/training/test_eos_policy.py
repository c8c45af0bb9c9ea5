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
