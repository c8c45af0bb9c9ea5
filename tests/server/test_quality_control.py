"""Quality control in the labeling app: gold questions, overlap, shuffled options, time on task, undo, the admin page,
and the JSON API with its client. Simulated labelers of known quality answer through the HTTP app: a noisy one must
score lower gold accuracy and agreement than a clean one, and one that always presses 1 must show position bias."""

from __future__ import annotations

import json
import re
import time
from html import unescape

import pytest
from fastapi.testclient import TestClient

from lmprefs.labels.labelers import ScoreLabeler
from lmprefs.labels.quality import quality
from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app
from lmprefs.server.client import ApiError, Client
from lmprefs.server.live import running
from lmprefs.server.queue import display_order


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def item_of(html: str) -> int | None:
    m = re.search(r'name="item_id" value="(\d+)"', html)
    return int(m.group(1)) if m else None


def shown(html: str) -> list[str]:
    return [unescape(t) for t in re.findall(r'<span class="text">(.*?)</span>', html, re.S)]


def sign_in(app, token: str) -> TestClient:
    client = TestClient(app, follow_redirects=False)
    r = client.post("/login", data={"token": token, "csrf": csrf_of(client.get("/login").text)})
    assert r.status_code == 303
    return client


def score(texts: list[str]) -> list[float]:
    """The simulated labelers' taste: the number after 'quality' in a sample."""
    return [float(re.search(r"quality (\d+)", t).group(1)) for t in texts]


def questions(n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        qualities = rng.sample(range(100), 4)  # distinct: one right answer
        out.append((f"Query {i}.", [f" answer {i}.{j} quality {q}" for j, q in enumerate(qualities)]))
    return out


def test_display_order_is_a_stable_per_labeler_permutation():
    orders = {name: display_order("store", name, 7, 4) for name in ("a", "b", "c", "d", "e")}
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders.values())
    assert len({tuple(o) for o in orders.values()}) > 1  # labelers see different orders
    assert display_order("store", "a", 7, 4) == orders["a"]  # and the same one on reload
    assert display_order("other store", "a", 7, 4) != orders["a"] or display_order("other store", "a", 8, 4)


# -- simulated labelers of known quality through the app -------------------------------------------------------


