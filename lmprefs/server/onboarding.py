"""Onboarding in the labeling app: while the admin's setting asks for it (`lmprefs serve --onboarding N
--admit-accuracy A`, or the admin page), a new labeler first answers the store's N practice questions (gold questions,
`LabelStore.practice_items`), one at a time, and after each sees whether they were right, the right answer and the
researcher's note. Once every practice question is answered they are admitted if their accuracy is at least A, and
label for real from then on; otherwise they wait for an admin (who may admit them, or send them back to practise
on a new set). Admins never onboard. Practice answers are stored with `practice` set, so they never train a reward
model nor count in a quality measure; one posted by an admitted labeler is refused (409) and stores nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from lmprefs.config import label_type_shape
from lmprefs.labels.store import DuplicateLabelError, Item
from lmprefs.server.answers import order_of, read_answer, read_confidence, shown_options
from lmprefs.server.pages import State, form_item_id, render, state
from lmprefs.server.queue import Progress
from lmprefs.server.security import User, csrf_checked


@dataclass(frozen=True)
class Practice:
    item: Item | None  # the next practice question; None: none left (or none set up) and not admitted
    number: int  # which of `total` it is, from 1
    total: int
    right: int  # right answers so far
    bar: float  # the accuracy that admits
    held: bool = False  # an admin held them back: only an admin admits them again


def practice(st: State, user: User) -> Practice | None:
    """Where `user` stands in onboarding, or None when they label for real (an admin, admitted, or no onboarding).
    Admits them, with a flash saying so, once every practice question is answered well enough, unless an admin
    held them back (who then waits for an admin, onboarding or not)."""
    if user.is_admin:
        return None
    n, bar = st.store.onboarding_settings()
    held = st.store.is_held(user.id)
    if not held and (n == 0 or st.store.is_admitted(user.id)):
        return None
    gold = st.store.practice_items(n, user.id) if n else []
    answers = st.store.practice_answers(user.id)
    right = sum(answers.get(i) == g for i, g in gold)
    left = [i for i, _ in gold if i not in answers]
    if left:
        return Practice(st.store.get_item(left[0]), len(gold) - len(left) + 1, len(gold), right, bar, held)
    if gold and not held and right / len(gold) >= bar:
        st.store.set_admitted(user.id)
        user.session.flash = (f"Welcome aboard: {right} of {len(gold)} practice answers were right. Your answers "
                              "count now.")  # fmt: skip
        return None
    return Practice(None, len(gold), len(gold), right, bar, held)


def practice_page(request: Request, st: State, user: User, p: Practice, feedback: dict | None) -> HTMLResponse:
    flash, user.session.flash = user.session.flash, None
    options = []
    if p.item is not None:
        options = shown_options(st, user.name, p.item)
    progress = Progress(0, 0, 0, p.total - p.number + (p.item is not None))
    return render(request, "label.html", user=user, csrf=user.session.csrf, item=p.item, options=options,
                  progress=progress, flash=flash, redo=False, undo=None, undo_seconds=0, action="/onboarding",
                  practice=p, feedback=feedback)  # fmt: skip


def submit_practice(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[str, Form(max_length=20)],
    choice: Annotated[str, Form(min_length=1, max_length=8)],
    ranking: Annotated[str, Form(max_length=40)] = "",
    confidence: Annotated[str, Form(max_length=8)] = "",
) -> Response:
    """A practice answer: only to the labeler's current practice question, only before they are admitted."""
    st = state(request)
    iid = form_item_id(item_id)
    p = practice(st, user)
    if p is None:
        raise HTTPException(409, "You are admitted (or there is no onboarding): practice answers are not taken. "
                                 "Answer on the labeling page.")  # fmt: skip
    if p.item is None or p.item.id != iid:
        raise HTTPException(409, f"Item {iid} is not your practice question (it was not saved). Open the labeling "
                                 "page for it.")  # fmt: skip
    item = p.item
    value_field, n = label_type_shape(item.label_type)
    kind, position, ranked = read_answer(choice, ranking, value_field, n, iid)
    if kind != "label":
        raise HTTPException(422, "A practice question cannot be skipped or flagged: answer it to see the right "
                                 "answer.")  # fmt: skip
    order = order_of(st, user.name, iid, n)
    best = order[position] if position is not None else None
    stored_ranking = [order[k] for k in ranked] if ranked is not None else None
    try:
        st.store.add_label(iid, user.name, best=best, ranking=stored_ranking, source="onboarding", shown=order,
                           practice=True, confidence=read_confidence(confidence, kind))  # fmt: skip
    except DuplicateLabelError:
        raise HTTPException(409, f"You already answered practice item {iid}; that answer stands.") from None
    picked = stored_ranking[0] if stored_ranking is not None else best
    assert item.gold is not None  # practice items are gold questions
    user.session.feedback = {"item": iid, "right": picked == item.gold, "number": order.index(item.gold) + 1,
                             "text": item.samples[item.gold], "note": item.gold_note,
                             "ranking": stored_ranking is not None}  # fmt: skip
    return RedirectResponse("/label", 303)
