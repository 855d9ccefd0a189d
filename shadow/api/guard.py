"""What the service refuses before any route runs, and why: one rule per path.

- A ``Host`` header not among the names the service answers to (400): a web page whose name was
  re-pointed at 127.0.0.1 (DNS rebinding) sends its own name and is turned away.
- With a token set (401 without it):
  - the shadow's own paths (every path of ``shadow serve``; on ``shadow proxy`` those under
    ``/v1/conductor/shadow``, ``/v1/conductor/proxy`` and ``/schema``) take
    ``Authorization: Bearer <token>`` or ``X-Shadow-Token: <token>``;
  - the paths ``shadow proxy`` forwards take ``X-Shadow-Token`` only: there ``Authorization`` is the
    engine's, passed on untouched;
  - the page's cookie (``shadow_token``: HttpOnly, SameSite=Strict, set by the server when the page's
    form is posted to ``/v1/conductor/shadow/token``) counts only on the GETs the page makes itself
    (``PAGE_READS``), since a browser's ``EventSource`` cannot send a header. The proxy strips it
    before forwarding anything.
- An ``Origin`` header not in ``QWEN38_SHADOW_ALLOWED_ORIGINS`` (403): browsers send one with every
  cross-site POST, hosts (httpx, the engine) send none, so a page the user opens cannot feed, hold
  or overwrite sessions. The page's own form post comes from the page's origin, which passes.
- A body that is not ``application/json`` (415): a browser sends ``text/plain`` forms cross-site
  without asking first; JSON it must ask for (CORS preflight), and the preflight is refused above.
  The one form this service takes is the page's token form, same-origin only.

Every answer of the app behind the guard carries ``X-Content-Type-Options: nosniff``,
``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer`` and a Content-Security-Policy that
lets the page run only its own script and style (``/schema``'s Swagger UI excepted from the CSP).
Each refusal is a ``Problem`` like every other error.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec

from shadow.core.settings import ShadowSettings

from .operators import ASSET_PATHS, LOGIN_PATH, OPERATOR_PATHS, PAGE_PATHS, PAGE_READS, TOKEN_COOKIE
from .paths import BASE
from .responses import Problem
from .server import is_loopback

BODY_METHODS = {b"POST", b"PUT", b"PATCH"}
TOKEN_HEADER = b"x-shadow-token"
PROXY_OWN = (BASE, "/v1/conductor/proxy", "/schema")  # the proxy's own paths: never forwarded to the engine
CSP = (b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer")]


def _host_name(value: str) -> str:
    """``[::1]:8011`` -> ``::1``; ``localhost:8011`` -> ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _headers(scope: Any) -> dict[bytes, bytes]:
    headers: dict[bytes, bytes] = {}
    for k, v in scope.get("headers", []):
        headers.setdefault(k.lower(), v)
    return headers


def cookie_value(header: bytes) -> bytes:
    """The page's token cookie in a ``Cookie`` header, or b""."""
    for part in header.split(b";"):
        name, _, value = part.strip().partition(b"=")
        if name == TOKEN_COOKIE.encode():
            return unquote(value.decode("latin-1")).encode("latin-1", "replace")
    return b""


def without_cookie(header: bytes) -> bytes:
    """A ``Cookie`` header less the page's token cookie (the other cookies stay as they were)."""
    parts = [p.strip() for p in header.split(b";") if p.strip()]
    return b"; ".join(p for p in parts if p.partition(b"=")[0] != TOKEN_COOKIE.encode())


