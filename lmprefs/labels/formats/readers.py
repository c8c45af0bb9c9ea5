"""Reading label files into the store (the formats are described in `lmprefs.labels.formats`).

Token ids from "openai" files are stored as given (pads removed), so a reward model trained on them sees the
original's tokens; the decoded text is for people and other tokenizers (it shows U+FFFD where a sample ends inside
a multi-byte character). Caveat: two different id sequences that decode to the same text under the same query share
one sample row, and the first ids stored win.

An import validates and decodes the whole file before writing anything, then adds every row in one transaction:
any error rejects the whole file and leaves the store as it was. Errors are `LabelFileError`s that name the file,
the row (0-based index into a JSON list) or line (1-based, JSONL) and the field. Importing a file twice adds
nothing the second time. Rows repeated within a file stay separate items (they are separate training rows, as in
the original), while the same question answered by different labelers is one item (so agreement can be measured).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lmprefs.assets.tokenizers import gpt2_tokenizer
from lmprefs.config import label_type_shape
from lmprefs.data.hf_datasets import DatasetReadError, is_saved_dataset, saved_rows, split_spec
from lmprefs.data.summarize import comparison_query
from lmprefs.io.jsonl import JsonRowsError, json_rows
from lmprefs.labels.formats.shared import GPT2_PAD, GPT2_VOCAB, IMPORT_FORMATS, LabelFileError, sample_keys
from lmprefs.labels.formats.trl_pairs import pair_texts
from lmprefs.labels.store import SPLIT_NAME, ImportRow, LabelStore, check_ranking


@dataclass(frozen=True)
class ImportReport:
    path: str
    format: str
    label_types: tuple[str, ...]
    rows: int
    items_added: int
    items_present: int
    labels_added: int
    labels_present: int


def _load(path: Path) -> tuple[str, list[tuple[str, object]]]:
    """("json" | "jsonl" | "dataset", [(where, row), ...]) where `where` is "row 17" or "line 18". A save_to_disk
    directory (`DIR`, or `DIR:SPLIT` for a DatasetDict) holds rows as a JSONL file does (a TRL preference dataset,
    say)."""
    saved, parts = split_spec(str(path))
    try:
        if is_saved_dataset(saved):
            return "dataset", saved_rows(saved, parts, str(path))
        return json_rows(path)
    except (JsonRowsError, DatasetReadError) as e:
        raise LabelFileError(str(e)) from e


def detect_format(path: str | Path) -> str:
    """ "openai" for a JSON list; for JSONL, "pairs" if the first row has `chosen`, "comparisons" if `samples`."""
    path = Path(path)
    return _detect(path, *_load(path))


def _detect(path: Path, kind: str, rows: list) -> str:
    if kind == "json":
        return "openai"
    first = rows[0][1] if rows else None
    if isinstance(first, dict) and "chosen" in first:
        return "pairs"
    if isinstance(first, dict) and "samples" in first:
        return "comparisons"
    if isinstance(first, dict) and "summaries" in first:
        return "summarize"
    if isinstance(first, dict) and "score" in first and "prompt" in first:
        return "scores"
    expected = ", ".join(IMPORT_FORMATS)
    raise LabelFileError(f"{path.name}: cannot tell the format (expected {expected}); name the format (--format on "
                         "the command line, format= in Python)")  # fmt: skip


def _field(name: str, where: str, row: object, key: str, types: type | tuple[type, ...], what: str):
    if not isinstance(row, dict):
        raise LabelFileError(f"{name} {where}: expected an object, got {type(row).__name__}")
    if key not in row:
        raise LabelFileError(f"{name} {where}: missing field {key!r}")
    v = row[key]
    if isinstance(v, bool) or not isinstance(v, types):
        raise LabelFileError(f"{name} {where}: field {key!r} = {v!r:.60} is not {what}")
    return v


def _label(name: str, where: str, row: dict, label_type: str) -> dict:
    value_field, n = label_type_shape(label_type)
    if value_field == "ranking":
        ranking = _field(name, where, row, "ranking", list, "a list of sample indices, best first")
        try:
            check_ranking(ranking, n, f"{name} {where}")
        except ValueError as e:
            raise LabelFileError(str(e)) from None
        return {"ranking": ranking}
    if value_field == "best":
        v = _field(name, where, row, "best", int, "an integer")
    else:
        v = _field(name, where, row, value_field, (int, float), "a number")
    if value_field == "best" and not 0 <= v < n:
        raise LabelFileError(f"{name} {where}: field 'best' = {v} is out of range 0..{n - 1}")
    if not math.isfinite(v):
        raise LabelFileError(f"{name} {where}: field {value_field!r} = {v} is not finite")
    return {value_field: v}


def _tokens(name: str, where: str, row: dict, key: str) -> list[int]:
    ids = _field(name, where, row, key, list, "a list of GPT-2 token ids")
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or not (0 <= t < GPT2_VOCAB or t == GPT2_PAD):
            raise LabelFileError(
                f"{name} {where}: field {key!r} token {j} = {t!r} is outside the GPT-2 vocabulary "
                f"[0, {GPT2_VOCAB}) and is not the pad id {GPT2_PAD}"
            )
    return [t for t in ids if t != GPT2_PAD]  # the original masks pads wherever they are


def _openai_rows(name, rows, label_type, labeler, tokenizer, tokenizer_name) -> list[dict]:
    if label_type is None and rows and isinstance(rows[0][1], dict):
        first = rows[0][1]
        if "best" in first:
            label_type = f"best_of_{sum(bool(re.fullmatch(r'sample[0-9]+', k)) for k in first)}"
        else:
            label_type = {"score": "scalar_rating", "difference": "scalar_compare"}.get(
                next((k for k in ("score", "difference") if k in first), ""), ""
            )
    try:
        label_type_shape(label_type or "")
    except ValueError as e:
        raise LabelFileError(f"{name} row 0: no label type from fields best/score/difference ({e})") from None
    keys = sample_keys(label_type)
    parsed, seqs = [], []
    for where, row in rows:
        query = _tokens(name, where, row, "query")
        extra = sorted(k for k in row if re.fullmatch(r"sample\d*", k) and k not in keys)
        if extra:
            raise LabelFileError(
                f"{name} {where}: field {extra[0]!r} is not a {label_type} field (expected {', '.join(keys)})"
            )
        samples = [_tokens(name, where, row, k) for k in keys]
        parsed.append(
            dict(
                label_type=label_type,
                labeler=labeler,
                **_label(name, where, row, label_type),
                query_tokens=query,
                sample_tokens=samples,
                tokenizer=tokenizer_name,
            )
        )
        seqs += [query, *samples]
    texts = iter(tokenizer.batch_decode(seqs, clean_up_tokenization_spaces=False) if seqs else [])
    for r in parsed:
        r["query"], r["samples"] = next(texts), [next(texts) for _ in keys]
    return parsed


def _check_pair(name, where, prompt: str, chosen: str, rejected: str) -> None:
    """A pair that says which of two different, non-empty responses is better; anything else teaches nothing (or
    worse) and is refused with the file."""
    for key, text in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if "\0" in text:
            raise LabelFileError(f"{name} {where}: field {key!r} holds a NUL character")
    for key, text in (("chosen", chosen), ("rejected", rejected)):
        if not text.strip():
            raise LabelFileError(f"{name} {where}: field {key!r} is empty")
    if chosen == rejected:
        raise LabelFileError(f"{name} {where}: fields 'chosen' and 'rejected' are the same text, a pair that prefers "
                             "nothing")  # fmt: skip


def _text_rows(name, fmt, rows, label_type, labeler) -> list[dict]:
    out = []
    for where, row in rows:
        if fmt == "pairs":
            strs = pair_texts(name, where, row)
            _check_pair(name, where, *strs)
            r = dict(query=strs[0], samples=strs[1:], label_type="best_of_2", best=0, labeler=labeler)
        else:
            query = _field(name, where, row, "query", str, "a string")
            samples = _field(name, where, row, "samples", list, "a list of strings")
            if not all(isinstance(s, str) for s in samples):
                raise LabelFileError(f"{name} {where}: field 'samples' must hold only strings")
            if any("\0" in s for s in (query, *samples)):
                raise LabelFileError(f"{name} {where}: a text holds a NUL character")
            given = [k for k in ("best", "ranking", "score", "difference") if k in row]
            if len(given) != 1:
                raise LabelFileError(f"{name} {where}: needs exactly one of fields 'best', 'ranking', 'score', "
                                     "'difference'")  # fmt: skip
            lt = {"best": f"best_of_{len(samples)}", "ranking": f"ranking_{len(samples)}", "score": "scalar_rating",
                  "difference": "scalar_compare"}[given[0]]  # fmt: skip
            who = _field(name, where, row, "labeler", str, "a string") if "labeler" in row else labeler
            r = dict(query=query, samples=samples, label_type=lt, labeler=who)
            if "confidence" in row:
                r["confidence"] = _field(name, where, row, "confidence", int, "an integer")
                if r["confidence"] not in (1, 2, 3):
                    raise LabelFileError(f"{name} {where}: field 'confidence' = {r['confidence']} is not 1, 2 or 3")
            if label_type is None:
                try:
                    label_type_shape(lt)
                except ValueError:
                    raise LabelFileError(
                        f"{name} {where}: field 'samples' has {len(samples)} samples, too few for a {given[0]!r} label"
                    ) from None
            r.update(_label(name, where, row, lt if label_type is None else label_type))
        if label_type is not None and r["label_type"] != label_type:
            n = label_type_shape(label_type)[1]
            raise LabelFileError(
                f"{name} {where}: field 'samples' has {len(r['samples'])} samples, {label_type} needs {n}"
            )
        out.append(r)
    return out


def _summarize_rows(name, rows, label_type) -> list[dict]:
    if label_type not in (None, "best_of_2"):
        raise LabelFileError(f"{name}: summarize comparisons are best_of_2 questions, not label_type={label_type!r}")
    out = []
    for where, row in rows:
        info = _field(name, where, row, "info", dict, "an object")
        query = comparison_query(info)
        if query is None:
            raise LabelFileError(f"{name} {where}: field 'info' has neither a 'post' nor an 'article' string")
        summaries = _field(name, where, row, "summaries", list, "a list of 2 summaries")
        if len(summaries) != 2:
            raise LabelFileError(f"{name} {where}: field 'summaries' has {len(summaries)} summaries, not 2")
        texts = [_field(name, f"{where} summaries[{i}]", s, "text", str, "a string") for i, s in enumerate(summaries)]
        choice = _field(name, where, row, "choice", int, "an integer")
        if not 0 <= choice <= 1:
            raise LabelFileError(f"{name} {where}: field 'choice' = {choice} is out of range 0..1")
        worker = _field(name, where, row, "worker", str, "a string")
        if not worker.strip() or worker != worker.strip() or len(worker) > 100:
            raise LabelFileError(f"{name} {where}: field 'worker' = {worker!r:.60} is not a labeler name (1-100 "
                                 "characters without surrounding spaces)")  # fmt: skip
        split = _field(name, where, row, "split", str, "a string")
        if not re.fullmatch(SPLIT_NAME, split):
            raise LabelFileError(f"{name} {where}: field 'split' = {split!r:.60} is not a split name (1-64 letters, "
                                 "digits, '_' or '-')")  # fmt: skip
        out.append(dict(query=query, samples=texts, label_type="best_of_2", best=choice, labeler=worker,
                        source=f"import:{name}#{split}"))  # fmt: skip
    return out


def _score_rows(name, rows, label_type, labeler) -> list[dict]:
    if label_type not in (None, "scalar_rating"):
        raise LabelFileError(f"{name}: per-response scores are scalar_rating questions, not label_type={label_type!r}")
    out = []
    for where, row in rows:
        key = "completion" if isinstance(row, dict) and "completion" in row and "response" not in row else "response"
        prompt = _field(name, where, row, "prompt", str, "a string")
        response = _field(name, where, row, key, str, "a string")
        who = _field(name, where, row, "labeler", str, "a string") if "labeler" in row else labeler
        out.append(dict(query=prompt, samples=[response], label_type="scalar_rating", labeler=who,
                        **_label(name, where, row, "scalar_rating")))  # fmt: skip
    return out


def import_file(
    store: LabelStore,
    path: str | Path,
    *,
    format: str = "auto",
    labeler: str = "import",
    tokenizer=None,
    tokenizer_name: str | None = None,
    label_type: str | None = None,
    limit: int | None = None,
) -> ImportReport:
    """Validate, decode and import a whole label file atomically (see the module docstring).

    tokenizer: for "openai" files the decoder (default: the GPT-2 BPE from lmprefs.assets, stored as "gpt2");
        for text files, optional: if given, token ids are stored too, under `tokenizer_name` (default: the last
        part of its `name_or_path`).
    label_type: expected label type of every row (default: read from the rows).
    limit: import only the first `limit` rows, like the original's `labels.num_train`; fewer rows is an error.
    """
    path = Path(path)
    if format not in ("auto", *IMPORT_FORMATS):
        raise ValueError(f"format={format!r} must be 'auto' or one of {IMPORT_FORMATS}")
    kind, rows = _load(path)
    if not rows:  # with a format given, an empty file imported "0 rows" and created the store
        raise LabelFileError(f"{path.name}: holds no rows to import")
    fmt = _detect(path, kind, rows) if format == "auto" else format
    if fmt == "pairs" and label_type not in (None, "best_of_2"):
        raise ValueError(f"pairs files hold best_of_2 questions, not label_type={label_type!r}")
    if (kind == "json") != (fmt == "openai"):
        raise LabelFileError(f"{path.name}: a {fmt} file must be {'a JSON list' if fmt == 'openai' else 'JSONL'}"
                             f"{' (or a save_to_disk directory)' if fmt != 'openai' else ''}")
    if limit is not None and len(rows) < limit:
        raise LabelFileError(f"{path.name}: has {len(rows)} rows, fewer than limit={limit}")
    if fmt == "openai":
        if tokenizer is None:
            tokenizer, tokenizer_name = gpt2_tokenizer(), tokenizer_name or "gpt2"
        parsed = _openai_rows(path.name, rows, label_type, labeler, tokenizer, tokenizer_name or "gpt2")
    else:
        if fmt == "summarize":
            parsed = _summarize_rows(path.name, rows, label_type)
        elif fmt == "scores":
            parsed = _score_rows(path.name, rows, label_type, labeler)
        else:
            parsed = _text_rows(path.name, fmt, rows, label_type, labeler)
        if tokenizer is not None:
            tokenizer_name = tokenizer_name or Path(getattr(tokenizer, "name_or_path", "") or "").name
            if not tokenizer_name:
                raise ValueError("pass tokenizer_name=... to name the tokenizer the ids are stored under")
            texts = [t for r in parsed for t in [r["query"], *r["samples"]]]
            ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
            for r in parsed:
                r["query_tokens"], r["sample_tokens"] = next(ids), [next(ids) for _ in r["samples"]]
                r["tokenizer"] = tokenizer_name
    parsed = parsed[:limit] if limit is not None else parsed
    # k-th repeat of the same question by the same labeler -> its own item (key "dup{k}"); a re-import recomputes
    # the same keys, so it finds every item again
    seen: Counter = Counter()
    import_rows = []
    for r in parsed:
        k = seen[(r["label_type"], r["query"], tuple(r["samples"]), r["labeler"])]
        seen[(r["label_type"], r["query"], tuple(r["samples"]), r["labeler"])] += 1
        r.setdefault("source", f"import:{path.name}")
        import_rows.append(ImportRow(key=f"dup{k}" if k else None, **r))
    try:
        counts = store.import_batch(import_rows)
    except ValueError as e:  # e.g. a labeler's different answer to an item already in the store
        raise LabelFileError(f"{path.name}: {e}") from e
    return ImportReport(
        str(path),
        fmt,
        tuple(sorted({r.label_type for r in import_rows})),
        counts.rows,
        counts.items_added,
        counts.items_present,
        counts.labels_added,
        counts.labels_present,
    )
