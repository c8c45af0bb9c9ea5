"""Task-specific text handling (lm_tasks.py @cbfd210): query formatting with prefix and suffix, response truncation
and the filter that decides which responses get `penalty_reward_value`, and the original's print format."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lmprefs.config import TaskConfig
from lmprefs.errors import UserError
from lmprefs.runtime.device import autocast


def encode_fixed(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids if text else []


def format_queries(queries: Tensor, prefix: list[int], suffix: list[int]) -> Tensor:
    """prefix + padded query + suffix (lm_tasks.py:query_formatter); pads in the middle are skipped by position ids."""
    B = queries.shape[0]
    parts = [torch.tensor(p, dtype=queries.dtype, device=queries.device).expand(B, -1) for p in (prefix, suffix)]
    return torch.cat([parts[0], queries, parts[1]], dim=1)


@dataclass(frozen=True)
class TaskContext:
    """How a task's queries are framed and where its models compute: the token ids put before and after every
    query (task.query_prefix, task.query_suffix), and the device and autocast dtype of the forward passes."""

    prefix: list[int]
    suffix: list[int]
    device: torch.device
    dtype: torch.dtype
    template: tuple[int, int] = (0, 0)
    """Ids of a chat template (task.chat_template) at the start of prefix and at the end of suffix: printed samples
    leave them out, as they keep query_prefix and query_suffix."""

    def shown(self, formatted: Tensor) -> Tensor:
        """Formatted queries without the chat template's ids, as samples print them."""
        return formatted[:, self.template[0] : formatted.shape[1] - self.template[1]]

    def format(self, queries: Tensor) -> Tensor:
        """queries [B, Q] framed and on the device: [B, len(prefix) + Q + len(suffix)]."""
        return format_queries(queries.to(self.device), self.prefix, self.suffix)

    def autocast(self):
        return autocast(self.device, self.dtype)


def stop_tokens(task: TaskConfig, tokenizer) -> tuple[int, ...]:
    """The ids that end a response (task.stop_at_eos): task.stop_tokens, else the tokenizer's EOS; () when off.
    Checked against the tokenizer before a command writes anything: an id it cannot sample would never stop a row
    (and task.truncate_token, which would never cut one)."""
    vocab = len(tokenizer)
    if task.truncate_token is not None and task.truncate_token >= vocab:
        raise UserError(f"task.truncate_token={task.truncate_token} is outside the vocabulary of task.initial_model="
                        f"{task.initial_model!r} ({vocab} tokens)")  # fmt: skip
    if not task.stop_at_eos:
        return ()
    if task.stop_tokens:
        bad = [t for t in task.stop_tokens if t >= vocab]
        if bad:
            raise UserError(f"task.stop_tokens={','.join(map(str, task.stop_tokens))}: {bad[0]} is outside the "
                            f"vocabulary of task.initial_model={task.initial_model!r} ({vocab} tokens)")
        return tuple(task.stop_tokens)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise UserError(f"task.stop_at_eos=true: the tokenizer of task.initial_model={task.initial_model!r} has no "
                        "eos_token_id; name the ids that end a response with task.stop_tokens")
    if eos >= vocab:
        raise UserError(f"task.stop_at_eos=true: the eos_token_id {eos} of task.initial_model="
                        f"{task.initial_model!r} is outside its vocabulary ({vocab} tokens); set task.stop_tokens")
    return (int(eos),)


def response_mask(responses: Tensor) -> Tensor:
    """[B, T] float mask of the real response tokens: 1 up to and including a row's stop token, 0 on the PAD after it
    (task.stop_at_eos). All ones for fixed-length responses."""
    return (responses != PAD).float()


def truncate_responses(responses: Tensor, truncate_token: int | None, truncate_after: int) -> Tensor:
    """Replace every token after the first truncate_token at index >= truncate_after with PAD
    (lm_tasks.py:postprocess_fn_from_hparams). The truncate token itself is kept."""
    if truncate_token is None:
        return responses
    hit = (responses == truncate_token).long()
    hit[:, :truncate_after] = 0
    after = (hit.cumsum(1) - hit).bool()  # strictly after the first hit
    return torch.where(after, torch.full_like(responses, PAD), responses)


def passes_filter(responses: Tensor, truncate_token: int | None, truncate_after: int) -> Tensor:
    """[B] bool: a truncate_token at index >= truncate_after (lm_tasks.py:filter_fn_from_hparams); others get
    penalty_reward_value instead of their score."""
    if truncate_token is None:
        return torch.ones(responses.shape[0], dtype=torch.bool, device=responses.device)
    return (responses[:, truncate_after:] == truncate_token).any(-1)


def apply_penalty(scores: Tensor, postprocessed: Tensor, task: TaskConfig) -> Tensor:
    """scores where the filter passes, penalty_reward_value elsewhere (train_policy.py:make_score_fn l.375-390);
    scores unchanged when penalty_reward_value is None (truncation without the penalty)."""
    if task.penalty_reward_value is None:
        return scores
    ok = passes_filter(postprocessed, task.truncate_token, task.truncate_after)
    return torch.where(ok, scores, torch.full_like(scores, task.penalty_reward_value))


def decode(tokenizer, tokens: Tensor, stop: Sequence[int] = ()) -> list[str]:
    """Texts of [B, L] tokens with PAD dropped. `stop` (responses: `stop_tokens`, () unless task.stop_at_eos): a
    row's last real token is dropped too when it is one of them, so a labeler, a true reward, reports and samples
    read what the response says, not the '<|im_end|>' that ended it; the token ids keep it (the policy and the
    reward model still read it)."""
    rows = [[t for t in row if t != PAD] for row in tokens.tolist()]
    if stop:
        rows = [r[:-1] if r and r[-1] in stop else r for r in rows]
    return [tokenizer.decode(r) for r in rows]


def response_texts(tokenizer, responses: Tensor, task: TaskConfig) -> list[str]:
    """Texts of responses as they are scored and shown: decode without the stop token that ended them."""
    return decode(tokenizer, responses, stop_tokens(task, tokenizer))


def query_texts(tokenizer, formatted: Tensor, prefix: Sequence[int], suffix: Sequence[int]) -> list[str]:
    """The query texts inside formatted queries (prefix + padded query + suffix, as a rollout scores them): what a
    judge of (response, query) pairs reads, the same text the label store keeps for a question."""
    return decode(tokenizer, formatted[:, len(prefix) : formatted.shape[1] - len(suffix)])


def show(text: str) -> str:
    """Newlines as a visible mark, as the original's sample.py prints them."""
    return text.replace("\n", "⏎")


PAD = -1
