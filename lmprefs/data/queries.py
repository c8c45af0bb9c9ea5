"""Query datasets and the query stream (language/datasets.py:tf_dataset and lm_tasks.py @cbfd210).

A dataset is a list of texts: `austen` (the offline asset), `lee-news` (300 ABC news articles, an offline asset),
`bundled` (a few KB of Austen shipped in the package), a prompt file of the user's (`.txt`, `.jsonl`, `.json` or
`.csv`, read by `lmprefs.data.prompt_files`; `FILE:FIELD` names the field or column), a directory written by
Hugging Face `save_to_disk` (`DIR[:SPLIT][:FIELD]`, offline), the original's CNN/DM `.story` files (a file or a
directory of them; read by `lmprefs.data.summarize`), or `hf:NAME[:SPLIT[:FIELD]]` from the hub.
Each text becomes a query as in the original: cut after the first start_text, truncated to query_length, cut after
the last end_text, right-padded with PAD; texts with no start or end token are skipped. That cropping was made for
book passages and articles (the books tasks start a query after a '.' and end it at one): it applies to the built-in
corpora, hub datasets and CNN/DM stories, and not to a local prompt file or saved dataset, whose texts are a user's
own prompts and are used as given (cut to query_length only) unless task.crop_local_files asks for it (`crops`).
A text that already ends in task.query_suffix loses it there, as the suffix follows the padding (`without_suffix`).
"""

from __future__ import annotations

import hashlib
import weakref
from pathlib import Path

import torch

from lmprefs.assets.corpora import austen_passages, bundled_passages, lee_news_articles
from lmprefs.config import TaskConfig
from lmprefs.data.chat import task_frame
from lmprefs.data.hf_datasets import (
    DatasetReadError,
    column_texts,
    is_saved_dataset,
    load_hub,
    load_saved,
    saved_parts,
    split_spec,
)
from lmprefs.data.prompt_files import SUFFIXES, prompt_file_texts
from lmprefs.data.summarize import story_texts
from lmprefs.data.tasks import PAD
from lmprefs.errors import UserError

BUILTIN = ("austen", "lee-news", "bundled")


class QueryDataError(UserError):
    """A query dataset that cannot be read or yields no queries; the message names it and the fix."""


def load_texts(spec: str) -> list[str]:
    """The raw texts of a query dataset (see the module docstring for the accepted specs)."""
    if spec == "austen":
        return [p["text"] for p in austen_passages()]
    if spec == "lee-news":
        return lee_news_articles()
    if spec == "bundled":
        return bundled_passages()
    what = f"task.query_dataset={spec!r}"
    p, parts = split_spec(spec)
    try:
        if spec.startswith("hf:"):
            return _hf_texts(spec, what)
        if is_saved_dataset(p):
            return _saved_texts(p, parts, what)
    except DatasetReadError as e:
        raise QueryDataError(str(e)) from None
    if p.is_dir() and p.suffix in SUFFIXES:
        raise QueryDataError(f"task.query_dataset {spec}: is a directory, expected a file")
    if p.is_dir() or p.suffix == ".story":  # CNN/DM: one .story file or a directory of them
        return story_texts(p)
    if not p.is_file():
        raise QueryDataError(f"{what}: no such file (expected austen, lee-news, bundled, a .txt, .jsonl, .json or "
                             ".csv file, a save_to_disk directory, CNN/DM .story files, or hf:NAME)")  # fmt: skip
    if len(parts) > 1:
        raise QueryDataError(f"{what}: a file takes at most one ':FIELD' after its path")
    return prompt_file_texts(p, parts[0] if parts else None, what, QueryDataError)


def _saved_texts(path: Path, parts: list[str], what: str) -> list[str]:
    """The texts of a save_to_disk directory: DIR[:FIELD] for a Dataset, DIR:SPLIT[:FIELD] for a DatasetDict."""
    split, rest = saved_parts(path, parts, what, most=1)
    return column_texts(load_saved(path, split, what), rest[0] if rest else None, what)


