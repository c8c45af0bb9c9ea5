"""The JSON API's OpenAPI schema tells a generated client what it needs: the bearer scheme (so the client sends the
token) and every error a call can answer, with the body it really has. Real error responses, provoked one by one,
must validate against the schema's documented response for their status."""

from __future__ import annotations

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from lmprefs.labels.store import LabelStore
from lmprefs.server.app import create_app
from lmprefs.server.security import MAX_API_BODY


@pytest.fixture
def setup(tmp_path):
    path = tmp_path / "labels.sqlite"
    with LabelStore(path) as store:
        store.add_item("q", [f" s{j}" for j in range(4)], source="t")
        tokens = {"alice": store.add_labeler("alice", admin=True), "bob": store.add_labeler("bob")}
    return create_app(path), tokens


def test_a_label_id_out_of_range_is_422_with_a_clear_message(setup):
    app, tokens = setup
    api = TestClient(app, headers={"Authorization": f"Bearer {tokens['alice']}"})
    r = api.get("/api/labels", params={"since_id": 2**63})
    assert r.status_code == 422 and "since_id" in r.json()["detail"] and str(2**63 - 1) in r.json()["detail"]
    r = api.get("/api/labels", params={"since_id": 2**63 - 1})
    assert r.status_code == 200 and r.json() == {"labels": [], "next_since_id": 2**63 - 1}


def test_the_schema_names_the_bearer_scheme_and_real_error_bodies_match_it(setup):
    app, tokens = setup
    schema = TestClient(app).get("/api/openapi.json").json()
    assert schema["components"]["securitySchemes"] == {
        "bearer": {"type": "http", "scheme": "bearer", "description": schema["components"]["securitySchemes"]
                   ["bearer"]["description"]}}  # fmt: skip
    operations = [(path, m, op) for path, ops in schema["paths"].items() for m, op in ops.items()]
    assert {(path, m) for path, m, _ in operations} == {("/api/me", "get"), ("/api/items", "post"),
        ("/api/items/{item_id}", "get"), ("/api/labels", "get"), ("/api/quality", "get")}  # fmt: skip
    for path, _, op in operations:
        assert op["security"] == [{"bearer": []}], path
        assert {"401", "403", "429"} <= set(op["responses"]), path

    def as_(name):
        return {"Authorization": f"Bearer {tokens[name]}"} if name in tokens else {"Authorization": name}

    huge = json.dumps({"items": [{"query": "q" * 20_000, "samples": ["a"] * 4}] * (MAX_API_BODY // 20_000 + 1)})
    provoked = [  # (documented path, method, request, expected status)
        ("/api/me", "get", {"url": "/api/me"}, 401),
        ("/api/me", "get", {"url": "/api/me", "headers": as_("Bearer wrong")}, 401),
        ("/api/quality", "get", {"url": "/api/quality", "headers": as_("bob")}, 403),
        ("/api/items/{item_id}", "get", {"url": "/api/items/99", "headers": as_("alice")}, 404),
        ("/api/items/{item_id}", "get", {"url": "/api/items/0", "headers": as_("alice")}, 422),
        ("/api/me", "get", {"url": "/api/me?verbose=1", "headers": as_("alice")}, 422),  # a parameter it does not take
        ("/api/quality", "get", {"url": "/api/quality?since_id=1", "headers": as_("alice")}, 422),
        ("/api/labels", "get", {"url": f"/api/labels?since_id={2**63}", "headers": as_("alice")}, 422),
        ("/api/labels", "get", {"url": "/api/labels?label_type=best_of_x", "headers": as_("alice")}, 422),
        ("/api/items", "post", {"url": "/api/items", "headers": as_("alice"), "json": {"items": [{"query": 1}]}}, 422),
        ("/api/items", "post", {"url": "/api/items", "headers": as_("alice"),
                                "json": {"items": [{"query": "q", "samples": ["a"]}]}}, 422),  # fmt: skip
        ("/api/items", "post", {"url": "/api/items", "headers": {**as_("alice"), "content-type": "application/json"},
                                "content": huge}, 413),  # fmt: skip
        ("/api/items", "post", {"url": "/api/items", "headers": {**as_("alice"), "content-type": "text/plain"},
                                "content": b'{"items": []}'}, 415),  # fmt: skip
        ("/api/items", "post", {"url": "/api/items", "headers": {**as_("alice"), "content-type": "application/json"},
                                "content": b'{"items": [{"query": "\xff"}]}'}, 422),  # fmt: skip
    ]
    client = TestClient(app)
    responses = [(path, method, client.request(method.upper(), **request), status)
                 for path, method, request, status in provoked]  # fmt: skip
    for k in range(6):  # wrong tokens until the address must wait
        r = client.get("/api/quality", headers=as_(f"Bearer wrong{k}"))
    responses.append(("/api/quality", "get", r, 429))
    for path, method, r, status in responses:
        assert r.status_code == status, (path, r.status_code, r.text)
        documented = schema["paths"][path][method]["responses"][str(status)]
        assert r.headers["content-type"] == "application/json", (path, status)
        body_schema = {**documented["content"]["application/json"]["schema"], "components": schema["components"]}
        jsonschema.Draft202012Validator(body_schema).validate(r.json())
        for header in documented.get("headers", {}):
            assert int(r.headers[header]) >= 1, (path, status, header)
