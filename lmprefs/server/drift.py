"""Drift anchors in the labeling app: while the admin's setting asks for them (`lmprefs serve --anchor-every N`, or
the admin page), each labeler is served the store's anchor items again in every interval of N of their labels,
unannounced, before their next queue item; the admin page charts each labeler's self-consistency on the anchors and
their gold accuracy per interval (`charts`). An anchor answered twice in one interval is a 409 that stores nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from lmprefs.config import label_type_shape
from lmprefs.labels.store import DuplicateLabelError, Item
from lmprefs.server.answers import order_of, read_answer, read_confidence, shown_options
from lmprefs.server.pages import State, form_item_id, render, state
from lmprefs.server.security import User, csrf_checked


def due_anchor(st: State, user: User) -> Item | None:
    """The drift anchor `user` should answer now, or None (no anchors, or all answered in this interval)."""
    every = st.store.anchor_every()
    if not every:
        return None
    due = st.store.due_anchors(user.id, st.store.labeler_interval(user.id, every))
    return st.store.get_item(due[0]) if due else None


def anchor_page(request: Request, st: State, user: User, item: Item, feedback: dict | None) -> HTMLResponse:
    flash, user.session.flash = user.session.flash, None
    options = shown_options(st, user.name, item)
    progress = st.queue.progress(user.id, user.name)
    return render(request, "label.html", user=user, csrf=user.session.csrf, item=item, options=options,
                  progress=progress, flash=flash, redo=False, undo=None, undo_seconds=0, action="/anchor",
                  practice=None, feedback=feedback)  # fmt: skip


def submit_anchor(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[str, Form(max_length=20)],
    choice: Annotated[str, Form(min_length=1, max_length=8)],
    ranking: Annotated[str, Form(max_length=40)] = "",
    confidence: Annotated[str, Form(max_length=8)] = "",
) -> Response:
    """An answer to the drift anchor the labeler is shown: once per anchor and interval."""
    st = state(request)
    iid = form_item_id(item_id)
    every = st.store.anchor_every()
    item = st.store.get_item(iid)
    if not every or item is None or not item.anchor:
        raise HTTPException(409, f"Item {iid} is not a drift anchor you were shown (it was not saved).")
    interval = st.store.labeler_interval(user.id, every)
    due = st.store.due_anchors(user.id, interval)
    if iid not in due:
        raise HTTPException(409, f"You already answered item {iid} in this interval of {every} labels; that answer "
                                 "stands.")  # fmt: skip
    if iid != due[0]:
        raise HTTPException(409, f"Item {iid} is not the question you were shown (it was not saved).")
    value_field, n = label_type_shape(item.label_type)
    kind, position, ranked = read_answer(choice, ranking, value_field, n, iid)
    if kind != "label":
        raise HTTPException(422, "This question cannot be skipped or flagged; please answer it.")
    # the page sends the confidence buttons' value as on any question: checked like there, though an anchor answer
    # keeps none (drift compares picks), so a bad value is refused rather than passed without a word
    read_confidence(confidence, kind)
    order = order_of(st, user.name, iid, n)
    try:
        st.store.add_anchor_answer(iid, user.id, interval, best=order[position] if position is not None else None,
                                   ranking=[order[k] for k in ranked] if ranked is not None else None)  # fmt: skip
    except DuplicateLabelError:
        raise HTTPException(409, f"You already answered item {iid} in this interval; that answer stands.") from None
    user.session.flash = f"Saved: item {iid}."
    return RedirectResponse("/label", 303)


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
