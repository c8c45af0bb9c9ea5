"""The JSON API under malformed input: every refusal is a 4xx whose JSON body names the bad field in one line, and
leaves the store exactly as it was; nothing invalid is taken silently."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app

SAMPLES = [f" s{j}" for j in range(4)]


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        store.add_item("q", SAMPLES, source="t")
    return path


@pytest.fixture
def api(db):
    with LabelStore(db) as store:
        token = store.add_labeler("alice", admin=True)
    return TestClient(create_app(db), headers={"Authorization": f"Bearer {token}"})


def counts(db) -> dict[str, int]:
    with LabelStore(db) as store:
        return store.table_counts()


def detail(r) -> str:
    assert r.headers["content-type"] == "application/json", r.text
    return r.json()["detail"]


@pytest.mark.parametrize("label_type, n, name", [("best_of_04", 4, "best_of_4"), ("best_of_\u0664", 4, "best_of_4"),
                                                ("ranking_\u0663", 3, "ranking_3")])  # fmt: skip
def test_a_label_type_not_written_plainly_is_refused_not_stored_under_a_second_name(api, db, label_type, n, name):
    # best_of_04 or best_of_<ARABIC-INDIC FOUR> read as four options, but train-reward --labels.type best_of_4 and
    # the exports never see an item stored under that name
    before = counts(db)
    r = api.post("/api/items", json={"items": [{"query": "q2", "samples": SAMPLES[:n], "label_type": label_type}]})
    assert r.status_code == 422 and detail(r) == f"items[0]: label type {label_type!r} must be written {name!r}"
    assert counts(db) == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({"items": [{"query": "q2", "samples": SAMPLES, "golden": 1}]}, "body.items.0.golden"),  # a typo of gold
        ({"items": [{"query": "q2", "samples": SAMPLES, "wantlabels": 3}]}, "body.items.0.wantlabels"),
        ({"items": [{"query": "q2", "samples": SAMPLES}], "gold": 1}, "body.gold"),
    ],
)
def test_an_unknown_field_is_refused_not_dropped(api, db, body, field):
    # dropped, a misspelt gold would queue an ordinary question with a 200, and nobody would know
    before = counts(db)
    r = api.post("/api/items", json=body)
    assert r.status_code == 422 and detail(r) == f"invalid request: {field}: Extra inputs are not permitted"
    assert counts(db) == before


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("gold", True, "Input should be a valid integer"),  # true would be gold answer 1
        ("gold", 1.0, "Input should be a valid integer"),
        ("priority", "3", "Input should be a valid integer"),
        ("want_labels", 2.0, "Input should be a valid integer"),
        ("want_labels", False, "Input should be a valid integer"),
    ],
)
def test_a_number_of_the_wrong_type_is_refused_not_converted(api, db, field, value, message):
    before = counts(db)
    r = api.post("/api/items", json={"items": [{"query": "q2", "samples": SAMPLES, field: value}]})
    assert r.status_code == 422 and detail(r) == f"invalid request: body.items.0.{field}: {message}"
    assert counts(db) == before


def test_a_gold_note_without_gold_is_refused_not_dropped(api, db):
    before = counts(db)
    r = api.post("/api/items", json={"items": [{"query": "q2", "samples": SAMPLES, "gold_note": "2 is kinder"}]})
    assert r.status_code == 422
    assert detail(r) == ("items[0].gold_note: a note explains a gold answer; send gold (the right sample's index) "
                         "with it.")  # fmt: skip
    assert counts(db) == before


@pytest.mark.parametrize(
    "item, message",
    [
        ({"samples": SAMPLES, "gold": 4}, "items[1].gold=4 must be the right sample's index, 0..3."),
        ({"samples": SAMPLES[:3], "label_type": "ranking_3", "gold": 3},
         "items[1].gold=3 must be the right sample's index, 0..2."),  # fmt: skip
        ({"samples": SAMPLES[:1], "label_type": "scalar_rating", "gold": 0},
         "items[1].gold: a scalar_rating question cannot be gold; only best_of_N and ranking_K questions can."),
    ],
)
def test_a_bad_gold_answer_is_named_by_its_field_not_by_an_item_that_was_rolled_back(api, db, item, message):
    # the store's own message named "gold item 3", an id the refused call never made
    before = counts(db)
    r = api.post("/api/items", json={"items": [{"query": "q2", "samples": SAMPLES}, {"query": "q3", **item}]})
    assert r.status_code == 422 and detail(r) == message
    assert counts(db) == before


GOOD = b'{"items": [{"query": "q2", "samples": [" a", " b", " c", " d"]}]}'


@pytest.mark.parametrize(
    "body, message",
    [
        (b'{"items": [{"query": "q\xff", "samples": []}]}', "invalid request: body: not UTF-8 (byte 23); send JSON "
         "in UTF-8."),  # fmt: skip
        (b'{"items": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid request: body: JSON nested too deeply to "
         "read."),  # fmt: skip
    ],
)
def test_a_body_that_is_not_utf8_json_is_a_422_naming_the_body_not_a_400(api, db, body, message):
    # FastAPI answered 400 "There was an error parsing the body": undocumented, and it said nothing of what was wrong
    before = counts(db)
    r = api.post("/api/items", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and detail(r) == message
    assert counts(db) == before


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_sent_as_another_content_type_is_415_naming_the_header(api, db, content_type):
    # the JSON was read as bytes and refused as "body: Input should be a valid dictionary", a puzzle for a valid body
    before = counts(db)
    r = api.post("/api/items", content=GOOD, headers={"content-type": content_type} if content_type else {})
    assert r.status_code == 415
    assert detail(r) == (f"invalid request: Content-Type: {content_type or 'none'!r} is not application/json; send "
                         "the body as JSON.")  # fmt: skip
    assert counts(db) == before
    assert TestClient(api.app).post("/api/items", content=GOOD).status_code == 401  # the token is checked first
    ok = api.post("/api/items", content=GOOD, headers={"content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200 and counts(db)["items"] == before["items"] + 1


@pytest.mark.parametrize(
    "url, message",
    [
        ("/api/labels?sinceid=5", "unknown parameter 'sinceid'; GET /api/labels takes since_id, limit, label_type."),
        ("/api/me?verbose=1", "unknown parameter 'verbose'; GET /api/me takes no parameters."),
        ("/api/items/1?fields=query", "unknown parameter 'fields'; GET /api/items/{item_id} takes no parameters."),
        ("/api/labels?since_id=5&since_id=0", "'since_id' was sent 2 times; send it once."),
    ],
)
def test_an_unknown_or_repeated_query_parameter_is_refused_not_ignored(api, url, message):
    # ignored, a misspelt since_id read every label from the start again, and of two since_id the last one won
    r = api.get(url)
    assert r.status_code == 422 and detail(r) == f"invalid request: query: {message}"
    assert TestClient(api.app).get(url).status_code == 401  # the token is checked first, as for other errors


@pytest.mark.parametrize(
    "url, field",
    [
        ("/api/items/1_0", "path.item_id"),  # was item 10
        ("/api/items/01", "path.item_id"),
        ("/api/items/+1", "path.item_id"),
        ("/api/items/1.0", "path.item_id"),
        ("/api/items/%201", "path.item_id"),
        ("/api/labels?since_id=1_000", "query.since_id"),
        ("/api/labels?limit=10.0", "query.limit"),
    ],
)
def test_a_number_not_written_plainly_is_refused_like_the_forms_item_id(api, url, field):
    r = api.get(url)
    assert r.status_code == 422
    assert detail(r) == f"invalid request: {field}: Input should be a whole number written plainly, like 12"
    assert api.get("/api/items/1").status_code == 200 and api.get("/api/labels?since_id=0&limit=10").status_code == 200
