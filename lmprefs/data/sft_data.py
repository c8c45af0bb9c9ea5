"""Supervised fine-tuning data (`--sft.data`): rows of a JSONL or JSON-list file, or of a `save_to_disk` directory
(`DIR`, or `DIR:SPLIT` for a DatasetDict), in TRL's dataset formats:

- prompt/completion: {"prompt": str, "response" | "completion": str}: the loss on the response;
- conversational: {"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}: the loss on every
  assistant turn; or {"prompt": [messages], "completion": [messages]}: the loss on the completion's assistant turns.

Rows are checked when read, so that bad data is one line (file, line or row, field) before a run directory exists;
tokens come from `encode_examples` (conversations through `lmprefs.data.conversations`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmprefs.assets.models import resolve_model
from lmprefs.assets.tokenizers import load_tokenizer
from lmprefs.config import TaskConfig
from lmprefs.data.conversations import (
    ROLES,
    ConversationError,
    encode_pieces,
    plain_pieces,
    sft_uses_template,
    template_pieces,
)
from lmprefs.data.hf_datasets import (
    DatasetReadError,
    is_saved_dataset,
    saved_rows,
    split_spec,
)
from lmprefs.data.tasks import PAD
from lmprefs.errors import UserError
from lmprefs.io.inputs import input_file
from lmprefs.io.jsonl import JsonRowsError, json_rows


class SFTDataError(UserError):
    """An SFT data file that cannot be read; the message names the file, the line and the field."""


@dataclass(frozen=True)
class SFTExample:
    """One row: a prompt and its response, or a conversation (messages; the assistant turns from trained_from on
    carry the loss)."""

    where: str
    """The file and line (or row) it came from, for errors found when it is encoded."""
    prompt: str = ""
    response: str = ""
    messages: tuple[dict, ...] = ()
    trained_from: int = 0


def read_sft_data(spec: str) -> list[SFTExample]:
    """The rows of --sft.data (see the module docstring); an SFTDataError for anything else."""
    path, parts = split_spec(spec)
    rows: list[tuple[str, object]]
    try:
        if is_saved_dataset(path):
            name, rows = spec, saved_rows(path, parts, f"--sft.data {spec}")
        else:
            if parts:
                raise SFTDataError(f"--sft.data {spec}: no such file or save_to_disk directory")
            name, rows = str(input_file(path, "--sft.data")), json_rows(path)[1]
    except (DatasetReadError, JsonRowsError, UserError) as e:
        raise SFTDataError(str(e)) from None
    examples = [_example(f"{name} {where}", row) for where, row in rows]
    if not examples:
        raise SFTDataError(f"{name}: no prompt/response pairs or conversations")
    return examples


def _example(where: str, row: object) -> SFTExample:
    if not isinstance(row, dict):
        raise SFTDataError(f"{where}: expected an object with prompt and response, or messages, got "
                           f"{type(row).__name__}")  # fmt: skip
    if "messages" in row:
        return _conversation(where, _messages(where, "messages", row["messages"]), 0)
    key = "completion" if "completion" in row and "response" not in row else "response"
    for k in ("prompt", key):
        if k not in row:
            also = " (or TRL's 'completion', or 'messages')" if k == "response" else ""
            raise SFTDataError(f"{where}: missing field {k!r}{also}")
    if isinstance(row["prompt"], list) and isinstance(row[key], list):  # TRL's conversational prompt/completion
        prompt = _messages(where, "prompt", row["prompt"])
        return _conversation(where, prompt + _messages(where, key, row[key]), len(prompt))
    for k in ("prompt", key):
        if not isinstance(row[k], str):
            raise SFTDataError(f"{where}: field {k!r} is {type(row[k]).__name__}, not a string (a conversational "
                               "row has message lists in both prompt and completion)")  # fmt: skip
    if not row[key]:
        raise SFTDataError(f"{where}: field {key!r} is empty: nothing to learn")
    for k in ("prompt", key):
        _no_nul(where, k, row[k])
    return SFTExample(where, prompt=row["prompt"], response=row[key])


def _messages(where: str, key: str, value: object) -> tuple[dict, ...]:
    """A list of {"role", "content"} messages with known roles and string contents (other keys dropped)."""
    if not isinstance(value, list) or not value:
        raise SFTDataError(f"{where}: field {key!r} must be a non-empty list of messages")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict):
            raise SFTDataError(f"{where}: {key}[{j}] is {type(m).__name__}, not a message")
        if m.get("role") not in ROLES:
            raise SFTDataError(f"{where}: {key}[{j}] has role {m.get('role')!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            got = "no" if m.get("content") is None else f"a {type(m['content']).__name__}"
            raise SFTDataError(f"{where}: {key}[{j}] ({m['role']}) has {got} 'content'; expected a string")
        _no_nul(where, f"{key}[{j}] content", m["content"])
        out.append({"role": m["role"], "content": m["content"]})
    return tuple(out)


def _no_nul(where: str, what: str, text: str) -> None:
    """A NUL character is no text a model should learn (a binary file's, or a broken export's): refused, as label
    files refuse it."""
    if "\0" in text:
        raise SFTDataError(f"{where}: {what} holds a NUL character at offset {text.index(chr(0))}")


def _conversation(where: str, messages: tuple[dict, ...], trained_from: int) -> SFTExample:
    if not any(m["role"] == "assistant" for m in messages[trained_from:]):
        part = "the completion" if trained_from else "'messages'"
        raise SFTDataError(f"{where}: no assistant turn in {part}: nothing to learn")
    if messages[0]["role"] == "assistant":
        raise SFTDataError(f"{where}: the conversation starts with an assistant turn; start it with a system or "
                           "user message")  # fmt: skip
    return SFTExample(where, messages=messages, trained_from=trained_from)


def check_first_conversation(examples: list[SFTExample], task: TaskConfig) -> None:
    """Render the first conversation as train-sft will, from the model's tokenizer alone, so that a chat template
    that cannot be rendered in pieces is refused before a command writes its run directory (a template's trouble
    is nearly always the template's, not one row's; a model that cannot be read is left to the loading that names
    it)."""
    first = next((e for e in examples if e.messages), None)
    if first is None:
        return
    try:
        tok = load_tokenizer(resolve_model(task.initial_model))
    except (OSError, ValueError):
        return
    if sft_uses_template(task, tok):
        try:
            template_pieces(tok, first.messages, first.trained_from)
        except ConversationError as err:
            raise SFTDataError(f"{first.where}: {err}") from None


def _pair_ids(tok, prompt: str, response: str, max_length: int) -> tuple[list[int], list[bool]]:
    """Prompt tokens then response tokens, cut to max_length by dropping the start of the prompt first (the
    response and the prompt's end, e.g. 'TL;DR:', stay), then the end of the response."""
    p = tok(prompt, add_special_tokens=False).input_ids if prompt else []
    r = tok(response, add_special_tokens=False).input_ids[:max_length]
    p = p[max(0, len(p) - (max_length - len(r))) :]
    if not p:  # the first response token needs a token before it to be predicted from
        r = r[: max_length - 1]
        p = [tok.eos_token_id if tok.eos_token_id is not None else r[0]]
    return p + r, [False] * len(p) + [True] * len(r)


def _conversation_ids(tok, e: SFTExample, max_length: int, chat: bool) -> tuple[list[int], list[bool]]:
    """A conversation's tokens and assistant mask, cut to max_length by dropping its start (it is rendered only up
    to its last trained turn, so that turn's end stays)."""
    try:
        pieces = template_pieces(tok, e.messages, e.trained_from) if chat else plain_pieces(e.messages, e.trained_from)
    except ConversationError as err:
        raise SFTDataError(f"{e.where}: {err}") from None
    ids, mask = encode_pieces(tok, pieces)
    return ids[-max_length:], mask[-max_length:]


def encode_examples(examples: list[SFTExample], tok, max_length: int, chat: bool = False) -> tuple[Tensor, Tensor]:
    """(tokens [N, L] right-padded with PAD, loss mask [N, L]): a pair's response tokens, a conversation's
    assistant tokens; chat: render conversations by the tokenizer's chat template (else plainly)."""
    rows, masks = [], []
    for e in examples:
        ids, m = (_conversation_ids(tok, e, max_length, chat) if e.messages else
                  _pair_ids(tok, e.prompt, e.response, max_length))  # fmt: skip
        rows.append(ids)
        masks.append(m)
    L = max(len(x) for x in rows)
    tokens = torch.tensor([x + [PAD] * (L - len(x)) for x in rows])
    mask = torch.tensor([m + [False] * (L - len(m)) for m in masks])
    return tokens, mask
