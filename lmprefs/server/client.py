"""A small Python client for the labeling app's JSON API (api.py), standard library only, so a training run on
another machine can queue questions and read labels:

    from lmprefs.server.client import Client
    app = Client("http://labels.example:8000", token)      # an admin's token (lmprefs labelers add NAME --admin)
    ids = app.add_items([{"query": q, "samples": [a, b, c, d]} for q, (a, b, c, d) in questions])
    labels = app.labels(since_id=0)                         # every label, skip and flag, oldest first

Each call raises `ApiError` (a UserError: one line naming the call and the server's answer) on an HTTP error.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from lmprefs.errors import UserError

CHUNK = 500  # questions per POST /api/items (the server takes at most 1000 and 4 MiB per call)


class ApiError(UserError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(self, url: str, token: str, *, timeout: float = 30) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise UserError(f"labeling app url {url!r} must start with http:// or https://")
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def _call(self, method: str, path: str, body: dict | None = None, **query) -> dict:
        query = {k: v for k, v in query.items() if v is not None}
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("detail", e.reason)
            except ValueError:
                detail = e.reason
            raise ApiError(e.code, f"{method} {url}: {e.code} {detail}") from None
        except urllib.error.URLError as e:
            raise ApiError(0, f"{method} {url}: cannot reach the labeling app ({e.reason})") from None

    def me(self) -> dict:
        return self._call("GET", "/api/me")

    def add_items(self, items: list[dict]) -> list[int]:
        """Queue questions ({query, samples, label_type="best_of_4", source="api", key, batch, priority,
        want_labels, gold}); returns their item ids in order. Sent in chunks of CHUNK; each chunk is all or none,
        and sending a question again returns its existing id, so a failed call can simply be repeated."""
        ids: list[int] = []
        for start in range(0, len(items), CHUNK):
            ids += self._call("POST", "/api/items", {"items": items[start : start + CHUNK]})["ids"]
        return ids

    def item(self, item_id: int) -> dict:
        return self._call("GET", f"/api/items/{int(item_id)}")

    def labels(self, since_id: int = 0, label_type: str | None = None, page: int = 1000) -> list[dict]:
        """Every label, skip and flag after feed position since_id (0: all), in feed order (read page by page), each
        id once, as last changed: an answer changed by undo while the pages are read comes once, at its new
        position. `best` indexes the item's stored samples; `shown` is the order the labeler saw them in; `seconds`
        the time on task. Pass the last row's `position` as since_id to read only what came or changed since."""
        out: dict[int, dict] = {}
        while True:
            r = self._call("GET", "/api/labels", since_id=since_id, label_type=label_type, limit=page)
            for row in r["labels"]:
                out.pop(row["id"], None)
                out[row["id"]] = row
            if len(r["labels"]) < page:
                return list(out.values())
            since_id = r["next_since_id"]

    def quality(self) -> dict:
        return self._call("GET", "/api/quality")
