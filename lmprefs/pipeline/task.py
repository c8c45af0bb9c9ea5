"""A task's model, tokenizer and queries, loaded once for a command (`setup_task`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lmprefs.config import Config
from lmprefs.data.chat import chat_template_note, template_lengths
from lmprefs.data.queries import task_queries
from lmprefs.data.tasks import TaskContext, stop_tokens
from lmprefs.errors import UserError
from lmprefs.models.loading import load_lm, max_positions
from lmprefs.models.lora import adapted_layers
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.device import setup_torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from lmprefs.training.prefix_share import SharedPrefixes

HELDOUT_QUERIES = 512  # queries set aside (a fixed permutation) for evaluation; never trained on


@dataclass
class Task:
    cfg: Config
    device: torch.device
    dtype: torch.dtype
    model: PreTrainedModel  # the initial policy LM (fp32, eval, dropout off)
    tok: PreTrainedTokenizerBase
    train_queries: torch.Tensor  # [N, Q] PAD right
    heldout_queries: torch.Tensor
    prefix: list[int]
    suffix: list[int]
    template: tuple[int, int] = (0, 0)  # the chat template's ids in prefix and suffix (TaskContext.template)
    # frozen prefixes of labeled rows computed once for several reward models (an experiment's arms and seeds);
    # train_reward_model takes its rows from here when every one of them is there
    shared_prefixes: SharedPrefixes | None = None
    # the untrained reward model's normalization and held-out figures, by seed (reward_model.before_training)
    shared_before: dict | None = None

    @property
    def ctx(self) -> TaskContext:
        return TaskContext(self.prefix, self.suffix, self.device, self.dtype, self.template)


def setup_task(cfg: Config, n_heldout: int = HELDOUT_QUERIES) -> Task:
    device, dtype = setup_torch(cfg.run)
    torch.manual_seed(cfg.run.seed)
    model, tok = load_lm(cfg.task.initial_model, device)
    stop_tokens(cfg.task, tok)  # a bad stop token is refused before the command writes anything
    if cfg.lora.rank > 0:
        adapted_layers(model, cfg.lora)  # and so are LoRA targets or a rank the model's layers do not take
    train, heldout, prefix, suffix = task_queries(cfg.task, tok, max_positions(model), n_heldout)
    note_chat_template(cfg, tok)
    return Task(cfg, device, dtype, model, tok, train, heldout, prefix, suffix, template_lengths(cfg.task, tok))


_NOTED: set[str] = set()  # the models whose chat framing this process has announced (a command may set up twice)


def note_chat_template(cfg: Config, tok) -> None:
    """Print chat_template_note once per model and process, on the main rank, where the template frames queries."""
    line = chat_template_note(cfg.task, tok) if template_lengths(cfg.task, tok) != (0, 0) else None
    if line and cfg.task.initial_model not in _NOTED and dist.is_main():
        _NOTED.add(cfg.task.initial_model)
        print(line, flush=True)


def setup_eval_task(cfg: Config, n_eval: int | None, default: int, flag: str = "--eval-queries") -> tuple[Task, int]:
    """setup_task with the held-out queries an evaluation of n_eval (None: up to `default`) needs set aside, and
    that evaluation's query count (`eval_query_count`)."""
    t = setup_task(cfg, n_eval or default)
    return t, eval_query_count(t, n_eval, flag, default)


def eval_query_count(t: Task, n: int | None, flag: str, default: int) -> int:
    """How many held-out queries an evaluation takes: n, refused by `check_heldout` where the task sets aside fewer;
    None (or 0): up to `default`, all of them where the task sets aside fewer (a small query dataset)."""
    if not n:
        return min(default, len(t.heldout_queries))
    check_heldout(t, n, flag)
    return n


def check_heldout(t: Task, n: int, flag: str) -> None:
    """A UserError naming `flag` where n held-out queries are asked for and the task sets aside fewer (the rest
    would be evaluated on fewer without a word)."""
    if len(t.heldout_queries) < n:
        raise UserError(f"{flag} {n}: task.query_dataset={t.cfg.task.query_dataset!r} sets aside only "
                        f"{len(t.heldout_queries)} held-out queries")  # fmt: skip
