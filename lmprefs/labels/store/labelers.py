"""Labelers: names, roles and sign-in tokens (only a token's sha256 is stored). Methods of `StoreBase` (each takes
the store first)."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING

from lmprefs.labels.store.records import Labeler, check_name, sha

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase


def token_hash(token: str) -> str:
    """What the store keeps of a sign-in token; a session remembers it to notice a revoked or replaced token."""
    return sha(token)


def labeler_id(c, name: str) -> int:
    """The id of labeler `name`, registered (without a token) if new; inside the caller's write transaction."""
    c.execute("INSERT OR IGNORE INTO labelers (name, created) VALUES (?, ?)", (check_name(name), time.time()))
    return c.execute("SELECT id FROM labelers WHERE name = ?", (name,)).fetchone()[0]


def add_labeler(store: StoreBase, name: str, admin: bool = False) -> str:
    """Register `name` and return a new login token (shown once: only its sha256 is stored). A labeler that
    exists without a token (e.g. created by an import) gets one; one that already has a token is an error."""
    token = secrets.token_urlsafe(32)
    with store._tx() as c:
        lid = labeler_id(c, name)
        if c.execute("SELECT token_hash FROM labelers WHERE id = ?", (lid,)).fetchone()[0] is not None:
            raise ValueError(f"labeler {name!r} already has a token")
        sql = "UPDATE labelers SET token_hash = ?, is_admin = ? WHERE id = ?"
        c.execute(sql, (token_hash(token), int(admin), lid))
    return token


_LABELER = "SELECT id, name, is_admin, created, token_hash IS NOT NULL, admitted, held FROM labelers"


def _labeler(row) -> Labeler:
    return Labeler(row[0], row[1], bool(row[2]), row[3], bool(row[4]), row[5], row[6])


def labeler_for_token(store: StoreBase, token: str) -> Labeler | None:
    """The labeler who signs in with `token`, or None."""
    row = store.connection().execute(f"{_LABELER} WHERE token_hash = ?", (token_hash(token),)).fetchone()
    return _labeler(row) if row else None


def labeler_for_session(store: StoreBase, labeler_id: int, token_hash: str) -> Labeler | None:
    """Labeler `labeler_id` if their token is still the one whose hash is `token_hash` (not revoked or replaced)."""
    sql = f"{_LABELER} WHERE id = ? AND token_hash = ?"
    row = store.connection().execute(sql, (labeler_id, token_hash)).fetchone()
    return _labeler(row) if row else None


def read_labelers(c) -> list[Labeler]:
    """Every registered labeler, with or without a token, by name, read on connection `c` (a snapshot's, say)."""
    return [_labeler(r) for r in c.execute(f"{_LABELER} ORDER BY name")]


def labelers(store: StoreBase) -> list[Labeler]:
    """Every registered labeler, with or without a token, by name."""
    return read_labelers(store.connection())


def labelers_with_tokens(store: StoreBase) -> int:
    """How many labelers can sign in."""
    return store.connection().execute("SELECT COUNT(*) FROM labelers WHERE token_hash IS NOT NULL").fetchone()[0]


def revoke_token(store: StoreBase, name: str) -> bool:
    """Take away `name`'s token (their sessions end at their next request); False if there is no such labeler."""
    with store._tx() as c:
        return c.execute("UPDATE labelers SET token_hash = NULL WHERE name = ?", (name,)).rowcount > 0
