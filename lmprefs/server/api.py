"""The JSON API of the labeling app, for scripts and for training runs on other machines (`client.py` wraps it).

Every call needs `Authorization: Bearer TOKEN` with an admin's token from `lmprefs labelers add NAME --admin`; no
cookie is read here, so a web page cannot make a signed-in browser call the API (no CSRF), and wrong tokens are
throttled with the sign-in form's. The schema is at /api/openapi.json.

  GET  /api/me                 who the token belongs to
  POST /api/items              queue questions (with an optional gold answer); idempotent like LabelStore.add_item
  GET  /api/items/{id}         one question, its status and hold
  GET  /api/labels             labels in id order, from `since_id` (page with `next_since_id`)
  GET  /api/quality            per-labeler gold accuracy, agreement with the majority, position picks, time on task
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from lmprefs.config import label_type_shape
from lmprefs.labels.quality import quality as quality_of
from lmprefs.labels.store import Item
from lmprefs.server.security import Caller, client_of

MAX_ITEMS = 1000  # per POST /api/items; the client sends larger lists in chunks


class ItemIn(BaseModel):
    query: str = Field(max_length=20_000)
    samples: list[str] = Field(min_length=1, max_length=16)
    label_type: str = Field("best_of_4", max_length=30)
    source: str = Field("api", max_length=200, description="where the question came from (part of its identity)")
    key: str | None = Field(None, max_length=200, description="tells deliberate duplicates apart")
    batch: str | None = Field(None, max_length=200)
    priority: int = Field(0, ge=-(2**31), le=2**31)
    want_labels: int = Field(1, ge=1, le=1000)
    gold: int | None = Field(None, ge=0, description="the right answer (stored sample index) of a gold question")


class ItemsIn(BaseModel):
    items: list[ItemIn] = Field(max_length=MAX_ITEMS)


class ItemsOut(BaseModel):
    ids: list[int] = Field(description="the store's item id of each question, in order")


class LabelOut(BaseModel):
    id: int
    item_id: int
    labeler: str
    kind: str = Field(description="label, skip or flag")
    best: int | None = Field(description="the chosen sample, an index into the item's stored samples")
    score: float | None
    difference: float | None
    note: str | None
    source: str
    created: float
    shown: list[int] | None = Field(description="display order: position p showed stored sample shown[p]")
    seconds: float | None = Field(description="time on task")
    too_fast: bool | None = Field(description="answered quicker than the server's --fast-seconds")


class LabelsOut(BaseModel):
    labels: list[LabelOut]
    next_since_id: int = Field(description="pass as since_id for the next page (equal to since_id when done)")


class LabelerQualityOut(BaseModel):
    name: str
    gold_correct: int
    gold_answered: int
    gold_accuracy: float | None
    gold_interval: tuple[float, float] | None = Field(description="95% Wilson interval of the gold accuracy")
    majority_agree: int
    majority_items: int
    positions: list[int] = Field(description="picks per displayed position")
    median_seconds: float | None


class QualityOut(BaseModel):
    labelers: list[LabelerQualityOut]
    fleiss_kappa: float | None
    fleiss_items: int


def api_user(request: Request, authorization: Annotated[str | None, Header(max_length=300)] = None) -> Caller:
    """The admin whose bearer token authorizes this call."""
    st = request.app.state.lmprefs
    wait = st.throttle.wait(client_of(request))
    if wait:
        raise HTTPException(429, f"Too many wrong tokens from your address; try again in {wait:.0f} s.")
    scheme, _, token = (authorization or "").partition(" ")
    labeler = st.store.labeler_for_token(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
    if labeler is None:
        if authorization:
            st.throttle.failed(client_of(request))
        raise HTTPException(401, "Send an admin's token as 'Authorization: Bearer TOKEN' (lmprefs labelers add).")
    if not labeler.is_admin:
        raise HTTPException(403, f"{labeler.name!r} is not an admin; the API is for admins' tokens.")
    return Caller(labeler.id, labeler.name, True)  # no session: the API keeps none


Admin = Annotated[Caller, Depends(api_user)]


def me(user: Admin) -> dict:
    """The name and role of the token's labeler (a cheap check that the URL and token work)."""
    return {"name": user.name, "is_admin": user.is_admin}


