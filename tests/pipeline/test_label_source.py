"""An imported label file is read through a temporary store: its folder lives as long as the store, and goes when
the store is collected, when the process exits without closing it (not when a forked child exits), and when the
file is refused; a process killed with its store open leaves the folder to the next temporary store, which sweeps
it, and only it."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from lmprefs.errors import UserError
from lmprefs.io.locks import ORPHAN_AGE_S
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


def _aged(folder):
    """Make folder's lock file look older than the sweep's grace period."""
    past = time.time() - 2 * ORPHAN_AGE_S
    os.utime(folder / ".lock", (past, past))
    return folder


def test_a_killed_process_leaves_its_folder_to_the_next_store_only(label_file):
    path, temp = label_file
    env = {**os.environ, "TMPDIR": str(temp)}
    opened = "import os, sys; from lmprefs.pipeline.labeling import label_source; s = label_source(sys.argv[1])\n"
    killed = subprocess.run([sys.executable, "-c", opened + "print(s.path.parent, flush=True); "
                             "os.kill(os.getpid(), 9)", str(path)], capture_output=True, text=True, env=env,
                            timeout=120)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    orphan = _aged(temp / os.path.basename(killed.stdout.strip()))
    assert (orphan / "labels.sqlite").is_file()
    fresh = temp / "lmprefs-labels-fresh"  # unlocked, but as young as a folder whose maker has not locked it yet
    fresh.mkdir()
    (fresh / ".lock").touch()
    unlocked = temp / "lmprefs-labels-older-code"  # no lock file: not one this code made
    unlocked.mkdir()
    waits = opened + "print(s.path.parent, flush=True); sys.stdin.read()"
    live = subprocess.Popen([sys.executable, "-c", waits, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)  # fmt: skip
    try:
        held = _aged(temp / os.path.basename(live.stdout.readline().strip()))
        store = label_source(str(path))
        assert not orphan.exists()
        assert held.is_dir() and fresh.is_dir() and unlocked.is_dir() and store.path.is_file()
        assert len(store.labeled_examples("best_of_2")) == 2
    finally:
        live.communicate("", timeout=120)
    assert live.returncode == 0 and not held.exists()
    del store
    gc.collect()
    assert sorted(p.name for p in temp.iterdir()) == ["lmprefs-labels-fresh", "lmprefs-labels-older-code"]
    _aged(fresh)
    label_source(str(path))
    gc.collect()
    assert [p.name for p in temp.iterdir()] == ["lmprefs-labels-older-code"]
