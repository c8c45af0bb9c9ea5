"""The SQLite label store: idempotent items, queue semantics, label validation, agreement, tokens, concurrency."""

import multiprocessing as mp
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lmprefs.labels.store import DuplicateLabelError, ImportRow, LabelStore

SAMPLES = ["a", "b", "c", "d"]
PACKAGE = Path(__file__).resolve().parents[2] / "lmprefs"
# what talking to SQLite looks like: a statement run, a raw connection or transaction, sqlite3, or SQL text
SQL = re.compile(
    r"\.(execute|executemany|executescript|cursor|connection|snapshot|_tx)\(|^\s*(import|from) sqlite3\b"
    r"|\b(SELECT|INSERT|UPDATE|DELETE|REPLACE)\s+(INTO\s+|FROM\s+|OR\s+)?[\w*(]|\b(CREATE|ALTER|DROP)\s+(TABLE|INDEX)\b"
    r"|\bPRAGMA\b|\bBEGIN\s+IMMEDIATE\b",
    re.MULTILINE,
)


@pytest.fixture
def store(tmp_path):
    with LabelStore(tmp_path / "labels.db") as s:
        yield s


def test_pragmas_and_no_torch(store, tmp_path):
    c = store.connection()
    assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert c.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    code = "import sys, lmprefs.labels.store; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_only_the_store_speaks_sql():
    """Every module outside lmprefs/labels/store/ asks the store by its methods, so the tables and columns can change
    in one place: no SQL text, no statement run, no raw connection or transaction."""
    store_dir = PACKAGE / "labels" / "store"
    outside = {
        f"{path.relative_to(PACKAGE.parent)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
        for path in PACKAGE.rglob("*.py")
        if store_dir not in path.parents
        for text in [path.read_text(encoding="utf-8")]
        for m in SQL.finditer(text)
    }
    assert not outside, "SQL outside the label store:\n" + "\n".join(sorted(outside))
    inside = [m for path in store_dir.glob("*.py") for m in SQL.finditer(path.read_text(encoding="utf-8"))]
    assert len(inside) > 100  # the pattern still finds the store's own SQL


def test_add_item_is_idempotent(store):
    a = store.add_item("q", SAMPLES, source="run:1")
    assert store.add_item("q", SAMPLES, source="run:1") == a
    assert store.add_item("q", SAMPLES, source="run:2") != a  # another source is another question
    assert store.add_item("q", ["b", "a", "c", "d"], source="run:1") != a  # order matters
    assert store.add_item("q", SAMPLES, source="run:1", key="dup1") != a
    counts = store.table_counts()
    assert counts["queries"] == 1 and counts["samples"] == 4 and counts["items"] == 4  # texts are shared
    assert store.get_item(a).samples == SAMPLES and store.get_item(a).status == "pending"


def test_add_item_validates(store):
    with pytest.raises(ValueError, match="4 sample strings"):
        store.add_item("q", ["a", "b"], source="x")
    with pytest.raises(ValueError, match="tokenizer"):
        store.add_item("q", SAMPLES, source="x", query_tokens=[1, 2])
    with pytest.raises(ValueError, match="unknown label type 'best_of_one'"):
        store.add_item("q", SAMPLES, source="x", label_type="best_of_one")
    assert store.table_counts()["items"] == 0


def test_next_item_queue(store):
    low = store.add_item("q1", SAMPLES, source="s", batch="b1")
    high = store.add_item("q2", SAMPLES, source="s", batch="b2", priority=5)
    two = store.add_item("q3", SAMPLES, source="s", batch="b1", want_labels=2)
    assert store.next_item("alice").id == high  # priority first
    assert store.next_item("alice", batch="b1").id == low  # then oldest, within the batch
    store.add_label(high, "alice", best=0)
    store.add_label(low, "alice", kind="skip", note="unreadable")
    assert store.next_item("alice").id == two  # done and skipped items are gone for alice
    assert store.next_item("bob").id == low  # alice's skip does not take the item from bob
    store.add_label(two, "alice", best=1)
    assert store.next_item("alice") is None and store.next_item("bob").id == low
    assert store.pending_count() == 2 and store.pending_count(batch="b1") == 2 and store.pending_count(batch="b2") == 0
    store.add_label(two, "bob", best=1)  # the second wanted label closes it
    assert store.get_item(two).status == "done" and store.pending_count() == 1


