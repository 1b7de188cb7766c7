"""Who an HTTP request runs as, and which requests are refused before any route sees them:
the ACL user from the Authorization header (``request_user``), requests a browser sent from
another site (``cross_site``), and a browser's state-changing requests without the dashboard's
CSRF token (``CsrfTokens``). ``Auth`` wraps the HTTP API's application (node/http_api.py) with
these checks; docs/security.md is the user's reference."""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from broker.acl import User
from broker.acl_users import Users


def _refusal(status: int, text: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": text}, status_code=status, headers=headers)


def request_user(headers: list[tuple[bytes, bytes]], users: Users) -> User | None:
    """The ACL user a request runs as (RESP's AUTH, docs/security.md), or None (401): Basic
    ``user:password`` (a name that is no user: the default user's password, as before ACL
    users), Bearer the default user's password, nothing the default user when it needs no
    password. Header names in lower case."""
    for key, value in headers:
        if key != b"authorization":
            continue
        kind, _, cred = value.decode("latin-1").partition(" ")
        if kind.lower() == "bearer":
            return users.login("default", cred.strip().encode())
        if kind.lower() == "basic":
            try:
                decoded = base64.b64decode(cred.strip(), validate=True).decode("utf-8")
            except ValueError:  # not base64 (a non-ASCII byte too), or not UTF-8
                return None
            name, _, password = decoded.partition(":")
            return users.login(name if name in users.users else "default", password.encode())
        return None
    return None if users.auth_required else users.default


def cross_site(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a browser sent this request from another site (the dashboard's buttons are
    same-origin ``fetch`` calls): ``Sec-Fetch-Site: cross-site``, or an ``Origin`` whose host
    is not the request's ``Host``. Clients that are not browsers send neither. A page of
    another site cannot so make a logged-in operator's browser redrive, delete or publish."""
    origin = host = b""
    for key, value in headers:
        if key == b"sec-fetch-site" and value == b"cross-site":
            return True
        if key == b"origin":
            origin = value
        elif key == b"host":
            host = value
    if not origin:
        return False
    return origin == b"null" or origin.partition(b"://")[2].rstrip(b"/") != host


def from_browser(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a browser sent the request: browsers add ``Sec-Fetch-Site`` (and ``Origin``
    to a POST or DELETE); curl and programs send neither."""
    return any(key in (b"sec-fetch-site", b"origin") for key, _ in headers)


#: The header the dashboard's buttons carry their token in.
CSRF_HEADER: Final = b"x-csrf-token"


class CsrfTokens:
    """The token a browser's state-changing request must carry: an HMAC of the user's name
    under a key made at start, which the dashboard's pages embed for the user who loaded them.
    A page of another site can neither read it (the same-origin policy) nor compute it, so
    even a request the browser does not mark as cross-site cannot act for the operator. A
    restart makes a new key: a page loaded before it must be reloaded."""

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key if key is not None else secrets.token_bytes(32)

    def token(self, user: User) -> str:
        name = user.name.encode("utf-8", "surrogateescape")
        return hmac.new(self.key, name, hashlib.sha256).hexdigest()

    def valid(self, user: User, headers: list[tuple[bytes, bytes]]) -> bool:
        expected = self.token(user).encode()
        return any(key == CSRF_HEADER and hmac.compare_digest(value, expected)
                   for key, value in headers)


# The user of the request being served (set by ``Auth``, read by the HTTP API's ``Bridge``): each request
# runs in its own task, and a task has its own context.
REQUEST_USER: Final[contextvars.ContextVar[User | None]] = contextvars.ContextVar(
    "request_user", default=None)


class Auth:
    """Every route but /openapi.json runs as the request's ACL user (``request_user``); 401
    without one. A refused request's body is read before the refusal (``drain``: hypercorn
    would otherwise close a keep-alive connection under the client's next request)."""

    def __init__(self, app: ASGIApp, users: Users, csrf: CsrfTokens,
                 drain: Callable[[Receive], Awaitable[None]]) -> None:
        self.app, self.users, self.csrf, self.drain = app, users, csrf, drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/openapi.json":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", [])
        if scope.get("method") not in ("GET", "HEAD") and cross_site(headers):
            await self.drain(receive)
            await _refusal(403, "cross-site request refused")(scope, receive, send)
            return
        user = request_user(headers, self.users)
        if user is None:
            await self.drain(receive)
            response = _refusal(401, "authentication required", {
                "WWW-Authenticate": 'Basic realm="trisque", Bearer realm="trisque"'})
            await response(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD") and from_browser(headers) \
                and not self.csrf.valid(user, headers):
            await self.drain(receive)
            response = _refusal(403, "CSRF token missing or wrong: reload the dashboard page")
            await response(scope, receive, send)
            return
        token = REQUEST_USER.set(user)
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_USER.reset(token)
