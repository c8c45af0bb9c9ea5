"""Conversations as training tokens with the loss on assistant turns only (TRL's conversational `messages` rows).

With a chat template, the conversation is rendered once and each assistant turn's text is found by rendering its
prefixes: the turn starts where the conversation before it, rendered with the generation prompt (the assistant's
header), ends, and stops where the conversation up to and including it ends; so the trained text is the turn's
content and whatever the template closes it with (e.g. `<|im_end|>` and a newline), never the header. Templates
rarely support `{% generation %}` (SmolLM2's does not), and this needs nothing of them but that a conversation's
rendering starts with the rendering of its beginning, which is checked. Without a template (or with
task.chat_template=false) the plain rendering is one `role: content` line per message, the loss on an assistant
line's content and its newline.

The text is tokenized piece by piece (the text before a trained turn, the turn, ...), as a prompt and its response
are: a trained turn starts on a token boundary, as a sampled response does.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmprefs.config import TaskConfig
from lmprefs.data.chat import has_chat_template, uses_chat_template

ROLES = ("system", "user", "assistant")


class ConversationError(ValueError):
    """A conversation the chat template cannot render in pieces; the message says why (the caller names the row)."""


def sft_uses_template(task: TaskConfig, tokenizer) -> bool:
    """Whether conversations are rendered by the tokenizer's chat template: task.chat_template true (refused for a
    tokenizer without one) or false; auto: whenever the tokenizer has one (conversations are chat data, for bundled
    models too, unlike the raw-text queries of the original's presets)."""
    if task.chat_template == "auto":
        return has_chat_template(tokenizer)
    return uses_chat_template(task, tokenizer)


def _render(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> str:
    try:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=generation_prompt)  # fmt: skip
    except Exception as e:  # a template raises its own errors (e.g. roles out of the order it expects)
        raise ConversationError(f"the chat template refuses it ({type(e).__name__}: {str(e)[:160]})") from None
    assert isinstance(text, str)
    return text


def _turn_start(tokenizer, before: Sequence[dict], full: str) -> int:
    """Where an assistant turn's trained text starts in `full`: after the conversation before it rendered with the
    generation prompt (or, for a template that has none, without it)."""
    for generation_prompt in (True, False):
        head = _render(tokenizer, before, generation_prompt)
        if full.startswith(head):
            return len(head)
    raise ConversationError("the chat template renders the start of this conversation differently from the "
                            "whole (it rewrites earlier turns); use task.chat_template=false for the plain "
                            "rendering")  # fmt: skip


def template_pieces(tokenizer, messages: Sequence[dict], trained_from: int = 0) -> list[tuple[str, bool]]:
    """[(text, trained), ...] of the conversation up to its last trained assistant turn rendered by the chat
    template; trained: an assistant turn at index >= trained_from."""
    trained = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= trained_from]
    messages = messages[: trained[-1] + 1]
    full = _render(tokenizer, messages, False)
    pieces, pos = [], 0
    for i in trained:
        start, through = _turn_start(tokenizer, messages[:i], full), _render(tokenizer, messages[: i + 1], False)
        if not full.startswith(through) or not pos <= start <= len(through):
            raise ConversationError("the chat template renders the start of this conversation differently from the "
                                    "whole; use task.chat_template=false for the plain rendering")  # fmt: skip
        pieces += [(full[pos:start], False), (full[start : len(through)], True)]
        pos = len(through)
    return [p for p in pieces if p[0]]


def plain_pieces(messages: Sequence[dict], trained_from: int = 0) -> list[tuple[str, bool]]:
    """[(text, trained), ...] of the plain rendering: `role: content` lines, the loss on an assistant line's content
    and newline (from trained_from on), up to the last trained assistant turn."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= trained_from)
    pieces = []
    for i, m in enumerate(messages[: last + 1]):
        train = m["role"] == "assistant" and i >= trained_from
        pieces += [(f"{m['role']}: ", False), (m["content"] + "\n", train)]
    return pieces


def encode_pieces(tokenizer, pieces: list[tuple[str, bool]]) -> tuple[list[int], list[bool]]:
    """(token ids, trained mask) of rendered pieces, each tokenized on its own with no special tokens added (a
    template's special tokens in the text, such as <|im_start|>, are still read as such)."""
    ids: list[int] = []
    mask: list[bool] = []
    for text, trained in pieces:
        t = tokenizer(text, add_special_tokens=False).input_ids
        ids += t
        mask += [trained] * len(t)
    return ids, mask
