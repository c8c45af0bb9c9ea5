"""Drift anchors: each labeler answers every anchor once per interval of their labels, before their queue; a second
answer in one interval is a 409 that stores nothing; the admin page charts self-consistency and gold accuracy."""

from __future__ import annotations

import html
import re

import pytest
from web_client import counts, page, sign_in

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        anchors = [store.add_item(f"Anchor {i}.", [f" a{i}", f" b{i}"], source="t", label_type="best_of_2")
                   for i in range(2)]  # fmt: skip
        for item in anchors:
            store.set_anchor(item)
        store.set_gold(anchors[0], 1)
        for i in range(4):
            store.add_item(f"Real {i}.", [f" x{i}", f" y{i}"], source="t", label_type="best_of_2")
        store.add_item("Rate.", [" one"], source="t", label_type="scalar_rating")
        store.set_anchor_every(2)
        tokens = {"ann": store.add_labeler("ann"), "root": store.add_labeler("root", admin=True)}
    return path, anchors, tokens


def post(client, url, choice, item=None):
    shown, csrf = page(client)
    return client.post(url, data={"item_id": str(item or shown), "csrf": csrf, "choice": choice})


def test_anchors_come_round_once_per_interval_and_drift_is_charted(db):
    path, anchors, tokens = db
    app = create_app(path, shuffle=False)
    ann = sign_in(app, tokens["ann"])
    assert page(ann)[0] == anchors[0] and 'action="/anchor"' in ann.get("/label").text
    assert post(ann, "/label", "1").status_code == 409  # not through the queue
    assert post(ann, "/anchor", "1").status_code == 303  # right (gold 1)
    assert page(ann)[0] == anchors[1]
    assert post(ann, "/anchor", "0").status_code == 303
    before = counts(path)
    r = post(ann, "/anchor", "0", item=anchors[0])
    assert r.status_code == 409 and "already answered" in r.text and "this interval" in r.text
    assert counts(path) == before
    for _ in range(2):  # two labels: the next interval, and the anchors are due again
        assert page(ann)[0] not in anchors
        assert post(ann, "/label", "0").status_code == 303
    assert page(ann)[0] == anchors[0]
    post(ann, "/anchor", "0")  # changed its mind, and wrong
    post(ann, "/anchor", "0")  # the same as before
    with LabelStore(path) as store:
        assert store.drift(2) == {"ann": [(0, None, 1.0), (1, 0.5, 0.0)]}
        assert {e.item_id for e in store.labeled_examples("best_of_2")}.isdisjoint(anchors)
    root = sign_in(app, tokens["root"])
    admin = root.get("/admin").text
    chart = re.search(r'<figure class="drift-chart" data-labeler="ann">(.*?)</figure>', admin, re.S).group(1)
    assert 'class="consistency" points="' in chart and "50% consistent, 0% gold (latest of 2)" in chart
    csrf = re.search(r'name="csrf" value="([^"]+)"', admin).group(1)
    r = root.post("/admin/item", data={"csrf": csrf, "item_id": "7", "action": "anchor"})
    assert r.status_code == 422 and "drift anchors are best-of-N or rankings" in r.text
    r = root.post("/admin/drift", data={"csrf": csrf, "every": "-3"})
    assert r.status_code == 422 and "must be a whole number of labels" in r.text
    assert root.post("/admin/drift", data={"csrf": csrf, "every": "0"}).status_code == 303
    assert page(ann)[0] not in anchors  # off: anchors are no longer served


@pytest.mark.parametrize("every", ["1_0", "\u0663", "1e1", "2.0"])
def test_a_drift_interval_not_written_plainly_is_refused_naming_the_field(db, every):
    path, _, tokens = db
    root = sign_in(create_app(path), tokens["root"])
    csrf = re.search(r'name="csrf" value="([^"]+)"', root.get("/admin").text).group(1)
    r = root.post("/admin/drift", data={"csrf": csrf, "every": every})
    assert r.status_code == 422
    assert f"every={every!r} must be a whole number of labels 0..100000 (0: off)." in html.unescape(r.text)
    with LabelStore(path) as store:
        assert store.anchor_every() == 2  # int() read 1_0 as 10 and an Arabic-Indic three as 3, and stored them


@pytest.mark.parametrize("confidence", ["9", "0", "sure"])
def test_an_anchor_answer_with_a_bad_confidence_is_422_as_on_the_labeling_page(db, confidence):
    # the anchor page shows the confidence buttons, but /anchor did not read the field: any value passed, with a 303
    path, anchors, tokens = db
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    item, csrf = page(ann)
    assert item == anchors[0]
    before = counts(path)
    r = ann.post("/anchor", data={"item_id": str(item), "csrf": csrf, "choice": "1", "confidence": confidence})
    assert r.status_code == 422
    assert f"confidence={confidence!r} must be 1 (a guess), 2 or 3 (sure), or left out." in html.unescape(r.text)
    assert counts(path) == before and page(ann)[0] == item
    r = ann.post("/anchor", data={"item_id": str(item), "csrf": csrf, "choice": "1", "confidence": "3"})
    assert r.status_code == 303 and counts(path)["anchor_answers"] == before["anchor_answers"] + 1


def test_drift_gold_accuracy_counts_a_gold_answers_first_answer_as_gold_accuracy_does(tmp_path):
    # the drift chart counted the answer an undo made, where gold accuracy counts the first one
    with LabelStore(tmp_path / "labels.sqlite") as store:
        anchor = store.add_item("Anchor.", [" a", " b"], source="t", label_type="best_of_2")
        store.set_anchor(anchor)
        gold = store.add_item("Gold.", [" wrong", " right"], source="t", label_type="best_of_2")
        store.set_gold(gold, 1)
        skipped = store.add_item("Gold 2.", [" wrong", " right"], source="t", label_type="best_of_2")
        store.set_gold(skipped, 1)
        store.add_labeler("ann")
        store.add_anchor_answer(anchor, store.labelers()[0].id, 0, best=0)
        store.add_label(gold, "ann", best=0, source="web")
        store.add_label(gold, "ann", best=1, source="web", replace=True)  # undone, and now right
        store.add_label(skipped, "ann", best=1, source="web")
        store.add_label(skipped, "ann", kind="skip", source="web", replace=True)  # right, then skipped
        assert store.gold_accuracy() == {"ann": (1, 2)}
        assert store.drift(10) == {"ann": [(0, None, 0.5)]}
