"""Ranking questions in the labeling app: the page offers a ranking, the server refuses a repeated, missing or unknown
option (422, one clear line, nothing stored) and stores the order of the samples the labeler saw, best first."""

from __future__ import annotations

import re

import pytest
from web_client import counts, page, shown, sign_in

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for i in range(2):
            store.add_item(f"Rank {i}.", [f" sample {i}.{j}" for j in range(3)], source="t", label_type="ranking_3")
        store.add_item("Pick one.", [" x", " y"], source="t", label_type="best_of_2")
        token = store.add_labeler("ann")
    return path, token


def post(client, item, csrf, **form):
    return client.post("/label", data={"item_id": str(item), "csrf": csrf, **form})


def test_a_ranking_is_checked_then_stored_as_the_samples_order(db):
    path, token = db
    client = sign_in(create_app(path), token)
    html = client.get("/label").text
    assert 'data-kind="ranking"' in html and 'id="ranking-submit"' in html and "rank the options" in html
    item, csrf = page(client)
    before = counts(path)
    for ranking, why in (("2,2,1", "names option 2 twice"), ("2,1", "leaves out option 3"),
                         ("1,2,4", "names option 4; item \\d+ has options 1..3"), ("a,b", "must be the option"),
                         ("", "leaves out option 1")):  # fmt: skip
        r = post(client, item, csrf, choice="rank", ranking=ranking)
        assert r.status_code == 422 and re.search(why, r.text), (ranking, r.text)
    r = post(client, item, csrf, choice="0")
    assert r.status_code == 422 and "asks for a ranking" in r.text
    assert counts(path) == before
    texts = shown(client.get("/label").text)
    r = post(client, item, csrf, choice="rank", ranking="3,1,2")
    assert r.status_code == 303
    assert "ranked options 3, 1, 2" in client.get("/label").text
    with LabelStore(path) as store:
        (ex,) = store.labeled_examples("ranking_3")
        assert [ex.samples[i] for i in ex.ranking] == [texts[2], texts[0], texts[1]]  # the texts in the order pressed
        assert ex.best == ex.ranking[0]


def test_a_best_of_n_item_takes_no_ranking(db):
    path, token = db
    with LabelStore(path) as store:
        store.set_hold(1, "retired")
        store.set_hold(2, "retired")
    client = sign_in(create_app(path), token)
    item, csrf = page(client)
    r = post(client, item, csrf, choice="rank", ranking="1,2")
    assert r.status_code == 422 and "must be 0..1" in r.text
