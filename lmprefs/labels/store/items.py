"""Questions: adding them (queries, samples and their token ids, deduplicated), reading them back, the store's own
queue order, and an item's gold answer and hold. Methods of `StoreBase` (each takes the store first)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from lmprefs.config import check_label_type
from lmprefs.labels.store.records import HOLDS, Item, check_label_value, sha, source_split
from lmprefs.labels.store.schema import QUEUE_ORDER, TABLES

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase


def _put_tokens(c, table: str, col: str, row_id: int, tokenizer: str | None, ids: list[int]) -> None:
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{table}: token ids must be ints, got {ids!r:.80}")
    c.execute(
        f"INSERT OR IGNORE INTO {table} ({col}, tokenizer, ids) VALUES (?, ?, ?)",
        (row_id, tokenizer, json.dumps(ids)),
    )


def add_item(
    store: StoreBase,
    query: str,
    samples: list[str],
    *,
    source: str,
    label_type: str = "best_of_4",
    query_tokens: list[int] | None = None,
    sample_tokens: list[list[int]] | None = None,
    tokenizer: str | None = None,
    want_labels: int = 1,
    batch: str | None = None,
    priority: int = 0,
    key: str | None = None,
) -> int:
    """Add a question (idempotent: the same query, samples, label type, source and `key` give the same id).
    `key` tells apart deliberate duplicates, e.g. the k-th repeat of a row in an imported file."""
    _, n = check_label_type(label_type)
    if not isinstance(query, str) or not all(isinstance(s, str) for s in samples) or len(samples) != n:
        raise ValueError(f"{label_type} needs a query string and {n} sample strings, got {len(samples)} samples")
    if (query_tokens is not None or sample_tokens is not None) and not tokenizer:
        raise ValueError("token ids need tokenizer=<name> (the tokenizer they belong to)")
    if sample_tokens is not None and len(sample_tokens) != n:
        raise ValueError(f"sample_tokens has {len(sample_tokens)} rows for {n} samples")
    if isinstance(want_labels, bool) or not isinstance(want_labels, int) or want_labels < 1:
        raise ValueError(f"want_labels={want_labels!r} must be an int >= 1")
    now = time.time()
    with store._tx() as c:
        c.execute("INSERT OR IGNORE INTO queries (text, hash, created) VALUES (?, ?, ?)", (query, sha(query), now))
        (qid,) = c.execute("SELECT id FROM queries WHERE hash = ?", (sha(query),)).fetchone()
        if query_tokens is not None:
            _put_tokens(c, "query_tokens", "query_id", qid, tokenizer, query_tokens)
        sids = []
        for i, text in enumerate(samples):
            c.execute(
                "INSERT OR IGNORE INTO samples (query_id, text, hash, created) VALUES (?, ?, ?, ?)",
                (qid, text, sha(text), now),
            )
            (sid,) = c.execute("SELECT id FROM samples WHERE query_id = ? AND hash = ?", (qid, sha(text))).fetchone()
            if sample_tokens is not None:
                _put_tokens(c, "sample_tokens", "sample_id", sid, tokenizer, sample_tokens[i])
            sids.append(sid)
        ident = sha(json.dumps([label_type, qid, sids, source, key]))
        row = c.execute("SELECT id FROM items WHERE ident = ?", (ident,)).fetchone()
        if row:
            return row[0]
        cur = c.execute(
            "INSERT INTO items (ident, query_id, label_type, num_samples, source, key, batch, priority,"
            " want_labels, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (ident, qid, label_type, n, source, key, batch, priority, want_labels, now),
        )
        c.executemany(
            "INSERT INTO item_samples VALUES (?, ?, ?)", [(cur.lastrowid, i, s) for i, s in enumerate(sids)]
        )
        assert cur.lastrowid is not None  # set by the INSERT just made
        return cur.lastrowid


def _items(store: StoreBase, where: str, args: tuple | dict) -> list[Item]:
    out = []
    with store.snapshot() as c:
        rows = c.execute(
            "SELECT i.id, q.text, i.label_type, i.source, i.batch, i.priority, i.want_labels, i.status, i.created,"
            " i.gold, i.hold, i.gold_note, i.anchor, i.acquisition"
            f" FROM items i JOIN queries q ON q.id = i.query_id WHERE {where}",
            args,
        ).fetchall()
        for r in rows:
            texts = [
                t
                for (t,) in c.execute(
                    "SELECT s.text FROM item_samples x JOIN samples s ON s.id = x.sample_id"
                    " WHERE x.item_id = ? ORDER BY x.position",
                    (r[0],),
                )
            ]
            out.append(Item(r[0], r[1], texts, r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
                            bool(r[12]), r[13]))  # fmt: skip
    return out


ITEM_STATES = ("pending", "done", "flagged", "gold", "retired", "anchor")
_STATE_SQL = {
    "pending": "i.status = 'pending' AND i.hold IS NULL",
    "done": "i.status = 'done' AND i.hold IS NULL",
    "flagged": "i.hold = 'flagged'",
    "gold": "i.gold IS NOT NULL",
    "retired": "i.hold = 'retired'",
    "anchor": "i.anchor = 1",
}


def search_items(store: StoreBase, text: str = "", state: str | None = None, *, limit: int = 50,
                 before_id: int | None = None) -> list[Item]:  # fmt: skip
    """Items whose query or a sample contains `text` (any case, for ASCII letters) in `state` (ITEM_STATES; None:
    any), newest first, at most `limit`, with ids below `before_id` (the next page)."""
    if state is not None and state not in ITEM_STATES:
        raise ValueError(f"state={state!r} must be one of {', '.join(ITEM_STATES)}")
    pattern = "%" + "".join("!" + ch if ch in "!%_" else ch for ch in text) + "%"
    where = (
        "(q.text LIKE :p ESCAPE '!' OR EXISTS (SELECT 1 FROM item_samples x JOIN samples s ON s.id = x.sample_id"
        " WHERE x.item_id = i.id AND s.text LIKE :p ESCAPE '!'))"
        f" AND {_STATE_SQL[state] if state else '1'} AND i.id < :before ORDER BY i.id DESC LIMIT :limit"
    )
    return _items(store, where, {"p": pattern, "before": before_id or 2**63 - 1, "limit": limit})


def get_item(store: StoreBase, item_id: int) -> Item | None:
    items = _items(store, "i.id = ?", (item_id,))
    return items[0] if items else None


def next_item(store: StoreBase, labeler: str, *, batch: str | None = None) -> Item | None:
    """The first pending item in the queue's order (QUEUE_ORDER: priority, acquisition score, age) that `labeler`
    has not labeled, skipped or flagged yet (held items are skipped). There is no lease: two labelers asking at once
    may get the same item, and both answers are kept."""
    items = _items(
        store,
        "i.status = 'pending' AND i.hold IS NULL AND i.anchor = 0 AND (?1 IS NULL OR i.batch = ?1)"
        " AND NOT EXISTS (SELECT 1 FROM labels l"
        " JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = i.id AND b.name = ?2)"
        f" ORDER BY {QUEUE_ORDER} LIMIT 1",
        (batch, labeler),
    )
    return items[0] if items else None


def pending_count(store: StoreBase, *, batch: str | None = None) -> int:
    sql = "SELECT COUNT(*) FROM items WHERE status = 'pending' AND hold IS NULL AND (?1 IS NULL OR batch = ?1)"
    return store.connection().execute(sql, (batch,)).fetchone()[0]


def item_splits(store: StoreBase) -> dict[int, str]:
    """{item id: split} of the items whose source carries an imported split (`source_split`)."""
    rows = store.connection().execute("SELECT id, source FROM items WHERE source LIKE 'import:%#%'")
    return {i: sp for i, src in rows if (sp := source_split(src)) is not None}


def item_count(store: StoreBase, *, batch: str) -> int:
    """How many items `batch` holds, answered or not."""
    return store.connection().execute("SELECT COUNT(*) FROM items WHERE batch = ?", (batch,)).fetchone()[0]


def item_batches(store: StoreBase, prefix: str) -> dict[int, str]:
    """{item id: batch} of the items whose batch starts with `prefix` (compared as SQL LIKE does: ASCII letters in
    any case)."""
    pattern = "".join("!" + ch if ch in "!%_" else ch for ch in prefix) + "%"
    return dict(store.connection().execute("SELECT id, batch FROM items WHERE batch LIKE ? ESCAPE '!'", (pattern,)))


def label_types(store: StoreBase) -> list[str]:
    return [t for (t,) in store.connection().execute("SELECT DISTINCT label_type FROM items ORDER BY label_type")]


def table_counts(store: StoreBase) -> dict[str, int]:
    """Rows per table (for reports, and to check that a failed import changed nothing)."""
    return {t: store.connection().execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in TABLES}


def set_gold(store: StoreBase, item_id: int, best: int | None, note: str | None = None) -> None:
    """Make `item_id` a gold question whose right answer is stored sample `best` (None: an ordinary item again); for
    a ranking_K item, the right top choice. `note`: why that answer is right, shown to labelers in onboarding."""
    if note is not None and (not isinstance(note, str) or len(note) > 2000):
        raise ValueError(f"gold note for item {item_id} must be a string of at most 2000 characters")
    with store._tx() as c:
        row = c.execute("SELECT label_type FROM items WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            raise ValueError(f"no item with id {item_id}")
        if best is not None:
            as_best = row[0].replace("ranking_", "best_of_")  # a ranking's gold is its top choice
            check_label_value(as_best, best, None, None, f"gold item {item_id}")
        c.execute("UPDATE items SET gold = ?, gold_note = ? WHERE id = ?", (best, note if best is not None else None,
                                                                            item_id))  # fmt: skip


def set_hold(store: StoreBase, item_id: int, hold: str | None) -> None:
    """Retire an item (hold="retired": never served again) or restore it (None: served, even if flagged)."""
    if hold not in (*HOLDS, None):
        raise ValueError(f"hold={hold!r} must be one of {HOLDS} or None")
    with store._tx() as c:
        if c.execute("UPDATE items SET hold = ? WHERE id = ?", (hold, item_id)).rowcount == 0:
            raise ValueError(f"no item with id {item_id}")
