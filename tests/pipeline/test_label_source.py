"""An imported label file is read through a temporary store: its folder lives as long as the store, and goes when
the store is collected, when the process exits without closing it (not when a forked child exits), and when the
file is refused."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile

import pytest

from lmprefs.errors import UserError
from lmprefs.labels.formats import export_file
from lmprefs.labels.store import LabelStore
from lmprefs.pipeline.labeling import label_source


@pytest.fixture
def label_file(tmp_path, monkeypatch):
    with LabelStore(tmp_path / "src.sqlite") as store:
        for q in ("q1", "q2"):
            store.add_label(store.add_item(q, ["a", "b"], source="t", label_type="best_of_2"), "ann", best=1)
        export_file(store, tmp_path / "labels.jsonl", format="comparisons")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where mkdtemp puts the store's folder
    return tmp_path / "labels.jsonl", temp


def test_the_folder_lives_with_the_store(label_file):
    path, temp = label_file
    store = label_source(str(path))
    (folder,) = temp.iterdir()
    assert folder.name.startswith("lmprefs-labels-") and store.path.parent == folder
    assert len(store.labeled_examples("best_of_2")) == 2
    del store
    gc.collect()
    assert list(temp.iterdir()) == []


def test_a_refused_file_leaves_no_folder(label_file):
    path, temp = label_file
    path.write_text('{"not": "a label"}\n')
    with pytest.raises(UserError):
        label_source(str(path))
    gc.collect()
    assert list(temp.iterdir()) == []


def test_a_process_that_never_closes_it_leaves_no_folder(label_file):
    # a forked child that exits as Python exits, running its exit handlers, leaves the folder to its parent
    path, temp = label_file
    code = (
        "import os, sys; from lmprefs.pipeline.labeling import label_source; s = label_source(sys.argv[1])\n"
        "pid = os.fork()\n"
        "if pid == 0: sys.exit(0)\n"
        "os.waitpid(pid, 0); assert s.path.is_file() and len(s.labeled_examples('best_of_2')) == 2; print(s.path)"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       env={**os.environ, "TMPDIR": str(temp)}, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(str(temp)) and list(temp.iterdir()) == []
