"""task.chat_template: a query framed as a chat turn by the tokenizer's template, as fixed ids around the padded
query, reproduces apply_chat_template; auto keeps the original's raw text for every built-in preset; a tiny run
with a template trains."""

from __future__ import annotations

import copy
import dataclasses
import shutil

import pytest
import torch

from lmprefs.assets.models import tiny_gpt2_austen_dir
from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.config import preset
from lmprefs.config.presets import PRESETS
from lmprefs.data.chat import chat_frame, task_frame, uses_chat_template
from lmprefs.data.tasks import PAD, encode_fixed, format_queries, query_texts
from lmprefs.errors import UserError

R = dataclasses.replace
# SmolLM2-Instruct's template without its default system turn
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # fmt: skip


@pytest.fixture(scope="module")
def chat_tok():
    """The tiny preset's GPT-2 tokenizer (a copy: loaded tokenizers are shared) with ChatML's markers as special
    tokens, as SmolLM2's tokenizer has them, and the template."""
    tok = copy.deepcopy(load_tokenizer(tiny_gpt2_austen_dir()))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE
    return tok


def test_the_frame_splits_the_template_around_the_content(chat_tok):
    before, after = chat_frame(chat_tok)
    assert (before, after) == ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("prefix,suffix", [("", ""), ("Article:\n\n", "\n\nTL;DR:")])
def test_formatted_queries_are_apply_chat_template_of_the_query_text(chat_tok, prefix, suffix):
    task = R(preset("tiny").task, chat_template="true", query_prefix=prefix, query_suffix=suffix)
    pre, suf = task_frame(task, chat_tok)
    texts = ["It is a truth universally acknowledged.", "She was the youngest of the two daughters"]
    rows = [encode_fixed(chat_tok, t) for t in texts]
    queries = torch.tensor([r + [PAD] * (12 - len(r)) for r in rows])
    formatted = format_queries(queries, pre, suf)
    for row, text in zip(formatted.tolist(), texts, strict=True):
        rendered = chat_tok.apply_chat_template([{"role": "user", "content": prefix + text + suffix}],
                                                add_generation_prompt=True, tokenize=False)  # fmt: skip
        ids = [t for t in row if t != PAD]  # the query's padding taken out
        assert chat_tok.decode(ids) == rendered
        if not prefix:  # query_prefix and query_suffix are tokenized apart from the query, as without a template
            assert ids == encode_fixed(chat_tok, rendered)
    # samples, reports and the label store read the plain query text
    assert query_texts(chat_tok, formatted, pre, suf) == texts


def test_auto_keeps_raw_text_for_every_built_in_preset(chat_tok):
    # the instruct demo's preset alone sets true: its model is the bundled instruct model
    assert [n for n, (_, c) in PRESETS.items() if c.task.chat_template == "true"] == ["instruct"]
    for name, (_, cfg) in PRESETS.items():
        if name == "instruct":
            continue
        assert not uses_chat_template(cfg.task, chat_tok), name
        assert task_frame(cfg.task, chat_tok) == (encode_fixed(chat_tok, cfg.task.query_prefix),
                                                  encode_fixed(chat_tok, cfg.task.query_suffix))  # fmt: skip
    # a model of the user's own with a template gets it; the original's presets keep raw text even then
    own = R(preset("tiny").task, initial_model="/models/my-instruct")
    assert uses_chat_template(own, chat_tok)
    assert not uses_chat_template(R(preset("sentiment").task, initial_model="/models/my-instruct"), chat_tok)
    plain = load_tokenizer(tiny_gpt2_austen_dir())
    assert not plain.chat_template and not uses_chat_template(own, plain)


def test_true_without_a_template_names_the_value_and_the_model():
    task = R(preset("tiny").task, chat_template="true")
    with pytest.raises(UserError, match="task.chat_template=true: 'tiny-gpt2-austen' has no chat template"):
        task_frame(task, load_tokenizer(tiny_gpt2_austen_dir()))


def test_a_tiny_run_with_the_template_trains(tmp_path):
    from lmprefs.cli.dispatch import main
    from lmprefs.io.jsonl import read_jsonl

    model = tmp_path / "chat-model"
    shutil.copytree(tiny_gpt2_austen_dir(), model)
    tok = copy.deepcopy(load_tokenizer(model))
    tok.chat_template = TEMPLATE  # no new tokens: the model's embeddings stay as they are
    tok.save_pretrained(model)
    run = tmp_path / "run"
    argv = ["train-policy", "tiny", "--reward", "vader", "--run-dir", str(run), "--task.initial-model", str(model),
            "--ppo.total-episodes", "16"]  # fmt: skip
    assert main(argv) == 0
    samples = read_jsonl(run / "samples.jsonl")
    assert samples and "<|im_start|>" not in samples[0]["query"]  # the plain query text


def test_auto_says_in_one_line_when_it_frames_queries_with_a_template(tmp_path, capsys):
    from lmprefs.cli.dispatch import main
    from lmprefs.pipeline import task

    model = tmp_path / "chat-model"
    shutil.copytree(tiny_gpt2_austen_dir(), model)
    tok = copy.deepcopy(load_tokenizer(model))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model)
    note = f"task.chat_template=auto: '{model}' has a chat template, so queries are framed as a user turn"
    for framing, said in (("auto", 1), ("false", 0), ("auto", 0)):  # the third: said once per process already
        task._NOTED.discard(str(model)) if said else None
        assert main(["sample", "--preset", "tiny", "--n", "1", "--task.initial-model", str(model),
                     "--task.chat-template", framing]) == 0  # fmt: skip
        assert capsys.readouterr().out.count(note) == said, framing
    assert main(["sample", "--preset", "tiny", "--n", "1"]) == 0  # an asset: the original's raw text, no line
    assert "task.chat_template" not in capsys.readouterr().out