class Guard:
    """ASGI middleware in front of the Litestar app (lifespan and websockets pass through).
    ``own``: the path prefixes that are the shadow's own; None (``shadow serve``): every path."""

    def __init__(self, app: Any, settings: ShadowSettings, own: tuple[str, ...] | None = None) -> None:
        self.app = app
        self.own = own
        self.hosts = settings.hosts
        self.origins = settings.origins
        self.token = settings.token.encode()
        self.metrics_public = settings.metrics_public

    def _own(self, path: str) -> bool:
        return self.own is None or path.startswith(self.own)

    def _exempt(self, scope: Any) -> bool:
        """Open without the token: the live page and its script and style (they hold no data: the
        page asks for the token), and with ``METRICS_PUBLIC`` the operators' paths for a client on
        loopback."""
        if scope.get("method") not in ("GET", "HEAD"):
            return False
        path = scope.get("path", "")
        if path in PAGE_PATHS or path in ASSET_PATHS:
            return True
        client = scope.get("client") or ("",)
        return self.metrics_public and path in OPERATOR_PATHS and is_loopback(str(client[0]))

    @staticmethod
    def _login(scope: Any, headers: dict[bytes, bytes]) -> bool:
        """The page's token form: a same-origin form POST to ``LOGIN_PATH``."""
        if scope.get("method") != "POST" or scope.get("path") != LOGIN_PATH:
            return False
        ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        origin = headers.get(b"origin")
        # the page's own post: under its Referrer-Policy no-referrer a browser sends ``Origin: null``,
        # and says where the request comes from in ``Sec-Fetch-Site``
        host = headers.get(b"host", b"").decode("latin-1").lower()
        same = (origin is None or headers.get(b"sec-fetch-site") == b"same-origin"
                or urlsplit(origin.decode("latin-1")).netloc.lower() == host)
        return ctype == b"application/x-www-form-urlencoded" and same

    def refusal(self, scope: Any) -> tuple[int, str] | None:
        headers = _headers(scope)
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if "*" not in self.hosts and host not in self.hosts:
            return 400, (f"Host {host!r} is not one this service answers to ({', '.join(sorted(self.hosts))}; "
                         "QWEN38_SHADOW_ALLOWED_HOSTS adds names)")
        if self._login(scope, headers):
            return None  # the form holds the token, checked by its route (``page.PageController.login``)
        if self.token and not self._exempt(scope) and (refused := self._token(headers, scope)) is not None:
            return 401, refused
        origin = headers.get(b"origin")
        if origin is not None:
            o = origin.decode("latin-1").strip().rstrip("/").lower()
            if o not in self.origins:
                return 403, (f"requests from the browser origin {o!r} are refused "
                             "(QWEN38_SHADOW_ALLOWED_ORIGINS allows origins)")
        if scope.get("method", "").encode() in BODY_METHODS:
            ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if ctype != b"application/json":
                shown = ctype.decode("latin-1") or "none"
                return 415, f"the body must be application/json (Content-Type: {shown})"
        return None

    def _token(self, headers: dict[bytes, bytes], scope: Any) -> str | None:
        """Why the request's token is refused, or None."""
        path = scope.get("path", "")
        own, what = headers.get(TOKEN_HEADER), "X-Shadow-Token"
        if own is None and b"authorization" not in headers and scope.get("method") in ("GET", "HEAD") \
                and path in PAGE_READS:  # a cross-site page never gets a SameSite cookie
            own, what = cookie_value(headers.get(b"cookie", b"")) or None, "token cookie (post the page's form again)"
        if own is not None:
            return None if hmac.compare_digest(own.strip(), self.token) else f"a wrong {what}"
        if not self._own(path):  # forwarded to the engine: Authorization is the engine's
            return ("no X-Shadow-Token: the proxy forwards this path to the engine, so it takes the token as "
                    "X-Shadow-Token: <QWEN38_SHADOW_TOKEN> (Authorization is passed on to the engine)")
        given = headers.get(b"authorization", b"")
        scheme, _, value = given.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), self.token):
            return None
        why = "no bearer token" if not given else "a wrong bearer token"
        return (f"{why}: this service needs Authorization: Bearer <QWEN38_SHADOW_TOKEN> "
                "(or X-Shadow-Token: <QWEN38_SHADOW_TOKEN>)")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (refused := self.refusal(scope)) is not None:
            await problem(send, *refused)
            return
        await self.app(scope, receive, _secured(send, csp=not scope.get("path", "").startswith("/schema")))


def _secured(send: Any, csp: bool) -> Any:
    """``send`` with the security headers added to the response's start."""
    async def wrapped(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            have = {k.lower() for k, _ in message.get("headers", [])}
            extra = [(k, v) for k, v in SECURITY_HEADERS if k not in have]
            if csp and b"content-security-policy" not in have:
                extra.append((b"content-security-policy", CSP))
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)
    return wrapped


async def problem(send: Any, status: int, detail: str) -> None:
    """The refusal as a ``Problem``, like every other error."""
    body = msgspec.json.encode(Problem(status_code=status, detail=detail))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *SECURITY_HEADERS]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
