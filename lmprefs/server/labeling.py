"""The labeler's routes: signing in and out, the labeling page, an answer, and undo.

Endpoints are sync functions: Starlette runs them in its thread pool and the store gives each thread its own SQLite
connection; each answer is one `add_label` transaction, and only the item leased to the labeler may be answered,
once: a replayed or raced second answer is a 409 that changes nothing.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated

from fastapi import Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from lmprefs.config import label_type_shape
from lmprefs.labels.store import DuplicateLabelError, token_hash
from lmprefs.server.answers import order_of, read_answer, read_confidence, saved_flash, shown_options
from lmprefs.server.drift import anchors_left, answer_anchor, answered_anchor, due_anchor
from lmprefs.server.onboarding import practice, practice_page
from lmprefs.server.pages import ITEM_ID, State, form_item_id, render, state
from lmprefs.server.security import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    NotSignedIn,
    User,
    cookie_name,
    cross_site,
    csrf_checked,
    delete_cookie,
    failure_keys,
    same,
    set_cookie,
    signed_in,
    too_many,
)

NOT_SHOWN = ("Item {} is not the question you were shown (it was not saved). Open the labeling page for your current "
             "question.")  # fmt: skip


def login_page(
    request: Request, status: int = 200, error: str | None = None, resume: int | None = None
) -> HTMLResponse:
    form_token = secrets.token_urlsafe(32)
    response = render(request, "login.html", status, csrf=form_token, error=error, resume=resume)
    set_cookie(response, request, LOGIN_COOKIE, form_token, max_age=3600)
    return response


def index(user: Annotated[User, Depends(signed_in)]) -> Response:
    return RedirectResponse("/label", 303)


def login_form(request: Request) -> Response:
    try:
        signed_in(request)
        return RedirectResponse("/label", 303)
    except NotSignedIn:
        return login_page(request)


def login(
    request: Request,
    token: Annotated[str, Form(max_length=200)],
    csrf: Annotated[str, Form(max_length=100)] = "",
    resume: Annotated[str, Form(max_length=20)] = "",
) -> Response:
    st = state(request)
    resume_id = int(resume) if ITEM_ID.fullmatch(resume) else None
    if cross_site(request) or not same(csrf, request.cookies.get(cookie_name(request, LOGIN_COOKIE))):
        return login_page(request, 403, "The sign-in form expired or came from another site; please try again.",
                          resume_id)  # fmt: skip
    token = token.strip()
    labeler = st.store.labeler_for_token(token)
    if labeler is None:  # only wrong tokens count and wait: a right one always gets in
        wait = st.throttle.failed(failure_keys(request, token))
        if wait:
            message, headers = too_many(wait)
            refused = login_page(request, 429, message, resume_id)
            refused.headers.update(headers)
            return refused
        return login_page(request, 401, "That token is not valid. Ask an admin for one (lmprefs labelers add).",
                          resume_id)  # fmt: skip
    st.sessions.close(request.cookies.get(cookie_name(request, SESSION_COOKIE)))  # a fresh id each sign-in
    session = st.sessions.open(labeler.id, token_hash(token), st.store.store_id)
    # `resume` only names the item whose answer was lost, for the message: what is served is the labeler's own lease,
    # or the queue's next pick, never an item the form chose (a forged or edited form could name any item)
    if resume_id is not None and (item := st.queue.current(labeler.name)) is not None and item.id == resume_id:
        session.flash = f"Signed in again: here is item {resume_id}, whose answer was not saved. Please answer again."
    response = RedirectResponse("/label", 303)
    set_cookie(response, request, SESSION_COOKIE, session.sid)
    delete_cookie(response, request, LOGIN_COOKIE)
    return response


def logout(request: Request, user: Annotated[User, Depends(csrf_checked)]) -> Response:
    state(request).sessions.close(user.session.sid)
    response = RedirectResponse("/login", 303)
    delete_cookie(response, request, SESSION_COOKIE)
    return response


def _last_answer(st: State, user: User) -> tuple[int, int, float, bool] | None:
    """(answer id, item id, seconds left to undo it, whether it answered a drift anchor) of the labeler's latest web
    or anchor answer, if still undoable."""
    rows = [(*r, False) for r in [st.store.last_answer(user.id, source="web")] if r]
    rows += [(*r, True) for r in [st.store.last_anchor_answer(user.id)] if r]
    rows += [(0, *r, True) for r in [st.queue.last_passed_anchor(user.name)] if r]  # a skip or flag, kept in memory
    if not rows:
        return None
    row = max(rows, key=lambda r: r[2])
    if time.time() - row[2] >= st.undo_seconds:
        return None
    return row[0], row[1], st.undo_seconds - (time.time() - row[2]), row[3]


def _undoing(st: State, user: User) -> bool:
    """Whether the labeler's lease is an undone answer to give again (served before a drift anchor comes due)."""
    lease = st.queue.lease(user.name)
    return bool(lease and lease.redo)