def test_gold_overlap_and_shuffling_tell_good_labelers_from_bad(tmp_path):
    path = tmp_path / "labels.sqlite"
    qs = questions(60)
    with LabelStore(path) as store:
        with store.transaction():
            ids = [store.add_item(q, s, source="t") for q, s in qs]
            for item_id, (_, samples) in zip(ids[:16], qs[:16], strict=True):  # 16 gold questions
                store.set_gold(item_id, max(range(4), key=lambda k: score(samples)[k]))
        labelers = {
            "clean1": ScoreLabeler(score, seed=1),
            "clean2": ScoreLabeler(score, seed=2),
            "noisy": ScoreLabeler(score, random_rate=0.8, seed=3),
            "press1": None,  # always the first option shown
        }
        tokens = {name: store.add_labeler(name, admin=name == "clean1") for name in labelers}
        with store.transaction():  # a fixed store id fixes the display orders, so the whole run is deterministic
            store.connection().execute("UPDATE meta SET value = 'test' WHERE key = 'store_id'")
    app = create_app(path, gold_rate=0.4, overlap_fraction=0.5, overlap_k=4, seed=0)
    clients = {name: sign_in(app, tokens[name]) for name in labelers}
    served = {name: [] for name in labelers}
    for _ in range(100):  # round robin, so shared items are seen by several labelers while they are still open
        for name, labeler in labelers.items():
            html = clients[name].get("/label").text
            item = item_of(html)
            if item is None:
                continue
            assert "gold" not in html.lower()  # unannounced
            options = shown(html)
            choice = 0 if labeler is None else labeler.pick(options)
            r = clients[name].post("/label", data={"item_id": item, "choice": choice, "csrf": csrf_of(html)})
            assert r.status_code == 303
            served[name].append((item, options[choice]))
    with LabelStore(path) as store:
        # every stored answer is the sample whose text the labeler pressed, whatever order it was shown in
        for name, answers in served.items():
            for item, text in answers:
                (best, order), = store.connection().execute(
                    "SELECT l.best, l.shown FROM labels l JOIN labelers b ON b.id = l.labeler_id"
                    " WHERE l.item_id = ? AND b.name = ?", (item, name)).fetchall()  # fmt: skip
                assert store.get_item(item).samples[best] == text and sorted(json.loads(order)) == [0, 1, 2, 3]
        q = quality(store)
        want = dict(store.connection().execute("SELECT id, want_labels FROM items WHERE gold IS NULL"))
    shared = [i for i, w in want.items() if w == 4]
    assert 0.25 < len(shared) / len(want) < 0.75  # overlap_fraction 0.5 of the 44 ordinary items
    clean, noisy, press1 = q.labelers["clean1"], q.labelers["noisy"], q.labelers["press1"]
    assert all(r.gold_answered >= 4 for r in q.labelers.values())  # gold was mixed into everyone's queue
    assert clean.gold_accuracy == 1 and noisy.gold_accuracy < 0.75 and clean.gold_interval[0] > noisy.gold_accuracy
    assert clean.majority_items >= 10 and noisy.majority_items >= 10
    assert clean.majority_rate > 0.7 and noisy.majority_rate < clean.majority_rate - 0.3, (clean, noisy)
    assert press1.positions[0] == sum(press1.positions) and max(clean.positions) < 0.6 * sum(clean.positions)
    assert q.kappa_pairs[("clean1", "clean2")][0] == pytest.approx(1.0)
    assert q.kappa_pairs[("clean1", "noisy")][0] < 0.5 and q.fleiss is not None
    # the admin page shows it all
    html = clients["clean1"].get("/admin").text
    row = re.search(r'<tr data-labeler="press1">(.*?)</tr>', html, re.S).group(1)
    assert 'class="pos warn">1: 100%' in row
    assert re.search(r'<tr data-labeler="clean1"><td>clean1</td>\s*<td class="num gold">100%</td>', html)
    assert "Fleiss" in html and "Cohen" in html


