"""The labeling web app: `create_app(store_path, task)` builds the FastAPI application.

Routes (all pages server-rendered with Jinja2, autoescaped; one small script for the keyboard):
  GET  /login, POST /login   sign in with a token from `lmprefs labelers add` (the only open routes, with /static)
  POST /logout
  GET  /label                the labeler's current question (options in this labeler's shuffled order), progress
  POST /label                one answer to the item leased to this labeler: item_id, choice = displayed position
                             0..N-1 | "skip" | "flag", optional note; 303 to /label
  POST /undo                 answer the last item again (within `undo_seconds`); the new answer replaces the old
  GET  /admin                counts, throughput, quality control, flags, export form (admins only)
  POST /admin/item           retire / restore an item, or mark it gold with its right answer (admins only)
  GET  /admin/export         ?format=openai|pairs|comparisons[&label_type=...]: download (admins only)
  /api/...                   the JSON API for scripts (api.py; bearer token, documented at /api/openapi.json)
Every form POST needs the session's CSRF token, and every form field may appear once. Endpoints are sync functions:
Starlette runs them in its thread pool and the store gives each thread its own SQLite connection; each answer is one
`add_label` transaction, and only the item leased to the labeler may be answered, once: a replayed or raced second
answer is a 409 that changes nothing.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import jinja2
from fastapi import Depends, FastAPI, Form, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from lmprefs.config import label_type_shape
from lmprefs.errors import UserError
from lmprefs.labels.formats import FORMATS, export_file
from lmprefs.labels.quality import quality
from lmprefs.labels.store import DuplicateLabelError, LabelStore, token_hash
from lmprefs.server import api, stats
from lmprefs.server.instructions import TASKS, Instructions
from lmprefs.server.queue import Queue, display_order
from lmprefs.server.security import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    NotSignedIn,
    SecurityMiddleware,
    Sessions,
    Throttle,
    User,
    admin,
    client_of,
    cookie_name,
    cross_site,
    csrf_checked,
    delete_cookie,
    same,
    set_cookie,
    signed_in,
)

HERE = Path(__file__).parent


@dataclass
class State:
    store: LabelStore
    sessions: Sessions
    queue: Queue
    task: str
    instructions: Instructions
    templates: Jinja2Templates
    throttle: Throttle
    shuffle: bool  # show each labeler the options in their own order
    undo_seconds: float  # how long after an answer the labeler may answer the item again
    fast_seconds: float  # answers quicker than this are marked too fast on the admin page


def _state(request: Request) -> State:
    return request.app.state.lmprefs


def _render(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    st = _state(request)
    context = {"task": st.task, "instructions": st.instructions, "user": None, **context}
    return st.templates.TemplateResponse(request, name, context, status_code=status_code)


# -- routes ------------------------------------------------------------------------------------------------------


def _login_page(
    request: Request, status: int = 200, error: str | None = None, resume: int | None = None
) -> HTMLResponse:
    form_token = secrets.token_urlsafe(32)
    response = _render(request, "login.html", status, csrf=form_token, error=error, resume=resume)
    set_cookie(response, request, LOGIN_COOKIE, form_token, max_age=3600)
    return response


async def single_valued(request: Request) -> None:
    """Every form field at most once: FastAPI would quietly take the last of a repeated `choice`."""
    if request.headers.get("content-type", "").startswith(("application/x-www-form-urlencoded", "multipart/")):
        form = await request.form()
        for key in form:
            if (n := len(form.getlist(key))) > 1:
                raise HTTPException(422, f"The form field {key!r} was sent {n} times; send it once.")


_ITEM_ID = re.compile(r"[1-9][0-9]{0,17}")  # a plain positive integer: not "1.0", "+1", "01" or " 1"


def _item_id(value: str, field: str = "item_id") -> int:
    if not _ITEM_ID.fullmatch(value):
        raise HTTPException(422, f"{field}={value!r} must be a positive whole number written plainly (like 12).")
    return int(value)


def index(user: Annotated[User, Depends(signed_in)]) -> Response:
    return RedirectResponse("/label", 303)


def login_form(request: Request) -> Response:
    try:
        signed_in(request)
        return RedirectResponse("/label", 303)
    except NotSignedIn:
        return _login_page(request)


def login(
    request: Request,
    token: Annotated[str, Form(max_length=200)],
    csrf: Annotated[str, Form(max_length=100)] = "",
    resume: Annotated[str, Form(max_length=20)] = "",
) -> Response:
    st = _state(request)
    resume_id = int(resume) if _ITEM_ID.fullmatch(resume) else None
    if cross_site(request) or not same(csrf, request.cookies.get(cookie_name(request, LOGIN_COOKIE))):
        return _login_page(request, 403, "The sign-in form expired or came from another site; please try again.",
                           resume_id)  # fmt: skip
    wait = st.throttle.wait(client_of(request))
    if wait:
        return _login_page(request, 429, f"Too many wrong tokens from your address; try again in {wait:.0f} s.",
                           resume_id)  # fmt: skip
    labeler = st.store.labeler_for_token(token.strip())
    if labeler is None:
        st.throttle.failed(client_of(request))
        return _login_page(request, 401, "That token is not valid. Ask an admin for one (lmprefs labelers add).",
                           resume_id)  # fmt: skip
    st.sessions.close(request.cookies.get(cookie_name(request, SESSION_COOKIE)))  # a fresh id each sign-in
    session = st.sessions.open(labeler.id, token_hash(token.strip()), st.store.store_id)
    if resume_id is not None and st.queue.take(labeler.name, resume_id):
        session.flash = f"Signed in again: here is item {resume_id}, whose answer was not saved. Please answer again."
    response = RedirectResponse("/label", 303)
    set_cookie(response, request, SESSION_COOKIE, session.sid)
    delete_cookie(response, request, LOGIN_COOKIE)
    return response


def logout(request: Request, user: Annotated[User, Depends(csrf_checked)]) -> Response:
    _state(request).sessions.close(user.session.sid)
    response = RedirectResponse("/login", 303)
    delete_cookie(response, request, SESSION_COOKIE)
    return response


def _last_answer(st: State, user: User) -> tuple[int, int, float] | None:
    """(label id, item id, seconds left to undo it) of the labeler's latest web answer, if still undoable."""
    row = st.store.last_answer(user.id, source="web")
    if row is None or time.time() - row[2] >= st.undo_seconds:
        return None
    return row[0], row[1], st.undo_seconds - (time.time() - row[2])


