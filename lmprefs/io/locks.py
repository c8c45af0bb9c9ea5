"""One process per run directory: an flock the kernel drops when the holder dies."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

from lmprefs.errors import UserError


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold an exclusive flock on RUN_DIR/.lock while the block runs (the kernel drops it when the process dies,
    even by kill -9); a second holder gets one line naming the first: pid, host and start time."""
    import fcntl

    run_dir = Path(run_dir)
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
        yield
    finally:
        f.close()