def _hf_texts(spec: str, what: str) -> list[str]:
    """hf:NAME[:SPLIT[:FIELD]] (split default train); hf:DIR of a saved dataset reads it as DIR[:SPLIT][:FIELD]."""
    name, *parts = spec[3:].split(":")
    if is_saved_dataset(Path(name).expanduser()):
        return _saved_texts(Path(name).expanduser(), parts, what)
    if len(parts) > 2 or not name:
        raise DatasetReadError(f"{what}: expected hf:NAME[:SPLIT[:FIELD]]")
    split = parts[0] if parts and parts[0] else "train"
    return column_texts(load_hub(name, split, what), parts[1] if len(parts) > 1 else None, what)


def crops(task: TaskConfig) -> bool:
    """Whether task.start_text and task.end_text crop the texts of task.query_dataset: always for the built-in
    corpora, hub datasets and CNN/DM .story files, which is how the original made queries from its data; for a
    user's own prompts (a local .txt, .jsonl, .json or .csv file, a saved dataset directory), only when
    task.crop_local_files says so, so that a preset made for book passages does not cut them at their first '.'."""
    spec = task.query_dataset
    if spec in BUILTIN:
        return True
    if spec.startswith("hf:"):
        return not is_saved_dataset(Path(spec[3:].split(":")[0]).expanduser()) or task.crop_local_files
    p, _ = split_spec(spec)
    if is_saved_dataset(p):
        return task.crop_local_files
    return p.is_dir() or p.suffix == ".story" or task.crop_local_files


def encode_query(tokenizer, text: str, task: TaskConfig, start_token: int | None, end_token: int | None):
    """A query's tokens (unpadded, <= query_length) or None if the text has no start or end token."""
    return crop_query(tokenizer(text, add_special_tokens=False).input_ids, task, start_token, end_token)


def crop_query(tokens: list[int], task: TaskConfig, start_token: int | None, end_token: int | None):
    """A text's tokens cut to the query: after the start token, at most query_length, through the last end token;
    None if a start or end token is asked for and missing."""
    if start_token is not None:
        if start_token not in tokens:
            return None
        first = tokens.index(start_token) + 1
        if first < len(tokens):
            tokens = tokens[first:]
    tokens = tokens[: task.query_length]
    if end_token is not None:
        if end_token not in tokens:
            return None
        tokens = tokens[: len(tokens) - tokens[::-1].index(end_token)]
    return tokens or None


def without_suffix(text: str, suffix: str) -> str:
    """A text without the task's query_suffix at its end (trailing whitespace aside): prompts made for the task
    (trl-lib/tldr's end in '\n\nTL;DR:') already carry it, and format_queries puts it after the padded query once."""
    end = suffix.rstrip()
    if not end.strip() or not text.rstrip().endswith(end):
        return text
    return text.rstrip()[: -len(end)]


def single_token(tokenizer, text: str | None, name: str) -> int | None:
    if text is None:
        return None
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) != 1:
        raise QueryDataError(f"task.{name}={text!r} must encode to exactly one token, got {ids}")
    return ids[0]


# queries built per tokenizer object, keyed by the texts' digest and the task's fields that shape a query: an
# experiment's arms, a sweep's runs and an evaluation after training build the same queries in one process
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
KEPT_BYTES = 64 << 20
"""Largest query tensor kept for the next build (bounded by texts x query_length x 8 bytes before building): a
corpus of news articles or posts would be held twice, the kept tensor and the caller's copy."""


