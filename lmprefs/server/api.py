"""The JSON API of the labeling app, for scripts and for training runs on other machines (`client.py` wraps it).

Every call needs `Authorization: Bearer TOKEN` with an admin's token from `lmprefs labelers add NAME --admin`; no
cookie is read here, so a web page cannot make a signed-in browser call the API (no CSRF), and wrong tokens are
throttled with the sign-in form's. The schema is at /api/openapi.json: it names the bearer scheme, so generated
clients send the token, and documents each call's errors, whose body is always `{"detail": "one line"}` (ErrorOut).

  GET  /api/me                 who the token belongs to
  POST /api/items              queue questions (with an optional gold answer); idempotent like LabelStore.add_item
  GET  /api/items/{id}         one question, its status and hold
  GET  /api/labels             labels in feed order, after position `since_id` (page with `next_since_id`)
  GET  /api/quality            per-labeler gold accuracy, agreement with the majority, position picks, time on task
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from functools import cached_property
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from lmprefs.config import label_type_shape
from lmprefs.labels.quality import quality as quality_of
from lmprefs.labels.store import Item
from lmprefs.server.pages import WHOLE
from lmprefs.server.security import Caller, failure_keys, too_many

MAX_ITEMS = 1000  # per POST /api/items; the client sends larger lists in chunks


def _plain(value: object) -> object:
    # pydantic reads "1_0" as 10 and takes "+1", " 1", "01" and "1.0" too: GET /api/items/1_0 answered item 10. A
    # minus passes, so that the bounds name a negative number
    if isinstance(value, str) and not WHOLE.fullmatch(value.removeprefix("-")):
        raise PydanticCustomError("int_plain", "Input should be a whole number written plainly, like 12")
    return value


PLAIN = BeforeValidator(_plain)  # a path or query integer, written as the forms' numbers must be (pages.WHOLE)


class ErrorOut(BaseModel):
    """Every error the API answers, 4xx or 5xx: one line saying what went wrong and how to fix it."""

    detail: str = Field(description="what went wrong, in one line")


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "No token, or a wrong one (send `Authorization: Bearer TOKEN`)."},
    403: {"description": "The token is a labeler's, not an admin's."},
    404: {"description": "There is no such item."},
    413: {"description": "The request body is over 4 MiB (send at most 1000 questions per call)."},
    415: {"description": "The body was not sent as `Content-Type: application/json`."},
    422: {"description": "A parameter or the body is invalid; the detail names which and why. Nothing was stored."},
    429: {
        "description": "Too many wrong tokens from this address or starting like this one; wait for Retry-After "
        "seconds. A right token is never refused.",
        "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    },
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of these error codes, each with the body every API error has (ErrorOut)."""
    return {code: {"model": ErrorOut, **ERRORS[code]} for code in codes}


# a field the API does not know is refused, not dropped: a misspelt `gold` would otherwise queue an ordinary question;
# strict: a value of the wrong JSON type is refused, not converted (`"gold": true` would be gold answer 1)
INPUT = ConfigDict(extra="forbid", strict=True)


class ItemIn(BaseModel):
    model_config = INPUT

    query: str = Field(max_length=20_000)
    samples: list[str] = Field(min_length=1, max_length=16)
    label_type: str = Field("best_of_4", max_length=30)
    source: str = Field("api", max_length=200, description="where the question came from (part of its identity)")
    key: str | None = Field(None, max_length=200, description="tells deliberate duplicates apart")
    batch: str | None = Field(None, max_length=200)
    priority: int = Field(0, ge=-(2**31), le=2**31)
    want_labels: int = Field(1, ge=1, le=1000)
    gold: int | None = Field(None, ge=0, description="the right answer (stored sample index) of a gold question; for "
                             "a ranking_K question, the right top choice")  # fmt: skip
    gold_note: str | None = Field(None, max_length=2000, description="why the gold answer is right (onboarding "
                                  "shows it to new labelers)")  # fmt: skip


