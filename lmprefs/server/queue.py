"""Which item a labeler sees next: the store's queue order plus a short in-memory lease.

`LabelStore.next_item` has no lease, so 20 labelers opening the page at once would all get the oldest item and 19
answers would be spent on an item that wanted one. Here each labeler holds at most one item ("current"), for
`lease_seconds` after they last loaded it; a labeler gets the first item in the store's order (priority, then
age) that has not had all the labels it wants from answers plus other labelers' live leases. If every pending item
is leased to others the labeler still gets the first one (a second opinion is never wasted: it measures agreement).
Only best_of_N items are served, since the page is a pick-the-best form. Leases are lost on restart, which only means
the next labeler may see the same item.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass

from lmprefs.labels.store import Item, LabelStore

# the store's next_item order and filter, plus best_of_N only and the count of labels each item already has
_OPEN = (
    "FROM items i WHERE i.status = 'pending' AND i.label_type LIKE 'best!_of!_%' ESCAPE '!'"
    " AND (:batch IS NULL OR i.batch = :batch) AND NOT EXISTS (SELECT 1 FROM labels l"
    " JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = i.id AND b.name = :labeler)"
)
_CANDIDATES = (
    "SELECT i.id, i.want_labels, (SELECT COUNT(*) FROM labels l WHERE l.item_id = i.id AND l.kind = 'label') "
    + _OPEN
    + " ORDER BY i.priority DESC, i.id LIMIT :limit"
)


@dataclass(frozen=True)
class Progress:
    labeled: int
    skipped: int
    flagged: int
    remaining: int  # pending best_of_N items this labeler has not answered


class Queue:
    def __init__(self, store: LabelStore, *, batch: str | None = None, lease_seconds: float = 900) -> None:
        self.store, self.batch, self.lease_seconds = store, batch, lease_seconds
        self._current: dict[str, tuple[int, float]] = {}  # labeler -> (item id, lease expiry)
        self._lock = threading.Lock()  # one labeler picks at a time, so two never take the same free item

    def _answered(self, item_id: int, labeler: str) -> bool:
        return (
            self.store.connection()
            .execute(
                "SELECT 1 FROM labels l JOIN labelers b ON b.id = l.labeler_id WHERE l.item_id = ? AND b.name = ?",
                (item_id, labeler),
            )
            .fetchone()
            is not None
        )

    def current(self, labeler: str) -> Item | None:
        """The item `labeler` should answer now (the same one on reload), or None when nothing is left."""
        now = time.time()
        with self._lock:
            self._current = {k: v for k, v in self._current.items() if v[1] > now}
            held = self._current.get(labeler)
            if held and not self._answered(held[0], labeler):
                item_id = held[0]
            else:
                leased = Counter(item for name, (item, _) in self._current.items() if name != labeler)
                # at most len(leased) candidates can be blocked, so one more is enough to find a free one
                rows = (
                    self.store.connection()
                    .execute(_CANDIDATES, {"batch": self.batch, "labeler": labeler, "limit": sum(leased.values()) + 1})
                    .fetchall()
                )
                if not rows:
                    self._current.pop(labeler, None)
                    return None
                free = [r for r in rows if r[2] + leased[r[0]] < r[1]]
                item_id = (free or rows)[0][0]
            self._current[labeler] = (item_id, now + self.lease_seconds)
        return self.store.get_item(item_id)

    def release(self, labeler: str, item_id: int) -> None:
        """`labeler` answered `item_id`: its lease ends now."""
        with self._lock:
            if self._current.get(labeler, (None,))[0] == item_id:
                del self._current[labeler]

    def progress(self, labeler_id: int, labeler: str) -> Progress:
        c = self.store.connection()
        kinds = dict(c.execute("SELECT kind, COUNT(*) FROM labels WHERE labeler_id = ? GROUP BY kind", (labeler_id,)))
        (remaining,) = c.execute("SELECT COUNT(*) " + _OPEN, {"batch": self.batch, "labeler": labeler}).fetchone()
        return Progress(kinds.get("label", 0), kinds.get("skip", 0), kinds.get("flag", 0), remaining)