def label_page(request: Request, user: Annotated[User, Depends(signed_in)]) -> HTMLResponse:
    st = _state(request)
    item = st.queue.current(user.name)
    flash, user.session.flash = user.session.flash, None
    progress = st.queue.progress(user.id, user.name)
    options, redo, undo = [], False, _last_answer(st, user)
    if item is not None:
        order = _order(st, user.name, item.id, len(item.samples))
        options = [(position, item.samples[k]) for position, k in enumerate(order)]
        lease = st.queue.lease(user.name)
        redo = bool(lease and lease.redo and lease.item_id == item.id)
        if undo and undo[1] == item.id:
            undo = None  # already answering it again
    return _render(request, "label.html", user=user, csrf=user.session.csrf, item=item, options=options,
                   progress=progress, flash=flash, redo=redo, undo=undo)  # fmt: skip


def _order(st: State, labeler: str, item_id: int, n: int) -> list[int]:
    return display_order(st.store.store_id, labeler, item_id, n) if st.shuffle else list(range(n))


def submit_label(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[str, Form(max_length=20)],
    choice: Annotated[str, Form(min_length=1, max_length=8)],
    note: Annotated[str, Form(max_length=1000)] = "",
) -> Response:
    st = _state(request)
    item_id = _item_id(item_id)
    item = st.store.get_item(item_id)
    if item is None:
        raise HTTPException(404, f"There is no item {item_id}.")
    value_field, n = label_type_shape(item.label_type)
    if value_field != "best":
        raise HTTPException(422, f"Item {item_id} is a {item.label_type} question; this page answers best-of-N only.")
    kind, position = (choice, None) if choice in ("skip", "flag") else ("label", None)
    if kind == "label":
        if not (choice.isascii() and choice.isdigit()) or not 0 <= int(choice) < n:  # "٣".isdigit() is True
            raise HTTPException(422, f"choice={choice!r} must be 0..{n - 1}, 'skip' or 'flag' for item {item_id}.")
        position = int(choice)
    lease = st.queue.claim(user.name, item_id)  # first come, first served: a raced second post gets None
    if lease is None:
        if st.queue.answered(item_id, user.name):
            raise HTTPException(409, f"You already answered item {item_id}; that answer stands.")
        raise HTTPException(409, f"Item {item_id} is not the question you were shown (it was not saved). "
                                 "Open the labeling page for your current question.")  # fmt: skip
    order = _order(st, user.name, item_id, n)
    best = order[position] if position is not None else None  # displayed position -> stored sample
    saved = False
    seconds = round(time.time() - lease.shown_at, 3)  # time on task: from when the item was first shown
    try:
        st.store.add_label(item_id, user.name, best=best, kind=kind, note=note.strip() or None, source="web",
                           shown=order, seconds=seconds, replace=lease.redo)  # fmt: skip
        saved = True
    except DuplicateLabelError:
        raise HTTPException(409, f"You already answered item {item_id}; that answer stands.") from None
    finally:
        st.queue.finish(user.name, item_id, saved)
    done = {"label": f"picked option {(position or 0) + 1}", "skip": "skipped", "flag": "flagged"}[kind]
    user.session.flash = f"{'Changed' if lease.redo else 'Saved'}: item {item_id} {done}."
    return RedirectResponse("/label", 303)