class ItemsIn(BaseModel):
    model_config = INPUT

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
    ranking: list[int] | None = Field(description="ranking_K: the stored samples' indices, best first (`best` is the "
                                      "top one)")  # fmt: skip
    confidence: int | None = Field(description="the labeler's confidence, 1 (a guess) to 3 (sure), if given")
    too_fast: bool | None = Field(description="answered quicker than the server's --fast-seconds")
    position: int = Field(description="the row's place in the feed: an answer changed by undo is sent again, same "
                          "id, at a new position; keep the last row sent for each id")  # fmt: skip


class LabelsOut(BaseModel):
    labels: list[LabelOut]
    next_since_id: int = Field(description="the last row's position: pass as since_id for the next page (equal to "
                               "since_id when done)")  # fmt: skip


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


BEARER = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="An admin's token from `lmprefs labelers add NAME --admin`.")  # fmt: skip


def api_user(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
) -> Caller:
    """The admin whose bearer token authorizes this call. Only wrong tokens are throttled: a right one always
    gets in, whoever else shares its address."""
    st = request.app.state.lmprefs
    token = credentials.credentials.strip() if credentials else ""
    labeler = st.store.labeler_for_token(token) if 0 < len(token) <= 200 else None
    if labeler is None:
        if request.headers.get("authorization"):  # a token was sent, and it is wrong
            wait = st.throttle.failed(failure_keys(request, token))
            if wait:
                message, headers = too_many(wait)
                raise HTTPException(429, message, headers=headers)
        raise HTTPException(401, "Send an admin's token as 'Authorization: Bearer TOKEN' (lmprefs labelers add).",
                            headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    if not labeler.is_admin:
        raise HTTPException(403, f"{labeler.name!r} is not an admin; the API is for admins' tokens.")
    return Caller(labeler.id, labeler.name, True)  # no session: the API keeps none


def api_call(request: Request, user: Annotated[Caller, Depends(api_user)]) -> Caller:
    """The admin of `api_user`, once the request's query and Content-Type are the call's own (checked after the
    token, like the parameters' values)."""
    route = request.scope.get("route")
    if not isinstance(route, ApiRoute):
        raise TypeError(f"{request.url.path} must be an ApiRoute (api.install adds it so)")
    check_query(request, route)
    if route.body_field is not None and not is_json(request.headers.get("content-type")):
        # FastAPI reads the JSON as bytes then, and refuses it as "body: Input should be a valid dictionary"
        raise HTTPException(415, f"invalid request: Content-Type: {request.headers.get('content-type') or 'none'!r} "
                                 "is not application/json; send the body as JSON.")  # fmt: skip
    return user


def check_query(request: Request, route: ApiRoute) -> None:
    """A 422 for a query parameter the call does not take, or one sent twice. FastAPI ignores the one and takes the
    last of the other: a misspelt since_id would read every label from the start again, without a word."""
    known = route.query_names
    for name in dict.fromkeys(request.query_params.keys()):
        if name not in known:
            takes = ", ".join(known) if known else "no parameters"
            raise HTTPException(422, f"invalid request: query: unknown parameter {name!r:.60}; {request.method} "
                                     f"{route.path} takes {takes}.")  # fmt: skip
        if (n := len(request.query_params.getlist(name))) > 1:
            raise HTTPException(422, f"invalid request: query: {name!r} was sent {n} times; send it once.")


Admin = Annotated[Caller, Depends(api_call)]


def me(user: Admin) -> dict:
    """The name and role of the token's labeler (a cheap check that the URL and token work)."""
    return {"name": user.name, "is_admin": user.is_admin}


def _gold_problem(it: ItemIn) -> str | None:
    """What is wrong with a question's gold answer or note, as `field: why`, or None. Checked here rather than left
    to the store, whose message names the item by an id that the refused call never made (it is rolled back)."""
    if it.gold is None:
        if it.gold_note is not None:  # stored only with a gold answer: without one it would be dropped with a 200
            return "gold_note: a note explains a gold answer; send gold (the right sample's index) with it"
        return None
    value_field, n = label_type_shape(it.label_type)  # valid: the store has just added the question
    if value_field not in ("best", "ranking"):
        return f"gold: a {it.label_type} question cannot be gold; only best_of_N and ranking_K questions can"
    if it.gold >= n:
        return f"gold={it.gold} must be the right sample's index, 0..{n - 1}"
    return None


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
                if problem := _gold_problem(it):
                    raise HTTPException(422, f"items[{k}].{problem}.")
                if it.gold is not None:
                    st.store.set_gold(item_id, it.gold, it.gold_note)
            except ValueError as e:
                raise HTTPException(422, f"items[{k}]: {e}") from None
            ids.append(item_id)
    st.queue.apply_overlap()
    return ItemsOut(ids=ids)


def get_item(request: Request, user: Admin, item_id: Annotated[int, Path(ge=1, le=2**62), PLAIN]) -> Item:
    """One question as the store holds it (samples in stored order; `gold` indexes them)."""
    item = request.app.state.lmprefs.store.get_item(item_id)
    if item is None:
        raise HTTPException(404, f"There is no item {item_id}.")
    return item


def labels(
    request: Request,
    user: Admin,
    since_id: Annotated[int, Query(ge=0, le=2**63 - 1), PLAIN] = 0,  # a label id is a signed 64-bit integer
    limit: Annotated[int, Query(ge=1, le=10_000), PLAIN] = 1000,
    label_type: Annotated[str | None, Query(max_length=30)] = None,
) -> LabelsOut:
    """Labels, skips and flags at a feed position after since_id, in feed order, at most `limit`; an answer changed
    by undo comes again at a new position (same id)."""
    if label_type is not None:
        try:
            label_type_shape(label_type)
        except ValueError as e:
            raise HTTPException(422, f"label_type: {e}") from None
    st = request.app.state.lmprefs
    answers = st.store.answers_since(since_id, limit=limit, label_type=label_type)
    out = [LabelOut(**asdict(a), too_fast=None if a.seconds is None else a.seconds < st.fast_seconds)
           for a in answers]  # fmt: skip
    return LabelsOut(labels=out, next_since_id=out[-1].position if out else since_id)


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


class ApiRoute(APIRoute):
    """An API route that parses its JSON body before FastAPI does (`read_json`; the request keeps the parse, so
    FastAPI reads that one and the body is parsed once) and knows its query parameters' names (`check_query`)."""

    @cached_property
    def query_names(self) -> list[str]:
        """The query parameters of the endpoint and its dependencies, in the order they are declared."""

        def names(dependant) -> list[str]:
            return [f.alias for f in dependant.query_params] + [n for d in dependant.dependencies for n in names(d)]

        return names(self.dependant)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None:  # no body to read
            return handle

        async def checked(request: Request) -> Response:
            if is_json(request.headers.get("content-type")):  # else api_call refuses it, once the token is checked
                await read_json(request)
            return await handle(request)

        return checked


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body of this Content-Type as JSON: application/json or application/...+json."""
    mime = (content_type or "").split(";")[0].strip().lower()
    return mime == "application/json" or (mime.startswith("application/") and mime.endswith("+json"))


async def read_json(request: Request) -> None:
    """Parse the JSON body, or refuse it in one line naming what is wrong: FastAPI answers a body that is not UTF-8,
    or nested past Python's recursion limit, with a bare 400 "There was an error parsing the body". Before the token
    is checked, like FastAPI's own answer to a body that is not JSON."""
    try:
        await request.json()
    except json.JSONDecodeError:
        pass  # FastAPI refuses it itself, as a 422 with the position (`invalid`)
    except UnicodeDecodeError as e:
        raise HTTPException(422, f"invalid request: body: not UTF-8 (byte {e.start}); send JSON in UTF-8.") from None
    except RecursionError:
        raise HTTPException(422, "invalid request: body: JSON nested too deeply to read.") from None


def install(app: FastAPI) -> None:
    """Add the API's routes to `app` (on its router, so they list among app.routes like the pages)."""
    every = (401, 403, 422, 429)  # every call needs an admin's token, and takes only its own query parameters
    for method, path, endpoint, failures in (
        ("GET", "/api/me", me, every),
        ("POST", "/api/items", add_items, (*every, 413, 415)),
        ("GET", "/api/items/{item_id}", get_item, (*every, 404)),
        ("GET", "/api/labels", labels, every),
        ("GET", "/api/quality", quality, every),
    ):
        app.router.add_api_route(path, endpoint, methods=[method], tags=["api"],
                                 responses=errors(*sorted(failures)), route_class_override=ApiRoute)  # fmt: skip


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
