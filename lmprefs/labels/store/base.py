"""The store's connections and transactions.

SQLite in WAL mode lets readers run beside one writer; each thread gets its own connection, every write is one
`BEGIN IMMEDIATE` transaction (nested calls become savepoints) and waits up to `busy_timeout` for the write lock, so
threads and processes can share a store.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Self

from lmprefs.errors import UserError
from lmprefs.io.locks import locked_temp_dir
from lmprefs.labels.store import schema

TEMP_PREFIX = "lmprefs-labels-"
"""The name of a temporary store's folder (`StoreBase.temporary`) begins with this."""


class StoreBase:
    """A SQLite store at `path` (created if missing), its connections and transactions: all the modules of the
    store's methods need to run their SQL. Safe to share between threads and processes."""

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
            if "locked" in str(e):  # another process held its write lock for all of busy_timeout
                raise UserError(f"label store {self.path}: in use by another process that holds it locked (waited "
                                f"{busy_timeout:g}s); try again once it is done") from None  # fmt: skip
            raise UserError(f"label store {self.path}: cannot open or create it ({e})") from None
        except UserError:  # a store from newer code: refused before anything is written
            self.close()
            raise

    @classmethod
    def temporary(cls) -> Self:
        """A new store in a folder of its own under the system's temporary directory (an imported label file's),
        removed with everything in it once the store is garbage-collected or the process exits. The folder holds a
        lock while its process lives: a process killed before it could remove it (kill -9) leaves it to the next
        temporary store made on the machine, which sweeps it (`io.locks.locked_temp_dir`)."""
        folder, lock = locked_temp_dir(TEMP_PREFIX)
        try:
            store = cls(folder / "labels.sqlite")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            lock.close()
            raise
        weakref.finalize(store, _close_and_remove, store._conns, store._conns_lock, folder, lock, os.getpid())
        return store

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
    def transaction(self) -> Iterator[Self]:
        """Group calls into one all-or-nothing transaction: `with store.transaction(): store.add_item(...); ...`."""
        with self._tx():
            yield self

    def close(self) -> None:
        _close_all(self._conns, self._conns_lock)
        self._local = threading.local()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close_and_remove(conns: list[sqlite3.Connection], lock: threading.Lock, folder: Path, held: IO[str],
                      pid: int) -> None:  # fmt: skip
    """A temporary store's end: its connections closed (SQLite folds the WAL back first), then its folder removed
    and the folder's lock let go, by the process that made it (a forked child that exits leaves it to its parent).
    Takes the store's parts, not the store, so that the finalizer holding them does not keep the store alive."""
    if os.getpid() != pid:
        return
    _close_all(conns, lock)
    shutil.rmtree(folder, ignore_errors=True)
    held.close()


def _close_all(conns: list[sqlite3.Connection], lock: threading.Lock) -> None:
    """Close every connection a store opened, in any thread."""
    with lock:
        for conn in conns:
            conn.close()
        conns.clear()
