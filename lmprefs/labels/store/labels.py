"""Judgements: recording a labeler's label, skip or flag on an item, importing labeled rows in one transaction, and
reading labels back for training and agreement. Methods of `StoreBase` (each takes the store first)."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, Unpack

from lmprefs.config import label_type_shape
from lmprefs.labels.store.labelers import labeler_id
from lmprefs.labels.store.records import (
    KINDS,
    Answer,
    DuplicateLabelError,
    Example,
    ImportCounts,
    ImportRow,
    check_confidence,
    check_label_value,
)
from lmprefs.labels.store.schema import CHOICE_ITEM

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase


class _Importing(Protocol):
    """What import_batch uses of a LabelStore (named here, not imported: the store's core binds this module)."""

    def add_item(self, *args: Any, **kwargs: Any) -> int: ...

    def add_label(self, *args: Any, **kwargs: Any) -> object: ...

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]: ...


class AnswerMeta(TypedDict, total=False):
    """How an answer was given, beside its value (`add_label`'s keyword arguments)."""

    note: str | None  # a skip's or flag's reason
    shown: list[int] | None  # display order: position p showed stored sample shown[p]
    seconds: float | None  # time on task
    confidence: int | None  # the labeler's, 1 (a guess) to 3 (sure), on a label only
    practice: bool  # given in onboarding: never trains a reward model, counts in no quality measure


def _check_answer(label_type: str, item_id: int, kind: str, value: dict, meta: AnswerMeta) -> int | None:
    """The checks of `add_label` on one answer; returns the `best` to store (a ranking's top choice)."""
    best, ranking = value["best"], value["ranking"]
    if kind == "label":
        check_label_value(label_type, best, value["score"], value["difference"], f"item {item_id}", ranking)
        best = ranking[0] if ranking is not None else best
    elif any(v is not None for v in value.values()):
        raise ValueError(f"a {kind} carries no value, got " + ", ".join(f"{k}={v}" for k, v in value.items()))
    confidence, seconds, shown = meta.get("confidence"), meta.get("seconds"), meta.get("shown")
    check_confidence(confidence, f"item {item_id}")
    if confidence is not None and kind != "label":
        raise ValueError(f"a {kind} carries no confidence, got confidence={confidence}")
    if seconds is not None and not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"seconds={seconds!r} must be a finite number >= 0")
    n = label_type_shape(label_type)[1]
    if shown is not None and sorted(shown) != list(range(n)):
        raise ValueError(f"shown={shown!r} must be an order of 0..{n - 1} for item {item_id}")
    return best


# the next position in the feed of answers (`answers_since`): a new answer and an answer changed by undo take it
_NEXT = "SELECT COALESCE(MAX(seq), 0) + 1 FROM labels"


