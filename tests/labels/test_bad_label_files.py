"""Label files and label stores, a table of bad inputs: exit 2, one line naming the value, no traceback, and nothing
written (the store as it was, no file or store created)."""

from __future__ import annotations

import json
import os

import pytest

from lmprefs.cli.dispatch import main


def _pairs(rows: list[tuple[str, str, str]]) -> str:
    return "".join(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in rows)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """tmp_path as the working directory, holding pairs.jsonl and a store of its two best_of_2 labels."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pairs.jsonl").write_text(_pairs([("q1", "a good one", "a bad one"), ("q2", "yes", "no")]))
    assert main(["import-labels", "pairs.jsonl", "--db", "pairs.sqlite"]) == 0
    return tmp_path


def _tree(root) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


ROWS = [
    # (files to write first, argv, text the one line must contain)
    ({"none.jsonl": ""}, ["import-labels", "none.jsonl", "--format", "pairs", "--db", "new.sqlite"],
     "none.jsonl: holds no rows to import"),
    ({"blank.jsonl": "\n\n"}, ["import-labels", "blank.jsonl", "--format", "scores", "--db", "pairs.sqlite"],
     "blank.jsonl: holds no rows to import"),
    ({"same.jsonl": _pairs([("q", "same", "same")])}, ["import-labels", "same.jsonl", "--db", "new.sqlite"],
     "same.jsonl line 1: fields 'chosen' and 'rejected' are the same text"),
    ({"empty.jsonl": _pairs([("q", "  ", "b")])}, ["import-labels", "empty.jsonl", "--db", "new.sqlite"],
     "empty.jsonl line 1: field 'chosen' is empty"),
    ({"nul.jsonl": _pairs([("q", "a\0b", "c")])}, ["import-labels", "nul.jsonl", "--db", "new.sqlite"],
     "nul.jsonl line 1: field 'chosen' holds a NUL character"),
    ({"nul2.jsonl": json.dumps({"query": "q\0", "samples": ["a", "b"], "best": 0}) + "\n"},
     ["import-labels", "nul2.jsonl", "--db", "new.sqlite"], "nul2.jsonl line 1: a text holds a NUL character"),
    ({}, ["import-labels", "pairs.jsonl", "--db", "/proc/new.sqlite"], "label store /proc/new.sqlite: cannot open"),
    ({}, ["export-labels", "/proc/out.jsonl", "--db", "pairs.sqlite"], "export file /proc/out.jsonl: cannot write"),
    ({}, ["export-labels", "out.json", "--db", "pairs.sqlite"],
     "no best_of_4 labels to export as openai (its questions are best_of_2); export them with label_type best_of_2"),
    ({}, ["export-labels", "out.json", "--db", "pairs.sqlite", "--label-type", "best_of"], "--label-type: unknown"),
    ({}, ["serve", "--db", "pairs.sqlite", "--batch", "-3", "--port", "0"],
     "--batch '-3': pairs.sqlite holds no items of that batch"),
]


@pytest.mark.parametrize("files,argv,needle", ROWS, ids=[" ".join(r[1]) for r in ROWS])
def test_bad_label_input_exits_2_with_one_line_and_writes_nothing(work, capsys, files, argv, needle):
    for name, text in files.items():
        (work / name).write_text(text)
    before = _tree(work)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
    assert _tree(work) == before and not os.path.exists("/proc/new.sqlite")


def test_export_of_the_labels_asked_for_works(work):
    assert main(["export-labels", "out.json", "--db", "pairs.sqlite", "--label-type", "best_of_2"]) == 0
    rows = json.loads((work / "out.json").read_text())
    assert len(rows) == 2 and {"query", "sample0", "sample1", "best"} <= set(rows[0])