def test_labels_are_validated_and_unique(store):
    i = store.add_item("q", SAMPLES, source="s")
    r = store.add_item("q", ["x"], source="s", label_type="scalar_rating")
    for kwargs, msg in [
        ({"best": 4}, r"best=4 is out of range 0\.\.3"),
        ({"best": -1}, "out of range"),
        ({"best": True}, "out of range"),
        ({"score": 1.0}, "exactly best"),
        ({}, "exactly best"),
        ({"best": 1, "kind": "maybe"}, "kind='maybe'"),
        ({"best": 1, "kind": "skip"}, "carries no value"),
    ]:
        with pytest.raises(ValueError, match=msg):
            store.add_label(i, "alice", **kwargs)
    with pytest.raises(ValueError, match="no item with id 99"):
        store.add_label(99, "alice", best=0)
    with pytest.raises(ValueError, match="finite"):
        store.add_label(r, "alice", score=float("nan"))
    first = store.add_label(i, "alice", best=2)
    with pytest.raises(DuplicateLabelError, match=f"label {first}"):
        store.add_label(i, "alice", best=1)
    with pytest.raises(DuplicateLabelError):
        store.add_label(i, "alice", kind="flag")
    # the schema itself refuses a second row and a value-less label, whatever the Python code does
    with pytest.raises(sqlite3.IntegrityError):
        store.connection().execute(
            "INSERT INTO labels (item_id, labeler_id, kind, created) VALUES (?, 1, 'label', 0)", (i,)
        )
    store.add_label(r, "alice", score=3)
    assert store.counts_by_labeler() == {"alice": {"label": 2, "skip": 0, "flag": 0}}


def test_labeled_examples_and_tokens(store):
    a = store.add_item(
        "q", SAMPLES, source="s", tokenizer="gpt2", query_tokens=[1, 2], sample_tokens=[[3], [4], [5], [6]]
    )
    b = store.add_item("q2", SAMPLES, source="s")
    store.add_label(a, "alice", best=3)
    store.add_label(b, "alice", best=0)
    store.add_label(a, "bob", kind="flag")
    ex = store.labeled_examples("best_of_4", tokenizer="gpt2")
    assert [(e.item_id, e.best, e.labeler) for e in ex] == [(a, 3, "alice"), (b, 0, "alice")]
    assert ex[0].query_tokens == [1, 2] and ex[0].sample_tokens == [[3], [4], [5], [6]]
    assert ex[1].query_tokens is None and ex[1].sample_tokens is None  # no ids stored for these texts
    assert store.labeled_examples()[0].query_tokens is None  # ids only when asked for
    assert [e.item_id for e in store.labeled_examples(since_id=ex[0].label_id)] == [b]
    assert store.labeled_examples("best_of_2") == []


def test_agreement_by_hand(store):
    items = [store.add_item(f"q{k}", SAMPLES, source="s", want_labels=3) for k in range(4)]
    answers = {  # item -> {labeler: best}
        0: {"ann": 1, "bob": 1, "cid": 2},  # pairs: ann-bob agree, ann-cid no, bob-cid no
        1: {"ann": 0, "bob": 0},  # ann-bob agree
        2: {"ann": 3, "cid": 3},  # ann-cid agree
        3: {"bob": 2},  # one label: not counted
    }
    for k, by in answers.items():
        for name, best in by.items():
            store.add_label(items[k], name, best=best)
    store.add_label(items[3], "ann", kind="skip")  # skips never count
    ag = store.agreement()
    assert ag.items == 3
    assert ag.rate == pytest.approx(3 / 5)
    assert ag.pairs == {("ann", "bob"): (1.0, 2), ("ann", "cid"): (0.5, 2), ("bob", "cid"): (0.0, 1)}