def add_label(
    store: StoreBase,
    item_id: int,
    labeler: str,
    *,
    best: int | None = None,
    score: float | None = None,
    difference: float | None = None,
    ranking: list[int] | None = None,
    kind: str = "label",
    source: str = "",
    replace: bool = False,
    **meta: Unpack[AnswerMeta],
) -> int:
    """Record one judgement and return its id. `kind="skip"`/`"flag"` carry no value (a note, perhaps); a flag
    holds the item (it is no longer served) until an admin restores or retires it. A ranking_K label gives
    `ranking` (every stored sample once, best first); its top choice is stored as `best` too. `meta`: the note,
    display order, time on task and confidence (`AnswerMeta`).
    Raises DuplicateLabelError if `labeler` already answered this item, ValueError on an invalid value.
    `replace=True` (undo in the web app) overwrites this labeler's answer to the item instead, in the same
    transaction and the same row, so the item never holds two answers from one labeler; the row keeps the time of
    the first answer and the first answer itself (`first_kind`, `first_best`), which gold accuracy counts, and takes
    a new position in the feed of answers (`seq`), so a reader of `answers_since` is sent the change."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {KINDS}")
    if unknown := set(meta) - set(AnswerMeta.__annotations__):
        raise TypeError(f"add_label() got unexpected keyword arguments {sorted(unknown)}")
    with store._tx() as c:
        row = c.execute("SELECT label_type, want_labels FROM items WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            raise ValueError(f"no item with id {item_id}")
        label_type, want = row
        value = {"best": best, "score": score, "difference": difference, "ranking": ranking}
        best = _check_answer(label_type, item_id, kind, value, meta)
        lid = labeler_id(c, labeler)
        old = c.execute(
            "SELECT id, kind, best, score, difference FROM labels WHERE item_id = ? AND labeler_id = ?",
            (item_id, lid),
        ).fetchone()
        shown = meta.get("shown")
        order = None if ranking is None else json.dumps(ranking)
        values = (kind, best, score, difference, meta.get("note"), source, json.dumps(shown) if shown else None,
                  meta.get("seconds"), order, meta.get("confidence"), int(bool(meta.get("practice"))))  # fmt: skip
        if old and replace:
            # the row keeps its time (the undo window runs from the first answer, not from each change) and the
            # first answer (gold accuracy counts it); SET reads the row as it was before this statement
            c.execute(
                "UPDATE labels SET kind = ?, best = ?, score = ?, difference = ?, note = ?, source = ?, shown = ?,"
                " seconds = ?, ranking = ?, confidence = ?, practice = ?, first_kind = COALESCE(first_kind, kind),"
                " first_best = CASE WHEN first_kind IS NULL THEN best ELSE first_best END,"
                f" seq = ({_NEXT}) WHERE id = ?",
                (*values, old[0]),
            )
            label_id = old[0]
        elif old:
            raise DuplicateLabelError(
                f"labeler {labeler!r} already answered item {item_id} (label {old[0]}: kind={old[1]}, "
                f"best={old[2]}, score={old[3]}, difference={old[4]})"
            )
        elif replace:
            raise ValueError(f"labeler {labeler!r} has no answer to item {item_id} to replace")
        else:
            label_id = c.execute(
                "INSERT INTO labels (item_id, labeler_id, kind, best, score, difference, note, source, shown,"
                " seconds, ranking, confidence, practice, created, seq)"
                f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ({_NEXT}))",
                (item_id, lid, *values, time.time()),
            ).lastrowid
        _update_item(c, item_id, want, kind)
        return label_id


def _update_item(c, item_id: int, want: int, kind: str) -> None:
    """After an answer: the item's status from its labels, and its hold from its flags."""
    (done, flags) = c.execute(
        "SELECT COUNT(*) FILTER (WHERE kind = 'label'), COUNT(*) FILTER (WHERE kind = 'flag') FROM labels"
        " WHERE item_id = ?",
        (item_id,),
    ).fetchone()
    # a replaced answer can lower the count or take back the only flag: recompute the status; a flag holds
    # the item, and an undone last flag releases it (an admin's restore or retire stands otherwise)
    c.execute(
        "UPDATE items SET status = ?, hold = CASE WHEN hold = 'retired' THEN hold WHEN ? THEN 'flagged'"
        " WHEN hold = 'flagged' AND ? = 0 THEN NULL ELSE hold END WHERE id = ?",
        ("done" if done >= want else "pending", kind == "flag", flags, item_id),
    )


def import_batch(store: _Importing, rows: Iterable[ImportRow]) -> ImportCounts:
    """Add labeled rows in ONE transaction: all of them or, on any error, none. Re-importing a row is a no-op
    (the item exists and the labeler's identical label is counted as present); a *different* label by the same
    labeler raises DuplicateLabelError and rolls everything back."""
    counts = ImportCounts()
    with store._tx() as c:
        items_before = c.execute("SELECT COUNT(*) FROM items").fetchone()[0]
        for r in rows:
            counts.rows += 1
            item_id = store.add_item(  # the bound method: a test may stand in for it
                r.query,
                r.samples,
                source=r.source,
                label_type=r.label_type,
                key=r.key,
                tokenizer=r.tokenizer,
                query_tokens=r.query_tokens,
                sample_tokens=r.sample_tokens,
            )
            old = c.execute(
                "SELECT l.kind, l.best, l.score, l.difference, l.ranking, l.confidence FROM labels l"
                " JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = ? AND b.name = ?",
                (item_id, r.labeler),
            ).fetchone()
            ranking = None if r.ranking is None else json.dumps(r.ranking)
            best = r.ranking[0] if r.ranking else r.best
            if old is not None and old == ("label", best, r.score, r.difference, ranking, r.confidence):
                counts.labels_present += 1
                continue
            store.add_label(item_id, r.labeler, best=r.best, score=r.score, difference=r.difference,
                            ranking=r.ranking, confidence=r.confidence, source=r.source)  # fmt: skip
            counts.labels_added += 1
        counts.items_added = c.execute("SELECT COUNT(*) FROM items").fetchone()[0] - items_before
    counts.items_present = counts.rows - counts.items_added  # rows whose question was already there
    return counts


