"""What the admin page and the quality measures read: answers per labeler and their times, agreement between
labelers, flags, held and gold items, and every answer on best_of_N items. Methods of `StoreBase` (each takes the
store first)."""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import combinations
from typing import TYPE_CHECKING

from lmprefs.labels.store.labelers import read_labelers
from lmprefs.labels.store.records import KINDS, Agreement, BestOfAnswer, Flag, GoldItem, HeldItem, Labeler
from lmprefs.labels.store.schema import CHOICE_ITEM, FIRST_BEST, FIRST_KIND

if TYPE_CHECKING:
    from lmprefs.labels.store.base import StoreBase


def counts_by_labeler(store: StoreBase) -> dict[str, dict[str, int]]:
    """{labeler: {"label": n, "skip": n, "flag": n}} for every labeler with at least one answer (practice answers
    from onboarding are no labels)."""
    out: dict[str, dict[str, int]] = {}
    for name, kind, n in store.connection().execute(
        "SELECT b.name, l.kind, COUNT(*) FROM labels l JOIN labelers b ON b.id = l.labeler_id WHERE l.practice = 0"
        " GROUP BY 1, 2"
    ):
        out.setdefault(name, dict.fromkeys(KINDS, 0))[kind] = n
    return out


def agreement(store: StoreBase) -> Agreement:
    """How often two labelers pick the same best sample, over best_of_N items with >= 2 labels."""
    by_item: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for item_id, name, best in store.connection().execute(
        "SELECT l.item_id, b.name, l.best FROM labels l JOIN labelers b ON b.id = l.labeler_id"
        " WHERE l.kind = 'label' AND l.practice = 0 AND l.best IS NOT NULL ORDER BY l.item_id, b.name"
    ):
        by_item[item_id].append((name, best))
    agree, total, items = 0, 0, 0
    per: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for answers in by_item.values():
        if len(answers) < 2:
            continue
        items += 1
        for (a, best_a), (b, best_b) in combinations(answers, 2):  # names sorted, so a < b
            agree += best_a == best_b
            total += 1
            per[(a, b)][0] += best_a == best_b
            per[(a, b)][1] += 1
    pairs = {k: (same / n, n) for k, (same, n) in sorted(per.items())}
    return Agreement(agree / total if total else None, items, pairs)


def labeler_activity(store: StoreBase) -> list[tuple[Labeler, list[tuple[str, float]]]]:
    """Every registered labeler by name, with their answers as (kind, time), oldest first (not practice answers);
    one snapshot, so totals over the labelers add up."""
    with store.snapshot() as c:
        labelers = read_labelers(c)
        answers: dict[int, list[tuple[str, float]]] = defaultdict(list)
        sql = "SELECT labeler_id, kind, created FROM labels WHERE practice = 0 ORDER BY created"
        for labeler_id, kind, created in c.execute(sql):
            answers[labeler_id].append((kind, created))
    return [(b, answers.get(b.id, [])) for b in labelers]


def recent_flags(store: StoreBase, limit: int = 20) -> list[Flag]:
    """The latest flags, newest first: what labelers found broken."""
    rows = store.connection().execute(
        "SELECT l.item_id, b.name, l.note, l.created, q.text FROM labels l JOIN labelers b ON b.id = l.labeler_id"
        " JOIN items i ON i.id = l.item_id JOIN queries q ON q.id = i.query_id WHERE l.kind = 'flag'"
        " ORDER BY l.id DESC LIMIT ?",
        (limit,),
    )
    return [Flag(*r) for r in rows]


def held_items(store: StoreBase, limit: int = 50) -> list[HeldItem]:
    """Held items (flagged or retired), newest first."""
    sql = (
        "SELECT i.id, i.hold, q.text FROM items i JOIN queries q ON q.id = i.query_id WHERE i.hold IS NOT NULL"
        " ORDER BY i.id DESC LIMIT ?"
    )
    return [HeldItem(*r) for r in store.connection().execute(sql, (limit,))]


def gold_items(store: StoreBase) -> list[GoldItem]:
    """The gold questions with their labels and right labels (each labeler's first answer), by id."""
    sql = (
        f"SELECT i.id, i.gold, COUNT(l.id), COALESCE(SUM({FIRST_BEST} = i.gold), 0), q.text FROM items i"
        f" JOIN queries q ON q.id = i.query_id LEFT JOIN labels l ON l.item_id = i.id AND {FIRST_KIND} = 'label'"
        " AND l.practice = 0"
        " WHERE i.gold IS NOT NULL GROUP BY i.id ORDER BY i.id"
    )
    return [GoldItem(*r) for r in store.connection().execute(sql)]


def gold_accuracy(store: StoreBase) -> dict[str, tuple[int, int]]:
    """{labeler: (correct, answered)} on gold questions, by each labeler's first answer (an undo cannot improve
    it), for labelers who answered at least one."""
    sql = (
        f"SELECT b.name, SUM({FIRST_BEST} = i.gold), COUNT(*) FROM labels l JOIN labelers b ON b.id = l.labeler_id"
        f" JOIN items i ON i.id = l.item_id WHERE {FIRST_KIND} = 'label' AND l.practice = 0 AND i.gold IS NOT NULL"
        " GROUP BY b.name"
    )
    return {name: (int(k), n) for name, k, n in store.connection().execute(sql)}


def best_of_answers(store: StoreBase) -> tuple[list[str], list[BestOfAnswer]]:
    """Every labeler's name, and every answer (labels, skips, flags) on best_of_N items (and ranking_K ones, by their
    top choice) ordered by item, then labeler; one snapshot."""
    with store.snapshot() as c:
        names = [n for (n,) in c.execute("SELECT name FROM labelers ORDER BY name")]
        rows = c.execute(
            f"SELECT l.item_id, b.name, l.kind, l.best, l.shown, l.seconds, i.gold, {FIRST_KIND}, {FIRST_BEST}"
            " FROM labels l JOIN labelers b ON b.id = l.labeler_id JOIN items i ON i.id = l.item_id"
            f" WHERE {CHOICE_ITEM} AND l.practice = 0 ORDER BY l.item_id, b.name"
        ).fetchall()
    return names, [BestOfAnswer(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None, r[5], r[6], r[7], r[8])
                   for r in rows]  # fmt: skip
