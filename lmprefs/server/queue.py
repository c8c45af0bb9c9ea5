"""Which item a labeler sees next: the store's queue order plus a short in-memory lease, gold questions mixed in,
a shared pool of items that several labelers answer (overlap), and the order each labeler sees the options in.

`LabelStore.next_item` has no lease, so 20 labelers opening the page at once would all get the oldest item and 19
answers would be spent on an item that wanted one. Here each labeler holds at most one item ("current"), for
`lease_seconds` after they last loaded it; a labeler gets the first item in the store's order (priority, then
age) that has not had all the labels it wants from answers plus other labelers' live leases. An expired lease no
longer keeps the item from others, but stays the labeler's own: after a long pause they come back to the same item
and can still answer it. If every pending item
is leased to others the labeler still gets the first one (a second opinion is never wasted: it measures agreement).
Only best_of_N items are served, since the page is a pick-the-best form, and never a held (flagged or retired) one.
The web app accepts an answer only for the item leased to that labeler. Leases are lost on restart, which only
means the next labeler may see the same item.

Quality control (the paper's labelers agreed with the authors only 38-46% of the time):
- gold: with probability `gold_rate` a labeler's next item is a gold question (known answer) they have not answered,
  unannounced; gold questions are served only beside real work, never on their own.
- overlap: a fixed `overlap_fraction` of items (chosen by a hash of the store id and item id, so the choice is
  stable across restarts) want `overlap_k` labels, so agreement between labelers can be measured on them.
- shuffling: each labeler sees each item's options in their own order (a keyed hash of store, labeler and item, so
  a reload shows the same order and a labeler cannot predict it); the label stores that order and the sample index.
- drift anchors (drift.py) come before the queue; what the queue keeps for them is in memory like a lease: the
  anchors a labeler skipped or flagged in an interval (not served again in it) and an undone anchor answer.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

from lmprefs.labels.store import Item, LabelStore


@dataclass(frozen=True)
class Progress:
    labeled: int
    skipped: int
    flagged: int
    remaining: int  # pending best_of_N items this labeler has not answered, and gold questions they may be served


@dataclass(frozen=True)
class Lease:
    item_id: int
    expires: float
    shown_at: float  # when this labeler was first shown the item (time on task starts here)
    redo: bool = False  # an undo: the answer replaces the labeler's earlier one


def _unit(*parts) -> float:
    """A uniform number in [0, 1) from a hash of `parts` (stable across runs and machines)."""
    return int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:13], 16) / 16**13


def display_order(store_id: str, labeler: str, item_id: int, n: int) -> list[int]:
    """The order `labeler` sees item `item_id`'s n options in: displayed position p shows stored sample order[p]."""
    order = list(range(n))
    random.Random(hashlib.sha256(f"{store_id}:{labeler}:{item_id}".encode()).digest()).shuffle(order)
    return order


