"""One process per run directory: an flock the kernel drops when the holder dies."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.run_owner import claim, refuse_other


@contextlib.contextmanager
def run_lock(run_dir: Path, command: str | None = None):
    """Hold an exclusive flock on RUN_DIR/.lock while the block runs (the kernel drops it when the process dies,
    even by kill -9); a second holder gets one line naming the first: pid, host and start time. `command`: the
    command the directory is for, refused where another made it and recorded where none has (run_owner.claim)."""
    import fcntl

    run_dir = Path(run_dir)
    if command is not None:
        refuse_other(run_dir, command, "--run-dir")  # before the lock file is made in another command's directory
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
    finally:
        f.close()
