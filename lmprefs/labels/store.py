"""The label store: every query, sample, comparison question ("item"), labeler and judgement in one SQLite file.

One store serves the file importers (`formats.py`), the labeling web app and the reward trainer (offline, or online
with `labeled_examples(since_id=...)`). SQLite in WAL mode lets readers run beside one writer; each thread gets its own
connection, every write is one `BEGIN IMMEDIATE` transaction (nested calls become savepoints) and waits up to
`busy_timeout` for the write lock, so threads and processes can share a store. Never imports torch.

Schema (see `_SCHEMA`): queries and samples are deduplicated by text (sha256); token ids are optional and kept per
tokenizer name (`query_tokens`, `sample_tokens`; the first ids stored for a text win); an item is a query plus N
ordered samples with a label type, a source, a queue position (`batch`, `priority`) and how many labels it wants;
a label is one labeler's `label`, `skip` or `flag` on one item, at most one per (item, labeler).

Version 2 (added by `_MIGRATIONS`, so a version-1 store opens and is upgraded in place, in one transaction) adds
quality control: `items.gold` (the known best sample of a gold question), `items.hold` ('flagged' after a labeler
flags it, 'retired' by an admin: held items are not served), `labels.shown` (the order the options were displayed
in: displayed position p showed sample shown[p]; `best` always indexes the stored samples) and `labels.seconds`
(time on task), and a random `store_id` in `meta` that names this store (the web app's cookies use it).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from lmprefs.config import label_type_shape
from lmprefs.errors import UserError

SCHEMA_VERSION = 2
KINDS = ("label", "skip", "flag")
HOLDS = ("flagged", "retired")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS queries (
    id INTEGER PRIMARY KEY, text TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS samples (
    id INTEGER PRIMARY KEY, query_id INTEGER NOT NULL REFERENCES queries(id), text TEXT NOT NULL,
    hash TEXT NOT NULL, created REAL NOT NULL, UNIQUE (query_id, hash));
CREATE TABLE IF NOT EXISTS query_tokens (
    query_id INTEGER NOT NULL REFERENCES queries(id), tokenizer TEXT NOT NULL, ids TEXT NOT NULL,
    PRIMARY KEY (query_id, tokenizer)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sample_tokens (
    sample_id INTEGER NOT NULL REFERENCES samples(id), tokenizer TEXT NOT NULL, ids TEXT NOT NULL,
    PRIMARY KEY (sample_id, tokenizer)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS items (
    id INTEGER PRIMARY KEY, ident TEXT NOT NULL UNIQUE, query_id INTEGER NOT NULL REFERENCES queries(id),
    label_type TEXT NOT NULL, num_samples INTEGER NOT NULL CHECK (num_samples >= 1), source TEXT NOT NULL,
    key TEXT, batch TEXT, priority INTEGER NOT NULL DEFAULT 0,
    want_labels INTEGER NOT NULL DEFAULT 1 CHECK (want_labels >= 1),
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done')), created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS items_queue ON items (status, priority DESC, id);
CREATE TABLE IF NOT EXISTS item_samples (
    item_id INTEGER NOT NULL REFERENCES items(id), position INTEGER NOT NULL,
    sample_id INTEGER NOT NULL REFERENCES samples(id), PRIMARY KEY (item_id, position)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS labelers (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, token_hash TEXT UNIQUE,
    is_admin INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS labels (
    id INTEGER PRIMARY KEY, item_id INTEGER NOT NULL REFERENCES items(id),
    labeler_id INTEGER NOT NULL REFERENCES labelers(id), kind TEXT NOT NULL CHECK (kind IN ('label', 'skip', 'flag')),
    best INTEGER, score REAL, difference REAL, note TEXT, source TEXT NOT NULL DEFAULT '', created REAL NOT NULL,
    UNIQUE (item_id, labeler_id),
    -- a `label` carries exactly one value; skips and flags carry none
    CHECK ((kind = 'label') = ((best IS NOT NULL) + (score IS NOT NULL) + (difference IS NOT NULL) = 1)));
CREATE INDEX IF NOT EXISTS labels_labeler ON labels (labeler_id);
"""
# version -> statements that upgrade a store from version - 1; _SCHEMA above stays version 1, so new and old stores
# take the same path
_MIGRATIONS = {
    2: [
        "ALTER TABLE items ADD COLUMN gold INTEGER",
        "ALTER TABLE items ADD COLUMN hold TEXT CHECK (hold IN ('flagged', 'retired'))",
        "ALTER TABLE labels ADD COLUMN shown TEXT",
        "ALTER TABLE labels ADD COLUMN seconds REAL",
        "UPDATE items SET hold = 'flagged' WHERE id IN (SELECT item_id FROM labels WHERE kind = 'flag')",
        "INSERT OR IGNORE INTO meta VALUES ('store_id', lower(hex(randomblob(16))))",
    ],
}


