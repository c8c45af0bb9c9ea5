"""What every page of the labeling app shares: the app's state, rendering a template, and reading a form's fields
(each at most once; an item id written plainly)."""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates

from lmprefs.labels.store import LabelStore
from lmprefs.server.instructions import Instructions
from lmprefs.server.queue import Queue
from lmprefs.server.security import Sessions, Throttle


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


def state(request: Request) -> State:
    return request.app.state.lmprefs


def render(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    st = state(request)
    context = {"task": st.task, "instructions": st.instructions, "user": None, **context}
    return st.templates.TemplateResponse(request, name, context, status_code=status_code)


FORM = "application/x-www-form-urlencoded"  # what the pages' forms send (a multipart one is refused: FormRoute)


async def single_valued(request: Request) -> None:
    """Every form field at most once: FastAPI would quietly take the last of a repeated `choice`."""
    if request.headers.get("content-type", "").startswith(FORM):
        form = await request.form()
        for key in form:
            if (n := len(form.getlist(key))) > 1:
                raise HTTPException(422, f"The form field {key!r} was sent {n} times; send it once.")


class FormRoute(APIRoute):
    """A page's route: a posted form's bytes are checked (`check_form`) before FastAPI parses them, as it would
    parse them garbled. The request keeps the body it read, so FastAPI parses the same bytes."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method == "POST":
                check_form(request.headers.get("content-type", ""), await request.body())
            return await handle(request)

        return checked


def check_form(kind: str, body: bytes) -> None:
    """Refuse a form that Starlette would read garbled (and the route store so, answering 303): a multipart form (a
    part that is not UTF-8 is read as Latin-1; the pages never send one) is a 415, and a URL-encoded one with a field
    name or value that is not URL-encoded UTF-8 (raw bytes are read as Latin-1, a bad %XX as U+FFFD) a 422 naming the
    field."""
    if kind.startswith("multipart/"):
        raise HTTPException(415, f"Send the form as {FORM}, as the page does (nothing was saved).")
    if not kind.startswith(FORM):
        return
    for pair in body.split(b"&"):
        name, _, value = pair.partition(b"=")
        try:
            for part in (name, value):
                unquote_plus(part.decode("ascii"), errors="strict")
        except UnicodeError:
            try:
                shown = unquote_plus(name.decode("ascii"), errors="strict")
            except UnicodeError:
                shown = name.decode("latin-1")  # the name itself is what is wrong: as sent
            raise HTTPException(422, f"The form field {shown!r:.40} is not URL-encoded UTF-8 text; send the form as "
                                     "the page does (nothing was saved).") from None  # fmt: skip


ITEM_ID = re.compile(r"[1-9][0-9]{0,17}")  # a plain positive integer: not "1.0", "+1", "01" or " 1"


def form_item_id(value: str, field: str = "item_id") -> int:
    if not ITEM_ID.fullmatch(value):
        raise HTTPException(422, f"{field}={value!r} must be a positive whole number written plainly (like 12).")
    return int(value)


# a number in a form, in ASCII as the pages and an HTML number input write it (0.8, .8, 8e-1): int() and float()
# would also read "1_0" as 10 and any script's digits ("\u0663" as 3)
WHOLE = re.compile(r"0|[1-9][0-9]*")
DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def form_count(value: str, field: str, top: int, unit: str = "") -> int:
    """A setting's typed count 0..top (0 turns it off), or a 422 naming the field; `unit` like "of labels "."""
    text = value.strip()
    if not WHOLE.fullmatch(text) or int(text) > top:
        raise HTTPException(422, f"{field}={value!r} must be a whole number {unit}0..{top} (0: off).")
    return int(text)


def form_fraction(value: str, field: str) -> float:
    """A typed number from 0 to 1, or a 422 naming the field."""
    text = value.strip()
    if not DECIMAL.fullmatch(text) or not 0 <= float(text) <= 1:
        raise HTTPException(422, f"{field}={value!r} must be a number from 0 to 1 (like 0.8).")
    return float(text)
