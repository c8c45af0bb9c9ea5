"""The offline instruct demo (`quickstart --preset instruct`): the preset, response texts without the stop token that
ended them (and unchanged with task.stop_at_eos off), the held-out mean response length in the report, and the
preset end to end at tiny size (a tiny GPT-2 given a chat template; the real demo is the lead's to time)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil

import pytest
import torch

from lmprefs.assets.models import tiny_gpt2_austen_dir
from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.config import preset
from lmprefs.config.presets import PRESETS
from lmprefs.data.tasks import PAD, decode, response_texts
from lmprefs.pipeline.rewards import track_true_reward
from lmprefs.training.rollout import text_score_fn

R = dataclasses.replace
EOS = 50256  # GPT-2's <|endoftext|>, the tiny model's EOS
# SmolLM2-Instruct's template without its default system turn (tests/data/test_chat_template.py)
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip


def test_the_preset_is_smollm2_instruct_in_its_chat_format_stopping_at_eos():
    from lmprefs.runtime.resolve import resolve_config

    cfg = resolve_config("instruct", [])
    t = cfg.task
    assert (t.initial_model, t.chat_template, t.stop_at_eos, t.stop_tokens) == ("smollm2-135m", "true", True, ())
    assert t.truncate_token is None and t.response_length == 48 and "kindly" in t.query_suffix
    assert cfg.labels.labeler == "vader" and cfg.labels.type == "best_of_4"
    # sized as the quickstart: LoRA in the top 8 blocks, 20 updates of 32, the same KL target
    qs = preset("quickstart")
    assert (cfg.lora, cfg.ppo, cfg.rewards, cfg.labels.num_train) == (qs.lora, qs.ppo, qs.rewards,
                                                                      qs.labels.num_train)  # fmt: skip
    assert "instruct" in PRESETS and [n for n, (_, c) in PRESETS.items() if c.task.stop_at_eos] == ["instruct"]


def test_smollm2s_eos_is_its_end_of_turn_token():
    """task.stop_tokens empty resolves to the tokenizer's EOS: for SmolLM2-Instruct, '<|im_end|>'."""
    from lmprefs.assets.models import resolve_model
    from lmprefs.data.tasks import stop_tokens

    try:
        tok = load_tokenizer(resolve_model("smollm2-135m"))
    except Exception as e:  # noqa: BLE001 - the asset is prepared on demand; CI without it skips
        pytest.skip(f"smollm2-135m not prepared here: {str(e).splitlines()[0][:80]}")
    stop = stop_tokens(preset("instruct").task, tok)
    assert [tok.convert_ids_to_tokens(i) for i in stop] == ["<|im_end|>"]
    row = torch.tensor([tok(" Thank you, dear friend.").input_ids + list(stop) + [PAD] * 3])
    assert response_texts(tok, row, preset("instruct").task) == [" Thank you, dear friend."]


def test_response_texts_leave_out_the_stop_token_only_with_stop_at_eos(tiny_lm):
    _, tok = tiny_lm
    kind = tok(" How kind of you.").input_ids
    rows = torch.tensor([kind + [EOS, PAD, PAD], kind + [13, 11, 13], [EOS] + [PAD] * (len(kind) + 2)])
    off = preset("tiny").task
    on = R(off, stop_at_eos=True)
    assert response_texts(tok, rows, off) == decode(tok, rows)  # off: exactly as before, the token's text kept
    assert decode(tok, rows)[0].endswith("<|endoftext|>")
    assert response_texts(tok, rows, on) == [" How kind of you.", decode(tok, rows)[1], ""]
    # named stop tokens: only a row's last real token, the one that ended it, is left out
    assert response_texts(tok, rows, R(on, stop_tokens=(13,)))[1] == tok.decode(kind + [13, 11])


def test_rollout_scores_read_the_texts_without_the_stop_token(tiny_lm):
    _, tok = tiny_lm
    q = torch.tensor([tok("Rain fell.").input_ids])
    r = torch.tensor([tok(" Wet.").input_ids + [EOS, PAD]])
    got = []

    def fn(responses, queries=None):
        got.append(list(responses))
        return [1.0]

    text_score_fn(fn, tok, stop=(EOS,))(q, r)
    score, _ = track_true_reward(lambda *a: torch.zeros(1), fn, tok, stop=(EOS,))
    score(q, r)
    text_score_fn(fn, tok)(q, r)  # without stop tokens (stop_at_eos off) the text is decoded as it always was
    assert got == [[" Wet."], [" Wet."], [" Wet.<|endoftext|>"]]