def undo(request: Request, user: Annotated[User, Depends(csrf_checked)]) -> Response:
    st = _state(request)
    last = _last_answer(st, user)
    if last is None:
        raise HTTPException(409, f"There is no answer of yours from the last {st.undo_seconds:.0f} s to undo.")
    if not st.queue.take(user.name, last[1], redo=True):
        raise HTTPException(409, f"Item {last[1]} was retired by an admin; its answer cannot be changed.")
    user.session.flash = f"Answer item {last[1]} again: your new answer replaces the earlier one."
    return RedirectResponse("/label", 303)


def admin_page(request: Request, user: Annotated[User, Depends(admin)]) -> HTMLResponse:
    st = _state(request)
    rows, total = stats.labeler_rows(st.store)
    flash, user.session.flash = user.session.flash, None
    return _render(
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
        held=st.store.held_items(),
        flags=st.store.recent_flags(),
        chance=stats.chance_agreement(st.store),
        pending=st.store.pending_count(batch=st.queue.batch),
        label_types=st.store.label_types(),
        formats=FORMATS,
        ago=stats.ago,
    )


def admin_item(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[str, Form(max_length=20)],
    action: Annotated[str, Form(max_length=10)],
    best: Annotated[str, Form(max_length=3)] = "",
) -> Response:
    """retire / restore an item, or `gold` with best = the right option (1-based, in the stored order) / `ungold`."""
    if not user.is_admin:
        raise HTTPException(403, "This page is for admins only.")
    st = _state(request)
    item_id = _item_id(item_id)
    item = st.store.get_item(item_id)
    if item is None:
        raise HTTPException(404, f"There is no item {item_id}.")
    if action in ("retire", "restore"):
        st.store.set_hold(item_id, "retired" if action == "retire" else None)
        user.session.flash = f"Item {item_id} {'retired' if action == 'retire' else 'restored'}."
    elif action in ("gold", "ungold"):
        n = len(item.samples)
        if action == "gold" and not (best.isascii() and best.isdigit() and 1 <= int(best) <= n):
            raise HTTPException(422, f"best={best!r} must be the right option, 1..{n}, for gold item {item_id}.")
        if item.label_type != f"best_of_{n}":
            raise HTTPException(422, f"Item {item_id} is a {item.label_type} question; gold items are best-of-N.")
        st.store.set_gold(item_id, int(best) - 1 if action == "gold" else None)
        user.session.flash = f"Item {item_id} is {'a gold item' if action == 'gold' else 'no longer a gold item'}."
    else:
        raise HTTPException(422, f"action={action!r} must be retire, restore, gold or ungold.")
    return RedirectResponse("/admin", 303)


def export(
    request: Request, user: Annotated[User, Depends(admin)], format: str = "comparisons", label_type: str = ""
) -> Response:
    st = _state(request)
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