class Queue:
    def __init__(
        self,
        store: LabelStore,
        *,
        batch: str | None = None,
        lease_seconds: float = 900,
        gold_rate: float = 0.0,
        overlap_fraction: float = 0.0,
        overlap_k: int = 2,
        seed: int | None = None,
    ) -> None:
        if not 0 <= gold_rate <= 1 or not 0 <= overlap_fraction <= 1 or overlap_k < 1:
            raise ValueError(f"gold_rate={gold_rate} and overlap_fraction={overlap_fraction} must be in [0, 1], "
                             f"overlap_k={overlap_k} >= 1")  # fmt: skip
        self.store, self.batch, self.lease_seconds = store, batch, lease_seconds
        self.gold_rate, self.overlap_fraction, self.overlap_k = gold_rate, overlap_fraction, overlap_k
        self._rng = random.Random(seed)  # which turns are gold: unpredictable to labelers unless a test seeds it
        self._current: dict[str, Lease] = {}  # labeler -> their one item
        self._answering: set[str] = set()  # labelers whose answer is being written (see claim)
        self._overlap_seen = 0  # items up to this id already have their overlap applied
        # (labeler, anchor, interval) -> (skip or flag, when): an anchor skipped or flagged in an interval
        self._anchors_passed: dict[tuple[str, int, int], tuple[str, float]] = {}
        self._anchor_redo: dict[str, int] = {}  # labeler -> the anchor whose answer they undid
        self._lock = threading.Lock()  # one labeler picks at a time, so two never take the same free item

    def answered(self, item_id: int, labeler: str) -> bool:
        return self.store.has_answered(item_id, labeler)

    def _servable(self, item_id: int, labeler: str, redo: bool = False) -> bool:
        """See `LabelStore.servable`."""
        return self.store.servable(item_id, labeler, redo=redo)

    def apply_overlap(self) -> None:
        """Items added since the last call that fall in the shared pool want at least overlap_k labels."""
        if not self.overlap_fraction or self.overlap_k < 2:
            return
        ids = self.store.items_wanting_fewer(self.overlap_k, after_id=self._overlap_seen)
        shared = [i for i in ids if _unit(self.store.store_id, "overlap", i) < self.overlap_fraction]
        if shared:
            self.store.set_want_labels(shared, self.overlap_k)
        self._overlap_seen = self.store.last_item_id()

    def current(self, labeler: str) -> Item | None:
        """The item `labeler` should answer now (the same one on reload), or None when nothing is left."""
        now = time.time()
        self.apply_overlap()
        with self._lock:
            held = self._current.get(labeler)
            if held and self._servable(held.item_id, labeler, held.redo):
                lease = Lease(held.item_id, now + self.lease_seconds, held.shown_at, held.redo)
            else:
                item_id = self._pick(labeler)
                if item_id is None:
                    self._current.pop(labeler, None)
                    return None
                lease = Lease(item_id, now + self.lease_seconds, now)
            self._current[labeler] = lease
        return self.store.get_item(lease.item_id)

    def _pick(self, labeler: str) -> int | None:
        now = time.time()
        leased = Counter(v.item_id for name, v in self._current.items() if name != labeler and v.expires > now)
        # at most len(leased) candidates can be blocked, so one more is enough to find a free one
        rows = self.store.open_items(labeler, batch=self.batch, limit=sum(leased.values()) + 1)
        if not rows:
            return None  # gold questions only ride along with real work
        if self.gold_rate and self._rng.random() < self.gold_rate:
            gold = self.store.unanswered_gold(labeler)
            if gold:
                return self._rng.choice(gold)
        free = [r for r in rows if r.labels + leased[r.id] < r.want_labels]
        return (free or rows)[0].id

    def lease(self, labeler: str) -> Lease | None:
        """`labeler`'s lease, if any (the only item they may answer)."""
        with self._lock:
            return self._current.get(labeler)

    def claim(self, labeler: str, item_id: int) -> Lease | None:
        """`labeler`'s lease on `item_id` (expired or not), taken for answering: until `finish`, a second (raced or
        replayed) claim gets None, while the lease still counts for other labelers, so nobody else is handed the
        item before the answer is in the store."""
        with self._lock:
            held = self._current.get(labeler)
            if labeler in self._answering or not held or held.item_id != item_id:
                return None
            self._answering.add(labeler)
            return held

    def finish(self, labeler: str, item_id: int, saved: bool) -> None:
        """The claimed answer was written (the lease ends) or failed (the lease stays)."""
        with self._lock:
            self._answering.discard(labeler)
        if saved:
            self.release(labeler, item_id)

    def release(self, labeler: str, item_id: int) -> None:
        """`labeler` answered `item_id`: its lease ends now."""
        with self._lock:
            if labeler in self._current and self._current[labeler].item_id == item_id:
                del self._current[labeler]

    def redo(self, labeler: str, item_id: int) -> bool:
        """After an undo: lease `item_id` to `labeler` again, to answer it anew (the answer replaces theirs). False
        if the item can no longer be served (an admin retired it). The only way a labeler is handed a given item:
        what they are served otherwise is the queue's choice."""
        if not self._servable(item_id, labeler, redo=True):
            return False
        now = time.time()
        with self._lock:
            self._current[labeler] = Lease(item_id, now + self.lease_seconds, now, redo=True)
        return True

    def pass_anchor(self, labeler: str, item_id: int, interval: int, kind: str) -> None:
        """`labeler` skipped or flagged (`kind`) anchor `item_id`: it is not served to them again in `interval`."""
        with self._lock:
            self._anchors_passed[(labeler, item_id, interval)] = (kind, time.time())

    def passed_anchors(self, labeler: str, interval: int) -> set[int]:
        with self._lock:
            return {i for name, i, k in self._anchors_passed if name == labeler and k == interval}

    def last_passed_anchor(self, labeler: str) -> tuple[int, float] | None:
        """(anchor, when) of `labeler`'s latest skip or flag of an anchor."""
        with self._lock:
            mine = [(i, when) for (name, i, _), (_, when) in self._anchors_passed.items() if name == labeler]
        return max(mine, key=lambda m: m[1]) if mine else None

    def unpass_anchor(self, labeler: str, item_id: int) -> str | None:
        """Take back `labeler`'s skip or flag of anchor `item_id` (an undo); returns which it was, or None."""
        with self._lock:
            keys = [key for key in self._anchors_passed if key[:2] == (labeler, item_id)]
            taken = [self._anchors_passed.pop(key) for key in keys]  # (kind, when)
        return max(taken, key=lambda t: t[1])[0] if taken else None

    def redo_anchor(self, labeler: str, item_id: int | None) -> None:
        """After an undo of anchor `item_id`'s answer: serve it to `labeler` again (None: that is done)."""
        with self._lock:
            if item_id is None:
                self._anchor_redo.pop(labeler, None)
            else:
                self._anchor_redo[labeler] = item_id

    def anchor_redo(self, labeler: str) -> int | None:
        with self._lock:
            return self._anchor_redo.get(labeler)

    def progress(self, labeler_id: int, labeler: str, *, serving: bool = True, anchors_due: int = 0) -> Progress:
        """`labeler`'s answers so far and how many items are left for them; `serving`: whether they have an item now
        (without one, nothing is left). The gold questions they may still be served count as left too, so the count
        drops by one with every answer, gold or not: a count that stood still would mark the answer as gold. So do
        the drift anchors: `anchors_due` now, and the store's anchors once for each interval the labeler will
        start if they answer all that is left, so an interval's anchors coming due do not move the count."""
        kinds = self.store.answer_counts(labeler_id)
        remaining = 0
        if serving:
            remaining = self.store.open_count(labeler, batch=self.batch)
            if self.gold_rate:
                remaining += len(self.store.unanswered_gold(labeler))
            if every := self.store.anchor_every():
                labels = kinds.get("label", 0)  # what the interval counts (`LabelStore.labeler_interval`)
                later = (labels + remaining) // every - labels // every
                remaining += anchors_due + self.store.anchor_count() * later
        return Progress(kinds.get("label", 0), kinds.get("skip", 0), kinds.get("flag", 0), remaining)