def _evaluation(mean: float, length: float | None) -> dict:
    e = {"mean": mean, "stderr": 0.01, "n_queries": 4, "samples_per_query": 1, "scores": [[mean]] * 4,
         "texts": ["Thank you."] * 4, "kl": 1.0, "kl_stderr": 0.1}  # fmt: skip
    return e if length is None else e | {"response_length": length, "response_length_stderr": 0.5}


@pytest.mark.parametrize("stop", [True, False])
def test_the_report_carries_mean_response_lengths_with_stop_at_eos(tmp_path, tiny_lm, stop):
    from lmprefs.recipes.quickstart import write_report

    _, tok = tiny_lm
    cfg = preset("tiny")
    queries = torch.tensor([tok("Rain fell.").input_ids] * 4)
    before, after = _evaluation(0.1, 20.25 if stop else None), _evaluation(0.3, 12.5 if stop else None)
    text = write_report(tmp_path, cfg, {}, {"PPO": 1.0}, before, after, queries=queries, tok=tok).read_text()
    rep = json.loads((tmp_path / "report.json").read_text())
    if stop:
        assert "mean response length, initial policy (tokens, stop token included; cap 8) | 20.2 +/- 0.5" in text
        assert "mean response length, final policy" in text and "| 12.5 +/- 0.5 |" in text
        assert rep["response_length_before"] == {"response_length": 20.25, "response_length_stderr": 0.5}
        assert rep["response_length_after"]["response_length"] == 12.5
    else:  # fixed-length responses: the report as it was
        assert "response length" not in text and not any(k.startswith("response_length") for k in rep)


def test_quickstart_instruct_preset_end_to_end_on_a_tiny_chat_model(tmp_path, capsys):
    """The instruct preset through every stage, on the tiny GPT-2 given SmolLM2's template (no new tokens) and
    stopping at '.' and ',' so that rows do stop within 8 tokens; 12-token queries, as the template and the
    preset's framing take 43 of the tiny model's 64 positions."""
    from lmprefs.cli.dispatch import main
    from lmprefs.io.jsonl import read_jsonl

    model = tmp_path / "chat-model"
    shutil.copytree(tiny_gpt2_austen_dir(), model)
    tok = copy.deepcopy(load_tokenizer(model))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    run = tmp_path / "run"
    argv = ["quickstart", "--preset", "instruct", "--run-dir", str(run), "--eval-queries", "8", "--eval-samples", "2",
            "--task.initial-model", str(model), "--task.query-length", "12", "--task.response-length", "8",
            "--task.stop-tokens", "13,11", "--labels.num-train", "16", "--train-reward.rollout-batch-size", "16",
            "--train-reward.normalize-samples", "16", "--train-reward.epochs", "1", "--ppo.total-episodes", "16",
            "--ppo.batch-size", "16", "--lora.layers", "0", "--run.dtype", "float32",
            "--run.threads", "1"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mean response length:" in out and "(cap 8)" in out
    rep = json.loads((run / "report.json").read_text())
    for k in ("response_length_before", "response_length_after"):
        n = rep[k]["response_length"]
        assert math.isfinite(n) and 1 <= n <= 8, rep
    assert "mean response length, final policy" in (run / "report.md").read_text()
    samples = read_jsonl(run / "samples.jsonl")
    assert samples and "<|im_start|>" not in samples[0]["query"]  # the plain query text, framed as a chat turn


def test_heldout_kl_and_lengths_count_only_the_real_tokens_of_rows_that_stop():
    """The initial policy against itself: KL exactly 0 with rows that stop early (the reference's logprobs on the
    padding after a stop token are not counted), and a mean length below the cap."""
    from lmprefs.labels.labelers import score_fn
    from lmprefs.pipeline.evaluation import evaluate_policy
    from lmprefs.pipeline.task import Task, setup_task

    cfg = preset("tiny")
    cfg = R(cfg, task=R(cfg.task, stop_at_eos=True, stop_tokens=(13, 11)))
    t = setup_task(cfg, n_heldout=8)
    e = evaluate_policy(t, t.heldout_queries[:8], score_fn("vader"), None, 2, 0, ref_model=t.model)
    assert e["kl"] == pytest.approx(0.0, abs=1e-5)
    assert 1 <= e["response_length"] < cfg.task.response_length and e["response_length_stderr"] > 0
    assert not any("," in x[-1:] or "." in x[-1:] for x in e["texts"] if x)  # the stop token left out
    t_off = Task(**{**t.__dict__, "cfg": preset("tiny")})
    off = evaluate_policy(t_off, t.heldout_queries[:8], score_fn("vader"), None, 2, 0)
    assert "response_length" not in off  # fixed-length responses: no length figures
