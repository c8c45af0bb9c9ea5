"""Labelers: names, roles and sign-in tokens (only a token's sha256 is stored). Methods of `LabelStore` (each takes
the store first)."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from lmprefs.labels.store.records import Labeler, check_name, sha

if TYPE_CHECKING:
    from lmprefs.labels.store.core import LabelStore


def labeler_id(c, name: str) -> int:
    """The id of labeler `name`, registered (without a token) if new; inside the caller's write transaction."""
    c.execute("INSERT OR IGNORE INTO labelers (name, created) VALUES (?, ?)", (check_name(name), time.time()))
    return c.execute("SELECT id FROM labelers WHERE name = ?", (name,)).fetchone()[0]


def add_labeler(store: LabelStore, name: str, admin: bool = False) -> str:
    """Register `name` and return a new login token (shown once: only its sha256 is stored). A labeler that
    exists without a token (e.g. created by an import) gets one; one that already has a token is an error."""
    token = secrets.token_urlsafe(32)
    with store._tx() as c:
        lid = labeler_id(c, name)
        if c.execute("SELECT token_hash FROM labelers WHERE id = ?", (lid,)).fetchone()[0] is not None:
            raise ValueError(f"labeler {name!r} already has a token")
        c.execute("UPDATE labelers SET token_hash = ?, is_admin = ? WHERE id = ?", (sha(token), int(admin), lid))
    return token


def labeler_for_token(store: LabelStore, token: str) -> Labeler | None:
    row = (
        store.connection()
        .execute("SELECT id, name, is_admin, created FROM labelers WHERE token_hash = ?", (sha(token),))
        .fetchone()
    )
    return Labeler(row[0], row[1], bool(row[2]), row[3]) if row else None
