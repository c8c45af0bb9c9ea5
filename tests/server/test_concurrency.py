"""Many labelers at once, over real HTTP on loopback: uvicorn in a thread, one httpx client per labeler thread.
No judgement may be lost or counted twice, and a submission raced from many threads is stored exactly once."""

from __future__ import annotations

import re
import threading
from collections import Counter

import httpx
import pytest

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app
from lmprefs.server.live import running

LABELERS, PER_LABELER = 24, 5


def sign_in(url: str, token: str) -> httpx.Client:
    client = httpx.Client(base_url=url, follow_redirects=False, timeout=30)
    form = client.get("/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form).group(1)
    assert client.post("/login", data={"token": token, "csrf": csrf}).status_code == 303
    return client


def current(client: httpx.Client) -> tuple[int | None, str]:
    html = client.get("/label").text
    item = re.search(r'name="item_id" value="(\d+)"', html)
    return (int(item.group(1)) if item else None), re.search(r'name="csrf" value="([^"]+)"', html).group(1)


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        with store.transaction():
            for i in range(LABELERS * PER_LABELER):
                store.add_item(f"query {i}", [f" sample {i}.{j}" for j in range(4)], source="t")
    return path


def test_many_labelers_at_once_lose_and_double_count_nothing(store_path):
    with LabelStore(store_path) as store:
        tokens = {f"labeler{k:02d}": store.add_labeler(f"labeler{k:02d}") for k in range(LABELERS)}
    sent: dict[str, list[tuple[int, int]]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(LABELERS)

    def work(name: str, url: str) -> None:
        try:
            client = sign_in(url, tokens[name])
            start.wait()  # everyone signs in first, then all submit at the same time
            mine = []
            for _ in range(PER_LABELER):
                item, csrf = current(client)
                best = (item * 7 + len(name)) % 4
                r = client.post("/label", data={"item_id": item, "choice": best, "csrf": csrf})
                assert r.status_code == 303, r.text
                mine.append((item, best))
            sent[name] = mine
            client.close()
        except BaseException as e:  # reported below: an assert in a thread would otherwise vanish
            errors.append(e)
            start.abort()

    with running(create_app(store_path, shuffle=False)) as url:  # unshuffled: `best` is the stored index
        threads = [threading.Thread(target=work, args=(name, url)) for name in tokens]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors[0]
    with LabelStore(store_path) as store:
        stored = {(e.labeler, e.item_id, e.best) for e in store.labeled_examples()}
        assert len(store.labeled_examples()) == LABELERS * PER_LABELER == len(stored)
        assert stored == {(name, item, best) for name, mine in sent.items() for item, best in mine}
        assert store.counts_by_labeler() == {n: {"label": PER_LABELER, "skip": 0, "flag": 0} for n in tokens}
        # the leases spread the labelers over the queue: every item labeled exactly once, none left
        assert Counter(item for _, item, _ in stored) == Counter(range(1, LABELERS * PER_LABELER + 1))
        assert store.pending_count() == 0


def test_one_submission_raced_from_many_threads_is_stored_once(store_path):
    with LabelStore(store_path) as store:
        token = store.add_labeler("racer")
    n = 32
    results: list[int] = []
    start = threading.Barrier(n)
    with running(create_app(store_path)) as url:
        first = sign_in(url, token)
        item, csrf = current(first)
        name = next(n for n in first.cookies if n.startswith("lmprefs_session_"))
        cookie = first.cookies[name]

        def submit(k: int) -> None:
            with httpx.Client(base_url=url, cookies={name: cookie}, timeout=30) as client:
                start.wait()
                r = client.post("/label", data={"item_id": item, "choice": k % 4, "csrf": csrf})
                results.append(r.status_code)

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        first.close()
    assert sorted(results) == [303] + [409] * (n - 1)
    with LabelStore(store_path) as store:
        assert store.table_counts()["labels"] == 1
        assert store.counts_by_labeler() == {"racer": {"label": 1, "skip": 0, "flag": 0}}
