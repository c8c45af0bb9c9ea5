"""What query selection asks the store: the pending questions a reward-model ensemble may score, and writing their
acquisition scores, which order the web app's queue (schema.QUEUE_ORDER). The scores are computed where the models
are (`lmprefs rank-queue`); the store and the app only keep and sort by them. Methods of `StoreBase` (each takes
the store first).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import TYPE_CHECKING

from lmprefs.labels.store.records import Question

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase

# pending items the queue serves as real work: not held, not gold, not a drift anchor
_RANKABLE = (
    "i.status = 'pending' AND i.hold IS NULL AND i.gold IS NULL AND i.anchor = 0 AND i.label_type = :type"
)


def rankable_items(store: StoreBase, label_type: str, *, tokenizer: str | None = None) -> list[Question]:
    """The pending items of `label_type` the queue may serve as real work (not held, gold or an anchor), oldest
    first, with the token ids stored under `tokenizer` when every text has them."""
    args = {"type": label_type, "tok": tokenizer}
    with store.snapshot() as c:
        rows = c.execute(
            "SELECT i.id, q.text, qt.ids FROM items i JOIN queries q ON q.id = i.query_id"
            f" LEFT JOIN query_tokens qt ON qt.query_id = q.id AND qt.tokenizer = :tok WHERE {_RANKABLE}"
            " ORDER BY i.id",
            args,
        ).fetchall()
        samples: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
        for item_id, text, ids in c.execute(
            "SELECT x.item_id, s.text, st.ids FROM items i JOIN item_samples x ON x.item_id = i.id"
            " JOIN samples s ON s.id = x.sample_id"
            f" LEFT JOIN sample_tokens st ON st.sample_id = s.id AND st.tokenizer = :tok WHERE {_RANKABLE}"
            " ORDER BY x.item_id, x.position",
            args,
        ):
            samples[item_id].append((text, ids))
    out = []
    for item_id, query, qids in rows:
        texts, ids = zip(*samples[item_id], strict=True)
        have = tokenizer is not None and qids is not None and None not in ids
        out.append(Question(item_id, query, list(texts), json.loads(qids) if have else None,
                            [json.loads(i) for i in ids] if have else None))  # fmt: skip
    return out


def set_acquisition(store: StoreBase, scores: dict[int, float], *, by: str) -> int:
    """Store each pending item's acquisition score (`scores`: item id -> a finite number, larger asked first) and
    what computed them (`by`, shown to admins), in one transaction: the queue sees all the new scores or none.
    Returns how many pending items took a score."""
    bad = [(i, v) for i, v in scores.items() if not isinstance(v, float | int) or not math.isfinite(v)]
    if bad:
        raise ValueError(f"acquisition scores must be finite numbers; item {bad[0][0]} has {bad[0][1]!r}")
    with store._tx() as c:
        n = sum(c.execute("UPDATE items SET acquisition = ? WHERE id = ? AND status = 'pending'",
                          (float(v), i)).rowcount for i, v in scores.items())  # fmt: skip
        c.execute("INSERT OR REPLACE INTO meta VALUES ('acquisition', ?)", (by,))
    return n


def acquisition_by(store: StoreBase) -> str | None:
    """What last scored the queue (`set_acquisition`'s `by`), None if nothing has."""
    row = store.connection().execute("SELECT value FROM meta WHERE key = 'acquisition'").fetchone()
    return row[0] if row else None
