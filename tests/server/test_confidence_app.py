"""Confidence in the labeling app: the page offers 1-3, an answer carries it into the store and the JSON API, and a
value out of the scale is a 422 that stores nothing."""

from __future__ import annotations

from web_client import counts, page, sign_in

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


def test_an_answer_carries_its_confidence_and_a_bad_one_is_refused(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for i in range(2):
            store.add_item(f"Q{i}.", [f" s{i}.{j}" for j in range(4)], source="t")
        token, admin = store.add_labeler("ann"), store.add_labeler("root", admin=True)
    app = create_app(path)
    client = sign_in(app, token)
    assert 'name="confidence" value="3"' in client.get("/label").text
    item, csrf = page(client)
    before = counts(path)
    for bad in ("4", "0", "high", "1.0"):
        r = client.post("/label", data={"item_id": str(item), "csrf": csrf, "choice": "0", "confidence": bad})
        assert r.status_code == 422 and "must be 1 (a guess), 2 or 3 (sure)" in r.text, bad
    assert counts(path) == before
    r = client.post("/label", data={"item_id": str(item), "csrf": csrf, "choice": "0", "confidence": "3"})
    assert r.status_code == 303 and "(confidence 3)" in client.get("/label").text
    item2, csrf = page(client)
    assert client.post("/label", data={"item_id": str(item2), "csrf": csrf, "choice": "1"}).status_code == 303
    labels = sign_in(app, admin).get("/api/labels", headers={"Authorization": f"Bearer {admin}"}).json()["labels"]
    assert [(x["item_id"], x["confidence"]) for x in labels] == [(item, 3), (item2, None)]