def test_gold_is_never_served_alone_and_an_admin_marks_it(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        gold = store.add_item("Gold.", [f" g{j}" for j in range(4)], source="t")
        plain = store.add_item("Plain.", [f" p{j}" for j in range(4)], source="t")
        admin_token, bob_token = store.add_labeler("alice", admin=True), store.add_labeler("bob")
    app = create_app(path, gold_rate=1.0, seed=0)
    alice = sign_in(app, admin_token)
    csrf = csrf_of(alice.get("/admin").text)
    form = {"item_id": gold, "action": "gold", "csrf": csrf}
    assert alice.post("/admin/item", data={**form, "best": "5"}).status_code == 422  # options are 1..4
    assert alice.post("/admin/item", data={**form, "best": "3"}).status_code == 303
    with LabelStore(path) as store:
        assert store.get_item(gold).gold == 2 and store.pending_count() == 2
    bob = sign_in(app, bob_token)
    html = bob.get("/label").text
    assert item_of(html) == gold  # gold_rate 1: the gold question first
    bob.post("/label", data={"item_id": gold, "choice": "0", "csrf": csrf_of(html)})
    html = bob.get("/label").text
    assert item_of(html) == plain
    bob.post("/label", data={"item_id": plain, "choice": "0", "csrf": csrf_of(html)})
    assert item_of(bob.get("/label").text) is None


# -- time on task and undo -------------------------------------------------------------------------------------


def test_time_on_task_is_stored_and_fast_answers_are_marked(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for q, s in questions(3):
            store.add_item(q, s, source="t")
        token = store.add_labeler("alice", admin=True)
    # a margin that a loaded CI machine's request round trip (up to ~0.5 s seen) stays within
    alice = sign_in(create_app(path, fast_seconds=1.5), token)
    for wait in (0.0, 1.6, 0.0):
        html = alice.get("/label").text
        time.sleep(wait)
        alice.post("/label", data={"item_id": item_of(html), "choice": "1", "csrf": csrf_of(html)})
    with LabelStore(path) as store:
        secs = [s for (s,) in store.connection().execute("SELECT seconds FROM labels ORDER BY id")]
    assert secs[0] < 1.5 and 1.6 <= secs[1] < 6 and secs[2] < 1.5
    html = alice.get("/admin").text
    assert re.search(r'<tr data-labeler="alice">.*?<td class="num fast">2</td>', html, re.S)


def test_undo_replaces_the_last_answer_in_place(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for q, s in questions(3):
            store.add_item(q, s, source="t")
        token = store.add_labeler("bob")
    app = create_app(path, undo_seconds=1.0)
    bob = sign_in(app, token)
    html = bob.get("/label").text
    first, options = item_of(html), shown(html)
    bob.post("/label", data={"item_id": first, "choice": "flag", "note": "oops", "csrf": csrf_of(html)})
    html = bob.get("/label").text
    assert f"Change my last answer (item {first})" in html and item_of(html) != first
    assert bob.post("/undo", data={"csrf": csrf_of(html)}).status_code == 303
    html = bob.get("/label").text
    assert item_of(html) == first and 'id="redo"' in html and shown(html) == options  # same order again
    with LabelStore(path) as store:
        assert store.get_item(first).hold == "flagged"  # the flag stands until it is replaced
        (label_id,) = store.connection().execute("SELECT id FROM labels").fetchone()
    assert bob.post("/label", data={"item_id": first, "choice": "2", "csrf": csrf_of(html)}).status_code == 303
    assert "Changed: item" in bob.get("/label").text
    with LabelStore(path) as store:
        rows = store.connection().execute("SELECT id, kind, best, note FROM labels").fetchall()
        assert rows == [(label_id, "label", store.get_item(first).samples.index(options[2]), None)]
        assert store.get_item(first).hold is None and store.get_item(first).status == "done"
    # a replay of the changed answer is refused; after the window, undo is refused
    assert bob.post("/label", data={"item_id": first, "choice": "1", "csrf": csrf_of(html)}).status_code == 409
    time.sleep(1.1)
    assert bob.post("/undo", data={"csrf": csrf_of(html)}).status_code == 409
    with LabelStore(path) as store:
        assert store.table_counts()["labels"] == 1


def test_the_undo_window_runs_from_the_answer_and_a_change_does_not_restart_it(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for q, s in questions(3):
            store.add_item(q, s, source="t")
        token = store.add_labeler("bob")
    bob = sign_in(create_app(path, undo_seconds=60), token)

    def age(seconds: float) -> None:  # as if the answer had been given `seconds` earlier
        with LabelStore(path) as store, store.transaction():
            store.connection().execute("UPDATE labels SET created = created - ?", (seconds,))

    html = bob.get("/label").text
    item = item_of(html)
    assert bob.post("/label", data={"item_id": item, "choice": "0", "csrf": csrf_of(html)}).status_code == 303
    age(50)  # 10 s of the window left: change the answer
    assert bob.post("/undo", data={"csrf": csrf_of(bob.get("/label").text)}).status_code == 303
    html = bob.get("/label").text
    assert bob.post("/label", data={"item_id": item, "choice": "1", "csrf": csrf_of(html)}).status_code == 303
    age(15)  # 65 s after the answer, 15 s after the change: the window has closed
    html = bob.get("/label").text
    assert "Change my last answer" not in html
    r = bob.post("/undo", data={"csrf": csrf_of(html)})
    assert r.status_code == 409 and "no answer of yours from the last 60 s" in r.text


# -- the JSON API and its client -------------------------------------------------------------------------------


def test_an_answer_changed_by_undo_is_sent_again_to_a_reader_paging_the_feed(tmp_path):
    # a client paging by next_since_id kept the old answer: the changed row kept its id, behind the cursor
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        admin_token, bob_token = store.add_labeler("alice", admin=True), store.add_labeler("bob")
        for q, s in questions(3):
            store.add_item(q, s, source="t")
    app = create_app(path, shuffle=False)
    api = TestClient(app, headers={"Authorization": f"Bearer {admin_token}"})
    bob = sign_in(app, bob_token)
    for _ in range(2):
        html = bob.get("/label").text
        bob.post("/label", data={"item_id": item_of(html), "choice": "0", "csrf": csrf_of(html)})
    first = api.get("/api/labels").json()
    assert [r["best"] for r in first["labels"]] == [0, 0]
    html = bob.get("/label").text
    assert bob.post("/undo", data={"csrf": csrf_of(html)}).status_code == 303
    html = bob.get("/label").text
    changed = item_of(html)
    bob.post("/label", data={"item_id": changed, "choice": "2", "csrf": csrf_of(html)})
    html = bob.get("/label").text
    bob.post("/label", data={"item_id": item_of(html), "choice": "1", "csrf": csrf_of(html)})
    more = api.get("/api/labels", params={"since_id": first["next_since_id"]}).json()
    assert [(r["item_id"], r["best"]) for r in more["labels"]] == [(changed, 2), (item_of(html), 1)]
    assert more["labels"][0]["id"] == first["labels"][1]["id"]  # the same row, sent again as changed
    assert api.get("/api/labels", params={"since_id": more["next_since_id"]}).json()["labels"] == []
    with running(app) as url:  # the client keeps each row once, as last changed
        assert [(r["item_id"], r["best"]) for r in Client(url, admin_token).labels(page=1)] == [
            (first["labels"][0]["item_id"], 0), (changed, 2), (item_of(html), 1)]  # fmt: skip


def test_api_and_client_queue_items_and_read_labels(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        admin_token, bob_token = store.add_labeler("alice", admin=True), store.add_labeler("bob")
    app = create_app(path)
    schema = TestClient(app).get("/api/openapi.json").json()
    assert {"/api/items", "/api/labels", "/api/quality"} <= set(schema["paths"]) and "/label" not in schema["paths"]
    with running(app) as url:
        with pytest.raises(ApiError, match="401"):
            Client(url, "wrong").me()
        with pytest.raises(ApiError, match="403.*not an admin"):
            Client(url, bob_token).me()
        api = Client(url, admin_token)
        assert api.me() == {"name": "alice", "is_admin": True}
        items = [{"query": q, "samples": s} for q, s in questions(3)]
        ids = api.add_items(items + [{**items[0], "query": "Gold q.", "gold": 1}])
        assert len(set(ids)) == 4 and api.add_items(items[:1]) == ids[:1]  # idempotent
        assert api.item(ids[3])["gold"] == 1 and api.item(ids[0])["status"] == "pending"
        with pytest.raises(ApiError, match=r"422 items\[0\]: best_of_4 needs .* 4 sample"):
            api.add_items([{"query": "q", "samples": ["a", "b"]}])
        with pytest.raises(ApiError, match="422"):
            api.add_items([{"query": "q", "samples": ["a"] * 4, "want_labels": 0}])
        bob = sign_in(app, bob_token)
        for _ in range(3):
            html = bob.get("/label").text
            bob.post("/label", data={"item_id": item_of(html), "choice": "0", "csrf": csrf_of(html)})
        labels = api.labels(page=2)  # read in pages of 2
        assert [lab["labeler"] for lab in labels] == ["bob"] * 3 and len({lab["id"] for lab in labels}) == 3
        for lab in labels:
            assert lab["best"] == lab["shown"][0] and lab["seconds"] >= 0  # pressed the first option shown
            assert lab["too_fast"] is (lab["seconds"] < 3)
        assert api.labels(since_id=labels[1]["position"]) == labels[2:]
        assert {r["name"] for r in api.quality()["labelers"]} == {"alice", "bob"}