def label_page(request: Request, user: Annotated[User, Depends(signed_in)]) -> HTMLResponse:
    st = state(request)
    feedback, user.session.feedback = user.session.feedback, None  # the last practice answer's right answer
    if (p := practice(st, user)) is not None:
        return practice_page(request, st, user, p, feedback)
    anchor = None if _undoing(st, user) else due_anchor(st, user)
    item = anchor.item if anchor is not None else st.queue.current(user.name)
    flash, user.session.flash = user.session.flash, None
    progress = st.queue.progress(user.id, user.name, serving=item is not None, anchors_due=anchors_left(st, user))
    options, redo, undo = [], False, _last_answer(st, user)
    if item is not None:
        options = shown_options(st, user.name, item)
        lease = st.queue.lease(user.name)
        redo = anchor.redo if anchor is not None else bool(lease and lease.redo and lease.item_id == item.id)
        if undo and undo[1] == item.id:
            undo = None  # already answering it again
    return render(request, "label.html", user=user, csrf=user.session.csrf, item=item, options=options,
                  progress=progress, flash=flash, redo=redo, undo=undo, undo_seconds=st.undo_seconds,
                  action="/label", practice=None, feedback=feedback)  # fmt: skip


def submit_label(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[str, Form(max_length=20)],
    choice: Annotated[str, Form(min_length=1, max_length=8)],
    note: Annotated[str, Form(max_length=1000)] = "",
    ranking: Annotated[str, Form(max_length=40)] = "",
    confidence: Annotated[str, Form(max_length=8)] = "",
) -> Response:
    st = state(request)
    iid = form_item_id(item_id)  # the form's text, parsed
    item = st.store.get_item(iid)
    if item is None:
        raise HTTPException(404, f"There is no item {iid}.")
    value_field, n = label_type_shape(item.label_type)
    if value_field not in ("best", "ranking"):
        raise HTTPException(422, f"Item {iid} is a {item.label_type} question; this page answers best-of-N and "
                                 "rankings only.")  # fmt: skip
    kind, position, ranked = read_answer(choice, ranking, value_field, n, iid)
    sure = read_confidence(confidence, kind)
    if practice(st, user) is not None:  # practising or held back: a lease from before takes no answer
        raise HTTPException(409, NOT_SHOWN.format(iid))
    anchor = None if _undoing(st, user) else due_anchor(st, user)
    if anchor is not None and anchor.item.id == iid:
        answer_anchor(st, user, anchor, kind, position, ranked)
        user.session.flash = saved_flash(iid, kind, position, ranked, sure, anchor.redo)
        return RedirectResponse("/label", 303)
    if item.anchor and answered_anchor(st, user, iid):
        raise HTTPException(409, f"You already answered item {iid}; that answer stands.")
    lease = st.queue.claim(user.name, iid)  # first come, first served: a raced second post gets None
    if lease is None:
        if st.queue.answered(iid, user.name):
            raise HTTPException(409, f"You already answered item {iid}; that answer stands.")
        raise HTTPException(409, NOT_SHOWN.format(iid))
    order = order_of(st, user.name, iid, n)
    best = order[position] if position is not None else None  # displayed position -> stored sample
    stored_ranking = [order[p] for p in ranked] if ranked is not None else None
    saved = False
    seconds = round(time.time() - lease.shown_at, 3)  # time on task: from when the item was first shown
    try:
        st.store.add_label(iid, user.name, best=best, ranking=stored_ranking, kind=kind, note=note.strip() or None,
                           source="web", shown=order, seconds=seconds, replace=lease.redo,
                           confidence=sure)  # fmt: skip
        saved = True
    except DuplicateLabelError:
        raise HTTPException(409, f"You already answered item {iid}; that answer stands.") from None
    finally:
        st.queue.finish(user.name, iid, saved)
    user.session.flash = saved_flash(iid, kind, position, ranked, sure, lease.redo)
    return RedirectResponse("/label", 303)


def undo(request: Request, user: Annotated[User, Depends(csrf_checked)]) -> Response:
    st = state(request)
    last = _last_answer(st, user)
    if last is None:
        raise HTTPException(409, f"There is no answer of yours from the last {st.undo_seconds:.0f} s to undo.")
    if last[3]:  # a drift anchor's answer: served again, as any question is
        item = st.store.get_item(last[1])
        if item is None or not item.anchor or item.hold == "retired":
            raise HTTPException(409, f"Item {last[1]} was retired by an admin; its answer cannot be changed.")
        if st.queue.unpass_anchor(user.name, item.id) == "flag" and item.hold == "flagged":
            st.store.set_hold(item.id, None)  # an undone flag releases the item, as on a queue item
        elif item.hold is not None:
            raise HTTPException(409, f"Item {last[1]} was retired by an admin; its answer cannot be changed.")
        st.queue.redo_anchor(user.name, last[1])
    elif not st.queue.redo(user.name, last[1]):
        raise HTTPException(409, f"Item {last[1]} was retired by an admin; its answer cannot be changed.")
    user.session.flash = f"Answer item {last[1]} again: your new answer replaces the earlier one."
    return RedirectResponse("/label", 303)
