"""Sign-in sessions, CSRF checks, the FastAPI dependencies that enforce them (`signed_in`, `admin`, `csrf_checked`)
and the security headers of the labeling app.

Sessions live in server memory: the cookie carries only a random session id (HttpOnly, SameSite=Strict), never the
labeler's token, and a restart signs everyone out (they sign in again with their token). Each session remembers the
sha256 of the token it was opened with and the id of the store that issued it, and every request re-reads the labeler
row, so `lmprefs labelers revoke` ends the labeler's open sessions at once and admin rights are never stale.

Cookies are per server: browsers scope cookies by host, not port, so every server on one host would otherwise share
one cookie (two lmprefs servers would sign each other out, and a page on another local port could plant a session).
The cookie name carries a hash of this store's id and the listening port, and the `__Host-` prefix under HTTPS (the
browser then refuses the cookie from plain http or with a Domain). Wrong tokens are throttled per address and per
token prefix; a right token always gets in. The address is the connection's: `X-Forwarded-For` and
`X-Forwarded-Proto` are read only from a proxy the admin named (`lmprefs serve --trusted-proxy`, see live.py).

CSRF: every POST carries the session's CSRF token (hidden form field or `X-CSRF-Token` header), compared in constant
time; the sign-in form, which has no session yet, uses a double-submit cookie instead. On top of that the session
cookie is SameSite=Strict and a POST whose `Origin` or `Sec-Fetch-Site` says it came from another site is refused
with 403. A forged POST arrives without the session cookie (SameSite keeps it back), so it is refused as a forgery,
never answered as if the victim's session had ended: their session stays open.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Form, Header, HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "lmprefs_session"  # the cookie names' stem; see cookie_name()
LOGIN_COOKIE = "lmprefs_login"  # double-submit CSRF token of the sign-in form
MAX_BODY = 64 * 1024  # a judgement is a few hundred bytes; anything bigger is not ours
MAX_API_BODY = 4 * 1024 * 1024  # POST /api/items: up to 1000 questions per call
MAX_FAILURES, FAILURE_WINDOW = 5, 60.0  # wrong tokens per address or token prefix per window before 429
TOKEN_PREFIX = 8  # wrong tokens that start alike count together, from any address

# no inline script or style anywhere, so the policy can forbid both
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    # not "no-referrer": with it Chrome sends `Origin: null` on our own form posts, which cross_site() refuses
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


def same(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    return hmac.compare_digest(a.encode(), b.encode())


def server_cookie(stem: str, store_id: str, port: int, https: bool = False) -> str:
    """The name of cookie `stem` for the server of store `store_id` listening on `port`."""
    tag = hashlib.sha256(f"{store_id}:{port}".encode()).hexdigest()[:12]
    return f"{'__Host-' if https else ''}{stem}_{tag}"


def cookie_name(request: Request, stem: str) -> str:
    """This server's name for cookie `stem`: the stem, a hash of the store's id and the listening port, and the
    `__Host-` prefix under HTTPS."""
    port = (request.scope.get("server") or ("", 0))[1]
    return server_cookie(stem, request.app.state.lmprefs.store.store_id, port, request.url.scheme == "https")


@dataclass
class Session:
    sid: str
    labeler_id: int
    token_hash: str
    csrf: str
    created: float
    seen: float
    store_id: str = ""  # the store that issued it: a session from another store is refused
    flash: str | None = field(default=None)  # one-line message for the next page ("Saved: ...")
    feedback: dict | None = field(default=None)  # onboarding: the right answer to the last practice question


class Sessions:
    """Session id -> Session, thread-safe. Sessions end after `idle` seconds unused or `max_age` in all."""

    def __init__(self, idle: float = 8 * 3600, max_age: float = 24 * 3600) -> None:
        self.idle, self.max_age = idle, max_age
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, labeler_id: int, token_sha: str, store_id: str = "") -> Session:
        now = time.time()
        s = Session(secrets.token_urlsafe(32), labeler_id, token_sha, secrets.token_urlsafe(32), now, now, store_id)
        with self._lock:
            # drop expired sessions here, so memory stays bounded without a sweeper thread
            self._by_id = {k: v for k, v in self._by_id.items() if self._alive(v, now)}
            self._by_id[s.sid] = s
        return s

    def _alive(self, s: Session, now: float) -> bool:
        return now - s.seen < self.idle and now - s.created < self.max_age

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        now = time.time()
        with self._lock:
            s = self._by_id.get(sid)
            if s is None or not self._alive(s, now):
                self._by_id.pop(sid, None)
                return None
            s.seen = now
            return s

    def close(self, sid: str | None) -> None:
        with self._lock:
            self._by_id.pop(sid or "", None)


class Throttle:
    """Wrong tokens, counted per key (the client's address, the first characters of the token tried): once a key has
    `max_failures` wrong tokens in `window` seconds, its next wrong tokens are answered 429 until the oldest failure
    leaves the window. Only wrong tokens are counted and refused, never a right one: labelers behind one NAT or proxy,
    or an admin's training client beside them, keep signing in while someone there types wrong tokens (a token has
    256 random bits, so the 429 is a signal to stop, not the guard against guessing). Thread-safe; memory is bounded
    by pruning stale keys."""

    def __init__(self, max_failures: int = MAX_FAILURES, window: float = FAILURE_WINDOW) -> None:
        self.max_failures, self.window = max_failures, window
        self._failures: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def failed(self, keys: list[str]) -> float:
        """Count one wrong token against each of `keys`. Returns the seconds to wait before trying again if a key
        was already at the limit (answer 429), else 0 (answer 401)."""
        now, wait = time.time(), 0.0
        with self._lock:
            if len(self._failures) > 10_000:
                self._failures = {k: v for k, v in self._failures.items() if now - v[-1] < self.window}
            for key in keys:
                recent = [t for t in self._failures.get(key, []) if now - t < self.window]
                if len(recent) >= self.max_failures:
                    wait = max(wait, recent[0] + self.window - now)
                self._failures[key] = (recent + [now])[-self.max_failures :]
        return wait


def failure_keys(request: Request, token: str) -> list[str]:
    """What a wrong token counts against: the client's address (the connection's, or the one a proxy the admin
    trusts reports) and, for a token of some length, its first characters."""
    keys = [f"address:{client_of(request)}"]
    if len(token) >= TOKEN_PREFIX:
        keys.append(f"token:{token[:TOKEN_PREFIX]}")
    return keys


def too_many(wait: float) -> tuple[str, dict[str, str]]:
    """The 429's message and headers for a client that must wait `wait` seconds."""
    seconds = max(1, math.ceil(wait))
    return f"Too many wrong tokens; try again in {seconds} s.", {"Retry-After": str(seconds)}


