"""Sign-in sessions, CSRF checks, the FastAPI dependencies that enforce them (`signed_in`, `admin`, `csrf_checked`)
and the security headers of the labeling app.

Sessions live in server memory: the cookie carries only a random session id (HttpOnly, SameSite=Strict), never the
labeler's token, and a restart signs everyone out (they sign in again with their token). Each session remembers the
sha256 of the token it was opened with, and every request re-reads the labeler row, so `lmprefs labelers revoke`
ends the labeler's open sessions at once and admin rights are never stale.

CSRF: every POST carries the session's CSRF token (hidden form field or `X-CSRF-Token` header), compared in constant
time; the sign-in form, which has no session yet, uses a double-submit cookie instead. On top of that the session
cookie is SameSite=Strict and a POST whose `Origin` or `Sec-Fetch-Site` says it came from another site is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Form, Header, HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SESSION_COOKIE = "lmprefs_session"
LOGIN_COOKIE = "lmprefs_login"  # double-submit CSRF token of the sign-in form
MAX_BODY = 64 * 1024  # a judgement is a few hundred bytes; anything bigger is not ours

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


def token_hash(token: str) -> str:
    """The store's hash of a sign-in token (LabelStore keeps only this)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def same(a: str | None, b: str | None) -> bool:
    return bool(a) and bool(b) and hmac.compare_digest(a.encode(), b.encode())


@dataclass
class Session:
    sid: str
    labeler_id: int
    token_hash: str
    csrf: str
    created: float
    seen: float
    flash: str | None = field(default=None)  # one-line message for the next page ("Saved: ...")


class Sessions:
    """Session id -> Session, thread-safe. Sessions end after `idle` seconds unused or `max_age` in all."""

    def __init__(self, idle: float = 8 * 3600, max_age: float = 24 * 3600) -> None:
        self.idle, self.max_age = idle, max_age
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, labeler_id: int, token_sha: str) -> Session:
        now = time.time()
        s = Session(secrets.token_urlsafe(32), labeler_id, token_sha, secrets.token_urlsafe(32), now, now)
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


def cross_site(request: Request) -> bool:
    """True when the browser tells us this request came from another site (a forged form post)."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return True
    origin = request.headers.get("origin")
    return origin is not None and urlsplit(origin).netloc != request.headers.get("host")


def set_cookie(response, request: Request, name: str, value: str, max_age: int | None = None) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",  # plain http on loopback is the default; https behind a proxy
    )


@dataclass(frozen=True)
class User:
    id: int
    name: str
    is_admin: bool
    session: Session


class NotSignedIn(Exception):
    """No valid session: pages redirect to /login, POSTs get 401 (see app.py)."""


# -- FastAPI dependencies: the app keeps its store and sessions in app.state.lmprefs ------------------------------


def signed_in(request: Request) -> User:
    st = request.app.state.lmprefs
    session = st.sessions.get(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise NotSignedIn
    # re-read the labeler each time: a revoked token or a changed admin flag takes effect at once
    sql = "SELECT name, is_admin FROM labelers WHERE id = ? AND token_hash = ?"
    row = st.store.connection().execute(sql, (session.labeler_id, session.token_hash)).fetchone()
    if row is None:
        st.sessions.close(session.sid)
        raise NotSignedIn
    return User(session.labeler_id, row[0], bool(row[1]), session)


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


class _TooLarge(Exception):
    pass


class SecurityMiddleware:
    """Adds the security headers to every response, `Cache-Control: no-store` to pages (they hold CSRF tokens and
    labelers' progress), and refuses request bodies over MAX_BODY with 413."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            await self._reply(send, 413, b"request body too large")
            return
        seen, started = 0, False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY:  # chunked bodies have no content-length to check up front
                raise _TooLarge
            return message

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = list(message.get("headers", [])) + HEADERS
                if not scope["path"].startswith("/static/"):
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, limited_receive, send_with_headers)
        except _TooLarge:
            if started:
                raise
            await self._reply(send, 413, b"request body too large")

    @staticmethod
    async def _reply(send: Send, status: int, body: bytes) -> None:
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers + HEADERS})
        await send({"type": "http.response.body", "body": body})