class DuplicateLabelError(ValueError):
    """The labeler already labeled (or skipped, or flagged) this item."""




SPLIT_NAME = r"[A-Za-z0-9_-]{1,64}"  # an imported split (summarize comparisons: train, valid1, valid2)
_SPLIT_SOURCE = re.compile(rf"import:.+#({SPLIT_NAME})")


def source_split(source: str) -> str | None:
    """The split an item's source carries, `import:FILE#SPLIT` (summarize comparisons), else None. A plain import of a
    file named like `a#b.jsonl` is not read as one: a split name has no '.'."""
    m = _SPLIT_SOURCE.fullmatch(source)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Item:
    id: int
    query: str
    samples: list[str]
    label_type: str
    source: str
    batch: str | None
    priority: int
    want_labels: int
    status: str
    created: float  # unix time (UTC)
    gold: int | None = None  # the known best sample of a gold question
    hold: str | None = None  # "flagged" or "retired": not served


@dataclass(frozen=True)
class Example:
    """One judgement, ready for reward-model training: `samples[best]` was preferred, or `score`/`difference`."""

    label_id: int
    item_id: int
    label_type: str
    labeler: str
    query: str
    samples: list[str]
    best: int | None = None
    score: float | None = None
    difference: float | None = None
    query_tokens: list[int] | None = None  # only when labeled_examples(tokenizer=...) has ids for them
    sample_tokens: list[list[int]] | None = None


@dataclass(frozen=True)
class Labeler:
    id: int
    name: str
    is_admin: bool
    created: float


@dataclass(frozen=True)
class ImportRow:
    """One labeled question for `import_batch`: the arguments of `add_item` and `add_label` in one row."""

    query: str
    samples: list[str]
    label_type: str
    source: str
    labeler: str
    best: int | None = None
    score: float | None = None
    difference: float | None = None
    key: str | None = None
    tokenizer: str | None = None
    query_tokens: list[int] | None = None
    sample_tokens: list[list[int]] | None = None


@dataclass
class ImportCounts:
    rows: int = 0
    items_added: int = 0
    items_present: int = 0
    labels_added: int = 0
    labels_present: int = 0


@dataclass(frozen=True)
class Agreement:
    """Pairwise agreement on best_of_N items labeled by more than one labeler."""

    rate: float | None  # agreeing labeler pairs / all labeler pairs, over all such items
    items: int  # items with >= 2 labels
    pairs: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)  # (a, b) a<b -> (rate, items)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 100 or name != name.strip():
        raise ValueError(f"labeler name {name!r} must be 1-100 characters without surrounding spaces")
    return name


def _check_label_value(label_type: str, best, score, difference, where: str) -> None:
    value_field, n = label_type_shape(label_type)
    given = {k: v for k, v in (("best", best), ("score", score), ("difference", difference)) if v is not None}
    if set(given) != {value_field}:
        raise ValueError(f"{where} is {label_type}: a label needs exactly {value_field}=..., got {given or 'nothing'}")
    v = given[value_field]
    if value_field == "best":
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            raise ValueError(f"{where} is {label_type}: best={v!r} is out of range 0..{n - 1}")
    elif isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValueError(f"{where} is {label_type}: {value_field}={v!r} is not a finite number")


