"""TRL's preference rows, in each of the forms its trainers accept (TRL's "dataset formats" guide), turned into one
(prompt, chosen, rejected) triple of texts:

- standard, explicit prompt: {"prompt": str, "chosen": str, "rejected": str};
- standard, implicit prompt: {"chosen": str, "rejected": str}, the full texts: the prompt is their common beginning,
  cut before the space that starts the first differing word (as TRL's `extract_prompt` cuts it; two texts with no
  common beginning are refused, not stored under an empty prompt);
- conversational: {"prompt": [messages], "chosen": [messages], "rejected": [messages]} with messages
  {"role", "content"}, or without "prompt", the conversations sharing their first messages (implicit).

A label store item is one user turn and its answers (a chat model renders them through its template when it reads
them), so a conversational row must come down to exactly one user message and one assistant message each; a longer
conversation is refused with the row rather than flattened into a text no model was trained on.
"""

from __future__ import annotations

from lmprefs.labels.formats.shared import LabelFileError


def pair_texts(name: str, where: str, row: object) -> tuple[str, str, str]:
    """(prompt, chosen, rejected) of one TRL preference row; a LabelFileError naming the file, the row and the field
    for anything else."""
    if not isinstance(row, dict):
        raise LabelFileError(f"{name} {where}: expected an object, got {type(row).__name__}")
    for key in ("chosen", "rejected"):
        if key not in row:
            raise LabelFileError(f"{name} {where}: missing field {key!r}")
    chosen, rejected = row["chosen"], row["rejected"]
    if isinstance(chosen, list) or isinstance(rejected, list):
        return _conversational(name, where, row)
    for key, v in (("chosen", chosen), ("rejected", rejected), ("prompt", row.get("prompt", ""))):
        if isinstance(v, bool) or not isinstance(v, str):
            raise LabelFileError(f"{name} {where}: field {key!r} = {v!r:.60} is not a string or a list of messages")
    if "prompt" in row or chosen == rejected:  # the same two texts: refused as such by the reader, not as empty
        return row.get("prompt", ""), chosen, rejected
    cut = _common_start(chosen, rejected)
    if not chosen[:cut].strip():
        raise LabelFileError(f"{name} {where}: 'chosen' and 'rejected' have no beginning in common, the implicit "
                             "prompt of a row without 'prompt'; add a 'prompt' field")  # fmt: skip
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _common_start(a: str, b: str) -> int:
    """Where the implicit prompt of two full texts ends: the length of their common beginning, less the space that
    starts the first word they differ in (it belongs to the answers)."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n - 1 if n > 0 and a[n - 1] == " " else n


def _messages(name: str, where: str, key: str, v: object) -> list[dict]:
    if not isinstance(v, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in v
    ):
        raise LabelFileError(f"{name} {where}: field {key!r} must be a list of messages with string 'role' and "
                             "'content'")  # fmt: skip
    return v


def _conversational(name: str, where: str, row: dict) -> tuple[str, str, str]:
    chosen = _messages(name, where, "chosen", row["chosen"])
    rejected = _messages(name, where, "rejected", row["rejected"])
    if "prompt" in row:
        prompt = _messages(name, where, "prompt", row["prompt"])
    else:  # implicit: the messages both conversations begin with
        n = 0
        while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
            n += 1
        prompt, chosen, rejected = chosen[:n], chosen[n:], rejected[n:]
    if [m["role"] for m in prompt] != ["user"]:
        raise LabelFileError(f"{name} {where}: the prompt is {len(prompt)} message(s) with roles "
                             f"{[m['role'] for m in prompt]}; a label is one user turn (multi-turn and system "
                             "prompts are not supported)")  # fmt: skip
    for key, answer in (("chosen", chosen), ("rejected", rejected)):
        if [m["role"] for m in answer] != ["assistant"]:
            raise LabelFileError(f"{name} {where}: field {key!r} must answer with one assistant message, got roles "
                                 f"{[m['role'] for m in answer]}")  # fmt: skip
    return prompt[0]["content"], chosen[0]["content"], rejected[0]["content"]
