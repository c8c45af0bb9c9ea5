"""Pieces both benchmark scripts use (they run as `python benchmarks/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path


def source_fingerprint() -> dict:
    """sha1 of lmprefs' Python sources (and their newest mtime): which code a run measured, without git."""
    import lmprefs

    root = Path(lmprefs.__file__).parent
    h, newest = hashlib.sha1(), 0.0
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
        newest = max(newest, f.stat().st_mtime)
    return {"sha1": h.hexdigest()[:12], "newest_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(newest))}
