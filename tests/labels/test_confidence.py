"""A labeler's confidence in an answer, 1 (a guess) to 3 (sure): stored with a label, refused out of scale or on a
skip (nothing stored), exported in comparisons JSONL and read back."""

from __future__ import annotations

import json

import pytest

from lmprefs.labels.formats import export_file, import_file
from lmprefs.labels.store import LabelStore


def test_confidence_is_stored_checked_exported_and_imported(tmp_path):
    with LabelStore(tmp_path / "c.sqlite") as store:
        a = store.add_item("q1", ["a", "b"], source="t", label_type="best_of_2")
        b = store.add_item("q2", ["c", "d"], source="t", label_type="best_of_2")
        before = store.table_counts()
        for bad in (0, 4, "2", True, 2.5):
            with pytest.raises(ValueError, match="confidence=.* must be 1 \\(a guess\\), 2 or 3 \\(sure\\)"):
                store.add_label(a, "ann", best=1, confidence=bad)
        with pytest.raises(ValueError, match="a skip carries no confidence"):
            store.add_label(a, "ann", kind="skip", confidence=2)
        assert store.table_counts() == before
        store.add_label(a, "ann", best=1, confidence=2)
        store.add_label(b, "ann", best=0)
        assert [e.confidence for e in store.labeled_examples("best_of_2")] == [2, None]
        assert store.answers_since(0)[0].confidence == 2
        out = tmp_path / "c.jsonl"
        export_file(store, out, format="comparisons")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["confidence"] == 2 and "confidence" not in rows[1]
    with LabelStore(tmp_path / "again.sqlite") as again:
        import_file(again, out)
        assert [e.confidence for e in again.labeled_examples("best_of_2")] == [2, None]
