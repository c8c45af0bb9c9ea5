"""The labeling app under an attacker's and a careless labeler's hands, one behaviour a test. These use only the
HTTP surface (the session cookie is found by its name's stem)."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from lmprefs.labels.store import LabelStore
from lmprefs.server import stats
from lmprefs.server.app import create_app
from lmprefs.server.live import running


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        for i in range(1, 7):
            store.add_item(f"Query {i}.", [f" sample {i}.{j}" for j in range(4)], source="t", batch="b1")
        store.add_item("Other batch.", [f" other {j}" for j in range(4)], source="t", batch="b2")
    return path


@pytest.fixture
def tokens(db):
    with LabelStore(db) as store:
        return {name: store.add_labeler(name, admin=name == "alice") for name in ("alice", "bob", "carol")}


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def item_of(html: str) -> int | None:
    m = re.search(r'name="item_id" value="(\d+)"', html)
    return int(m.group(1)) if m else None


def sign_in(app, token: str, base_url: str = "http://testserver", client: TestClient | None = None) -> TestClient:
    client = client or TestClient(app, base_url=base_url, follow_redirects=False)
    form = client.get("/login")
    r = client.post("/login", data={"token": token, "csrf": csrf_of(form.text)})
    assert r.status_code == 303 and r.headers["location"] == "/label", r.text
    return client


def page(client: TestClient) -> tuple[int | None, str]:
    html = client.get("/label").text
    return item_of(html), csrf_of(html)


def counts(db) -> dict[str, int]:
    with LabelStore(db) as store:
        return store.table_counts()


# -- 1. only the item leased to this labeler may be answered ------------------------------------------------------


def test_only_the_item_shown_to_this_labeler_can_be_answered(db, tokens):
    app = create_app(db, batch="b1")
    bob, carol = sign_in(app, tokens["bob"]), sign_in(app, tokens["carol"])
    mine, csrf = page(bob)
    theirs, _ = page(carol)
    with LabelStore(db) as store:
        store.add_label(6, "alice", best=0)  # item 6 is done
        never_shown = next(i for i in range(1, 6) if i not in (mine, theirs))
    before = counts(db)
    for item in (theirs, 6, never_shown, 7):  # leased to carol, done, never shown to bob, outside the served batch
        r = bob.post("/label", data={"item_id": str(item), "choice": "0", "csrf": csrf})
        assert r.status_code == 409, (item, r.status_code)
    assert counts(db) == before
    for form in ({"item_id": f"{mine}.0", "choice": "0"}, {"item_id": f"+{mine}", "choice": "0"},
                 {"item_id": f"0{mine}", "choice": "0"}):  # fmt: skip
        assert bob.post("/label", data={**form, "csrf": csrf}).status_code == 422, form
    repeated = [("item_id", str(mine)), ("choice", "0"), ("choice", "3"), ("csrf", csrf)]
    r = bob.post("/label", content="&".join(f"{k}={v}" for k, v in repeated),
                 headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 422 and "choice&#39; was sent 2 times" in r.text
    assert counts(db) == before
    assert bob.post("/label", data={"item_id": str(mine), "choice": "0", "csrf": csrf}).status_code == 303


# -- 2. the session cookie belongs to one server -------------------------------------------------------------------


def test_two_servers_on_one_host_do_not_sign_each_other_out(db, tokens, tmp_path):
    other = tmp_path / "other.sqlite"
    with LabelStore(other) as store:
        store.add_item("Elsewhere.", [f" e {j}" for j in range(4)], source="t")
        other_token = store.add_labeler("bob")
    a, b = create_app(db), create_app(other)
    # one browser: cookies are scoped by host, not port, so both servers see one cookie jar
    browser_a = sign_in(a, tokens["bob"], "http://127.0.0.1:8001")
    browser_b = TestClient(b, base_url="http://127.0.0.1:8002", follow_redirects=False, cookies=browser_a.cookies)
    sign_in(b, other_token, client=browser_b)
    browser_a.cookies = browser_b.cookies
    names = [c.name for c in browser_b.cookies.jar if c.name.startswith("lmprefs_session")]
    assert len(names) == 2 and len(set(names)) == 2
    assert browser_a.get("/label").status_code == 200  # still signed in to the first server
    assert browser_b.get("/label").status_code == 200
    # the same store behind another port is another server: its cookie does not sign in there
    c = TestClient(create_app(db), base_url="http://127.0.0.1:8003", follow_redirects=False, cookies=browser_a.cookies)
    assert c.get("/label").headers["location"] == "/login"


def test_the_session_cookie_has_the_host_prefix_under_https(db, tokens):
    client = TestClient(create_app(db), base_url="https://testserver", follow_redirects=False)
    form = client.get("/login")
    r = client.post("/login", data={"token": tokens["bob"], "csrf": csrf_of(form.text)})
    cookie = next(c for c in r.headers.get_list("set-cookie") if "lmprefs_session" in c)
    assert cookie.startswith("__Host-lmprefs_session") and "Secure" in cookie and "Domain" not in cookie
    assert "Path=/" in cookie and client.get("/label").status_code == 200


# -- 3. wrong tokens are throttled, right ones never; a chunked body over the limit is 413 ---------------------


def test_wrong_tokens_are_throttled_but_a_right_token_always_gets_in(db, tokens):
    app = create_app(db)
    nat = ("203.0.113.7", 40000)  # one address shared by every labeler behind a NAT
    attacker = TestClient(app, follow_redirects=False, client=nat)

    def try_token(client: TestClient, token: str):
        return client.post("/login", data={"token": token, "csrf": csrf_of(client.get("/login").text)})

    assert [try_token(attacker, f"guess{k}").status_code for k in range(6)] == [401] * 5 + [429]
    r = try_token(attacker, "guess")
    assert r.status_code == 429 and "try again in" in r.text and int(r.headers["retry-after"]) >= 1
    api = TestClient(app, client=nat)
    r = api.get("/api/me", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 429 and r.json()["detail"].startswith("Too many wrong tokens")
    # the right tokens from the same address still get in: a labeler's sign-in and the admin's training client
    assert try_token(TestClient(app, follow_redirects=False, client=nat), tokens["bob"]).status_code == 303
    assert api.get("/api/me", headers={"Authorization": f"Bearer {tokens['alice']}"}).status_code == 200
    # wrong tokens that start alike count together, whatever address they come from
    near = [tokens["carol"][:8] + f"x{k}" for k in range(6)]
    codes = [try_token(TestClient(app, follow_redirects=False, client=(f"198.51.100.{k}", 1)), t).status_code
             for k, t in enumerate(near)]  # fmt: skip
    assert codes == [401] * 5 + [429]
    elsewhere = TestClient(app, follow_redirects=False, client=("198.51.100.9", 1))
    assert try_token(elsewhere, tokens["carol"]).status_code == 303


def test_x_forwarded_for_is_believed_only_from_a_proxy_the_admin_trusts(db, tokens):
    def statuses(url: str) -> list[int]:
        with httpx.Client(base_url=url) as client:
            return [client.get("/api/me", headers={"Authorization": "Bearer wrong", "X-Forwarded-For": f"192.0.2.{k}"})
                    .status_code for k in range(6)]  # fmt: skip

    with running(create_app(db)) as url:  # by default: the connection's address, whatever the header says
        assert statuses(url) == [401] * 5 + [429]
    with running(create_app(db), trusted_proxies=["127.0.0.1"]) as url:  # a proxy on this machine, named
        assert statuses(url) == [401] * 6  # each forwarded address counts on its own


def test_a_chunked_body_over_the_limit_is_413(db, tokens):
    app = create_app(db)
    bob = sign_in(app, tokens["bob"])
    item, csrf = page(bob)
    before = counts(db)

    def chunks():
        yield f"item_id={item}&choice=flag&csrf={csrf}&note=".encode()
        for _ in range(40):
            yield b"n" * 4096

    r = bob.post("/label", content=chunks(), headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413 and counts(db) == before


# -- 4. a flagged item is held; an admin retires or restores it --------------------------------------------------


def test_a_flagged_item_is_not_served_again_and_an_admin_can_retire_it(db, tokens):
    app = create_app(db, batch="b1")
    bob, carol, alice = (sign_in(app, tokens[n]) for n in ("bob", "carol", "alice"))
    flagged, csrf = page(bob)
    r = bob.post("/label", data={"item_id": flagged, "choice": "flag", "note": "broken", "csrf": csrf})
    assert r.status_code == 303
    served = []
    while True:
        item, csrf = page(carol)
        if item is None:
            break
        served.append(item)
        assert carol.post("/label", data={"item_id": item, "choice": "skip", "csrf": csrf}).status_code == 303
    assert flagged not in served and len(served) == 5
    admin_csrf = csrf_of(alice.get("/admin").text)
    assert "Held items" in alice.get("/admin").text
    r = alice.post("/admin/item", data={"item_id": flagged, "action": "retire", "csrf": admin_csrf})
    assert r.status_code == 303
    with LabelStore(db) as store:
        assert store.get_item(flagged).hold == "retired"
    restore = {"item_id": flagged, "action": "restore"}
    assert bob.post("/admin/item", data={**restore, "csrf": page(bob)[1]}).status_code == 403
    assert alice.post("/admin/item", data={**restore, "csrf": admin_csrf}).status_code == 303
    assert page(alice)[0] == flagged  # served again


# -- 5. the totals' rate pools only labelers with a rate of their own ---------------------------------------------


def test_the_total_rate_is_not_made_of_bursts(db):
    with LabelStore(db) as store:
        t0 = time.time() - 3600
        with store.transaction():
            for k in range(6):  # six labelers, each answering three items 10 s apart: 20 s active, no rate each
                for j in range(3):
                    kind = "skip" if j == 2 else "label"
                    lid = store.add_label(j + 1, f"burst{k}", kind=kind, best=None if j == 2 else 0)
                    at = t0 + 100 * k + 10 * j
                    store.connection().execute("UPDATE labels SET created = ? WHERE id = ?", (at, lid))
        rows, total = stats.labeler_rows(store)
        assert all(r.throughput.per_hour_active is None for r in rows)
        assert total.per_hour_active is None and total.median_seconds is None and total.labels == 12
        with store.transaction():  # one real labeler: 4 labels at 30 s gaps = 90 s active, 160 labels per hour
            for j in range(4):
                lid = store.add_label(j + 1, "steady", best=1)
                store.connection().execute("UPDATE labels SET created = ? WHERE id = ?", (t0 + 30 * j, lid))
        rows, total = stats.labeler_rows(store)
        steady = next(r for r in rows if r.name == "steady")
        assert steady.throughput.per_hour_active == pytest.approx(160)
        assert total.per_hour_active == pytest.approx(160) and total.labels == 16


# -- 6. an answer lost to an expired session says so and comes back ----------------------------------------------


def test_an_answer_lost_to_a_restart_says_so_and_returns_to_the_item(db, tokens):
    bob = sign_in(create_app(db), tokens["bob"])
    item, csrf = page(bob)
    # a new server process: sessions and leases are gone, the browser still holds its cookie
    bob = TestClient(create_app(db), follow_redirects=False, cookies=bob.cookies)
    r = bob.post("/label", data={"item_id": item, "choice": "2", "csrf": csrf})
    assert r.status_code == 401
    assert f"Your answer to item {item} was not saved" in r.text and 'name="token"' in r.text
    assert counts(db)["labels"] == 0
    r = bob.post("/login", data={"token": tokens["bob"], "csrf": csrf_of(r.text), "resume": str(item)})
    assert r.status_code == 303
    html = bob.get("/label").text
    assert item_of(html) == item and "whose answer was not saved" in html


def test_resuming_after_sign_in_cannot_pick_an_item_the_queue_would_not_serve(db, tokens):
    app = create_app(db, batch="b1")
    with LabelStore(db) as store:
        store.add_label(2, "alice", best=0)  # item 2 is done
    for item in (2, 7):  # done; outside the served batch
        client = TestClient(app, follow_redirects=False)
        form = {"token": tokens["bob"], "csrf": csrf_of(client.get("/login").text), "resume": str(item)}
        assert client.post("/login", data=form).status_code == 303
        assert page(client)[0] == 1 and "was not saved" not in client.get("/label").text


def test_resuming_after_sign_in_serves_only_the_labelers_own_item(db, tokens):
    app = create_app(db, batch="b1")
    bob, carol = sign_in(app, tokens["bob"]), sign_in(app, tokens["carol"])
    mine, _ = page(bob)
    theirs, _ = page(carol)
    never_shown = next(i for i in range(1, 7) if i not in (mine, theirs))

    def sign_in_resuming(item: int) -> str:
        client = TestClient(app, follow_redirects=False)
        form = {"token": tokens["bob"], "csrf": csrf_of(client.get("/login").text), "resume": str(item)}
        assert client.post("/login", data=form).status_code == 303
        return client.get("/label").text

    for item in (theirs, never_shown):  # carol's item; one the queue has not reached
        html = sign_in_resuming(item)
        assert item_of(html) == mine and "was not saved" not in html
    html = sign_in_resuming(mine)  # the item leased to bob: it comes back, with the message
    assert item_of(html) == mine and f"here is item {mine}, whose answer was not saved" in html
    assert page(carol)[0] == theirs


# -- 7. a forged cross-site post is refused without touching the victim's session ------------------------------


def test_a_cross_site_post_is_403_and_keeps_the_victims_session(db, tokens):
    app = create_app(db)
    alice = sign_in(app, tokens["alice"])
    item, csrf = page(alice)
    before = counts(db)
    # the forged form: SameSite=Strict keeps the session cookie back, so it arrives without one
    forged = TestClient(app, follow_redirects=False)
    evil = {"origin": "http://evil.example", "sec-fetch-site": "cross-site"}
    for path, form in (("/label", {"item_id": str(item), "choice": "0"}), ("/undo", {}), ("/logout", {}),
                       ("/admin/item", {"item_id": str(item), "action": "retire"})):  # fmt: skip
        r = forged.post(path, data={**form, "csrf": "forged"}, headers=evil)
        assert r.status_code == 403 and "came from another site" in r.text, path
        assert "session ended" not in r.text and 'name="token"' not in r.text, path
    # a browser that sends the cookie anyway: refused too
    r = alice.post("/logout", data={"csrf": csrf}, headers=evil)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    assert counts(db) == before
    assert page(alice) == (item, csrf)  # the same session, the same question
