"""Onboarding: the admin's settings (how many gold questions a new labeler practises on, the accuracy that admits
them), which gold questions those are, a labeler's practice answers, and admission. Methods of `StoreBase` (each
takes the store first).

The practice questions are the first `onboarding_items` gold questions by id (best_of_N or ranking_K, not
retired, not drift anchors) that the labeler has not answered for real, so every new labeler practises on the same
set, in the same order, and one who answered a gold question for real (before onboarding was switched on, or before
an admin held them back) practises on the next one instead. Practice answers are labels with `practice = 1`: they
never reach `labeled_examples`, the JSON API's labels or any quality measure.

Switching onboarding on admits every labeler who already gave a real answer: they were labeling for real, as the
labelers from before the store had onboarding were. A labeler an admin holds back (`labelers.held`) is not admitted
again by their practice score, only by an admin.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from lmprefs.labels.store.schema import CHOICE_ITEM

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase

DEFAULT_ACCURACY = 0.8


def onboarding_settings(store: StoreBase) -> tuple[int, float]:
    """(practice questions per new labeler, 0: no onboarding; gold accuracy that admits them)."""
    rows = dict(store.connection().execute(
        "SELECT key, value FROM meta WHERE key IN ('onboarding_items', 'admit_accuracy')"))  # fmt: skip
    return int(rows.get("onboarding_items", 0)), float(rows.get("admit_accuracy", DEFAULT_ACCURACY))


def set_onboarding(store: StoreBase, items: int, accuracy: float) -> None:
    """New labelers first answer `items` gold questions (0: none) and are admitted at `accuracy` or above."""
    if isinstance(items, bool) or not isinstance(items, int) or not 0 <= items <= 1000:
        raise ValueError(f"onboarding items={items!r} must be a whole number 0..1000")
    if isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or not 0 <= accuracy <= 1:
        raise ValueError(f"admit accuracy={accuracy!r} must be a number in [0, 1]")
    with store._tx() as c:
        row = c.execute("SELECT value FROM meta WHERE key = 'onboarding_items'").fetchone()
        if items and not (row and int(row[0])):  # switched on: who labels for real already stays at it
            c.execute("UPDATE labelers SET admitted = ? WHERE admitted IS NULL AND held IS NULL AND is_admin = 0"
                      " AND id IN (SELECT labeler_id FROM labels WHERE practice = 0)", (time.time(),))  # fmt: skip
        c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                      [("onboarding_items", str(items)), ("admit_accuracy", repr(float(accuracy)))])  # fmt: skip


def practice_items(store: StoreBase, n: int, labeler_id: int) -> list[tuple[int, int]]:
    """(item id, right answer) of labeler `labeler_id`'s practice set: the first `n` gold questions by id, not
    retired, that they did not answer for real (a practice answer would collide with that answer)."""
    sql = f"SELECT i.id, i.gold FROM items i WHERE i.gold IS NOT NULL AND {CHOICE_ITEM} AND i.anchor = 0"
    sql += " AND i.hold IS NOT 'retired' AND NOT EXISTS (SELECT 1 FROM labels l WHERE l.item_id = i.id"
    sql += " AND l.labeler_id = ? AND l.practice = 0)"
    return store.connection().execute(sql + " ORDER BY i.id LIMIT ?", (labeler_id, n)).fetchall()


def practice_answers(store: StoreBase, labeler_id: int) -> dict[int, int | None]:
    """{item id: the picked sample (a ranking's top; None for a skip)} of labeler `labeler_id`'s practice answers."""
    sql = "SELECT item_id, best FROM labels WHERE labeler_id = ? AND practice = 1"
    return dict(store.connection().execute(sql, (labeler_id,)))


def set_admitted(store: StoreBase, labeler_id: int, admitted: bool = True, *, by_admin: bool = False) -> None:
    """Admit labeler `labeler_id` (they label for real from now on) or, `admitted=False`, hold them back from real
    work until an admin admits them (`by_admin`: an admin's admission also lifts a hold; a practice score's
    does not)."""
    now = time.time()
    with store._tx() as c:
        if not admitted:
            c.execute("UPDATE labelers SET admitted = NULL, held = ? WHERE id = ?", (now, labeler_id))
        elif by_admin:
            c.execute("UPDATE labelers SET admitted = ?, held = NULL WHERE id = ?", (now, labeler_id))
        else:
            c.execute("UPDATE labelers SET admitted = ? WHERE id = ? AND held IS NULL", (now, labeler_id))


def is_admitted(store: StoreBase, labeler_id: int) -> bool:
    row = store.connection().execute("SELECT admitted IS NOT NULL FROM labelers WHERE id = ?", (labeler_id,))
    return bool((row.fetchone() or (0,))[0])


def is_held(store: StoreBase, labeler_id: int) -> bool:
    """Whether an admin held labeler `labeler_id` back from real work (and has not admitted them since)."""
    row = store.connection().execute("SELECT held IS NOT NULL FROM labelers WHERE id = ?", (labeler_id,))
    return bool((row.fetchone() or (0,))[0])


def practice_summary(store: StoreBase) -> dict[int, tuple[int, int]]:
    """{labeler id: (right, answered)} of every labeler's practice answers (a ranking by its top choice)."""
    sql = (
        "SELECT l.labeler_id, COALESCE(SUM(l.best = i.gold), 0), COUNT(*) FROM labels l"
        " JOIN items i ON i.id = l.item_id"
        " WHERE l.practice = 1 GROUP BY l.labeler_id"
    )
    return {lid: (int(k), n) for lid, k, n in store.connection().execute(sql)}
