"""Gold questions look like any other question from the labeler's side of the app: the count of what is left drops
alike, signing in with `resume=` answers alike, and undo works alike but cannot improve a gold answer (accuracy
counts the first answer). Each test drives the app over HTTP, as a labeler hunting for gold would."""

from __future__ import annotations

import re
from html import unescape

from fastapi.testclient import TestClient

from lmprefs.labels.quality import quality
from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def item_of(html: str) -> int | None:
    m = re.search(r'name="item_id" value="(\d+)"', html)
    return int(m.group(1)) if m else None


def remaining(html: str) -> int:
    return int(re.search(r'id="remaining-count">(\d+)<', html).group(1))


def shown(html: str) -> list[str]:
    return [unescape(t) for t in re.findall(r'<span class="text">(.*?)</span>', html, re.S)]


def sign_in(app, token: str, resume: int | None = None) -> TestClient:
    client = TestClient(app, follow_redirects=False)
    form = {"token": token, "csrf": csrf_of(client.get("/login").text)}
    if resume is not None:
        form["resume"] = str(resume)
    assert client.post("/login", data=form).status_code == 303
    return client


def make_store(path, plain: int, gold: int) -> tuple[list[int], list[int], str]:
    """(plain item ids, gold item ids, bob's token); every gold question's right answer is stored sample 0."""
    with LabelStore(path) as store:
        plain_ids = [store.add_item(f"Plain {i}.", [f" p{i}.{j}" for j in range(4)], source="t") for i in range(plain)]
        gold_ids = [store.add_item(f"Gold {i}.", [f" g{i}.{j}" for j in range(4)], source="t") for i in range(gold)]
        for g in gold_ids:
            store.set_gold(g, 0)
        return plain_ids, gold_ids, store.add_labeler("bob")


def test_the_count_left_drops_by_one_after_every_answer_gold_or_not(tmp_path):
    path = tmp_path / "labels.sqlite"
    _, gold_ids, token = make_store(path, plain=3, gold=2)
    bob = sign_in(create_app(path, gold_rate=1.0, seed=0), token)  # gold first, while real work is left
    counts, served = [], []
    while (item := item_of(html := bob.get("/label").text)) is not None:
        counts.append(remaining(html))
        served.append(item)
        assert bob.post("/label", data={"item_id": item, "choice": "1", "csrf": csrf_of(html)}).status_code == 303
    assert set(gold_ids) <= set(served) and len(served) == 5
    assert counts == [5, 4, 3, 2, 1] and remaining(html) == 0


def test_resume_answers_alike_for_a_done_gold_item_and_a_done_plain_one(tmp_path):
    path = tmp_path / "labels.sqlite"
    plain_ids, gold_ids, token = make_store(path, plain=3, gold=1)
    with LabelStore(path) as store:  # both done: each had the one label it wanted, from someone else
        store.add_label(gold_ids[0], "alice", best=0)
        store.add_label(plain_ids[2], "alice", best=0)
    app = create_app(path)
    pages = {}
    for item in (gold_ids[0], plain_ids[2]):
        html = sign_in(app, token, resume=item).get("/label").text
        pages[item] = (item_of(html), "was not saved" in html, remaining(html))
    assert pages[gold_ids[0]] == pages[plain_ids[2]] == (plain_ids[0], False, 2)


def test_undo_of_a_gold_answer_works_like_any_undo_but_its_first_answer_counts(tmp_path):
    path = tmp_path / "labels.sqlite"
    plain_ids, gold_ids, token = make_store(path, plain=1, gold=1)
    app = create_app(path, gold_rate=1.0, seed=0)
    bob = sign_in(app, token)
    flashes = []
    for item in (gold_ids[0], plain_ids[0]):  # gold comes first (gold_rate 1), then the plain item
        html = bob.get("/label").text
        assert item_of(html) == item
        with LabelStore(path) as store:
            samples = store.get_item(item).samples
        wrong, right = shown(html).index(samples[1]), shown(html).index(samples[0])  # stored sample 0 is right
        assert bob.post("/label", data={"item_id": item, "choice": wrong, "csrf": csrf_of(html)}).status_code == 303
        r = bob.post("/undo", data={"csrf": csrf_of(bob.get("/label").text)})
        assert r.status_code == 303
        html = bob.get("/label").text
        assert item_of(html) == item and 'id="redo"' in html
        flashes.append(re.search(r'class="flash" role="status">(.*?)<', html).group(1).replace(str(item), "N"))
        assert bob.post("/label", data={"item_id": item, "choice": right, "csrf": csrf_of(html)}).status_code == 303
    assert flashes[0] == flashes[1]
    with LabelStore(path) as store:
        finals = [e.best for e in store.labeled_examples()]
        gold_row = store.gold_items()[0]
        assert finals == [0, 0]  # the changed answers are the labels training reads
        assert store.gold_accuracy() == {"bob": (0, 1)}  # but gold accuracy counts the first, wrong one
        assert (gold_row.answers, gold_row.right) == (1, 0)
        bob_quality = quality(store).labelers["bob"]
        assert (bob_quality.gold_correct, bob_quality.gold_answered) == (0, 1)
