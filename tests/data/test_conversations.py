"""SFT data: TRL's conversational rows rendered through a chat template (or plainly) with the loss on assistant
tokens only, the prompt/completion rows beside them, save_to_disk directories, and one-line errors."""

import copy
import json

import pytest

from lmprefs.config import TaskConfig
from lmprefs.data.conversations import plain_pieces, sft_uses_template, template_pieces
from lmprefs.data.sft_data import SFTDataError, encode_examples, read_sft_data
from lmprefs.data.tasks import PAD
from lmprefs.errors import UserError

# a template in the style of ChatML, with a generation prompt and an end-of-turn marker
TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you."},
]


@pytest.fixture
def chat_tok(tiny_lm):
    tok = copy.deepcopy(tiny_lm[1])  # the session's tokenizer stays without a template
    tok.chat_template = TEMPLATE
    return tok


def trained_text(tok, tokens, mask):
    return tok.decode([t for t, m in zip(tokens.tolist(), mask.tolist(), strict=True) if m and t != PAD])


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_assistant_tokens_are_found_by_rendering_prefixes_of_the_template(tmp_path, chat_tok):
    pieces = template_pieces(chat_tok, CHAT)
    assert pieces == [("<|system|>Be brief.<|end|>\n<|user|>Hi there<|end|>\n<|assistant|>", False),
                      ("Hello!<|end|>\n", True), ("<|user|>Bye<|end|>\n<|assistant|>", False),
                      ("See you.<|end|>\n", True)]  # fmt: skip
    data = write_rows(tmp_path / "chat.jsonl", [{"messages": CHAT}, {"prompt": "Q:", "completion": " yes"}])
    tokens, mask = encode_examples(read_sft_data(data), chat_tok, 128, chat=True)
    assert trained_text(chat_tok, tokens[0], mask[0]) == "Hello!<|end|>\nSee you.<|end|>\n"
    assert chat_tok.decode([t for t in tokens[0].tolist() if t != PAD]) == chat_tok.apply_chat_template(
        CHAT, tokenize=False)  # fmt: skip
    assert trained_text(chat_tok, tokens[1], mask[1]) == " yes"  # a prompt/completion row beside it, as before
    # TRL's conversational prompt/completion: only the completion's assistant turn is trained; the conversation is
    # rendered up to it
    conv = write_rows(tmp_path / "pc.jsonl", [{"prompt": CHAT[:3] + CHAT[3:4], "completion": CHAT[4:]}])
    tokens, mask = encode_examples(read_sft_data(conv), chat_tok, 64, chat=True)
    assert trained_text(chat_tok, tokens[0], mask[0]) == "See you.<|end|>\n"
    # a cut to max_length drops the start of the conversation, not its last turn
    tokens, mask = encode_examples(read_sft_data(data)[:1], chat_tok, 8, chat=True)
    assert tokens.shape == (1, 8) and trained_text(chat_tok, tokens[0], mask[0]).endswith("See you.<|end|>\n")


def test_plain_rendering_without_a_template(tmp_path, tiny_lm):
    _, tok = tiny_lm
    assert not sft_uses_template(TaskConfig(), tok)
    assert plain_pieces(CHAT[:3]) == [("system: ", False), ("Be brief.\n", False), ("user: ", False),
                                      ("Hi there\n", False), ("assistant: ", False), ("Hello!\n", True)]  # fmt: skip
    tokens, mask = encode_examples(read_sft_data(write_rows(tmp_path / "c.jsonl", [{"messages": CHAT}])), tok, 64)
    assert tok.decode([t for t in tokens[0].tolist() if t != PAD]) == (
        "system: Be brief.\nuser: Hi there\nassistant: Hello!\nuser: Bye\nassistant: See you.\n")
    assert trained_text(tok, tokens[0], mask[0]) == "Hello!\nSee you.\n"
    with pytest.raises(UserError, match="has no chat template"):
        sft_uses_template(TaskConfig(chat_template="true", initial_model="tiny-gpt2"), tok)


def test_templates_that_rewrite_earlier_turns_are_refused_with_the_row(tmp_path, chat_tok):
    # the last turn rendered differently from an earlier one (as templates that drop earlier reasoning do)
    chat_tok.chat_template = ("{% for m in messages %}{% if loop.last %}[{{ m.content }}]{% else %}{{ m.content }}"
                              "{% endif %}{% endfor %}")  # fmt: skip
    data = write_rows(tmp_path / "c.jsonl", [{"messages": CHAT[1:3]}])
    with pytest.raises(SFTDataError, match=r"c.jsonl line 1: the chat template renders the start of this "
                                           "conversation differently"):  # fmt: skip
        encode_examples(read_sft_data(data), chat_tok, 64, chat=True)


def test_saved_datasets_are_sft_data(tmp_path):
    import datasets

    rows = {"messages": [CHAT, CHAT[1:3]]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dict"))
    assert [e.messages for e in read_sft_data(str(tmp_path / "one"))] == [tuple(CHAT), tuple(CHAT[1:3])]
    assert len(read_sft_data(f"{tmp_path / 'dict'}:train")) == 2
    with pytest.raises(SFTDataError, match=r"--sft.data .*dict: a DatasetDict with splits train; name one"):
        read_sft_data(str(tmp_path / "dict"))
    bad = {"messages": [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]]}
    datasets.Dataset.from_dict(bad).save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(SFTDataError, match=r"bad row 0: messages\[1\] \(assistant\) has no 'content'"):
        read_sft_data(str(tmp_path / "bad"))


@pytest.mark.parametrize(
    "row, message",
    [
        ({"messages": CHAT[:2]}, "line 1: no assistant turn in 'messages': nothing to learn"),
        ({"messages": [{"role": "tool", "content": "x"}, CHAT[2]]}, "messages[0] has role 'tool'; expected one of"),
        ({"messages": [CHAT[1], {"role": "assistant"}]}, "messages[1] (assistant) has no 'content'"),
        ({"messages": [CHAT[2]]}, "the conversation starts with an assistant turn"),
        ({"messages": "hello"}, "field 'messages' must be a non-empty list of messages"),
        ({"prompt": CHAT[1:2], "completion": CHAT[1:2]}, "no assistant turn in the completion"),
    ],
)
def test_bad_conversations_name_the_file_line_and_field(tmp_path, row, message):
    data = write_rows(tmp_path / "c.jsonl", [row])
    with pytest.raises(SFTDataError) as e:
        read_sft_data(data)
    assert f"c.jsonl {message}" in str(e.value) or message in str(e.value) and "c.jsonl line 1" in str(e.value)
