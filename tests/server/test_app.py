"""The labeling web app through FastAPI's TestClient: sign-in, sessions, CSRF, escaping, validation, replay, leases,
the admin page and export. Every rejected request must also leave the store exactly as it was."""

from __future__ import annotations

import json
import re
import socket
from html import unescape as html_unescape

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from lmprefs.cli.dispatch import main
from lmprefs.labels.formats import import_file
from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app
from lmprefs.server.security import server_cookie

XSS = "<script>alert(1)</script>"


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        store.add_item(f"The door opened. {XSS}", [f" option {j} {XSS}" for j in range(4)], source="t")
        for i in range(1, 6):
            store.add_item(f"Query {i}.", [f" sample {i}.{j}" for j in range(4)], source="t")
        store.add_item("Rate me.", [" one sample"], source="t", label_type="scalar_rating")
    return path


@pytest.fixture
def tokens(db):
    with LabelStore(db) as store:
        return {"alice": store.add_labeler("alice", admin=True), "bob": store.add_labeler("bob")}


@pytest.fixture
def app(db, tokens):
    return create_app(db)


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def item_of(html: str) -> int:
    return int(re.search(r'name="item_id" value="(\d+)"', html).group(1))


def sign_in(app, token: str) -> TestClient:
    client = TestClient(app, follow_redirects=False)
    form = client.get("/login")
    r = client.post("/login", data={"token": token, "csrf": csrf_of(form.text)})
    assert r.status_code == 303 and r.headers["location"] == "/label"
    return client


def session_cookie(db, port: int = 80) -> str:
    """The session cookie's name for the app over `db` (TestClient's server is testserver:80)."""
    with LabelStore(db) as store:
        return server_cookie("lmprefs_session", store.store_id, port)


def shown(html: str) -> list[str]:
    """The option texts of the labeling page, in the order this labeler sees them."""
    return [html_unescape(t) for t in re.findall(r'<span class="text">(.*?)</span>', html, re.S)]


def stored_best(db, item: int, html: str, position: int) -> int:
    """The stored sample index of the option shown at `position` on `html`."""
    with LabelStore(db) as store:
        return store.get_item(item).samples.index(shown(html)[position])


def page(client: TestClient) -> tuple[int, str]:
    """(item id, csrf) of the labeler's current question."""
    html = client.get("/label").text
    return item_of(html), csrf_of(html)


def counts(db) -> dict[str, int]:
    with LabelStore(db) as store:
        return store.table_counts()


