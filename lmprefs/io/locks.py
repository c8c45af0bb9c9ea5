"""One process per run directory, and temporary folders that outlive no process: flocks the kernel drops when the
holder dies."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import IO

from lmprefs.errors import UserError
from lmprefs.io.run_owner import MARKER, claim, refuse_other


@contextlib.contextmanager
def run_lock(run_dir: Path, command: str | None = None):
    """Hold an exclusive flock on RUN_DIR/.lock while the block runs (the kernel drops it when the process dies,
    even by kill -9); a second holder gets one line naming the first: pid, host and start time. `command`: the
    command the directory is for, refused where another made it and recorded where none has (run_owner.claim)."""
    import fcntl

    run_dir = Path(run_dir)
    if command is not None:
        refuse_other(run_dir, command, "--run-dir")  # before the lock file is made in another command's directory
    made = [d for d in [run_dir, *run_dir.parents] if not d.exists()]  # the folders mkdir makes, deepest first
    claimed = not (run_dir / MARKER).exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    f = open(path, "a+")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            who = f.read().strip() or "another process"
            raise UserError(f"{run_dir} is in use by {who}; wait for it to finish or stop it first") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
        f.flush()
        if command is not None:  # checked again once held: another process may have claimed it meanwhile
            claim(run_dir, command)
        yield
    except BaseException:
        _undo_start(run_dir, made, claimed)
        raise
    finally:
        f.close()


def _undo_start(run_dir: Path, made: list[Path], claimed: bool) -> None:
    """After a run failed before it wrote anything of its own (a refusal once the lock was held), take away what
    run_lock put there: the record that would mark the directory as a run, the lock file, the folders it made (a
    default run directory's runs/ too, where it made that). A run that wrote more keeps its directory, to be
    continued."""
    if {p.name for p in run_dir.iterdir()} - {".lock", MARKER}:
        return
    if claimed:
        (run_dir / MARKER).unlink(missing_ok=True)
    if made:
        (run_dir / ".lock").unlink(missing_ok=True)
        for d in made:  # deepest first; one another process has put something in meanwhile stays
            try:
                d.rmdir()
            except OSError:
                break


ORPHAN_AGE_S = 60.0
"""A temporary folder's lock file younger than this is never swept: its maker may not have locked it yet."""


def locked_temp_dir(prefix: str) -> tuple[Path, IO[str]]:
    """A new folder under the system's temporary directory and its lock file, open and flocked by this process
    (close it once the folder is removed). The kernel drops the lock when the process dies, even by kill -9, so the
    folders of this prefix whose maker died without removing them are swept first (`sweep_orphans`)."""
    import fcntl

    sweep_orphans(prefix)
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    f = open(folder / ".lock", "w")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder just made: nobody else holds it
    return folder, f


def sweep_orphans(prefix: str) -> None:
    """Remove the folders `locked_temp_dir(prefix)` made whose lock no process holds (their maker died, or a
    process it forked, which shares the lock, has ended too). A folder without a lock file (made by older code, or
    its maker not yet past `open`) or with a lock file younger than ORPHAN_AGE_S is left alone."""
    import fcntl

    for folder in Path(tempfile.gettempdir()).glob(prefix + "*"):
        try:
            f = open(folder / ".lock", "r+")
        except OSError:  # no lock file, not a folder, another user's
            continue
        with f:
            try:
                if time.time() - os.fstat(f.fileno()).st_mtime < ORPHAN_AGE_S:
                    continue
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its process lives
                continue
            shutil.rmtree(folder, ignore_errors=True)
