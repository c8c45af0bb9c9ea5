"""The admin's routes: the admin page (counts, throughput, quality control, flags), an item's retire / restore /
gold actions, and the labels export."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Form, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.background import BackgroundTask

from lmprefs.errors import UserError
from lmprefs.labels.formats import FORMATS, export_file
from lmprefs.labels.quality import quality
from lmprefs.labels.store import ITEM_STATES
from lmprefs.server import drift, stats
from lmprefs.server.pages import form_count, form_fraction, form_item_id, render, state
from lmprefs.server.pages import state as _state
from lmprefs.server.security import User, admin, csrf_checked


def admin_page(request: Request, user: Annotated[User, Depends(admin)]) -> HTMLResponse:
    st = state(request)
    rows, total = stats.labeler_rows(st.store)
    flash, user.session.flash = user.session.flash, None
    return render(
        request,
        "admin.html",
        user=user,
        flash=flash,
        csrf=user.session.csrf,
        rows=rows,
        total=total,
        agreement=st.store.agreement(),
        quality=quality(st.store),
        fast_seconds=st.fast_seconds,
        gold_rate=st.queue.gold_rate,
        overlap=(st.queue.overlap_fraction, st.queue.overlap_k),
        gold_items=st.store.gold_items(),
        onboarding=st.store.onboarding_settings(),
        practice=st.store.practice_summary(),
        labelers=st.store.labelers(),
        anchor_every=(every := st.store.anchor_every()),
        drift=drift.charts(st.store.drift(every)) if every else [],
        held=st.store.held_items(),
        flags=st.store.recent_flags(),
        chance=stats.chance_agreement(st.store),
        pending=st.store.pending_count(batch=st.queue.batch),
        label_types=st.store.label_types(),
        formats=FORMATS,
        ago=stats.ago,
    )


PAGE = 50  # items per page of the item browser


def item_browser(
    request: Request,
    user: Annotated[User, Depends(admin)],
    q: Annotated[str, Query(max_length=200)] = "",
    state: Annotated[str, Query(max_length=10)] = "",
    before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> HTMLResponse:
    """Items whose query or an option contains `q`, in `state` (pending, done, flagged, gold, retired; "" any),
    newest first, each with every option, its gold answer and note, its queue score (`lmprefs rank-queue`) and its
    actions."""
    if state and state not in ITEM_STATES:
        raise HTTPException(422, f"state={state!r} must be one of {', '.join(ITEM_STATES)}, or left out.")
    st = _state(request)
    items = st.store.search_items(q, state or None, limit=PAGE + 1, before_id=before)
    flash, user.session.flash = user.session.flash, None
    back = str(request.url.path) + ("?" + request.url.query if request.url.query else "")
    return render(request, "items.html", user=user, csrf=user.session.csrf, flash=flash, items=items[:PAGE],
                  more=items[PAGE - 1].id if len(items) > PAGE else None, q=q, state=state,
                  states=ITEM_STATES, ranked_by=st.store.acquisition_by(), back=back)  # fmt: skip


def _back(back: str) -> str:
    """Where an item action returns to: the item browser (with its search) if it sent the form, else /admin."""
    ok = back.startswith("/admin/items") and "//" not in back and "\\" not in back
    return back if ok else "/admin"


def admin_item(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[str, Form(max_length=20)],
    action: Annotated[str, Form(max_length=10)],
    best: Annotated[str, Form(max_length=3)] = "",
    note: Annotated[str, Form(max_length=2000)] = "",
    back: Annotated[str, Form(max_length=500)] = "",
) -> Response:
    """retire / restore an item, or `gold` with best = the right option (1-based, in the stored order) / `ungold`."""
    if not user.is_admin:
        raise HTTPException(403, "This page is for admins only.")
    st = state(request)
    iid = form_item_id(item_id)  # the form's text, parsed
    item = st.store.get_item(iid)
    if item is None:
        raise HTTPException(404, f"There is no item {iid}.")
    if action in ("retire", "restore"):
        st.store.set_hold(iid, "retired" if action == "retire" else None)
        user.session.flash = f"Item {iid} {'retired' if action == 'retire' else 'restored'}."
    elif action in ("anchor", "unanchor"):
        try:
            st.store.set_anchor(iid, action == "anchor")
        except ValueError as e:
            raise HTTPException(422, f"{e}.") from None
        user.session.flash = f"Item {iid} is {'a drift anchor' if action == 'anchor' else 'no longer a drift anchor'}."
    elif action in ("gold", "ungold"):
        n = len(item.samples)
        if action == "gold" and not (best.isascii() and best.isdigit() and 1 <= int(best) <= n):
            raise HTTPException(422, f"best={best!r} must be the right option, 1..{n}, for gold item {iid}.")
        if item.label_type not in (f"best_of_{n}", f"ranking_{n}"):
            raise HTTPException(422, f"Item {iid} is a {item.label_type} question; gold items are best-of-N or "
                                     "rankings (by their top choice).")  # fmt: skip
        st.store.set_gold(iid, int(best) - 1 if action == "gold" else None, note.strip() or None)
        user.session.flash = f"Item {iid} is {'a gold item' if action == 'gold' else 'no longer a gold item'}."
    else:
        raise HTTPException(422, f"action={action!r} must be retire, restore, gold, ungold, anchor or unanchor.")
    return RedirectResponse(_back(back), 303)


def admin_onboarding(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    items: Annotated[str, Form(max_length=5)],
    accuracy: Annotated[str, Form(max_length=10)],
) -> Response:
    """The onboarding settings: practice questions per new labeler (0: none) and the accuracy that admits them."""
    if not user.is_admin:
        raise HTTPException(403, "This page is for admins only.")
    n, bar = form_count(items, "items", 1000), form_fraction(accuracy, "accuracy")
    state(request).store.set_onboarding(n, bar)
    user.session.flash = f"Onboarding: {n} practice questions, admitted at {bar:.0%}." if n else "Onboarding is off."
    return RedirectResponse("/admin", 303)


def admin_labeler(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    name: Annotated[str, Form(max_length=100)],
    action: Annotated[str, Form(max_length=10)],
) -> Response:
    """Admit a labeler who did not pass onboarding (`admit`), or hold one back from real work (`hold`)."""
    if not user.is_admin:
        raise HTTPException(403, "This page is for admins only.")
    st = state(request)
    labeler = next((b for b in st.store.labelers() if b.name == name), None)
    if labeler is None:
        raise HTTPException(404, f"There is no labeler {name!r}.")
    if action not in ("admit", "hold"):
        raise HTTPException(422, f"action={action!r} must be admit or hold.")
    st.store.set_admitted(labeler.id, action == "admit", by_admin=True)
    user.session.flash = f"{name} {'is admitted' if action == 'admit' else 'is held back from real work'}."
    return RedirectResponse("/admin", 303)


def admin_drift(
    request: Request, user: Annotated[User, Depends(csrf_checked)], every: Annotated[str, Form(max_length=7)]
) -> Response:
    """Labels per drift interval: each labeler answers every anchor once per interval (0: no anchors served)."""
    if not user.is_admin:
        raise HTTPException(403, "This page is for admins only.")
    n = form_count(every, "every", 100_000, "of labels ")
    state(request).store.set_anchor_every(n)
    user.session.flash = f"Drift anchors every {n} labels." if n else "Drift anchors are off."
    return RedirectResponse("/admin", 303)


def export(
    request: Request, user: Annotated[User, Depends(admin)], format: str = "comparisons", label_type: str = ""
) -> Response:
    st = state(request)
    if format not in FORMATS:
        raise HTTPException(422, f"format={format!r} must be one of {', '.join(FORMATS)}.")
    types = st.store.label_types()
    if label_type and label_type not in types:
        raise HTTPException(422, f"label_type={label_type!r} is not in the store ({', '.join(types)}).")
    tmp = Path(tempfile.mkdtemp(prefix="lmprefs-export-"))
    name = f"labels-{format}{'-' + label_type if label_type else ''}.{'json' if format == 'openai' else 'jsonl'}"
    try:
        export_file(st.store, tmp / name, format=format, label_type=label_type or None)
    except (ValueError, UserError) as e:  # e.g. a text too long for the openai format, or no GPT-2 tokenizer
        shutil.rmtree(tmp, ignore_errors=True)
        raise HTTPException(400, f"Export failed: {e}") from None
    media = "application/json" if format == "openai" else "application/x-ndjson"
    return FileResponse(tmp / name, media_type=media, filename=name, background=BackgroundTask(shutil.rmtree, tmp))
