"""The store's schema version: a store written by the previous version opens and is upgraded in place, keeping its
labels; a store written by newer code is refused in one line and left as it was."""

from __future__ import annotations

import sqlite3

import pytest

from lmprefs.cli.dispatch import main
from lmprefs.errors import UserError
from lmprefs.labels.store import LabelStore, schema


def write_version_2_store(path) -> None:
    """What the code before version 3 wrote: version 1's tables and version 2's upgrade, with one label."""
    conn = sqlite3.connect(path)
    conn.executescript(schema.SCHEMA)
    for sql in schema.MIGRATIONS[2]:
        conn.execute(sql)
    conn.executescript(
        "INSERT INTO meta VALUES ('schema_version', '2');"
        "INSERT INTO queries VALUES (1, 'q', 'h', 0);"
        + "".join(f"INSERT INTO samples VALUES ({j}, 1, 's{j}', 'h{j}', 0);" for j in range(1, 5))
        + "INSERT INTO items (id, ident, query_id, label_type, num_samples, source, created, gold)"
        " VALUES (1, 'i1', 1, 'best_of_4', 4, 't', 0, 2);"
        + "".join(f"INSERT INTO item_samples VALUES (1, {j - 1}, {j});" for j in range(1, 5))
        + "INSERT INTO labelers (id, name, created) VALUES (1, 'old', 0);"
        "INSERT INTO labels (item_id, labeler_id, kind, best, created, shown, seconds)"
        " VALUES (1, 1, 'label', 2, 5, '[2, 0, 1, 3]', 1.5);"
    )
    conn.commit()
    conn.close()


def test_a_version_2_store_is_upgraded_in_place_and_keeps_its_labels(tmp_path):
    path = tmp_path / "v2.sqlite"
    write_version_2_store(path)
    with LabelStore(path) as store:
        version = store.connection().execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == (str(schema.SCHEMA_VERSION),)
        assert [(e.item_id, e.best, e.labeler) for e in store.labeled_examples()] == [(1, 2, "old")]
        assert store.gold_accuracy() == {"old": (1, 1)}  # an answer never replaced counts as it is
        assert store.is_admitted(1)  # labelers from before onboarding need none
        assert store.get_item(1).acquisition is None and store.acquisition_by() is None  # no queue score yet
        store.add_label(1, "old", best=0, replace=True)  # an undo after the upgrade keeps the first answer
        assert store.gold_accuracy() == {"old": (1, 1)} and store.labeled_examples()[0].best == 0
    with LabelStore(path) as store:  # a second open changes nothing
        assert store.table_counts()["labels"] == 1


def test_a_store_from_newer_code_is_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "new.sqlite"
    with LabelStore(path) as store:
        store.add_labeler("zoe")
        with store.transaction():
            store.connection().execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    before = path.read_bytes()
    refused = rf"schema version 99; this one reads up to {schema.SCHEMA_VERSION}\); upgrade lmprefs"
    with pytest.raises(UserError, match=refused):
        LabelStore(path)
    assert main(["labelers", "list", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert "newer lmprefs" in err and len(err.strip().splitlines()) == 1
    assert path.read_bytes() == before


def test_a_version_7_store_gives_its_labels_feed_positions_in_id_order(tmp_path):
    path = tmp_path / "v7.sqlite"
    write_version_2_store(path)
    conn = sqlite3.connect(path)
    for version in range(3, 8):
        for sql in schema.MIGRATIONS[version]:
            conn.execute(sql)
    conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with LabelStore(path) as store:
        assert [(a.id, a.position) for a in store.answers_since(0)] == [(1, 1)]
        assert store.is_admitted(1) and not store.is_held(1)
        store.add_label(1, "new", best=3)
        store.add_label(1, "old", best=0, replace=True)  # an undo: the same row, at the feed's end
        assert [(a.id, a.labeler, a.position) for a in store.answers_since(0)] == [(2, "new", 2), (1, "old", 3)]