class LabelStore:
    """A SQLite label store at `path` (created if missing). Safe to share between threads and processes."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self.connection().executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")  # all tables or none
        with self._tx() as c:  # one transaction: two processes opening an old store upgrade it once
            c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', '1')")
            (v,) = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if int(v) > SCHEMA_VERSION:
                raise ValueError(f"{self.path} has label-store schema version {v}, this code reads {SCHEMA_VERSION}")
            for version in range(int(v) + 1, SCHEMA_VERSION + 1):
                for sql in _MIGRATIONS[version]:
                    c.execute(sql)
                c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
            (self.store_id,) = c.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()

    # -- connections and transactions ------------------------------------------------------------------------

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (WAL, foreign keys on), for modules that query the schema directly, such as the
        web app's queue and statistics. Writes go through `transaction()`; multi-statement reads through
        `snapshot()`."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # isolation_level=None: we issue BEGIN ourselves (BEGIN IMMEDIATE takes the write lock up front, so two
            # writers queue on busy_timeout instead of deadlocking on a read->write upgrade)
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; WAL keeps the file consistent
            conn.execute("PRAGMA foreign_keys = ON")
            self._local.conn, self._local.depth = conn, 0
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self.connection()
        depth = self._local.depth
        self._local.depth = depth + 1
        try:
            if depth == 0:
                with conn:  # commits on success, rolls back on any exception
                    conn.execute("BEGIN IMMEDIATE")
                    yield conn
            else:  # nested: a savepoint, so a caught inner failure undoes only the inner writes
                conn.execute(f"SAVEPOINT sp{depth}")
                try:
                    yield conn
                except BaseException:
                    conn.execute(f"ROLLBACK TO sp{depth}")
                    conn.execute(f"RELEASE sp{depth}")
                    raise
                conn.execute(f"RELEASE sp{depth}")
        finally:
            self._local.depth = depth

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot for a multi-statement read (inside a write transaction, that one)."""
        conn = self.connection()
        if self._local.depth:
            yield conn
            return
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[LabelStore]:
        """Group calls into one all-or-nothing transaction: `with store.transaction(): store.add_item(...); ...`."""
        with self._tx():
            yield self

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()

    def __enter__(self) -> LabelStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- items -----------------------------------------------------------------------------------------------

    def _put_tokens(self, c, table: str, col: str, row_id: int, tokenizer: str, ids: list[int]) -> None:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError(f"{table}: token ids must be ints, got {ids!r:.80}")
        c.execute(
            f"INSERT OR IGNORE INTO {table} ({col}, tokenizer, ids) VALUES (?, ?, ?)",
            (row_id, tokenizer, json.dumps(ids)),
        )

    def add_item(
        self,
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
        _, n = label_type_shape(label_type)
        if not isinstance(query, str) or not all(isinstance(s, str) for s in samples) or len(samples) != n:
            raise ValueError(f"{label_type} needs a query string and {n} sample strings, got {len(samples)} samples")
        if (query_tokens is not None or sample_tokens is not None) and not tokenizer:
            raise ValueError("token ids need tokenizer=<name> (the tokenizer they belong to)")
        if sample_tokens is not None and len(sample_tokens) != n:
            raise ValueError(f"sample_tokens has {len(sample_tokens)} rows for {n} samples")
        if isinstance(want_labels, bool) or not isinstance(want_labels, int) or want_labels < 1:
            raise ValueError(f"want_labels={want_labels!r} must be an int >= 1")
        now = time.time()
        with self._tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO queries (text, hash, created) VALUES (?, ?, ?)", (query, _sha(query), now)
            )
            (qid,) = c.execute("SELECT id FROM queries WHERE hash = ?", (_sha(query),)).fetchone()
            if query_tokens is not None:
                self._put_tokens(c, "query_tokens", "query_id", qid, tokenizer, query_tokens)
            sids = []
            for i, text in enumerate(samples):
                c.execute(
                    "INSERT OR IGNORE INTO samples (query_id, text, hash, created) VALUES (?, ?, ?, ?)",
                    (qid, text, _sha(text), now),
                )
                (sid,) = c.execute(
                    "SELECT id FROM samples WHERE query_id = ? AND hash = ?", (qid, _sha(text))
                ).fetchone()
                if sample_tokens is not None:
                    self._put_tokens(c, "sample_tokens", "sample_id", sid, tokenizer, sample_tokens[i])
                sids.append(sid)
            ident = _sha(json.dumps([label_type, qid, sids, source, key]))
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
            return cur.lastrowid

    def _items(self, where: str, args: tuple) -> list[Item]:
        out = []
        with self.snapshot() as c:
            rows = c.execute(
                "SELECT i.id, q.text, i.label_type, i.source, i.batch, i.priority, i.want_labels, i.status, i.created,"
                f" i.gold, i.hold FROM items i JOIN queries q ON q.id = i.query_id WHERE {where}",
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
                out.append(Item(r[0], r[1], texts, *r[2:]))
        return out

    def get_item(self, item_id: int) -> Item | None:
        items = self._items("i.id = ?", (item_id,))
        return items[0] if items else None

    def next_item(self, labeler: str, *, batch: str | None = None) -> Item | None:
        """The highest-priority, oldest pending item that `labeler` has not labeled, skipped or flagged yet (held
        items are skipped). There is no lease: two labelers asking at once may get the same item, and both answers
        are kept."""
        items = self._items(
            "i.status = 'pending' AND i.hold IS NULL AND (?1 IS NULL OR i.batch = ?1)"
            " AND NOT EXISTS (SELECT 1 FROM labels l"
            " JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = i.id AND b.name = ?2)"
            " ORDER BY i.priority DESC, i.id LIMIT 1",
            (batch, labeler),
        )
        return items[0] if items else None

    def pending_count(self, *, batch: str | None = None) -> int:
        sql = "SELECT COUNT(*) FROM items WHERE status = 'pending' AND hold IS NULL AND (?1 IS NULL OR batch = ?1)"
        return self.connection().execute(sql, (batch,)).fetchone()[0]

    def item_splits(self) -> dict[int, str]:
        """{item id: split} of the items whose source carries an imported split (`source_split`)."""
        rows = self.connection().execute("SELECT id, source FROM items WHERE source LIKE 'import:%#%'")
        return {i: sp for i, src in rows if (sp := source_split(src)) is not None}

    def label_types(self) -> list[str]:
        return [t for (t,) in self.connection().execute("SELECT DISTINCT label_type FROM items ORDER BY label_type")]

    def table_counts(self) -> dict[str, int]:
        """Rows per table (for reports, and to check that a failed import changed nothing)."""
        tables = ("queries", "samples", "query_tokens", "sample_tokens", "items", "item_samples", "labelers", "labels")
        return {t: self.connection().execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}

    # -- labels ----------------------------------------------------------------------------------------------

    def _labeler_id(self, c, name: str) -> int:
        c.execute("INSERT OR IGNORE INTO labelers (name, created) VALUES (?, ?)", (_check_name(name), time.time()))
        return c.execute("SELECT id FROM labelers WHERE name = ?", (name,)).fetchone()[0]

    def add_label(
        self,
        item_id: int,
        labeler: str,
        *,
        best: int | None = None,
        score: float | None = None,
        difference: float | None = None,
        kind: str = "label",
        source: str = "",
        note: str | None = None,
        shown: list[int] | None = None,
        seconds: float | None = None,
        replace: bool = False,
    ) -> int:
        """Record one judgement and return its id. `kind="skip"`/`"flag"` carry no value (a note, perhaps); a flag
        holds the item (it is no longer served) until an admin restores or retires it. `shown`: the order the
        options were displayed in (displayed position p showed sample shown[p]); `seconds`: time on task.
        Raises DuplicateLabelError if `labeler` already answered this item, ValueError on an invalid value.
        `replace=True` (undo in the web app) overwrites this labeler's answer to the item instead, in the same
        transaction and the same row, so the item never holds two answers from one labeler."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r} must be one of {KINDS}")
        if seconds is not None and not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"seconds={seconds!r} must be a finite number >= 0")
        with self._tx() as c:
            row = c.execute("SELECT label_type, want_labels FROM items WHERE id = ?", (item_id,)).fetchone()
            if row is None:
                raise ValueError(f"no item with id {item_id}")
            label_type, want = row
            if kind == "label":
                _check_label_value(label_type, best, score, difference, f"item {item_id}")
            elif (best, score, difference) != (None, None, None):
                raise ValueError(f"a {kind} carries no value, got best={best}, score={score}, difference={difference}")
            n = label_type_shape(label_type)[1]
            if shown is not None and sorted(shown) != list(range(n)):
                raise ValueError(f"shown={shown!r} must be an order of 0..{n - 1} for item {item_id}")
            lid = self._labeler_id(c, labeler)
            old = c.execute(
                "SELECT id, kind, best, score, difference FROM labels WHERE item_id = ? AND labeler_id = ?",
                (item_id, lid),
            ).fetchone()
            values = (kind, best, score, difference, note, source, time.time(), json.dumps(shown) if shown else None,
                      seconds)  # fmt: skip
            if old and replace:
                c.execute(
                    "UPDATE labels SET kind = ?, best = ?, score = ?, difference = ?, note = ?, source = ?,"
                    " created = ?, shown = ?, seconds = ? WHERE id = ?",
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
                    "INSERT INTO labels (item_id, labeler_id, kind, best, score, difference, note, source, created,"
                    " shown, seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (item_id, lid, *values),
                ).lastrowid
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
            return label_id

    def set_gold(self, item_id: int, best: int | None) -> None:
        """Make `item_id` a gold question whose right answer is stored sample `best` (None: an ordinary item again)."""
        with self._tx() as c:
            row = c.execute("SELECT label_type FROM items WHERE id = ?", (item_id,)).fetchone()
            if row is None:
                raise ValueError(f"no item with id {item_id}")
            if best is not None:
                _check_label_value(row[0], best, None, None, f"gold item {item_id}")
            c.execute("UPDATE items SET gold = ? WHERE id = ?", (best, item_id))

    def set_hold(self, item_id: int, hold: str | None) -> None:
        """Retire an item (hold="retired": never served again) or restore it (None: served, even if flagged)."""
        if hold not in (*HOLDS, None):
            raise ValueError(f"hold={hold!r} must be one of {HOLDS} or None")
        with self._tx() as c:
            if c.execute("UPDATE items SET hold = ? WHERE id = ?", (hold, item_id)).rowcount == 0:
                raise ValueError(f"no item with id {item_id}")

    def import_batch(self, rows: Iterable[ImportRow]) -> ImportCounts:
        """Add labeled rows in ONE transaction: all of them or, on any error, none. Re-importing a row is a no-op
        (the item exists and the labeler's identical label is counted as present); a *different* label by the same
        labeler raises DuplicateLabelError and rolls everything back."""
        counts = ImportCounts()
        with self._tx() as c:
            items_before = c.execute("SELECT COUNT(*) FROM items").fetchone()[0]
            for r in rows:
                counts.rows += 1
                item_id = self.add_item(
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
                    "SELECT l.kind, l.best, l.score, l.difference FROM labels l JOIN labelers b ON b.id = l.labeler_id"
                    " WHERE l.item_id = ? AND b.name = ?",
                    (item_id, r.labeler),
                ).fetchone()
                if old is not None and old == ("label", r.best, r.score, r.difference):
                    counts.labels_present += 1
                    continue
                self.add_label(
                    item_id, r.labeler, best=r.best, score=r.score, difference=r.difference, source=r.source
                )
                counts.labels_added += 1
            counts.items_added = c.execute("SELECT COUNT(*) FROM items").fetchone()[0] - items_before
        counts.items_present = counts.rows - counts.items_added  # rows whose question was already there
        return counts

    def labeled_examples(
        self, label_type: str = "best_of_4", *, since_id: int | None = None, tokenizer: str | None = None
    ) -> list[Example]:
        """Every `label` (not skips or flags) on items of `label_type`, oldest first; `since_id` keeps labels with a
        larger id (for online training). With `tokenizer`, attach the ids stored under that name (None if absent)."""
        # the labels wanted, then the samples of their items: two queries for the whole result, not one per item
        chosen = "SELECT l.id, l.item_id FROM labels l JOIN items i ON i.id = l.item_id"
        chosen += " WHERE l.kind = 'label' AND i.label_type = :type AND l.id > :since"
        args = {"tok": tokenizer, "type": label_type, "since": since_id or 0}
        with self.snapshot() as c:
            labels = c.execute(
                f"WITH chosen AS ({chosen}) SELECT l.id, l.item_id, b.name, q.text, l.best, l.score, l.difference,"
                " qt.ids FROM chosen JOIN labels l ON l.id = chosen.id JOIN labelers b ON b.id = l.labeler_id"
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
        for lid, item_id, name, query, best, score, difference, qids in labels:
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
                    query_tokens=json.loads(qids) if have else None,
                    sample_tokens=[json.loads(i) for i in ids] if have else None,
                )
            )
        return out

    def counts_by_labeler(self) -> dict[str, dict[str, int]]:
        """{labeler: {"label": n, "skip": n, "flag": n}} for every labeler with at least one answer."""
        out: dict[str, dict[str, int]] = {}
        for name, kind, n in self.connection().execute(
            "SELECT b.name, l.kind, COUNT(*) FROM labels l JOIN labelers b ON b.id = l.labeler_id GROUP BY 1, 2"
        ):
            out.setdefault(name, dict.fromkeys(KINDS, 0))[kind] = n
        return out

    def agreement(self) -> Agreement:
        """How often two labelers pick the same best sample, over best_of_N items with >= 2 labels."""
        by_item: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for item_id, name, best in self.connection().execute(
            "SELECT l.item_id, b.name, l.best FROM labels l JOIN labelers b ON b.id = l.labeler_id"
            " WHERE l.kind = 'label' AND l.best IS NOT NULL ORDER BY l.item_id, b.name"
        ):
            by_item[item_id].append((name, best))
        agree, total, items = 0, 0, 0
        per: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for answers in by_item.values():
            if len(answers) < 2:
                continue
            items += 1
            for (a, best_a), (b, best_b) in combinations(answers, 2):  # names sorted, so a < b
                agree += best_a == best_b
                total += 1
                per[(a, b)][0] += best_a == best_b
                per[(a, b)][1] += 1
        pairs = {k: (same / n, n) for k, (same, n) in sorted(per.items())}
        return Agreement(agree / total if total else None, items, pairs)

    # -- labelers --------------------------------------------------------------------------------------------

    def add_labeler(self, name: str, admin: bool = False) -> str:
        """Register `name` and return a new login token (shown once: only its sha256 is stored). A labeler that
        exists without a token (e.g. created by an import) gets one; one that already has a token is an error."""
        token = secrets.token_urlsafe(32)
        with self._tx() as c:
            lid = self._labeler_id(c, name)
            if c.execute("SELECT token_hash FROM labelers WHERE id = ?", (lid,)).fetchone()[0] is not None:
                raise ValueError(f"labeler {name!r} already has a token")
            c.execute("UPDATE labelers SET token_hash = ?, is_admin = ? WHERE id = ?", (_sha(token), int(admin), lid))
        return token

    def labeler_for_token(self, token: str) -> Labeler | None:
        row = (
            self.connection()
            .execute("SELECT id, name, is_admin, created FROM labelers WHERE token_hash = ?", (_sha(token),))
            .fetchone()
        )
        return Labeler(row[0], row[1], bool(row[2]), row[3]) if row else None


def check_store_path(path: str | Path, *, must_exist: bool, flag: str = "--db") -> Path:
    """The label-store path a command was given, or a UserError naming what is wrong with it: a directory, a
    missing folder, a missing store (when `must_exist`), or a file that is not SQLite (opening one would fail deep
    inside sqlite3, or, for an empty file, turn it into a store)."""

    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p}: is a directory; give a label store file (.sqlite)")
    if not p.exists():
        if must_exist:
            raise UserError(f"{flag} {p}: label store does not exist; create it with `lmprefs label` or "
                            "`lmprefs import-labels`")  # fmt: skip
        if not p.parent.is_dir():
            raise UserError(f"{flag} {p}: folder {p.parent} does not exist")
        return p
    with open(p, "rb") as f:
        head = f.read(16)
    if head and head != b"SQLite format 3\x00":
        raise UserError(f"{flag} {p}: not a label store (not an SQLite file)")
    return p
