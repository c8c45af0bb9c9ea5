"""The labeling app's queue in acquisition order: pending items are served by the scores `lmprefs rank-queue` stores
(largest first, unscored items after, oldest first), gold questions and drift anchors are left to their own
schedules, the order survives a restart of the app, labelers never see a score and the admin's item browser shows
it."""

from __future__ import annotations

import re
from html import unescape

import pytest
from web_client import page, sign_in

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


@pytest.fixture
def db(tmp_path):
    """Items 1-7 (best_of_3): 2 gold, 5 a drift anchor, 7 added after the queue was scored."""
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        ids = [store.add_item(f"Query {k}.", [f" a{k}", f" b{k}", f" c{k}"], source="t", label_type="best_of_3")
               for k in range(1, 7)]  # fmt: skip
        store.set_gold(ids[1], 0)
        store.set_anchor(ids[4])
        assert [q.item_id for q in store.rankable_items("best_of_3")] == [ids[0], ids[2], ids[3], ids[5]]
        scored = store.set_acquisition({ids[0]: 0.1, ids[2]: 0.9, ids[3]: 0.5, ids[5]: 0.3}, by="bald of test/rm")
        assert scored == 4
        ids.append(store.add_item("Query 7.", [" a7", " b7", " c7"], source="t", label_type="best_of_3"))
        tokens = {"root": store.add_labeler("root", admin=True), "ann": store.add_labeler("ann")}
    return path, ids, tokens


def answer(client) -> int:
    item, csrf = page(client)
    r = client.post("/label", data={"item_id": str(item), "choice": "1", "csrf": csrf})
    assert r.status_code == 303, r.text
    return item


def test_pending_items_are_served_by_score_and_the_order_survives_a_restart(db):
    path, ids, tokens = db
    ann = sign_in(create_app(path), tokens["ann"])
    assert [answer(ann) for _ in range(2)] == [ids[2], ids[3]]
    ann = sign_in(create_app(path), tokens["ann"])  # a restarted server: leases gone, the order kept
    assert [answer(ann) for _ in range(3)] == [ids[5], ids[0], ids[6]]
    assert page(ann)[0] is None  # gold only rides along with real work; the anchor waits for its interval


def test_gold_is_still_mixed_in_and_unscored_stores_keep_their_order(tmp_path, db):
    path, ids, tokens = db
    ann = sign_in(create_app(path, gold_rate=1.0, seed=0), tokens["ann"])
    assert answer(ann) == ids[1]  # the gold question, whatever the scores
    assert answer(ann) == ids[2]
    plain = tmp_path / "plain.sqlite"
    with LabelStore(plain) as store:
        made = [store.add_item(f"Q{k}.", [" a", " b"], source="t", label_type="best_of_2") for k in range(3)]
        tok = store.add_labeler("bo")
        assert store.acquisition_by() is None
    bo = sign_in(create_app(plain), tok)
    assert [answer(bo) for _ in range(3)] == made  # oldest first, as before scores existed


def test_labelers_never_see_the_score_and_admins_do(db):
    path, ids, tokens = db
    ann = sign_in(create_app(path), tokens["ann"])
    html = ann.get("/label").text
    assert "Query 3." in unescape(html)
    assert not re.search(r"0\.9|acquisition|queue score|bald", html, re.I)
    assert ann.get("/admin/items").status_code == 403
    root = sign_in(create_app(path), tokens["root"])
    html = unescape(root.get("/admin/items").text)
    assert "queue score 0.9000" in html and "queue score 0.1000" in html and "bald of test/rm" in html
    api = root.get(f"/api/items/{ids[2]}", headers={"authorization": f"Bearer {tokens['root']}"})
    assert api.json()["acquisition"] == 0.9


def test_scores_are_checked_and_written_at_once(db):
    path, ids, _ = db
    with LabelStore(path) as store:
        with pytest.raises(ValueError, match="item 1 has nan"):
            store.set_acquisition({ids[0]: 0.2, 1: float("nan")}, by="x")
        assert store.get_item(ids[0]).acquisition == 0.1  # nothing written
        assert store.acquisition_by() == "bald of test/rm"