def client_of(request: Request) -> str:
    return request.client.host if request.client else "?"


CROSS_SITE = ("This request came from another site, so it was refused and nothing was saved. If you are signed in "
              "here, you still are: open the labeling page and go on.")


def cross_site(request: Request) -> bool:
    """True when the browser tells us this request came from another site (a forged form post)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != request.headers.get("host")


def set_cookie(response, request: Request, stem: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(
        cookie_name(request, stem),
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",  # plain http on loopback is the default; https behind a proxy
    )


def delete_cookie(response, request: Request, stem: str) -> None:
    response.delete_cookie(
        cookie_name(request, stem), path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )


@dataclass(frozen=True)
class Caller:
    """Who sent a request; the API's callers (admins' bearer tokens) have no session, so they are only this."""

    id: int
    name: str
    is_admin: bool


@dataclass(frozen=True)
class User(Caller):
    """A labeler signed in to the web pages, with their session (its CSRF token and flash message)."""

    session: Session


class NotSignedIn(Exception):
    """No valid session: pages redirect to /login, POSTs get 401 (see app.py)."""


# -- FastAPI dependencies: the app keeps its store and sessions in app.state.lmprefs ------------------------------


def signed_in(request: Request) -> User:
    st = request.app.state.lmprefs
    session = st.sessions.get(request.cookies.get(cookie_name(request, SESSION_COOKIE)))
    if session is None or session.store_id != st.store.store_id:
        raise NotSignedIn
    # re-read the labeler each time: a revoked token or a changed admin flag takes effect at once
    labeler = st.store.labeler_for_session(session.labeler_id, session.token_hash)
    if labeler is None:
        st.sessions.close(session.sid)
        raise NotSignedIn
    return User(labeler.id, labeler.name, labeler.is_admin, session)


def admin(user: Annotated[User, Depends(signed_in)]) -> User:
    if not user.is_admin:
        raise HTTPException(403, "This page is for admins only.")
    return user


def csrf_checked(
    request: Request,
    user: Annotated[User, Depends(signed_in)],
    csrf: Annotated[str, Form(max_length=100)] = "",
    x_csrf_token: Annotated[str | None, Header(max_length=100)] = None,
) -> User:
    """A signed-in user whose POST carries their session's CSRF token and did not come from another site."""
    if cross_site(request) or not same(csrf or x_csrf_token, user.session.csrf):
        raise HTTPException(403, "This form is out of date or came from another site. Reload the page and try again.")
    return user


class SecurityMiddleware:
    """Adds the security headers to every response, `Cache-Control: no-store` to pages (they hold CSRF tokens and
    labelers' progress), and refuses request bodies over MAX_BODY (MAX_API_BODY under /api/) with 413 (as JSON under
    /api/, like the API's other errors). The body is read here in full before the app sees it (it is small): a
    chunked body has no content-length to check up front, and an error raised mid-parse would reach the app's form
    parser, which answers 400. A HEAD request gets the GET response's status and headers without its body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = scope["path"].startswith("/api/")
        limit = MAX_API_BODY if api else MAX_BODY
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await self._too_large(send, limit, api)
            return
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            seen += len(message.get("body", b""))
            if seen > limit:
                await self._too_large(send, limit, api)
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body_sent = False

        async def replay() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", [])) + HEADERS
                if not scope["path"].startswith("/static/"):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and scope["method"] == "HEAD":
                message = {**message, "body": b""}
            await send(message)

        await self.app(scope, replay, send_with_headers)

    @staticmethod
    async def _too_large(send: Send, limit: int, api: bool) -> None:
        text = f"request body too large (at most {limit // 1024} KiB)"
        if api:
            body, kind = json.dumps({"detail": text}).encode(), b"application/json"
        else:
            body, kind = text.encode(), b"text/plain; charset=utf-8"
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers + HEADERS})
        await send({"type": "http.response.body", "body": body})