def add_items(request: Request, user: Admin, body: ItemsIn) -> ItemsOut:
    """Queue questions in one transaction (all or none). The same question again returns the same id."""
    st = request.app.state.lmprefs
    ids: list[int] = []
    with st.store.transaction():  # an HTTPException raised inside rolls back the whole call
        for k, it in enumerate(body.items):
            try:
                item_id = st.store.add_item(it.query, it.samples, source=it.source, label_type=it.label_type,
                                            want_labels=it.want_labels, batch=it.batch, priority=it.priority,
                                            key=it.key)  # fmt: skip
                if it.gold is not None:
                    st.store.set_gold(item_id, it.gold)
            except ValueError as e:
                raise HTTPException(422, f"items[{k}]: {e}") from None
            ids.append(item_id)
    st.queue.apply_overlap()
    return ItemsOut(ids=ids)


def get_item(request: Request, user: Admin, item_id: Annotated[int, Path(ge=1, le=2**62)]) -> Item:
    """One question as the store holds it (samples in stored order; `gold` indexes them)."""
    item = request.app.state.lmprefs.store.get_item(item_id)
    if item is None:
        raise HTTPException(404, f"There is no item {item_id}.")
    return item


def labels(
    request: Request,
    user: Admin,
    since_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    label_type: Annotated[str | None, Query(max_length=30)] = None,
) -> LabelsOut:
    """Labels, skips and flags with id > since_id, oldest first, at most `limit`."""
    if label_type is not None:
        try:
            label_type_shape(label_type)
        except ValueError as e:
            raise HTTPException(422, f"label_type: {e}") from None
    st = request.app.state.lmprefs
    answers = st.store.answers_since(since_id, limit=limit, label_type=label_type)
    out = [LabelOut(**asdict(a), too_fast=None if a.seconds is None else a.seconds < st.fast_seconds)
           for a in answers]  # fmt: skip
    return LabelsOut(labels=out, next_since_id=out[-1].id if out else since_id)


def quality(request: Request, user: Admin) -> QualityOut:
    q = quality_of(request.app.state.lmprefs.store)
    rows = [
        LabelerQualityOut(
            name=r.name,
            gold_correct=r.gold_correct,
            gold_answered=r.gold_answered,
            gold_accuracy=r.gold_accuracy,
            gold_interval=r.gold_interval,
            majority_agree=r.majority_agree,
            majority_items=r.majority_items,
            positions=r.positions,
            median_seconds=r.quantile(0.5),
        )  # fmt: skip
        for r in q.labelers.values()
    ]
    return QualityOut(labelers=rows, fleiss_kappa=q.fleiss, fleiss_items=q.fleiss_items)


def install(app: FastAPI) -> None:
    """Add the API's routes to `app` (on the app itself, so they list among app.routes like the pages)."""
    for method, path, endpoint in (
        ("GET", "/api/me", me),
        ("POST", "/api/items", add_items),
        ("GET", "/api/items/{item_id}", get_item),
        ("GET", "/api/labels", labels),
        ("GET", "/api/quality", quality),
    ):
        app.add_api_route(path, endpoint, methods=[method], tags=["api"])


# -- errors: JSON under /api, the HTML error page elsewhere -------------------------------------------------------


def http_error(html_handler):
    def handler(request: Request, exc):
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": str(exc.detail)}, exc.status_code, headers=getattr(exc, "headers", None))
        return html_handler(request, exc)

    return handler


def invalid(html_handler):
    def handler(request: Request, exc):
        if request.url.path.startswith("/api/"):
            where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
            return JSONResponse({"detail": f"invalid request: {where}"}, 422)
        return html_handler(request, exc)

    return handler
