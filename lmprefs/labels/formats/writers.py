"""Writing the store's labels to a file in one of the formats described in `lmprefs.labels.formats`."""

from __future__ import annotations

import json
from pathlib import Path

from lmprefs.assets.tokenizers import gpt2_tokenizer
from lmprefs.config import label_type_shape
from lmprefs.io.atomic import atomic_write_text
from lmprefs.labels.formats.shared import FORMATS, GPT2_PAD, LabelFileError, sample_keys
from lmprefs.labels.store import LabelStore


def _pad(ids: list[int], length: int, what: str) -> list[int]:
    if len(ids) > length:
        raise ValueError(f"a {what} has {len(ids)} tokens, more than {what}_length={length}")
    return ids + [GPT2_PAD] * (length - len(ids))


_CHOICES = ("best", "ranking")  # the label fields a TRL pair can come from


def _pairs(ex, pairs: str) -> list[dict]:
    """TRL rows of one best_of_N or ranking_K example (see the module docstring of `formats`)."""
    if ex.ranking is not None:  # every implied pair, each sample against every one ranked below it
        ranked = [ex.samples[i] for i in ex.ranking]
        return [{"prompt": ex.query, "chosen": a, "rejected": b}
                for k, a in enumerate(ranked) for b in ranked[k + 1 :] if a != b]  # fmt: skip
    assert ex.best is not None  # labeled best-of-N examples all have one
    chosen = ex.samples[ex.best]
    rejected = list(dict.fromkeys(s for s in ex.samples if s != chosen))  # distinct, in order
    return [{"prompt": ex.query, "chosen": chosen, "rejected": r}
            for r in (rejected[:1] if pairs == "first" else rejected)]  # fmt: skip


def export_file(
    store: LabelStore,
    path: str | Path,
    *,
    format: str,
    label_type: str | None = None,
    pairs: str = "first",
    tokenizer=None,
    query_length: int | None = None,
    response_length: int | None = None,
) -> int:
    """Write the store's labels (not skips or flags) to `path` atomically; returns the number of rows written.

    "openai": one label type (default best_of_4; a ranking_K as best_of_K, by its top choice); stored "gpt2" ids are
        used, texts without them are encoded with `tokenizer` (default: the GPT-2 BPE); right-padded with 50259 to
        `query_length`/`response_length` (default: the longest in the file).
    "pairs": best_of_N and ranking_K labels (`label_type` or all such types); `pairs` = "first" | "all" (module
        docstring); a ranking gives every pair it implies.
    "comparisons": every label type, or only `label_type`.
    """
    path = Path(path)
    if format not in FORMATS or pairs not in ("first", "all"):
        raise ValueError(f"format={format!r} must be one of {FORMATS}; pairs={pairs!r} must be 'first' or 'all'")
    if format == "pairs" and label_type and label_type_shape(label_type)[0] not in _CHOICES:
        raise LabelFileError(f"the pairs format holds best_of_N and ranking labels, not {label_type}; export those "
                             "as comparisons (.jsonl)")  # fmt: skip
    types = [label_type] if label_type else store.label_types()
    if format == "openai":
        types = [label_type or "best_of_4"]
    elif format == "pairs":
        types = [t for t in types if label_type_shape(t)[0] in _CHOICES]
    out: list[dict] = []
    for lt in types:
        value_field = label_type_shape(lt)[0]
        for ex in store.labeled_examples(lt, tokenizer="gpt2" if format == "openai" else None):
            value = getattr(ex, value_field)
            if format == "comparisons":
                row = {"query": ex.query, "samples": ex.samples, value_field: value, "labeler": ex.labeler}
                out.append(row if ex.confidence is None else {**row, "confidence": ex.confidence})
            elif format == "pairs":
                out += _pairs(ex, pairs)
            else:
                if ex.query_tokens is None:
                    if tokenizer is None:
                        tokenizer = gpt2_tokenizer()
                    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in [ex.query, *ex.samples]]
                else:
                    assert ex.sample_tokens is not None  # stored with the query's tokens
                    enc = [ex.query_tokens, *ex.sample_tokens]
                field = "best" if value_field == "ranking" else value_field  # a ranking as best-of-K: its top
                value = ex.best if value_field == "ranking" else value
                out.append({"query": enc[0], **dict(zip(sample_keys(lt), enc[1:], strict=True)), field: value})
    others = [t for t in store.label_types() if t not in types]
    if not out and others:  # the store holds questions of other types: an empty file would hide them
        fit = [t for t in others if format != "pairs" or label_type_shape(t)[0] in _CHOICES]
        hint = (f"; export them with label_type {fit[0]} (--label-type)" if fit
                else f"; the {format} format holds only best_of_N labels")  # fmt: skip
        raise LabelFileError(f"the store holds no {' or '.join(types) or 'best_of_N'} labels to export as {format} "
                             f"(its questions are {', '.join(others)}){hint}")  # fmt: skip
    if format == "openai":
        keys = sample_keys(types[0])
        ql = query_length or max((len(r["query"]) for r in out), default=0)
        rl = response_length or max((len(r[k]) for r in out for k in keys), default=0)
        for row in out:
            row["query"] = _pad(row["query"], ql, "query")
            row.update({k: _pad(row[k], rl, "response") for k in keys})
        atomic_write_text(path, json.dumps(out))
    else:
        atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    return len(out)
