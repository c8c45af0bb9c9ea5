"""Drift anchors: a fixed set of items every labeler answers again once per interval of their work, so the admin
can see whether a labeler's judgement drifts (do they still answer an anchor as they did before?) and whether their
gold accuracy holds over time. Methods of `StoreBase` (each takes the store first).

A labeler's interval is the number of their labels (not skips, flags or practice answers) divided by `anchor_every`,
rounded down: interval 0 is their first `anchor_every` labels, and the anchors come due again in each later one.
Anchor answers live in their own table, one per (anchor, labeler, interval): they never train a reward model.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from lmprefs.config import label_type_shape
from lmprefs.labels.store.records import DuplicateLabelError, check_label_value
from lmprefs.labels.store.schema import CHOICE_ITEM, FIRST_BEST, FIRST_KIND

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase


def anchor_every(store: StoreBase) -> int:
    """Labels per drift interval (0: no drift anchors are served)."""
    row = store.connection().execute("SELECT value FROM meta WHERE key = 'anchor_every'").fetchone()
    return int(row[0]) if row else 0


def set_anchor_every(store: StoreBase, every: int) -> None:
    if isinstance(every, bool) or not isinstance(every, int) or not 0 <= every <= 100_000:
        raise ValueError(f"anchor interval={every!r} must be a whole number of labels 0..100000 (0: off)")
    with store._tx() as c:
        c.execute("INSERT OR REPLACE INTO meta VALUES ('anchor_every', ?)", (str(every),))


def set_anchor(store: StoreBase, item_id: int, anchor: bool = True) -> None:
    """Make `item_id` (a best_of_N or ranking_K item) a drift anchor, or an ordinary item again."""
    with store._tx() as c:
        row = c.execute("SELECT label_type FROM items WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            raise ValueError(f"no item with id {item_id}")
        if label_type_shape(row[0])[0] not in ("best", "ranking"):
            raise ValueError(f"item {item_id} is a {row[0]} question; drift anchors are best-of-N or rankings")
        c.execute("UPDATE items SET anchor = ? WHERE id = ?", (int(anchor), item_id))


def labeler_interval(store: StoreBase, labeler_id: int, every: int) -> int:
    """The interval labeler `labeler_id` is in now."""
    sql = "SELECT COUNT(*) FROM labels WHERE labeler_id = ? AND kind = 'label' AND practice = 0"
    return store.connection().execute(sql, (labeler_id,)).fetchone()[0] // every


# the anchors served: not held (a flag holds an anchor as it holds any item, until an admin serves it again)
_SERVED = f"i.anchor = 1 AND {CHOICE_ITEM} AND i.hold IS NULL"


def due_anchors(store: StoreBase, labeler_id: int, interval: int) -> list[int]:
    """The anchors (not held) labeler `labeler_id` has not answered in `interval`, by id."""
    sql = (
        f"SELECT i.id FROM items i WHERE {_SERVED} AND NOT EXISTS"
        " (SELECT 1 FROM anchor_answers a WHERE a.item_id = i.id AND a.labeler_id = ? AND a.interval = ?)"
        " ORDER BY i.id"
    )
    return [i for (i,) in store.connection().execute(sql, (labeler_id, interval))]


def anchor_count(store: StoreBase) -> int:
    """How many anchors are served in each interval."""
    return store.connection().execute(f"SELECT COUNT(*) FROM items i WHERE {_SERVED}").fetchone()[0]


def last_anchor_answer(store: StoreBase, labeler_id: int) -> tuple[int, int, float] | None:
    """(answer id, item id, time) of labeler `labeler_id`'s latest anchor answer."""
    sql = "SELECT id, item_id, created FROM anchor_answers WHERE labeler_id = ? ORDER BY created DESC, id DESC LIMIT 1"
    return store.connection().execute(sql, (labeler_id,)).fetchone()


def add_anchor_answer(store: StoreBase, item_id: int, labeler_id: int, interval: int, *, best: int | None = None,
                      ranking: list[int] | None = None, seconds: float | None = None) -> int:  # fmt: skip
    """Record an answer to a drift anchor in `interval`; DuplicateLabelError if this labeler already answered it in
    that interval, ValueError on an invalid value or an item that is no anchor."""
    with store._tx() as c:
        row = c.execute("SELECT label_type, anchor FROM items WHERE id = ?", (item_id,)).fetchone()
        if row is None or not row[1]:
            raise ValueError(f"item {item_id} is not a drift anchor")
        check_label_value(row[0], best, None, None, f"anchor {item_id}", ranking)
        top = ranking[0] if ranking is not None else best
        try:
            return c.execute(
                "INSERT INTO anchor_answers (item_id, labeler_id, interval, best, ranking, seconds, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (item_id, labeler_id, interval, top, None if ranking is None else json.dumps(ranking), seconds,
                 time.time()),  # fmt: skip
            ).lastrowid or 0
        except sqlite3.IntegrityError:
            raise DuplicateLabelError(f"drift anchor {item_id} was already answered in interval {interval}") from None


def drift(store: StoreBase, every: int) -> dict[str, list[tuple[int, float | None, float | None]]]:
    """{labeler: [(interval, self-consistency, gold accuracy), ...]} for labelers with anchor answers. Self-consistency
    in an interval: the share of anchors answered then whose pick (a ranking's top) equals the labeler's previous
    answer to the same anchor (None in an interval with no earlier answer to compare with). Gold accuracy: right
    answers over gold questions answered in the interval, anchors and served gold questions together; a served gold
    question by its first answer, as the quality measures count it (an undo cannot make a wrong answer right)."""
    with store.snapshot() as c:
        anchors = c.execute(
            "SELECT b.name, a.item_id, a.interval, a.best, i.gold FROM anchor_answers a"
            " JOIN labelers b ON b.id = a.labeler_id JOIN items i ON i.id = a.item_id ORDER BY b.name, a.interval"
        ).fetchall()
        labels = c.execute(
            f"SELECT b.name, l.kind, {FIRST_KIND}, {FIRST_BEST}, i.gold FROM labels l"
            " JOIN labelers b ON b.id = l.labeler_id JOIN items i ON i.id = l.item_id"
            f" WHERE 'label' IN (l.kind, {FIRST_KIND}) AND l.practice = 0 ORDER BY b.name, l.id"
        ).fetchall()
    gold: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    seen: dict[str, int] = defaultdict(int)
    for name, kind, first_kind, first_best, right in labels:  # a label's interval: the labels its labeler gave before
        k = seen[name] // max(every, 1)
        seen[name] += kind == "label"  # as `labeler_interval` counts them
        if right is not None and first_kind == "label":
            gold[name][k][0] += first_best == right
            gold[name][k][1] += 1
    same: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    last: dict[tuple[str, int], int] = {}
    for name, item, k, best, right in anchors:
        counts = same[name].setdefault(k, [0, 0])  # an interval with anchor answers shows, compared or not
        if (name, item) in last:
            counts[0] += best == last[(name, item)]
            counts[1] += 1
        last[(name, item)] = best
        if right is not None:
            gold[name][k][0] += best == right
            gold[name][k][1] += 1
    return {
        name: [(k, same[name][k][0] / same[name][k][1] if same[name][k][1] else None,
                gold[name][k][0] / gold[name][k][1] if gold[name][k][1] else None)
               for k in sorted(set(same[name]) | set(gold[name]))]  # fmt: skip
        for name in sorted(same)
    }
