"""What the web app's queue asks the store: the items a labeler may be served next, in the store's order, with the
labels each already has; the gold questions they have not answered; whether one item may be served to them; and
the labels the shared pool's items want. The leases themselves are the queue's own, in memory
(`lmprefs.server.queue`). Methods of `StoreBase` (each takes the store first).

Only best_of_N and ranking_K items are served (the page picks the best option, or orders them all), never a held
one, and never one the labeler has answered (labeled, skipped or flagged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmprefs.labels.store.records import Candidate
from lmprefs.labels.store.schema import CHOICE_ITEM, QUEUE_ORDER

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase

_IS_BEST_OF = CHOICE_ITEM
_BEST_OF = f"{_IS_BEST_OF} AND i.hold IS NULL AND i.anchor = 0"  # anchors come round by their own schedule
_NOT_MINE = (
    "NOT EXISTS (SELECT 1 FROM labels l JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = i.id"
    " AND b.name = :labeler)"
)
# the store's next_item order and filter, plus best_of_N only, no gold, and the count of labels each item already has
_OPEN = (
    f"FROM items i WHERE i.status = 'pending' AND {_BEST_OF} AND i.gold IS NULL"
    f" AND (:batch IS NULL OR i.batch = :batch) AND {_NOT_MINE}"
)
_CANDIDATES = (
    "SELECT i.id, i.want_labels, (SELECT COUNT(*) FROM labels l WHERE l.item_id = i.id AND l.kind = 'label') "
    + _OPEN
    + f" ORDER BY {QUEUE_ORDER} LIMIT :limit"
)
# gold questions stay served to every labeler who has not answered them, whatever their status or batch
_GOLD = f"SELECT i.id FROM items i WHERE i.gold IS NOT NULL AND {_BEST_OF} AND {_NOT_MINE}"


def open_items(store: StoreBase, labeler: str, *, batch: str | None, limit: int) -> list[Candidate]:
    """The first `limit` items `labeler` may be served, in the queue's order (QUEUE_ORDER: highest priority, then
    highest acquisition score, then oldest first): pending best_of_N items, not gold, not held, in `batch` (None:
    any), that they have not answered."""
    args = {"batch": batch, "labeler": labeler, "limit": limit}
    return [Candidate(*r) for r in store.connection().execute(_CANDIDATES, args)]


def open_count(store: StoreBase, labeler: str, *, batch: str | None) -> int:
    """How many items `open_items` could give `labeler` without a limit."""
    args = {"batch": batch, "labeler": labeler}
    return store.connection().execute("SELECT COUNT(*) " + _OPEN, args).fetchone()[0]


def unanswered_gold(store: StoreBase, labeler: str) -> list[int]:
    """The gold questions (best_of_N, not held) `labeler` has not answered, in any batch and status."""
    return [i for (i,) in store.connection().execute(_GOLD, {"labeler": labeler})]


def servable(store: StoreBase, item_id: int, labeler: str, *, redo: bool = False) -> bool:
    """The item is a best_of_N, not held, and not yet answered by `labeler`; or, for an undo (`redo`), not retired
    (the answer being undone may be the flag that holds it)."""
    held = "i.hold IS NOT 'retired'" if redo else f"i.hold IS NULL AND {_NOT_MINE}"
    sql = f"SELECT 1 FROM items i WHERE i.id = :id AND {_IS_BEST_OF} AND {held}"
    return store.connection().execute(sql, {"id": item_id, "labeler": labeler}).fetchone() is not None


def items_wanting_fewer(store: StoreBase, labels: int, *, after_id: int) -> list[int]:
    """Pending items, not gold, with an id above `after_id`, that want fewer than `labels` labels."""
    sql = "SELECT id FROM items WHERE id > ? AND status = 'pending' AND gold IS NULL AND want_labels < ?"
    return [i for (i,) in store.connection().execute(sql, (after_id, labels))]


def set_want_labels(store: StoreBase, item_ids: list[int], labels: int) -> None:
    """The items of `item_ids` that are still pending want `labels` labels (one transaction)."""
    with store._tx() as c:
        c.executemany("UPDATE items SET want_labels = ? WHERE id = ? AND status = 'pending'",
                      [(labels, i) for i in item_ids])  # fmt: skip


def last_item_id(store: StoreBase) -> int:
    """The largest item id (0 in an empty store)."""
    return store.connection().execute("SELECT COALESCE(MAX(id), 0) FROM items").fetchone()[0]