def test_labeler_tokens(store):
    token = store.add_labeler("alice", admin=True)
    assert len(token) >= 40
    raw = store.connection().execute("SELECT token_hash FROM labelers").fetchall()
    assert all(token not in str(r) for r in raw)  # only the hash is stored
    who = store.labeler_for_token(token)
    assert who.name == "alice" and who.is_admin
    assert store.labeler_for_token(token + "x") is None
    with pytest.raises(ValueError, match="already has a token"):
        store.add_labeler("alice")
    i = store.add_item("q", SAMPLES, source="s")
    store.add_label(i, "bob", best=0)  # labelers appear on first label, without a token ...
    assert not store.labeler_for_token(store.add_labeler("bob")).is_admin  # ... and can get one later


def test_transaction_and_import_batch_are_all_or_nothing(store):
    store.add_item("q0", SAMPLES, source="s")
    before = store.table_counts()
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.add_label(store.add_item("q1", SAMPLES, source="s"), "alice", best=0)
            raise RuntimeError("crash")
    rows = [
        ImportRow("q", SAMPLES, "best_of_4", "import:f", "imp", best=1),
        ImportRow("q", SAMPLES, "best_of_4", "import:f", "imp", best=5),
    ]
    with pytest.raises(ValueError, match="out of range"):
        store.import_batch(rows)
    assert store.table_counts() == before
    counts = store.import_batch(rows[:1])
    assert (counts.items_added, counts.labels_added) == (1, 1)
    again = store.import_batch(rows[:1])
    assert (again.items_present, again.labels_present, again.labels_added) == (1, 1, 0)
    with pytest.raises(DuplicateLabelError):  # same labeler, different answer
        store.import_batch([ImportRow("q", SAMPLES, "best_of_4", "import:f", "imp", best=2)])


def test_threads_lose_nothing(store):
    items = [store.add_item(f"q{k}", SAMPLES, source="s") for k in range(80)]
    errors = []

    def work(t: int) -> None:
        try:
            for k in range(t, 80, 8):
                store.add_label(items[k], f"worker{t}", best=k % 4)
                store.add_item(f"new{t}-{k}", SAMPLES, source="s")
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert len(store.labeled_examples()) == 80 and store.table_counts()["items"] == 160
    assert sum(c["label"] for c in store.counts_by_labeler().values()) == 80


def _process_worker(path: str, worker: int) -> None:
    with LabelStore(path) as s:
        for k in range(20):
            s.add_label(s.add_item(f"p{worker}-{k}", SAMPLES, source="proc"), f"p{worker}", best=k % 4)


def test_processes_share_a_store(tmp_path):
    path = str(tmp_path / "shared.db")
    LabelStore(path).close()
    procs = [mp.get_context("spawn").Process(target=_process_worker, args=(path, w)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    with LabelStore(path) as s:
        assert len(s.labeled_examples()) == 60


def test_a_replaced_answer_keeps_its_time_and_its_first_answer(store):
    item = store.add_item("q", SAMPLES, source="t")
    store.set_gold(item, 1)
    label = store.add_label(item, "bob", best=0)
    (created,) = store.connection().execute("SELECT created FROM labels WHERE id = ?", (label,)).fetchone()
    for answer in ({"best": 1}, {"kind": "skip"}, {"best": 1}):  # undo after undo: the first answer stays first
        assert store.add_label(item, "bob", replace=True, **answer) == label
    row = store.connection().execute("SELECT kind, best, created, first_kind, first_best FROM labels").fetchall()
    assert row == [("label", 1, created, "label", 0)]
    assert store.last_answer(store.labelers()[0].id, source="")[2] == created  # the undo window runs from it
    assert store.gold_accuracy() == {"bob": (0, 1)} and [e.best for e in store.labeled_examples()] == [1]
