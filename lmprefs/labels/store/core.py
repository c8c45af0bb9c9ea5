"""`LabelStore`: one SQLite file, its connections and transactions, and the methods every other module asks it by.

SQLite in WAL mode lets readers run beside one writer; each thread gets its own connection, every write is one
`BEGIN IMMEDIATE` transaction (nested calls become savepoints) and waits up to `busy_timeout` for the write lock, so
threads and processes can share a store. The methods are plain functions of the store, kept in the modules named
after what they touch or who asks (`items`, `labels`, `labelers`, `reports`, `serving`) and bound here, so callers
write `store.add_item(...)`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.labels.store import items as _items
from lmprefs.labels.store import labelers as _labelers
from lmprefs.labels.store import labels as _labels
from lmprefs.labels.store import reports as _reports
from lmprefs.labels.store import schema
from lmprefs.labels.store import serving as _serving


class LabelStore:
    """A SQLite label store at `path` (created if missing). Safe to share between threads and processes."""

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        try:
            schema.create(self.connection())
            with self._tx() as c:  # one transaction: two processes opening an old store upgrade it once
                self.store_id = schema.upgrade(c, self.path)
        except sqlite3.OperationalError as e:  # a folder that cannot be written, a file that cannot be opened
            self.close()
            raise UserError(f"label store {self.path}: cannot open or create it ({e})") from None

    # -- connections and transactions ------------------------------------------------------------------------

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (WAL, foreign keys on), for the store's own modules and for tests that look at
        the file itself. Writes go through `_tx()`; multi-statement reads through `snapshot()`."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = schema.connect(self.path, self.busy_timeout)
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

    # -- items (items.py) ------------------------------------------------------------------------------------

    add_item = _items.add_item
    get_item = _items.get_item
    next_item = _items.next_item
    pending_count = _items.pending_count
    item_count = _items.item_count
    item_batches = _items.item_batches
    item_splits = _items.item_splits
    label_types = _items.label_types
    table_counts = _items.table_counts
    set_gold = _items.set_gold
    set_hold = _items.set_hold

    # -- labels (labels.py) ----------------------------------------------------------------------------------

    add_label = _labels.add_label
    import_batch = _labels.import_batch
    labeled_examples = _labels.labeled_examples
    has_answered = _labels.has_answered
    answer_counts = _labels.answer_counts
    answers_since = _labels.answers_since
    last_answer = _labels.last_answer

    # -- labelers (labelers.py) ------------------------------------------------------------------------------

    add_labeler = _labelers.add_labeler
    labeler_for_token = _labelers.labeler_for_token
    labeler_for_session = _labelers.labeler_for_session
    labelers = _labelers.labelers
    labelers_with_tokens = _labelers.labelers_with_tokens
    revoke_token = _labelers.revoke_token

    # -- what the admin page and the quality measures read (reports.py) --------------------------------------

    counts_by_labeler = _reports.counts_by_labeler
    agreement = _reports.agreement
    labeler_activity = _reports.labeler_activity
    recent_flags = _reports.recent_flags
    held_items = _reports.held_items
    gold_items = _reports.gold_items
    gold_accuracy = _reports.gold_accuracy
    best_of_answers = _reports.best_of_answers

    # -- what the web app's queue serves (serving.py) --------------------------------------------------------

    open_items = _serving.open_items
    open_count = _serving.open_count
    unanswered_gold = _serving.unanswered_gold
    servable = _serving.servable
    items_wanting_fewer = _serving.items_wanting_fewer
    set_want_labels = _serving.set_want_labels
    last_item_id = _serving.last_item_id