def test_every_route_but_sign_in_and_static_needs_a_session(app, db):
    before = counts(db)
    client = TestClient(app, follow_redirects=False)
    routes = [(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods if r.path != "/login"]
    pages = {"/", "/logout", "/label", "/undo", "/onboarding", "/admin", "/admin/items", "/admin/item",
             "/admin/onboarding", "/admin/labeler", "/admin/drift", "/admin/export"}
    assert {p for _, p in routes} == pages | {"/api/me", "/api/items", "/api/items/{item_id}", "/api/labels",
                                              "/api/quality"}  # fmt: skip
    for method, path in routes:
        form = {"item_id": "1", "choice": "0", "csrf": "x"} if method == "POST" else None
        r = client.request(method, path.replace("{item_id}", "1"), data=form)
        if path.startswith("/api/"):
            assert r.status_code == 401 and "Bearer" in r.json()["detail"], path
        elif method in ("GET", "HEAD"):
            assert (r.status_code, r.headers["location"]) == (303, "/login"), path
        else:
            assert r.status_code == 401, path
    client.cookies.set(session_cookie(db), "forged")
    assert client.get("/admin").status_code == 303
    assert client.get("/static/style.css").status_code == 200 and client.get("/login").status_code == 200
    assert counts(db) == before


def test_head_answers_like_get_without_a_body(app, tokens):
    anonymous, alice = TestClient(app, follow_redirects=False), sign_in(app, tokens["alice"])
    for client, path in ((anonymous, "/login"), (alice, "/label"), (alice, "/admin"), (anonymous, "/label")):
        get, head = client.get(path), client.head(path)
        assert head.status_code == get.status_code in (200, 303), path
        assert head.content == b"" and head.headers.get("content-type") == get.headers.get("content-type"), path
        assert head.headers.get("location") == get.headers.get("location"), path


def test_sign_in_sets_a_safe_cookie_and_never_puts_the_token_in_a_url(app, tokens):
    client = TestClient(app, follow_redirects=False)
    form = client.get("/login")
    assert client.post("/login", data={"token": "wrong", "csrf": csrf_of(form.text)}).status_code == 401
    assert client.post("/login", data={"token": tokens["bob"], "csrf": "stale"}).status_code == 403
    r = client.post("/login", data={"token": tokens["bob"], "csrf": csrf_of(client.get("/login").text)})
    cookie = next(c for c in r.headers.get_list("set-cookie") if c.startswith("lmprefs_session_"))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and tokens["bob"] not in cookie
    assert r.headers["location"] == "/label"
    assert client.get("/login").headers["location"] == "/label"  # already signed in
    html = client.get("/label").text
    assert tokens["bob"] not in html and "bob" in html and "/admin" not in html


def test_admin_pages_are_for_admins_only(app, tokens):
    bob, alice = sign_in(app, tokens["bob"]), sign_in(app, tokens["alice"])
    for path in ("/admin", "/admin/export?format=comparisons"):
        assert bob.get(path).status_code == 403
        assert alice.get(path).status_code == 200


def test_posts_need_the_sessions_csrf_token_and_same_origin(app, db, tokens):
    bob, alice = sign_in(app, tokens["bob"]), sign_in(app, tokens["alice"])
    item, csrf = page(bob)
    before = counts(db)
    form = {"item_id": str(item), "choice": "1"}
    assert bob.post("/label", data=form).status_code == 403  # no token
    assert bob.post("/label", data={**form, "csrf": "x" * 43}).status_code == 403
    assert bob.post("/label", data={**form, "csrf": page(alice)[1]}).status_code == 403  # another session's
    evil = {"origin": "http://evil.example"}
    assert bob.post("/label", data={**form, "csrf": csrf}, headers=evil).status_code == 403
    assert bob.post("/label", data={**form, "csrf": csrf}, headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert bob.post("/logout", data={}).status_code == 403
    assert counts(db) == before
    r = bob.post("/label", data=form, headers={"x-csrf-token": csrf, "origin": "http://testserver"})
    assert r.status_code == 303 and counts(db)["labels"] == before["labels"] + 1


def test_texts_are_escaped(app, db, tokens):
    with LabelStore(db) as store:
        store.add_labeler("<img src=x onerror=alert(1)>")
    alice = sign_in(app, tokens["alice"])
    html = alice.get("/label").text
    assert "The door opened." in html and XSS not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 5  # the query and 4 options
    admin = alice.get("/admin").text
    assert "<img src=x" not in admin and "&lt;img src=x onerror=alert(1)&gt;" in admin
    # the only scripts are our own files: no inline script for the CSP to allow
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/label.js" defer>']


def test_security_headers(app, tokens):
    alice = sign_in(app, tokens["alice"])
    for path in ("/login", "/label", "/admin", "/static/label.js"):
        h = alice.get(path).headers
        assert h["x-frame-options"] == "DENY" and h["x-content-type-options"] == "nosniff", path
        assert "script-src 'self'" in h["content-security-policy"] and "unsafe" not in h["content-security-policy"]
        assert "frame-ancestors 'none'" in h["content-security-policy"]
    assert alice.get("/label").headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    "form, status",
    [
        ({"item_id": "9999", "choice": "0"}, 404),
        ({"item_id": "ITEM", "choice": "4"}, 422),
        ({"item_id": "ITEM", "choice": "-1"}, 422),
        ({"item_id": "ITEM", "choice": "1.0"}, 422),
        ({"item_id": "ITEM", "choice": "\u0663"}, 422),  # ARABIC-INDIC DIGIT THREE: isdigit(), but not a choice
        ({"item_id": "ITEM", "choice": "01"}, 422),  # was option 1: a choice is written as the page writes it
        ({"item_id": "ITEM", "choice": "00"}, 422),
        ({"item_id": "ITEM", "choice": "best"}, 422),
        ({"item_id": "ITEM", "choice": ""}, 422),
        ({"item_id": "ITEM"}, 422),
        ({"item_id": "one", "choice": "0"}, 422),
        ({"item_id": "0", "choice": "0"}, 422),
        ({"item_id": "7", "choice": "0"}, 422),  # a scalar_rating item: not a pick-the-best question
        ({"item_id": "ITEM", "choice": "flag", "note": "n" * 1001}, 422),
        ({"item_id": "ITEM", "choice": "0", "note": "n" * 70_000}, 413),
    ],
)
def test_invalid_submissions_are_4xx_and_change_nothing(app, db, tokens, form, status):
    bob = sign_in(app, tokens["bob"])
    item, csrf = page(bob)
    before = counts(db)
    form = {k: v.replace("ITEM", str(item)) for k, v in form.items()}
    assert bob.post("/label", data={**form, "csrf": csrf}).status_code == status
    assert counts(db) == before
    assert page(bob)[0] == item  # still the same question


@pytest.mark.parametrize(
    "note, field",
    [
        (b"%ff%fe", "note"),  # was stored as two U+FFFD replacement characters
        (b"caf\xc3\xa9", "note"),  # raw UTF-8, not percent-encoded: was stored as 'cafÃ©'
        (b"\xff", "note"),  # was stored as 'ÿ'
        (b"x&%ff=1", "%ff"),  # a field name that is not UTF-8
    ],
)
def test_a_form_that_is_not_url_encoded_utf8_is_422_not_stored_garbled(app, db, tokens, note, field):
    bob = sign_in(app, tokens["bob"])
    item, csrf = page(bob)
    before = counts(db)
    r = bob.post("/label", content=f"item_id={item}&choice=flag&csrf={csrf}&note=".encode() + note,
                 headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 422
    assert html_unescape(f"The form field {field!r} is not URL-encoded UTF-8 text") in html_unescape(r.text)
    assert counts(db) == before and page(bob)[0] == item
    r = bob.post("/label", files={"item_id": (None, str(item)), "choice": (None, "flag"), "csrf": (None, csrf),
                                  "note": (None, b"\xff")})  # fmt: skip
    assert r.status_code == 415 and "application/x-www-form-urlencoded" in r.text
    assert counts(db) == before
    r = bob.post("/label", data={"item_id": str(item), "choice": "flag", "note": "café ✓", "csrf": csrf})
    assert r.status_code == 303
    with LabelStore(db) as store:
        assert store.answers_since(0)[0].note == "café ✓"


def test_a_store_holding_a_label_type_spelt_before_it_was_checked_still_works(app, db, tokens):
    # add_item refuses best_of_04 now (a second name for best_of_4); a store written before keeps serving its items,
    # and its admin page, exports and API filter still read the name
    with LabelStore(db) as store, store.transaction() as tx:
        tx.connection().execute("UPDATE items SET label_type = 'best_of_04' WHERE id = 2")
    alice, bob = sign_in(app, tokens["alice"]), sign_in(app, tokens["bob"])
    assert alice.get("/admin").status_code == 200
    while (item := page(bob))[0] != 2:
        assert bob.post("/label", data={"item_id": item[0], "choice": "skip", "csrf": item[1]}).status_code == 303
    assert bob.post("/label", data={"item_id": "2", "choice": "1", "csrf": item[1]}).status_code == 303
    r = alice.get("/api/labels", params={"label_type": "best_of_04"}, headers={"Authorization": f"Bearer "
                                                                                f"{tokens['alice']}"})  # fmt: skip
    assert r.status_code == 200 and [a["item_id"] for a in r.json()["labels"]] == [2]
    assert alice.get("/admin/export", params={"format": "comparisons"}).status_code == 200


def test_a_replayed_submission_is_409_and_the_first_answer_stands(app, db, tokens):
    bob = sign_in(app, tokens["bob"])
    item, csrf = page(bob)
    best = stored_best(db, item, bob.get("/label").text, 2)
    form = {"item_id": str(item), "choice": "2", "csrf": csrf}
    assert bob.post("/label", data=form).status_code == 303
    before = counts(db)
    for replay in (form, {**form, "choice": "0"}, {**form, "choice": "skip"}, {**form, "choice": "flag"}):
        r = bob.post("/label", data=replay)
        assert r.status_code == 409 and "already answered" in r.text
    assert counts(db) == before
    with LabelStore(db) as store:
        assert [(e.item_id, e.best) for e in store.labeled_examples()] == [(item, best)]


def test_label_skip_flag_progress_and_an_empty_queue(app, db, tokens):
    bob = sign_in(app, tokens["bob"])
    seen = []
    for choice, note in (("3", ""), ("skip", ""), ("flag", "gibberish <b>"), ("0", ""), ("1", ""), ("2", "")):
        item, csrf = page(bob)
        seen.append(item)
        r = bob.post("/label", data={"item_id": item, "choice": choice, "note": note, "csrf": csrf})
        assert r.status_code == 303
        html = bob.get("/label").text
        assert f"Saved: item {item}" in html
    assert len(set(seen)) == 6 and 7 not in seen  # each best_of_4 item once; never the scalar_rating item
    assert "Nothing left to label" in html and 'id="remaining-count">0<' in html
    assert re.search(r'id="done-count">4</b> labeled · 1 skipped · 1 flagged', html)
    with LabelStore(db) as store:
        assert store.counts_by_labeler()["bob"] == {"label": 4, "skip": 1, "flag": 1}
        note = store.connection().execute("SELECT note FROM labels WHERE kind = 'flag'").fetchone()[0]
        assert note == "gibberish <b>"


def test_labelers_get_different_items_and_the_same_one_on_reload(app, tokens):
    bob, alice = sign_in(app, tokens["bob"]), sign_in(app, tokens["alice"])
    b, a = page(bob)[0], page(alice)[0]
    assert a != b and page(bob)[0] == b and page(alice)[0] == a


def test_an_expired_lease_frees_the_item_for_others_but_stays_answerable(db, tokens):
    import time

    app = create_app(db, lease_seconds=0.3)
    bob, alice = sign_in(app, tokens["bob"]), sign_in(app, tokens["alice"])
    item, csrf = page(bob)
    assert page(alice)[0] != item  # leased to bob
    time.sleep(0.4)
    assert page(alice)[0] != item  # alice keeps her own item; a newcomer may now get bob's
    with LabelStore(db) as store:
        carol = sign_in(app, store.add_labeler("carol"))
    assert page(carol)[0] == item
    assert bob.post("/label", data={"item_id": item, "choice": "1", "csrf": csrf}).status_code == 303
    assert page(bob)[0] != item


def test_sign_out_and_revoking_a_token_end_the_session(app, db, tokens):
    bob, alice = sign_in(app, tokens["bob"]), sign_in(app, tokens["alice"])
    cookie = bob.cookies[session_cookie(db)]
    assert bob.post("/logout", data={"csrf": page(bob)[1]}).status_code == 303
    bob.cookies.set(session_cookie(db), cookie)  # an old cookie is worth nothing
    assert bob.get("/label").headers["location"] == "/login"
    assert main(["labelers", "revoke", "alice", "--db", str(db)]) == 0
    assert alice.get("/label").headers["location"] == "/login"
    client = TestClient(app, follow_redirects=False)
    form = {"token": tokens["alice"], "csrf": csrf_of(client.get("/login").text)}
    assert client.post("/login", data=form).status_code == 401


def test_admin_page_shows_counts_throughput_and_agreement(app, db, tokens):
    with LabelStore(db) as store:
        for item, (a, b) in zip(range(2, 6), [(0, 0), (1, 1), (2, 3), (3, 3)], strict=True):
            store.add_label(item, "carol", best=a)
            store.add_label(item, "dave", best=b)
        store.add_label(2, "erin", kind="flag", note="<b>broken</b>")
        # carol labeled at 20 s intervals an hour ago-ish: 4 labels, 60 s active, so 240 labels per active hour
        t0 = store.connection().execute("SELECT MIN(created) FROM labels").fetchone()[0] - 7200
        ids = [r[0] for r in store.connection().execute(
            "SELECT l.id FROM labels l JOIN labelers b ON b.id = l.labeler_id WHERE b.name = 'carol' ORDER BY l.id")]
        with store.transaction():
            for k, lid in enumerate(ids):
                store.connection().execute("UPDATE labels SET created = ? WHERE id = ?", (t0 + 20 * k, lid))
    html = sign_in(app, tokens["alice"]).get("/admin").text
    assert 'id="agreement">75%<' in html and "over 4 items" in html and "Chance is 25%" in html
    assert 'id="labels-total">8<' in html and 'id="labels-hour">4<' in html
    assert 'id="pending">3<' in html  # items 1, 6 and the scalar_rating one
    row = re.search(r"<td>carol <span class=\"tag muted\">no token(.*?)</tr>", html, re.S).group(1)
    cells = re.findall(r'<td class="num">(.*?)</td>', row)
    assert cells == ["4", "0", "0", "0", "4", "240", "20 s"]  # labels skips flags, last hour/day, rate, median
    assert "38%" in html
    assert "<td>&lt;b&gt;broken&lt;/b&gt;</td>" in html  # the flag's note, escaped


@pytest.mark.parametrize("fmt", ["comparisons", "pairs", "openai"])
def test_export_downloads_parse_back(app, db, tokens, tmp_path, fmt):
    bob = sign_in(app, tokens["bob"])
    answers = {}
    for choice in ("1", "3", "skip"):
        html = bob.get("/label").text
        item, csrf = item_of(html), csrf_of(html)
        bob.post("/label", data={"item_id": item, "choice": choice, "csrf": csrf})
        answers[item] = shown(html)[int(choice)] if choice != "skip" else None
    r = sign_in(app, tokens["alice"]).get(f"/admin/export?format={fmt}")
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    if fmt == "openai":
        rows = json.loads(r.text)
        with LabelStore(db) as store:
            bests = sorted(e.best for e in store.labeled_examples())
        assert sorted(row["best"] for row in rows) == bests and all(len(row) == 6 for row in rows)
        return
    path = tmp_path / f"export.{fmt}.jsonl"
    path.write_bytes(r.content)
    with LabelStore(tmp_path / "back.sqlite") as back:
        assert import_file(back, path, format=fmt).rows == 2
        examples = back.labeled_examples("best_of_4" if fmt == "comparisons" else "best_of_2")
    assert {e.samples[e.best] for e in examples} == {text for text in answers.values() if text is not None}
    if fmt == "comparisons":
        assert XSS in examples[0].query and {e.labeler for e in examples} == {"bob"}


def test_export_rejects_unknown_format_and_label_type(app, tokens):
    alice = sign_in(app, tokens["alice"])
    assert alice.get("/admin/export?format=csv").status_code == 422
    assert alice.get("/admin/export?format=pairs&label_type=best_of_9").status_code == 422


def test_a_foreign_host_header_is_refused_when_hosts_are_pinned(db, tokens):
    app = create_app(db, allowed_hosts=["127.0.0.1", "localhost"])
    assert TestClient(app, base_url="http://127.0.0.1:8000").get("/login").status_code == 200
    r = TestClient(app, base_url="http://rebound.example:8000").get("/login")
    assert r.status_code == 400 and r.headers["x-frame-options"] == "DENY"


def test_task_instructions(db, tokens):
    assert "vividly descriptive" in sign_in(create_app(db, "descriptiveness"), tokens["bob"]).get("/label").text
    assert "Which summary is the best?" in sign_in(create_app(db, "summarize"), tokens["bob"]).get("/label").text
    with pytest.raises(ValueError, match="task='poetry'"):
        create_app(db, "poetry")


def test_labelers_and_serve_commands(tmp_path, capsys):
    db = str(tmp_path / "cli.sqlite")
    assert main(["labelers", "add", "zoe", "--admin", "--db", db]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    assert len(token) >= 40 and "\n" not in token and "admin 'zoe'" in err
    with LabelStore(db) as store:
        assert store.labeler_for_token(token).is_admin
    assert main(["labelers", "add", "zoe", "--db", db]) == 2
    assert "labelers revoke zoe" in capsys.readouterr().err
    assert main(["labelers", "list", "--db", db]) == 0
    assert re.search(r"zoe\s+admin\s+yes\s+0", capsys.readouterr().out)
    assert main(["labelers", "revoke", "nobody", "--db", db]) == 2
    assert main(["labelers", "list", "--db", str(tmp_path / "missing.sqlite")]) == 2
    assert main(["serve", "--db", str(tmp_path / "missing.sqlite")]) == 2
    assert "does not exist" in capsys.readouterr().err
    for bad in (["--gold-rate", "1.5"], ["--overlap", "-0.1"], ["--overlap-k", "1"], ["--undo-seconds", "nan"]):
        assert main(["serve", "--db", db, *bad]) == 2
        err = capsys.readouterr().err
        assert bad[0] in err and len(err.strip().splitlines()) == 1, err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(["serve", "--db", db, "--port", str(busy.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1" in err and len(err.strip().splitlines()) == 1


def test_serve_on_an_address_of_another_machine_says_to_fix_the_host_not_the_port(tmp_path, capsys):
    db = str(tmp_path / "cli.sqlite")
    assert main(["labelers", "add", "zoe", "--db", db]) == 0
    capsys.readouterr()
    assert main(["serve", "--db", db, "--host", "192.0.2.1", "--port", "0"]) == 2  # TEST-NET-1: no one's address
    err = capsys.readouterr().err
    assert err.startswith("lmprefs serve: error: cannot listen on 192.0.2.1:0 (") and len(err.splitlines()) == 1
    assert "--host must be an address of this machine" in err and "--port" not in err, err
