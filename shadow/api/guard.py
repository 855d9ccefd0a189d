"""What the service refuses before any route runs, and why.

- A ``Host`` header not among the names the service answers to (400): a web page whose name was
  re-pointed at 127.0.0.1 (DNS rebinding) sends its own name and is turned away.
- No ``Authorization: Bearer <QWEN38_SHADOW_TOKEN>`` or ``X-Shadow-Token: <QWEN38_SHADOW_TOKEN>`` when a
  token is set (401). Behind ``shadow proxy`` only ``X-Shadow-Token`` counts (``bearer=False``): there
  ``Authorization`` is the engine's, passed on untouched.
- An ``Origin`` header not in ``QWEN38_SHADOW_ALLOWED_ORIGINS`` (403): browsers send one with every
  cross-site POST, hosts (httpx, the engine) send none, so a page the user opens cannot feed, hold
  or overwrite sessions.
- A body that is not ``application/json`` (415): a browser sends ``text/plain`` forms cross-site
  without asking first; JSON it must ask for (CORS preflight), and the preflight is refused above.

Each answer is a ``Problem`` like every other error.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import unquote

import msgspec

from shadow.core.settings import ShadowSettings

from .operators import OPERATOR_PATHS, PAGE_PATHS, TOKEN_COOKIE
from .responses import Problem
from .server import is_loopback

BODY_METHODS = {b"POST", b"PUT", b"PATCH"}
TOKEN_HEADER = b"x-shadow-token"


def _host_name(value: str) -> str:
    """``[::1]:8011`` -> ``::1``; ``localhost:8011`` -> ``localhost``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """ASGI middleware in front of the Litestar app (lifespan and websockets pass through)."""

    def __init__(self, app: Any, settings: ShadowSettings, bearer: bool = True) -> None:
        self.app = app
        self.bearer = bearer
        self.hosts = settings.hosts
        self.origins = settings.origins
        self.token = settings.token.encode()
        self.metrics_public = settings.metrics_public

    def _exempt(self, scope: Any) -> bool:
        """Open without the token: the live page (it holds no data: it asks for the token), and with
        ``METRICS_PUBLIC`` the operators' paths for a client on loopback."""
        if scope.get("method") not in ("GET", "HEAD"):
            return False
        path = scope.get("path", "")
        if path in PAGE_PATHS:
            return True
        client = scope.get("client") or ("",)
        return self.metrics_public and path in OPERATOR_PATHS and is_loopback(str(client[0]))

    @staticmethod
    def _cookie(headers: dict[bytes, bytes]) -> bytes:
        """The page's token cookie (a browser's ``EventSource`` cannot send a header)."""
        for part in headers.get(b"cookie", b"").split(b";"):
            name, _, value = part.strip().partition(b"=")
            if name == TOKEN_COOKIE.encode():
                return unquote(value.decode("latin-1")).encode("latin-1", "replace")
        return b""

    def refusal(self, scope: Any) -> tuple[int, str] | None:
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.lower(), v)
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if "*" not in self.hosts and host not in self.hosts:
            return 400, (f"Host {host!r} is not one this service answers to ({', '.join(sorted(self.hosts))}; "
                         "QWEN38_SHADOW_ALLOWED_HOSTS adds names)")
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
        own = headers.get(TOKEN_HEADER)
        if own is None and b"authorization" not in headers and scope.get("method") in ("GET", "HEAD"):
            own = self._cookie(headers) or None  # reads only: a cross-site page never gets a SameSite cookie
        if own is not None:
            return None if hmac.compare_digest(own.strip(), self.token) else "a wrong X-Shadow-Token"
        if not self.bearer:
            return "no X-Shadow-Token: this proxy needs X-Shadow-Token: <QWEN38_SHADOW_TOKEN>"
        given = headers.get(b"authorization", b"")
        scheme, _, value = given.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(value.strip(), self.token):
            why = "no bearer token" if not given else "a wrong bearer token"
            return (f"{why}: this service needs Authorization: Bearer <QWEN38_SHADOW_TOKEN> "
                    "(or X-Shadow-Token: <QWEN38_SHADOW_TOKEN>)")
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (refused := self.refusal(scope)) is None:
            await self.app(scope, receive, send)
            return
        await problem(send, *refused)


async def problem(send: Any, status: int, detail: str) -> None:
    """The refusal as a ``Problem``, like every other error."""
    body = msgspec.json.encode(Problem(status_code=status, detail=detail))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
