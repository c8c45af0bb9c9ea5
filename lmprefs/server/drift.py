"""Drift anchors in the labeling app: while the admin's setting asks for them (`lmprefs serve --anchor-every N`, or
the admin page), each labeler is served the store's anchor items again in every interval of N of their labels,
unannounced, before their next queue item; the admin page charts each labeler's self-consistency on the anchors and
their gold accuracy per interval (`charts`).

Unannounced means an anchor looks and answers like any question: the same page and form (`POST /label`), the same
"N left" count (`Queue.progress` counts the anchors), flash, undo and refusals. A skip or a flag passes the anchor
for this interval (a flag also holds it, as it holds any item, until an admin serves it again); an undo serves it
again, but drift counts the first answer, as gold accuracy does, so a changed answer is not kept (an undone skip or
flag is no answer: the one given instead is kept)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException

from lmprefs.labels.store import DuplicateLabelError, Item
from lmprefs.server.answers import order_of
from lmprefs.server.pages import State
from lmprefs.server.security import User


@dataclass(frozen=True)
class Due:
    item: Item
    interval: int
    redo: bool  # the labeler undid their answer to it
    left: int  # anchors still due in this interval, this one included


def due_anchor(st: State, user: User) -> Due | None:
    """The drift anchor `user` should answer now, or None (no anchors, or all answered in this interval)."""
    every = st.store.anchor_every()
    if not every:
        return None
    interval = st.store.labeler_interval(user.id, every)
    redo = st.queue.anchor_redo(user.name)
    passed = st.queue.passed_anchors(user.name, interval)
    due = [i for i in st.store.due_anchors(user.id, interval) if i not in passed]
    if redo is not None and (item := st.store.get_item(redo)) is not None and item.anchor and item.hold is None:
        return Due(item, interval, True, len(due))
    item = st.store.get_item(due[0]) if due else None
    return Due(item, interval, False, len(due)) if item is not None else None


def anchors_left(st: State, user: User) -> int:
    """The anchors `user` still answers in this interval (for the "N left" count): not one they undid, which counted
    as answered, as an undone queue item does."""
    due = due_anchor(st, user)
    return due.left - (due.redo and due.item.id in st.store.due_anchors(user.id, due.interval)) if due else 0


def answered_anchor(st: State, user: User, item_id: int) -> bool:
    """Whether `user` answered (or skipped or flagged) anchor `item_id` in their interval now."""
    every = st.store.anchor_every()
    if not every:
        return False
    interval = st.store.labeler_interval(user.id, every)
    passed = st.queue.passed_anchors(user.name, interval)
    return item_id in passed or item_id not in st.store.due_anchors(user.id, interval)


def answer_anchor(st: State, user: User, due: Due, kind: str, position: int | None, ranked: list[int] | None) -> None:
    """Keep an answer to the anchor `due`, as `submit_label` keeps one to a queue item; a 409 if it was answered in
    this interval already."""
    n = len(due.item.samples)
    iid = due.item.id
    if due.redo:
        st.queue.redo_anchor(user.name, None)
        if iid not in st.store.due_anchors(user.id, due.interval):
            return  # drift counts the first answer: the change is not kept
        # an undone skip or flag: this is the first answer
    if kind != "label":
        st.queue.pass_anchor(user.name, iid, due.interval, kind)
        if kind == "flag":
            st.store.set_hold(iid, "flagged")
        return
    order = order_of(st, user.name, iid, n)
    try:
        st.store.add_anchor_answer(iid, user.id, due.interval, best=order[position] if position is not None else None,
                                   ranking=[order[k] for k in ranked] if ranked is not None else None)  # fmt: skip
    except DuplicateLabelError:
        raise HTTPException(409, f"You already answered item {iid}; that answer stands.") from None


@dataclass(frozen=True)
class Chart:
    """One labeler's drift chart: SVG polyline points of self-consistency and gold accuracy per interval."""

    name: str
    intervals: int
    consistency: str
    gold: str
    last: tuple[float | None, float | None]  # the latest interval's values


WIDTH, HEIGHT, PAD = 240, 80, 8


def charts(report: dict[str, list[tuple[int, float | None, float | None]]]) -> list[Chart]:
    """A chart per labeler of `LabelStore.drift`: x the interval, y from 0 (bottom) to 1 (top)."""
    out = []
    for name, rows in report.items():
        last_k = max(k for k, _, _ in rows) or 1

        def line(i: int, rows=rows, last_k=last_k) -> str:
            return " ".join(f"{PAD + k / last_k * (WIDTH - 2 * PAD):.1f},{HEIGHT - PAD - v * (HEIGHT - 2 * PAD):.1f}"
                            for k, *vs in rows if (v := vs[i]) is not None)  # fmt: skip

        out.append(Chart(name, len(rows), line(0), line(1), (rows[-1][1], rows[-1][2])))
    return out
