"""Onboarding: a new labeler answers the practice (gold) questions first, sees the right answer and the researcher's
note after each, and is admitted at the admin's accuracy (or by an admin); practice answers never train, and one
posted by an admitted labeler is a 409 that stores nothing."""

from __future__ import annotations

import html
import re

import pytest
from web_client import counts, page, sign_in

from lmprefs.cli.dispatch import main
from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for i in range(3):  # the practice set: right answer 1, with a note
            item = store.add_item(f"Gold {i}.", [f" wrong {i}", f" right {i}"], source="t", label_type="best_of_2")
            store.set_gold(item, 1, note=f"because {i}")
        for i in range(3):
            store.add_item(f"Real {i}.", [f" a{i}", f" b{i}"], source="t", label_type="best_of_2")
        store.set_onboarding(3, 0.6)
        tokens = {n: store.add_labeler(n, admin=n == "root") for n in ("ann", "bob", "root")}
    return path, tokens


def answer(client, url: str, choice: str):
    item, csrf = page(client)
    return client.post(url, data={"item_id": str(item), "csrf": csrf, "choice": choice}), item


def test_practice_with_feedback_then_admission(db):
    path, tokens = db
    app = create_app(path, shuffle=False)
    ann = sign_in(app, tokens["ann"])
    html = ann.get("/label").text
    assert "Practice question 1 of 3" in html and 'action="/onboarding"' in html
    before = counts(path)
    r, _ = answer(ann, "/label", "1")  # the real form: no lease on a practice question
    assert r.status_code == 409 and counts(path) == before
    assert answer(ann, "/onboarding", "skip")[0].status_code == 422 and counts(path) == before
    r, _ = answer(ann, "/onboarding", "1")
    assert r.status_code == 303
    html = ann.get("/label").text
    assert "Right!" in html and "because 0" in html and "Practice question 2 of 3" in html
    answer(ann, "/onboarding", "0")
    html = ann.get("/label").text
    assert "Not quite." in html and "option 2: <span class=\"quote\"> right 1</span>" in html
    answer(ann, "/onboarding", "1")  # 2 of 3 right: over 0.6
    html = ann.get("/label").text
    assert "Welcome aboard: 2 of 3" in html and "Real 0." in html and 'action="/label"' in html
    before = counts(path)
    r = ann.post("/onboarding", data={"item_id": "1", "csrf": page(ann)[1], "choice": "1"})
    assert r.status_code == 409 and "practice answers are not taken" in r.text and counts(path) == before
    assert answer(ann, "/label", "0")[0].status_code == 303
    with LabelStore(path) as store:
        assert [e.item_id for e in store.labeled_examples("best_of_2")] == [4]  # practice answers never train
        assert store.gold_accuracy() == {} and store.answers_since(0)[0].item_id == 4


def test_a_labeler_under_the_bar_waits_for_an_admin(db):
    path, tokens = db
    app = create_app(path, shuffle=False)
    bob = sign_in(app, tokens["bob"])
    for _ in range(3):
        answer(bob, "/onboarding", "0")
    html = bob.get("/label").text
    assert "Practice finished" in html and "0 of 3" in html and 'name="item_id"' not in html
    root = sign_in(app, tokens["root"])
    admin = root.get("/admin").text
    assert re.search(r'data-onboarding="bob"><td>bob</td><td class="num">0 of 3</td>\s*<td>practising', admin)
    csrf = re.search(r'name="csrf" value="([^"]+)"', admin).group(1)
    assert root.post("/admin/labeler", data={"csrf": csrf, "name": "bob", "action": "admit"}).status_code == 303
    assert "Real 0." in bob.get("/label").text
    for items, accuracy, bad in (("-1", "0.5", "items"), ("3", "1.5", "accuracy"), ("x", "0.5", "items")):
        r = root.post("/admin/onboarding", data={"csrf": csrf, "items": items, "accuracy": accuracy})
        assert r.status_code == 422 and f"{bad}=&#39;" in r.text and "must be a" in r.text
    assert root.post("/admin/onboarding", data={"csrf": csrf, "items": "0", "accuracy": "0.9"}).status_code == 303
    with LabelStore(path) as store:
        assert store.onboarding_settings() == (0, 0.9)