def build_queries(texts: list[str], tokenizer, task: TaskConfig, source: str = "") -> torch.Tensor:
    """All usable queries as a [N, query_length] tensor right-padded with PAD (cropped as `crops` says)."""
    crop = crops(task)
    if len(texts) * task.query_length * 8 > KEPT_BYTES:
        return _build_queries(texts, tokenizer, task, crop, source)
    h = hashlib.blake2b(digest_size=16)
    for t in texts:
        h.update(t.encode() + b"\0")
    key = (h.digest(), crop, task.start_text, task.end_text, task.query_suffix, task.query_length)
    built = _BUILT.setdefault(tokenizer, {})
    if key not in built:
        if len(built) >= 4:
            built.pop(next(iter(built)))
        built[key] = _build_queries(texts, tokenizer, task, crop, source)
    return built[key].clone()


def _build_queries(texts: list[str], tokenizer, task: TaskConfig, crop: bool, source: str) -> torch.Tensor:
    start = single_token(tokenizer, task.start_text, "start_text") if crop else None
    end = single_token(tokenizer, task.end_text, "end_text") if crop else None
    rows = []
    # one call for all texts: the tokenizer's per-call overhead, not the BPE, is most of the cost of short texts
    stripped = [without_suffix(t, task.query_suffix) for t in texts]
    encoded = tokenizer(stripped, add_special_tokens=False).input_ids if texts else []
    for ids in encoded:
        tokens = crop_query(ids, task, start, end)
        if tokens:
            rows.append(tokens + [PAD] * (task.query_length - len(tokens)))
    if not rows:
        need = (f"each needs start_text={task.start_text!r} and end_text={task.end_text!r}" if crop else
                "all are empty")  # fmt: skip
        why = f"{len(texts)} texts; {need}" if texts else "it holds no texts"
        raise QueryDataError(f"task.query_dataset={source or task.query_dataset!r} yields no queries ({why})")
    return torch.tensor(rows, dtype=torch.long)


class QueryStream:
    """Batches of queries in a deterministic order per seed, sharded by rank; its state resumes exactly.

    Each epoch draws a fresh permutation from (seed, epoch); rank r of `world` takes every world-th query, fixing
    the original's bug where every rank shuffled identically (N-details blog, detail 6.1).
    """

    def __init__(self, queries: torch.Tensor, seed: int, rank: int = 0, world: int = 1):
        self.queries, self.seed, self.rank, self.world = queries, seed, rank, world
        self.epoch, self.pos = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(len(self.queries), generator=g)[self.rank :: self.world]

    def next(self, n: int) -> torch.Tensor:
        out = []
        while n > 0:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation()
            take = self._order[self.pos : self.pos + n]
            out.append(take)
            self.pos += len(take)
            n -= len(take)
        return self.queries[torch.cat(out)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed}

    def load_state_dict(self, s: dict) -> None:
        self.epoch, self.pos, self.seed = s["epoch"], s["pos"], s["seed"]
        self._order = self._permutation()


def split_heldout(queries: torch.Tensor, n_heldout: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, heldout) by a fixed permutation, so evaluation queries are never trained on."""
    order = torch.randperm(len(queries), generator=torch.Generator().manual_seed(seed))
    return queries[order[n_heldout:]], queries[order[:n_heldout]]


def task_queries(task: TaskConfig, tokenizer, max_positions: int, n_heldout: int = 0):
    """(train, heldout, prefix, suffix): the task's queries split by a fixed permutation, checked against the
    model's context (query + prefix + suffix + response must fit)."""

    prefix, suffix = task_frame(task, tokenizer)
    total = len(prefix) + task.query_length + len(suffix) + task.response_length
    if total > max_positions:
        raise QueryDataError(f"task.query_length={task.query_length} + prefix/suffix ({len(prefix) + len(suffix)}) + "
                             f"task.response_length={task.response_length} = {total} tokens exceeds the model's "
                             f"context of {max_positions}; lower task.query_length")  # fmt: skip
    queries = build_queries(load_texts(task.query_dataset), tokenizer, task)
    n_heldout = min(n_heldout, len(queries) // 2)
    train, heldout = split_heldout(queries, n_heldout)
    return train, heldout, prefix, suffix
