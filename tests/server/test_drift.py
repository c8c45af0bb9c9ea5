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
    assert page(ann)[0] == anchors[0] and 'action="/label"' in ann.get("/label").text
    assert post(ann, "/label", "1").status_code == 303  # right (gold 1)
    assert page(ann)[0] == anchors[1]
    assert post(ann, "/label", "0").status_code == 303
    before = counts(path)
    r = post(ann, "/label", "0", item=anchors[0])
    assert r.status_code == 409 and f"You already answered item {anchors[0]}; that answer stands." in r.text
    assert counts(path) == before
    for _ in range(2):  # two labels: the next interval, and the anchors are due again
        assert page(ann)[0] not in anchors
        assert post(ann, "/label", "0").status_code == 303
    assert page(ann)[0] == anchors[0]
    post(ann, "/label", "0")  # changed its mind, and wrong
    post(ann, "/label", "0")  # the same as before
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
    # the anchor page shows the confidence buttons, but its answer did not read the field: any value passed
    path, anchors, tokens = db
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    item, csrf = page(ann)
    assert item == anchors[0]
    before = counts(path)
    r = ann.post("/label", data={"item_id": str(item), "csrf": csrf, "choice": "1", "confidence": confidence})
    assert r.status_code == 422
    assert f"confidence={confidence!r} must be 1 (a guess), 2 or 3 (sure), or left out." in html.unescape(r.text)
    assert counts(path) == before and page(ann)[0] == item
    r = ann.post("/label", data={"item_id": str(item), "csrf": csrf, "choice": "1", "confidence": "3"})
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


def status(html: str) -> tuple[int, str | None, str | None]:
    """("N left" count, flash, the item the undo link names) of a labeling page."""
    left = re.search(r'<b id="remaining-count">(\d+)</b>', html)
    flash = re.search(r'<span class="flash" role="status">(.*?)</span>', html)
    undo = re.search(r"Change my last answer \(item (\d+)\)", html)
    return int(left.group(1)), flash and flash.group(1), undo and undo.group(1)


def test_an_anchor_cannot_be_told_from_a_queue_item(db):
    # five tells: the form's action, no undo link, a "N left" count that stood still, its own flash text, and its
    # own refusal of an item that is not an anchor
    path, anchors, tokens = db
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    assert page(ann)[0] == anchors[0]
    r = ann.post("/label", data={"item_id": "3", "csrf": page(ann)[1], "choice": "0"})  # the queue's refusal
    assert r.status_code == 409 and "Item 3 is not the question you were shown (it was not saved)." in r.text
    seen, lefts = [], []
    for step in range(9):
        text = ann.get("/label").text
        item, csrf = page(ann)
        assert 'action="/label"' in text and 'id="skip"' in text and 'id="flag"' in text
        left, flash, undo = status(text)
        lefts.append(left)
        if seen:  # the same flash and undo link after an anchor's answer (or skip) as after a queue item's
            assert flash == f"Saved: item {seen[-1]} {'skipped' if step == 2 else 'picked option 2'}."
            assert undo == str(seen[-1])
        seen.append(item)
        choice = "skip" if step == 1 else "1"
        assert ann.post("/label", data={"item_id": str(item), "csrf": csrf, "choice": choice}).status_code == 303
    assert seen[:5] == [anchors[0], anchors[1], 3, 4, anchors[0]]  # the skipped anchor waits for the next interval
    assert lefts == list(range(lefts[0], lefts[0] - 9, -1))  # one fewer with every answer, anchors included
    for item in (anchors[0], 6):  # answered in this interval, as a queue item: the same refusal
        r = ann.post("/label", data={"item_id": str(item), "csrf": page(ann)[1], "choice": "0"})
        assert r.status_code == 409 and f"You already answered item {item}; that answer stands." in r.text


def test_an_anchor_answer_can_be_changed_as_any_answer_but_drift_keeps_the_first(db):
    path, anchors, tokens = db
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    assert post(ann, "/label", "1").status_code == 303  # anchor 1, right
    assert status(ann.get("/label").text)[2] == str(anchors[0])
    assert ann.post("/undo", data={"csrf": page(ann)[1]}).status_code == 303
    html = ann.get("/label").text
    assert page(ann)[0] == anchors[0] and 'id="redo"' in html
    assert post(ann, "/label", "0").status_code == 303
    assert status(ann.get("/label").text)[1] == f"Changed: item {anchors[0]} picked option 1."
    with LabelStore(path) as store:
        assert store.drift(2) == {"ann": [(0, None, 1.0)]}


def test_an_anchor_skipped_or_flagged_and_undone_is_answered_again_and_that_answer_kept(db):
    path, anchors, tokens = db
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    left = status(ann.get("/label").text)[0]
    assert post(ann, "/label", "skip").status_code == 303
    assert page(ann)[0] == anchors[1] and status(ann.get("/label").text)[0] == left - 1
    assert ann.post("/undo", data={"csrf": page(ann)[1]}).status_code == 303
    html = ann.get("/label").text
    assert page(ann)[0] == anchors[0] and 'id="redo"' in html and status(html)[0] == left - 1
    assert post(ann, "/label", "1").status_code == 303  # the first answer after all: kept
    assert page(ann)[0] == anchors[1] and status(ann.get("/label").text)[0] == left - 1  # as after a changed answer
    assert post(ann, "/label", "flag").status_code == 303
    with LabelStore(path) as store:
        assert store.get_item(anchors[1]).hold == "flagged"  # a flag holds an anchor as any item
        assert store.drift(2) == {"ann": [(0, None, 1.0)]}
    assert ann.post("/undo", data={"csrf": page(ann)[1]}).status_code == 303
    assert page(ann)[0] == anchors[1]
    with LabelStore(path) as store:
        assert store.get_item(anchors[1]).hold is None  # the undone flag no longer holds it


def test_a_labeler_not_admitted_cannot_answer_an_anchor(db):
    path, anchors, tokens = db
    with LabelStore(path) as store:
        store.set_gold(store.add_item("Gold.", [" w", " r"], source="t", label_type="best_of_2"), 1)
        store.set_onboarding(1, 1.0)
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    assert "Practice question 1 of 1" in ann.get("/label").text
    before = counts(path)
    for url in ("/label", "/anchor"):
        r = ann.post(url, data={"item_id": str(anchors[0]), "csrf": page(ann)[1], "choice": "1"})
        assert r.status_code in (404, 405, 409) and counts(path) == before
