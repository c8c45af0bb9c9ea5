"""The admin's item browser: search by text and state, every option shown with the gold answer and its note, and the
actions (mark gold with a note, serve a flagged item again, retire it) returning to the same search."""

from __future__ import annotations

import re
from html import unescape

import pytest
from web_client import counts, csrf_of, sign_in

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        ids = [store.add_item(f"About {w}.", [f" {w} one", f" {w} two", " 100% sure"], source="t",
                              label_type="best_of_3") for w in ("apples", "pears", "plums", "figs")]  # fmt: skip
        store.add_label(ids[1], "ann", kind="flag", note="broken")
        store.set_gold(ids[2], 0, note="the first is plain")
        store.set_hold(ids[3], "retired")
        tokens = {"root": store.add_labeler("root", admin=True), "ann": store.add_labeler("ann")}
    return path, ids, tokens


def shown_items(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'class="card item" data-item="(\d+)"', html)]


def test_search_by_text_and_state_shows_every_option(db):
    path, ids, tokens = db
    app = create_app(path)
    root = sign_in(app, tokens["root"])
    assert shown_items(root.get("/admin/items").text) == ids[::-1]
    html = root.get("/admin/items", params={"q": "PEAR"}).text
    assert shown_items(html) == [ids[1]] and "flagged" in html
    assert shown_items(root.get("/admin/items", params={"q": "100%"}).text) == ids[::-1]  # % is a character
    assert shown_items(root.get("/admin/items", params={"q": "10_%"}).text) == []
    for state, expect in (("pending", [ids[2], ids[0]]), ("flagged", [ids[1]]), ("gold", [ids[2]]),
                          ("retired", [ids[3]]), ("done", [])):  # fmt: skip
        assert shown_items(root.get("/admin/items", params={"state": state}).text) == expect, state
    html = unescape(root.get("/admin/items", params={"state": "gold"}).text)
    assert all(t in html for t in (" plums one", " plums two", "gold: option 1", "the first is plain"))
    r = root.get("/admin/items", params={"state": "lost"})
    assert r.status_code == 422 and "must be one of pending, done, flagged, gold, retired" in r.text
    assert sign_in(app, tokens["ann"]).get("/admin/items").status_code == 403


def test_actions_from_the_browser_return_to_the_search(db):
    path, ids, tokens = db
    root = sign_in(create_app(path), tokens["root"])
    csrf = csrf_of(root.get("/admin/items").text)
    back = "/admin/items?state=flagged"

    def act(item, **form):
        return root.post("/admin/item", data={"csrf": csrf, "item_id": str(item), "back": back, **form})

    r = act(ids[0], action="gold", best="2", note="two says it best")
    assert r.status_code == 303 and r.headers["location"] == back
    assert act(ids[1], action="restore").status_code == 303
    assert act(ids[3], action="restore").status_code == 303
    before = counts(path)
    assert act(ids[0], action="gold", best="4").status_code == 422 and counts(path) == before
    r = root.post("/admin/item", data={"csrf": csrf, "item_id": str(ids[2]), "action": "retire",
                                       "back": "//evil.example/admin/items"})  # fmt: skip
    assert r.headers["location"] == "/admin"  # only the browser's own pages
    with LabelStore(path) as store:
        first = store.get_item(ids[0])
        assert (first.gold, first.gold_note) == (1, "two says it best")
        assert [store.get_item(i).hold for i in ids[1:]] == [None, "retired", None]
