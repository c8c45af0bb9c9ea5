"""The store's file: its tables, the upgrades that bring an older file to this version, and opening a connection.

Queries and samples are deduplicated by text (sha256); token ids are optional and kept per tokenizer name
(`query_tokens`, `sample_tokens`; the first ids stored for a text win); an item is a query plus N ordered samples with
a label type, a source, a queue position (`batch`, `priority`) and how many labels it wants; a label is one
labeler's `label`, `skip` or `flag` on one item, at most one per (item, labeler).

Version 2 (added by `MIGRATIONS`, so a version-1 store opens and is upgraded in place, in one transaction) adds
quality control: `items.gold` (the known best sample of a gold question), `items.hold` ('flagged' after a labeler
flags it, 'retired' by an admin: held items are not served), `labels.shown` (the order the options were displayed
in: displayed position p showed sample shown[p]; `best` always indexes the stored samples) and `labels.seconds`
(time on task), and a random `store_id` in `meta` that names this store (the web app's cookies use it).

Version 3 keeps a labeler's first answer when an undo in the web app replaces it (`labels.first_kind`,
`labels.first_best`; NULL while the answer was never replaced): gold accuracy counts the first answer, so undo cannot
turn a wrong gold answer into a right one.

Version 4 adds full rankings (`ranking_K` items): `labels.ranking` holds the order of the stored samples, best first,
as JSON; `best` holds its top choice, so every reader of best-of-N answers (gold, agreement, exports as best-of-N)
reads a ranking as its top pick.

Version 5 adds a labeler's optional confidence in an answer, 1 (a guess) to 3 (sure): `labels.confidence`.

Version 6 adds onboarding: `items.gold_note` (the researcher's note on a gold question's right answer, shown to a new
labeler after a practice answer), `labels.practice` (1: an answer given in onboarding, which never trains a reward
model and counts in no quality measure) and `labelers.admitted` (when the labeler passed onboarding; labelers from
before version 6 count as admitted). The onboarding settings live in `meta` (`onboarding_items`, `admit_accuracy`).

Version 7 adds drift anchors: `items.anchor` (1: a fixed item re-served to every labeler once per interval of their
answers, never through the queue and never for training) and `anchor_answers`, one row per (anchor, labeler,
interval); the interval length lives in `meta` (`anchor_every`).

Version 8 adds `labels.seq`, a label's position in the feed of answers (`GET /api/labels`): an answer takes the next
position when it is given and again when an undo changes it, so a reader paging by position sees the change (the row
id stays the item's and labeler's); and `labelers.held` (when an admin held the labeler back from real work: they are
not admitted again by their practice score, only by an admin).

Version 9 adds query selection: `items.acquisition` (how much an answer to a pending item would teach a reward-model
ensemble, as `lmprefs rank-queue` scored it: larger first; NULL: never scored) and, in `meta`, what scored them
(`acquisition`). The queue serves scored items first, by score, then the rest oldest first.

A store from newer code (a larger version) is refused, never written.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.inputs import path_kind

SCHEMA_VERSION = 9
SCHEMA = """
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
# version -> statements that upgrade a store from version - 1; SCHEMA above stays version 1, so new and old stores
# take the same path
MIGRATIONS = {
    2: [
        "ALTER TABLE items ADD COLUMN gold INTEGER",
        "ALTER TABLE items ADD COLUMN hold TEXT CHECK (hold IN ('flagged', 'retired'))",
        "ALTER TABLE labels ADD COLUMN shown TEXT",
        "ALTER TABLE labels ADD COLUMN seconds REAL",
        "UPDATE items SET hold = 'flagged' WHERE id IN (SELECT item_id FROM labels WHERE kind = 'flag')",
        "INSERT OR IGNORE INTO meta VALUES ('store_id', lower(hex(randomblob(16))))",
    ],
    3: [
        "ALTER TABLE labels ADD COLUMN first_kind TEXT CHECK (first_kind IN ('label', 'skip', 'flag'))",
        "ALTER TABLE labels ADD COLUMN first_best INTEGER",
    ],
    4: ["ALTER TABLE labels ADD COLUMN ranking TEXT"],
    5: ["ALTER TABLE labels ADD COLUMN confidence INTEGER CHECK (confidence BETWEEN 1 AND 3)"],
    6: [
        "ALTER TABLE items ADD COLUMN gold_note TEXT",
        "ALTER TABLE labels ADD COLUMN practice INTEGER NOT NULL DEFAULT 0 CHECK (practice IN (0, 1))",
        "ALTER TABLE labelers ADD COLUMN admitted REAL",
        "UPDATE labelers SET admitted = created",
    ],
    7: [
        "ALTER TABLE items ADD COLUMN anchor INTEGER NOT NULL DEFAULT 0 CHECK (anchor IN (0, 1))",
        "CREATE TABLE anchor_answers (id INTEGER PRIMARY KEY, item_id INTEGER NOT NULL REFERENCES items(id),"
        " labeler_id INTEGER NOT NULL REFERENCES labelers(id), interval INTEGER NOT NULL CHECK (interval >= 0),"
        " best INTEGER NOT NULL, ranking TEXT, seconds REAL, created REAL NOT NULL,"
        " UNIQUE (item_id, labeler_id, interval))",
    ],
    8: [
        "ALTER TABLE labels ADD COLUMN seq INTEGER",
        "UPDATE labels SET seq = id",
        "CREATE UNIQUE INDEX labels_seq ON labels (seq)",
        "ALTER TABLE labelers ADD COLUMN held REAL",
    ],
    9: [
        "ALTER TABLE items ADD COLUMN acquisition REAL",
        "CREATE INDEX items_acquired ON items (status, priority DESC, acquisition IS NULL, acquisition DESC, id)",
    ],
}
# the queue's order: an admin's priority first, then the acquisition score (scored items before unscored), then age
QUEUE_ORDER = "i.priority DESC, i.acquisition IS NULL, i.acquisition DESC, i.id"
# items whose labels pick among the options (best_of_N, and ranking_K by its top choice): the ones the web app serves
# and the quality measures read
CHOICE_ITEM = "(i.label_type LIKE 'best!_of!_%' ESCAPE '!' OR i.label_type LIKE 'ranking!_%' ESCAPE '!')"
# a labeler's first answer to an item, labels `l` (an undo may have replaced it since): what gold accuracy counts
FIRST_KIND = "COALESCE(l.first_kind, l.kind)"
FIRST_BEST = "(CASE WHEN l.first_kind IS NULL THEN l.best ELSE l.first_best END)"
TABLES = ("queries", "samples", "query_tokens", "sample_tokens", "items", "item_samples", "labelers", "labels",
          "anchor_answers")  # fmt: skip


def connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """A new connection to the store at `path`: WAL, foreign keys on, waiting up to `busy_timeout` for a lock."""
    # isolation_level=None: the store issues BEGIN itself (BEGIN IMMEDIATE takes the write lock up front, so two
    # writers queue on busy_timeout instead of deadlocking on a read->write upgrade)
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; WAL keeps the file consistent
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def create(conn: sqlite3.Connection) -> None:
    """The version-1 tables, if missing: all of them or none."""
    conn.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")


def upgrade(c: sqlite3.Connection, path: Path) -> str:
    """Bring the store to SCHEMA_VERSION inside the caller's write transaction; returns its store_id."""
    c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', '1')")
    (v,) = c.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if int(v) > SCHEMA_VERSION:
        raise UserError(f"label store {path}: written by a newer lmprefs (schema version {v}; this one reads up to "
                        f"{SCHEMA_VERSION}); upgrade lmprefs to open it")  # fmt: skip
    for version in range(int(v) + 1, SCHEMA_VERSION + 1):
        for sql in MIGRATIONS[version]:
            c.execute(sql)
        c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    (store_id,) = c.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
    return store_id


def check_store_path(path: str | Path, *, must_exist: bool, flag: str = "--db") -> Path:
    """The label-store path a command was given, or a UserError naming what is wrong with it: a directory, a
    missing folder, a missing store (when `must_exist`), or a file that is not SQLite (opening one would fail deep
    inside sqlite3) or empty (opening it would turn it into a store)."""

    p = Path(path)
    kind = path_kind(p, flag, path)  # a path too long to look up, a link to nothing: named as the flag's
    if kind == "dir":
        raise UserError(f"{flag} {p}: is a directory; give a label store file (.sqlite)")
    if kind == "other":  # a pipe or a device: opening it to read its header would wait for a writer
        raise UserError(f"{flag} {p}: not a regular file; give a label store file (.sqlite)")
    if kind == "none":
        if must_exist:
            raise UserError(f"{flag} {p}: label store does not exist; create it with `lmprefs label` or "
                            "`lmprefs import-labels`")  # fmt: skip
        if not p.parent.is_dir():
            raise UserError(f"{flag} {p}: folder {p.parent} does not exist")
        return p
    with open(p, "rb") as f:
        head = f.read(16)
    if not head and not Path(f"{p}-wal").exists():  # an SQLite store has its header from the moment it is made
        raise UserError(f"{flag} {p}: an empty file (0 bytes), not a label store; delete it, or give another path "
                        "(a store is made where none exists)")  # fmt: skip
    if head and head != b"SQLite format 3\x00":
        raise UserError(f"{flag} {p}: not a label store (not an SQLite file)")
    return p
