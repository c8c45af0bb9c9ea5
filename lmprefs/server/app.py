"""The labeling web app: `create_app(store_path, task)` builds the FastAPI application.

Routes (all pages server-rendered with Jinja2, autoescaped; one small script for the keyboard; every GET page answers
HEAD too):
  GET  /login, POST /login   sign in with a token from `lmprefs labelers add` (the only open routes, with /static)
  POST /logout
  GET  /label                the labeler's current question (options in this labeler's shuffled order), progress
  POST /label                one answer to the item leased to this labeler: item_id, choice = displayed position
                             0..N-1 | "skip" | "flag" (a ranking_K item: "rank" with ranking = the displayed option
                             numbers 1..K best first, like "2,1,3"), optional confidence 1..3 and note; 303 to
                             /label; a drift anchor (drift.py) is served and answered here too, unannounced
  POST /onboarding           a practice answer (onboarding.py): item_id, choice or ranking, as POST /label
  POST /undo                 answer the last item again (within `undo_seconds` of the answer); the new one replaces it
  GET  /admin                counts, throughput, quality control, flags, export form (admins only)
  GET  /admin/items          the item browser: search by text and state, every option, gold and its note, actions
  POST /admin/item           retire / restore an item, or mark it gold with its right answer and a note (admins only)
  POST /admin/onboarding     how many practice questions a new labeler answers, and the accuracy that admits them
  POST /admin/labeler        admit a labeler, or hold one back from real work
  POST /admin/drift          labels per drift interval (0: no anchors served)
  GET  /admin/export         ?format=openai|pairs|comparisons[&label_type=...]: download (admins only)
  /api/...                   the JSON API for scripts (api.py; bearer token, documented at /api/openapi.json)
Every form POST needs the session's CSRF token, and every form field may appear once, URL-encoded UTF-8 (a multipart
form is refused). The labeler's routes are in `labeling`, the admin's in `admin`, what they share in `pages`; this
module assembles the app and its error pages.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from lmprefs.labels.store import LabelStore
from lmprefs.server import admin, api, labeling, onboarding
from lmprefs.server.instructions import TASKS
from lmprefs.server.pages import ITEM_ID, FormRoute, State, render, single_valued
from lmprefs.server.queue import Queue
from lmprefs.server.security import CROSS_SITE, NotSignedIn, SecurityMiddleware, Sessions, Throttle, cross_site

HERE = Path(__file__).parent


# -- errors ------------------------------------------------------------------------------------------------------


def _not_signed_in(request: Request, exc: NotSignedIn) -> Response:
    if request.method in ("GET", "HEAD"):
        return RedirectResponse("/login", 303)
    if cross_site(request):  # a forgery, sent without the victim's cookie (SameSite): their session has not ended
        return render(request, "error.html", 403, status=403, message=CROSS_SITE)
    if request.url.path == "/label":  # an answer lost to an expired session (a restart): say so, and come back to it
        form = getattr(request, "_form", None)  # parsed by the dependencies before the session check failed
        item = form.get("item_id") if form is not None else None
        resume = int(item) if isinstance(item, str) and ITEM_ID.fullmatch(item) else None
        what = f"Your answer to item {resume} was" if resume else "Your answer was"
        return labeling.login_page(request, 401, f"{what} not saved: your session ended (the server restarted or "
                                   "you signed out). Sign in again to answer it.", resume)  # fmt: skip
    return render(request, "error.html", 401, status=401, message="Please sign in first.")


def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    return render(request, "error.html", exc.status_code, status=exc.status_code, message=str(exc.detail))


def _invalid(request: Request, exc: RequestValidationError) -> Response:
    fields = ", ".join(str(e["loc"][-1]) for e in exc.errors())
    return render(request, "error.html", 422, status=422, message=f"Invalid or missing form fields: {fields}.")


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
    # Starlette's stub types every handler as taking Exception, though it calls it only with the class registered
    app.add_exception_handler(NotSignedIn, _not_signed_in)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, api.http_error(_http_error))  # ours, and 404/405 from routing
    app.add_exception_handler(RequestValidationError, api.invalid(_invalid))
    app.router.route_class = FormRoute  # the routes added below, the pages' (the API's are api.ApiRoute)
    html: dict[str, Any] = {"response_class": HTMLResponse, "include_in_schema": False}
    page: dict[str, Any] = {**html, "methods": ["GET", "HEAD"]}  # HEAD: the GET's status and headers, no body
    form: dict[str, Any] = {**html, "dependencies": [Depends(single_valued)]}
    app.api_route("/", **page)(labeling.index)
    app.api_route("/login", **page)(labeling.login_form)
    app.post("/login", **form)(labeling.login)
    app.post("/logout", **form)(labeling.logout)
    app.api_route("/label", **page)(labeling.label_page)
    app.post("/label", **form)(labeling.submit_label)
    app.post("/undo", **form)(labeling.undo)
    app.post("/onboarding", **form)(onboarding.submit_practice)
    app.api_route("/admin", **page)(admin.admin_page)
    app.api_route("/admin/items", **page)(admin.item_browser)
    app.post("/admin/item", **form)(admin.admin_item)
    app.post("/admin/onboarding", **form)(admin.admin_onboarding)
    app.post("/admin/labeler", **form)(admin.admin_labeler)
    app.post("/admin/drift", **form)(admin.admin_drift)
    app.get("/admin/export", include_in_schema=False)(admin.export)
    api.install(app)
    return app
