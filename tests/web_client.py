"""What the labeling app's newer HTTP tests share: signing in through the form, reading the page's CSRF token, item
and option texts, and the store's row counts (a refused request must leave them as they were)."""

from __future__ import annotations

import re
from html import unescape

from fastapi.testclient import TestClient

from lmprefs.labels.store import LabelStore


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def sign_in(app, token: str) -> TestClient:
    client = TestClient(app, follow_redirects=False)
    r = client.post("/login", data={"token": token, "csrf": csrf_of(client.get("/login").text)})
    assert r.status_code == 303 and r.headers["location"] == "/label", r.text
    return client


def page(client: TestClient) -> tuple[int | None, str]:
    """(item id or None, csrf) of the labeler's current question."""
    html = client.get("/label").text
    m = re.search(r'name="item_id" value="(\d+)"', html)
    return (int(m.group(1)) if m else None), csrf_of(html)


def shown(html: str) -> list[str]:
    """The option texts of the labeling page, in the order this labeler sees them."""
    return [unescape(t) for t in re.findall(r'<span class="text">(.*?)</span>', html, re.S)]


def counts(db) -> dict[str, int]:
    with LabelStore(db) as store:
        return store.table_counts()