def labeled_examples(
    store: StoreBase, label_type: str = "best_of_4", *, since_id: int | None = None, tokenizer: str | None = None
) -> list[Example]:
    """Every `label` (not skips or flags, nor practice answers from onboarding) on items of `label_type`, oldest
    first; `since_id` keeps labels with a larger id (for online training). With `tokenizer`, attach the ids stored
    under that name (None if absent)."""
    # the labels wanted, then the samples of their items: two queries for the whole result, not one per item
    chosen = "SELECT l.id, l.item_id FROM labels l JOIN items i ON i.id = l.item_id"
    chosen += " WHERE l.kind = 'label' AND l.practice = 0 AND i.label_type = :type AND l.id > :since"
    args = {"tok": tokenizer, "type": label_type, "since": since_id or 0}
    with store.snapshot() as c:
        labels = c.execute(
            f"WITH chosen AS ({chosen}) SELECT l.id, l.item_id, b.name, q.text, l.best, l.score, l.difference,"
            " l.ranking, l.confidence, qt.ids FROM chosen JOIN labels l ON l.id = chosen.id"
            " JOIN labelers b ON b.id = l.labeler_id"
            " JOIN items i ON i.id = l.item_id JOIN queries q ON q.id = i.query_id"
            " LEFT JOIN query_tokens qt ON qt.query_id = q.id AND qt.tokenizer = :tok ORDER BY l.id",
            args,
        ).fetchall()
        samples: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
        for item_id, text, ids in c.execute(
            f"WITH chosen AS ({chosen}) SELECT x.item_id, s.text, st.ids FROM item_samples x"
            " JOIN samples s ON s.id = x.sample_id"
            " LEFT JOIN sample_tokens st ON st.sample_id = s.id AND st.tokenizer = :tok"
            " WHERE x.item_id IN (SELECT item_id FROM chosen) ORDER BY x.item_id, x.position",
            args,
        ):
            samples[item_id].append((text, ids))
    out = []
    for lid, item_id, name, query, best, score, difference, ranking, confidence, qids in labels:
        texts, ids = zip(*samples[item_id], strict=True)
        have = tokenizer is not None and qids is not None and None not in ids
        out.append(
            Example(
                lid,
                item_id,
                label_type,
                name,
                query,
                list(texts),
                best,
                score,
                difference,
                ranking=json.loads(ranking) if ranking else None,
                confidence=confidence,
                query_tokens=json.loads(qids) if have else None,
                sample_tokens=[json.loads(i) for i in ids] if have else None,
            )
        )
    return out


def has_answered(store: StoreBase, item_id: int, labeler: str) -> bool:
    """Whether `labeler` labeled, skipped or flagged item `item_id`."""
    sql = "SELECT 1 FROM labels l JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = ? AND b.name = ?"
    return store.connection().execute(sql, (item_id, labeler)).fetchone() is not None


def answer_counts(store: StoreBase, labeler_id: int) -> dict[str, int]:
    """{kind: n} of labeler `labeler_id`'s answers (not practice answers), for the kinds they gave at least once."""
    sql = "SELECT kind, COUNT(*) FROM labels WHERE labeler_id = ? AND practice = 0 GROUP BY kind"
    return dict(store.connection().execute(sql, (labeler_id,)))


def answers_since(
    store: StoreBase, since_id: int = 0, *, limit: int = 1000, label_type: str | None = None
) -> list[Answer]:
    """Labels, skips and flags at a feed position above `since_id` (on items of `label_type`, or any), in feed
    order; not practice answers from onboarding. An answer is placed when given and placed again at the end when an
    undo changes it (same id), so a reader who pages by position is sent every change; a row's position equals its
    id until an answer in the store is changed."""
    rows = store.connection().execute(
        "SELECT l.id, l.item_id, b.name, l.kind, l.best, l.score, l.difference, l.note, l.source, l.created,"
        " l.shown, l.seconds, l.ranking, l.confidence, l.seq FROM labels l JOIN labelers b ON b.id = l.labeler_id"
        " JOIN items i ON i.id = l.item_id"
        " WHERE l.seq > ? AND l.practice = 0 AND (? IS NULL OR i.label_type = ?) ORDER BY l.seq LIMIT ?",
        (since_id, label_type, label_type, limit),
    )
    return [Answer(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], json.loads(r[10]) if r[10] else None,
                   r[11], json.loads(r[12]) if r[12] else None, r[13], r[14]) for r in rows]  # fmt: skip


def last_answer(store: StoreBase, labeler_id: int, *, source: str) -> tuple[int, int, float] | None:
    """(label id, item id, time) of labeler `labeler_id`'s latest answer from `source` on a served (best_of_N or
    ranking_K) item; the time
    is when it was first given (an undo's new answer keeps it)."""
    return store.connection().execute(
        "SELECT l.id, l.item_id, l.created FROM labels l JOIN items i ON i.id = l.item_id WHERE l.labeler_id = ?"
        f" AND l.source = ? AND {CHOICE_ITEM} ORDER BY l.created DESC, l.id DESC LIMIT 1",
        (labeler_id, source),
    ).fetchone()