def test_serve_refuses_bad_onboarding_settings_in_one_line(db, capsys):
    path, _ = db
    for flags, why in ((["--onboarding", "-1"], "--onboarding -1: must be 0..1000"),
                       (["--admit-accuracy", "2"], "--admit-accuracy 2.0: must be in [0, 1]")):  # fmt: skip
        assert main(["serve", "--db", str(path), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and len(err.splitlines()) == 1


def test_serve_that_cannot_listen_leaves_the_stores_settings_as_they_were(db, capsys):
    import socket

    path, _ = db
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert main(["serve", "--db", str(path), "--port", port, "--onboarding", "7", "--admit-accuracy", "0.9",
                     "--anchor-every", "5"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"lmprefs serve: error: cannot listen on 127.0.0.1:{port}") and len(err.splitlines()) == 1
    with LabelStore(path) as store:
        assert store.onboarding_settings() == (3, 0.6) and store.anchor_every() == 0


@pytest.mark.parametrize(
    "items, accuracy, message",
    [
        ("1_0", "0.8", "items='1_0' must be a whole number 0..1000 (0: off)."),  # int() read it as 10
        ("\u0663", "0.8", "items='\u0663' must be a whole number 0..1000 (0: off)."),  # an Arabic-Indic three
        ("3", "\u0660.\u0665", "accuracy='\u0660.\u0665' must be a number from 0 to 1 (like 0.8)."),  # float(): 0.5
        ("3", "1.5", "accuracy='1.5' must be a number from 0 to 1 (like 0.8)."),  # named alone, not beside items
    ],
)
def test_onboarding_settings_not_written_plainly_are_refused_naming_the_field(db, items, accuracy, message):
    path, tokens = db
    root = sign_in(create_app(path), tokens["root"])
    csrf = re.search(r'name="csrf" value="([^"]+)"', root.get("/admin").text).group(1)
    r = root.post("/admin/onboarding", data={"csrf": csrf, "items": items, "accuracy": accuracy})
    assert r.status_code == 422 and message in html.unescape(r.text)
    with LabelStore(path) as store:
        assert store.onboarding_settings() == (3, 0.6)
    r = root.post("/admin/onboarding", data={"csrf": csrf, "items": " 4 ", "accuracy": "8e-1"})  # as typed: fine
    assert r.status_code == 303
    with LabelStore(path) as store:
        assert store.onboarding_settings() == (4, 0.8)


def test_onboarding_switched_on_mid_project_keeps_labelers_at_work_and_never_offers_an_answered_item(db):
    # switched on mid-project, onboarding sent everyone back to practice; one who had answered a practice question
    # for real got 409 on it, for good
    path, tokens = db
    with LabelStore(path) as store:
        store.set_onboarding(0, 0.6)
        store.add_label(1, "ann", best=0, source="web")  # ann labels for real, a gold question among her answers
    app = create_app(path, shuffle=False)
    ann, bob = sign_in(app, tokens["ann"]), sign_in(app, tokens["bob"])
    with LabelStore(path) as store:
        store.set_onboarding(3, 0.6)
    assert 'action="/label"' in ann.get("/label").text  # at work already: admitted when onboarding came on
    assert "Practice question 1 of 3" in bob.get("/label").text  # new to the project: practises
    root = sign_in(app, tokens["root"])
    csrf = re.search(r'name="csrf" value="([^"]+)"', root.get("/admin").text).group(1)
    assert root.post("/admin/labeler", data={"csrf": csrf, "name": "ann", "action": "hold"}).status_code == 303
    with LabelStore(path) as store:
        store.set_gold(store.add_item("Gold 3.", [" w", " r"], source="t", label_type="best_of_2"), 1)
    ann_id = next(b.id for b in LabelStore(path).labelers() if b.name == "ann")
    with LabelStore(path) as store:
        assert 1 not in [i for i, _ in store.practice_items(3, ann_id)]  # the one she answered for real is skipped
    for k in range(3):
        html = ann.get("/label").text
        assert f"Practice question {k + 1} of 3" in html
        r, item = answer(ann, "/onboarding", "1")
        assert r.status_code == 303 and item != 1, r.text
    assert "Real work is paused" in ann.get("/label").text  # held back: her score does not admit her


def test_a_labeler_held_back_stays_held_until_an_admin_admits_them(db):
    path, tokens = db
    app = create_app(path, shuffle=False)
    ann, root = sign_in(app, tokens["ann"]), sign_in(app, tokens["root"])
    for _ in range(3):
        answer(ann, "/onboarding", "1")
    assert "Welcome aboard" in ann.get("/label").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', root.get("/admin").text).group(1)
    assert root.post("/admin/labeler", data={"csrf": csrf, "name": "ann", "action": "hold"}).status_code == 303
    for _ in range(2):  # it held for one page load: her practice score admitted her again ("Welcome aboard")
        html = ann.get("/label").text
        assert "Real work is paused" in html and "Welcome aboard" not in html and 'name="item_id"' not in html
    before = counts(path)
    assert ann.post("/label", data={"item_id": "4", "csrf": page(ann)[1], "choice": "0"}).status_code == 409
    assert counts(path) == before
    assert re.search(r'data-onboarding="ann"><td>ann</td><td class="num">3 of 3</td>\s*<td>held back',
                     root.get("/admin").text)  # fmt: skip
    with LabelStore(path) as store:
        store.set_onboarding(0, 0.6)  # held whether onboarding is on or not
    assert "Real work is paused" in ann.get("/label").text
    assert root.post("/admin/labeler", data={"csrf": csrf, "name": "ann", "action": "admit"}).status_code == 303
    assert "Real 0." in ann.get("/label").text


def test_practice_answers_are_not_counted_as_labels_anywhere(db, capsys):
    # they were: in the admin page's table and tiles, `labelers list` and the labeler's own counter
    path, tokens = db
    app = create_app(path, shuffle=False)
    ann = sign_in(app, tokens["ann"])
    for _ in range(3):
        answer(ann, "/onboarding", "1")
    html = ann.get("/label").text
    assert "Welcome aboard" in html and '<b id="done-count">0</b> labeled' in html
    assert answer(ann, "/label", "0")[0].status_code == 303
    assert '<b id="done-count">1</b> labeled' in ann.get("/label").text
    admin = sign_in(app, tokens["root"]).get("/admin").text
    assert '<div class="big" id="labels-total">1</div>' in admin
    assert main(["labelers", "list", "--db", str(path)]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ann "))
    assert row.split()[-3:] == ["1", "0", "0"]


def test_a_practice_page_offers_no_skip_and_never_prints_a_gold_questions_id(db):
    # `s` on a practice page sent a skip, answered with a bare 422 page; the feedback printed "practice item N"
    path, tokens = db
    ann = sign_in(create_app(path, shuffle=False), tokens["ann"])
    for _ in range(3):
        text = ann.get("/label").text
        visible = re.sub(r"<[^>]*>", " ", text)  # the page's text, not its form's hidden fields
        assert 'id="skip"' not in text and 'id="flag"' not in text and "cannot be skipped or flagged" in visible
        assert not re.search(r"item\s+\d", visible), visible
        answer(ann, "/onboarding", "1")
