"""What every page of the labeling app shares: the app's state, rendering a template, and reading a form's fields
(each at most once; an item id written plainly)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
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


async def single_valued(request: Request) -> None:
    """Every form field at most once: FastAPI would quietly take the last of a repeated `choice`."""
    if request.headers.get("content-type", "").startswith(("application/x-www-form-urlencoded", "multipart/")):
        form = await request.form()
        for key in form:
            if (n := len(form.getlist(key))) > 1:
                raise HTTPException(422, f"The form field {key!r} was sent {n} times; send it once.")


ITEM_ID = re.compile(r"[1-9][0-9]{0,17}")  # a plain positive integer: not "1.0", "+1", "01" or " 1"


def form_item_id(value: str, field: str = "item_id") -> int:
    if not ITEM_ID.fullmatch(value):
        raise HTTPException(422, f"{field}={value!r} must be a positive whole number written plainly (like 12).")
    return int(value)