# -- errors ------------------------------------------------------------------------------------------------------


def _not_signed_in(request: Request, exc: NotSignedIn) -> Response:
    if request.method in ("GET", "HEAD"):
        return RedirectResponse("/login", 303)
    if request.url.path == "/label":  # an answer lost to an expired session (a restart): say so, and come back to it
        form = getattr(request, "_form", None)  # parsed by the dependencies before the session check failed
        item = form.get("item_id") if form is not None else None
        resume = int(item) if isinstance(item, str) and _ITEM_ID.fullmatch(item) else None
        what = f"Your answer to item {resume} was" if resume else "Your answer was"
        return _login_page(request, 401, f"{what} not saved: your session ended (the server restarted or you "
                           "signed out). Sign in again to answer it.", resume)  # fmt: skip
    return _render(request, "error.html", 401, status=401, message="Please sign in first.")


def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    return _render(request, "error.html", exc.status_code, status=exc.status_code, message=str(exc.detail))


def _invalid(request: Request, exc: RequestValidationError) -> Response:
    fields = ", ".join(str(e["loc"][-1]) for e in exc.errors())
    return _render(request, "error.html", 422, status=422, message=f"Invalid or missing form fields: {fields}.")


def create_app(
    store_path: str | Path,
    task: str = "sentiment",
    *,
    batch: str | None = None,
    lease_seconds: float = 900,
    session_idle_seconds: float = 8 * 3600,
    allowed_hosts: list[str] | None = None,
    shuffle: bool = True,
    gold_rate: float = 0.0,
    overlap_fraction: float = 0.0,
    overlap_k: int = 2,
    undo_seconds: float = 60,
    fast_seconds: float = 3,
    seed: int | None = None,
) -> FastAPI:
    """The app over the label store at `store_path` (created if missing), with `task`'s instructions.
    `allowed_hosts`: Host headers to accept (None: any); `lmprefs serve` on loopback passes the loopback names, so
    a web page that rebinds its own domain name to 127.0.0.1 cannot talk to the app. `shuffle`: each labeler sees
    the options in their own order; `gold_rate`: share of served items that are gold questions; `overlap_fraction`
    of the items want `overlap_k` labels; `undo_seconds`: how long an answer can be changed; `fast_seconds`: answers
    quicker than this are marked on the admin page; `seed`: seeds which turns are gold (tests)."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} must be one of {', '.join(TASKS)}")
    store = LabelStore(store_path)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    # the OpenAPI schema documents the JSON API only; no /docs or /redoc pages (they load scripts from a CDN)
    app = FastAPI(title="lmprefs labeling", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json", lifespan=lifespan)  # fmt: skip
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    queue = Queue(store, batch=batch, lease_seconds=lease_seconds, gold_rate=gold_rate,
                  overlap_fraction=overlap_fraction, overlap_k=overlap_k, seed=seed)  # fmt: skip
    app.state.lmprefs = State(
        store=store,
        sessions=Sessions(idle=session_idle_seconds),
        queue=queue,
        task=task,
        instructions=TASKS[task],
        templates=Jinja2Templates(env=env),
        throttle=Throttle(),
        shuffle=shuffle,
        undo_seconds=undo_seconds,
        fast_seconds=fast_seconds,
    )
    if allowed_hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(SecurityMiddleware)  # added last, so it is outermost: every response gets the headers
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_exception_handler(NotSignedIn, _not_signed_in)
    app.add_exception_handler(StarletteHTTPException, api.http_error(_http_error))  # ours, and 404/405 from routing
    app.add_exception_handler(RequestValidationError, api.invalid(_invalid))
    html = {"response_class": HTMLResponse, "include_in_schema": False}
    form = {**html, "dependencies": [Depends(single_valued)]}
    app.get("/", **html)(index)
    app.get("/login", **html)(login_form)
    app.post("/login", **form)(login)
    app.post("/logout", **form)(logout)
    app.get("/label", **html)(label_page)
    app.post("/label", **form)(submit_label)
    app.post("/undo", **form)(undo)
    app.get("/admin", **html)(admin_page)
    app.post("/admin/item", **form)(admin_item)
    app.get("/admin/export", include_in_schema=False)(export)
    api.install(app)
    return app
