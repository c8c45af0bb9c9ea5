"""The labeling web app: `create_app(store_path, task)` builds the FastAPI application.

Routes (all pages server-rendered with Jinja2, autoescaped; one small script for the keyboard):
  GET  /login, POST /login   sign in with a token from `lmprefs labelers add` (the only open routes, with /static)
  POST /logout
  GET  /label                the labeler's current question, instructions and progress
  POST /label                one answer: item_id, choice = 0..N-1 | "skip" | "flag", optional note; 303 to /label
  GET  /admin                counts, throughput, agreement, queue, export form (admins only)
  GET  /admin/export         ?format=openai|pairs|comparisons[&label_type=...]: download (admins only)
Every POST needs the session's CSRF token. Endpoints are sync functions: Starlette runs them in its thread pool and
the store gives each thread its own SQLite connection; each answer is one `add_label` transaction, and the store's
UNIQUE (item, labeler) makes a replayed or raced second answer a 409 that changes nothing.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
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

from lmprefs.errors import UserError
from lmprefs.labels.formats import FORMATS, export_file
from lmprefs.labels.store import DuplicateLabelError, LabelStore, label_type_shape
from lmprefs.server import stats
from lmprefs.server.instructions import TASKS, Instructions
from lmprefs.server.queue import Queue
from lmprefs.server.security import (
    LOGIN_COOKIE,
    SESSION_COOKIE,
    NotSignedIn,
    SecurityMiddleware,
    Sessions,
    User,
    admin,
    cross_site,
    csrf_checked,
    same,
    set_cookie,
    signed_in,
    token_hash,
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


def _state(request: Request) -> State:
    return request.app.state.lmprefs


def _render(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    st = _state(request)
    context = {"task": st.task, "instructions": st.instructions, "user": None, **context}
    return st.templates.TemplateResponse(request, name, context, status_code=status_code)


# -- routes ------------------------------------------------------------------------------------------------------


def _login_page(request: Request, status: int = 200, error: str | None = None) -> HTMLResponse:
    form_token = secrets.token_urlsafe(32)
    response = _render(request, "login.html", status, csrf=form_token, error=error)
    set_cookie(response, request, LOGIN_COOKIE, form_token, max_age=3600)
    return response


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
) -> Response:
    st = _state(request)
    if cross_site(request) or not same(csrf, request.cookies.get(LOGIN_COOKIE)):
        return _login_page(request, 403, "The sign-in form expired or came from another site; please try again.")
    labeler = st.store.labeler_for_token(token.strip())
    if labeler is None:
        return _login_page(request, 401, "That token is not valid. Ask an admin for one (lmprefs labelers add).")
    st.sessions.close(request.cookies.get(SESSION_COOKIE))  # a fresh session id on every sign-in (no fixation)
    session = st.sessions.open(labeler.id, token_hash(token.strip()))
    response = RedirectResponse("/label", 303)
    set_cookie(response, request, SESSION_COOKIE, session.sid)
    response.delete_cookie(LOGIN_COOKIE, path="/", httponly=True, samesite="strict")
    return response


def logout(request: Request, user: Annotated[User, Depends(csrf_checked)]) -> Response:
    _state(request).sessions.close(user.session.sid)
    response = RedirectResponse("/login", 303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


def label_page(request: Request, user: Annotated[User, Depends(signed_in)]) -> HTMLResponse:
    st = _state(request)
    item = st.queue.current(user.name)
    flash, user.session.flash = user.session.flash, None
    progress = st.queue.progress(user.id, user.name)
    return _render(request, "label.html", user=user, csrf=user.session.csrf, item=item, progress=progress, flash=flash)


def submit_label(
    request: Request,
    user: Annotated[User, Depends(csrf_checked)],
    item_id: Annotated[int, Form(ge=1, le=2**62)],
    choice: Annotated[str, Form(min_length=1, max_length=8)],
    note: Annotated[str, Form(max_length=1000)] = "",
) -> Response:
    st = _state(request)
    item = st.store.get_item(item_id)
    if item is None:
        raise HTTPException(404, f"There is no item {item_id}.")
    value_field, n = label_type_shape(item.label_type)
    if value_field != "best":
        raise HTTPException(422, f"Item {item_id} is a {item.label_type} question; this page answers best-of-N only.")
    kind, best = (choice, None) if choice in ("skip", "flag") else ("label", None)
    if kind == "label":
        if not (choice.isascii() and choice.isdigit()) or not 0 <= int(choice) < n:  # "٣".isdigit() is True
            raise HTTPException(422, f"choice={choice!r} must be 0..{n - 1}, 'skip' or 'flag' for item {item_id}.")
        best = int(choice)
    try:
        st.store.add_label(item_id, user.name, best=best, kind=kind, note=note.strip() or None, source="web")
    except DuplicateLabelError:
        raise HTTPException(409, f"You already answered item {item_id}; that answer stands.") from None
    st.queue.release(user.name, item_id)
    done = {"label": f"picked option {(best or 0) + 1}", "skip": "skipped", "flag": "flagged"}[kind]
    user.session.flash = f"Saved: item {item_id} {done}."
    return RedirectResponse("/label", 303)


def admin_page(request: Request, user: Annotated[User, Depends(admin)]) -> HTMLResponse:
    st = _state(request)
    rows, total = stats.labeler_rows(st.store)
    return _render(
        request,
        "admin.html",
        user=user,
        csrf=user.session.csrf,
        rows=rows,
        total=total,
        agreement=st.store.agreement(),
        flags=stats.recent_flags(st.store),
        chance=stats.chance_agreement(st.store),
        pending=st.store.pending_count(batch=st.queue.batch),
        label_types=st.store.label_types(),
        formats=FORMATS,
        ago=stats.ago,
    )


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
) -> FastAPI:
    """The app over the label store at `store_path` (created if missing), with `task`'s instructions.
    `allowed_hosts`: Host headers to accept (None: any); `lmprefs serve` on loopback passes the loopback names, so
    a web page that rebinds its own domain name to 127.0.0.1 cannot talk to the app."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} must be one of {', '.join(TASKS)}")
    store = LabelStore(store_path)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    # no /docs or /openapi.json: they would be open to anyone and load scripts from a CDN
    app = FastAPI(title="lmprefs labeling", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    app.state.lmprefs = State(
        store=store,
        sessions=Sessions(idle=session_idle_seconds),
        queue=Queue(store, batch=batch, lease_seconds=lease_seconds),
        task=task,
        instructions=TASKS[task],
        templates=Jinja2Templates(env=env),
    )
    if allowed_hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)
    app.add_middleware(SecurityMiddleware)  # added last, so it is outermost: every response gets the headers
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_exception_handler(NotSignedIn, _not_signed_in)
    app.add_exception_handler(StarletteHTTPException, _http_error)  # ours, and 404/405 from routing
    app.add_exception_handler(RequestValidationError, _invalid)
    html = {"response_class": HTMLResponse}
    app.get("/", **html)(index)
    app.get("/login", **html)(login_form)
    app.post("/login", **html)(login)
    app.post("/logout", **html)(logout)
    app.get("/label", **html)(label_page)
    app.post("/label", **html)(submit_label)
    app.get("/admin", **html)(admin_page)
    app.get("/admin/export")(export)
    return app
