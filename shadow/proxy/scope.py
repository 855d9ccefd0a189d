"""Which sessions a client reaches through the proxy's routes to the shadow (``/v1/conductor/shadow``).

A session the proxy found without ``X-Session-Id`` belongs to the client whose conversation started
it: the digest of its ``Authorization`` (its engine key). A request that carries another
``Authorization`` does not reach it: asking, narrating, feeding, following its narration or
deleting it answers 404 (as for a session that does not exist), and the status it reads leaves it
out; the narration of every session at once is the operator's (such a client names one, or 400).
Sessions named by a header are the naming client's business and stay reachable by name.

A request without ``Authorization`` is the operator's: with ``QWEN38_SHADOW_TOKEN`` set, the
proxy's guard has checked its ``X-Shadow-Token`` already, and the token is an admin credential
for every session (docs/proxy.md): it belongs in the operator's tools, not in an agent's config.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, unquote

from .sessions import Sessions

SHADOW_BASE = "/v1/conductor/shadow"
SESSIONS_PATH = SHADOW_BASE + "/sessions/"
STATUS = SHADOW_BASE + "/status"
NARRATION = SHADOW_BASE + "/narration"

Scope = dict[str, Any]
Send = Any


def _authorized(scope: Scope) -> bool:
    return any(k.lower() == b"authorization" for k, _ in scope["headers"])


class SessionScope:
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions

    def named(self, scope: Scope, body: bytes) -> str | None:
        """The session a shadow route names: in its path, its query or its JSON body."""
        path = scope["path"]
        if path.startswith(SESSIONS_PATH):
            raw = scope.get("raw_path") or path.encode()
            return unquote(raw.decode("latin-1").split("/sessions/", 1)[1])
        if path == NARRATION:
            got = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session")
            return got[0] if got else None
        if body:
            try:
                parsed = json.loads(body)
            except (ValueError, RecursionError):
                return None  # the shadow's own check refuses it
            session = parsed.get("session") if isinstance(parsed, dict) else None
            return session if isinstance(session, str) else None
        return None

    def refusal(self, scope: Scope, session: str | None, client: str) -> tuple[int, str] | None:
        """Why the client may not use this shadow route (status, reason), or None."""
        if not _authorized(scope):
            return None
        if scope["path"] == NARRATION and session is None:
            return 400, "a client with an engine key follows one session's narration: ?session=NAME"
        if session is not None and not self.may_reach(session, client, scope):
            return 404, f"unknown session {session!r}"
        return None

    def may_reach(self, session: str, client: str, scope: Scope) -> bool:
        if not _authorized(scope):
            return True
        owner = self.sessions.owner(session)
        return owner is None or owner[0] or owner[1] == client

    def filtered(self, scope: Scope, send: Send, client: str) -> Send:
        """``send`` for the shadow's status: other clients' sessions taken out of its JSON."""
        if scope["path"] != STATUS or scope["method"] != "GET" or not _authorized(scope):
            return send
        held: dict[str, Any] = {}
        body = bytearray()

        async def wrapped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                held.update(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body"):
                return
            out = bytes(body)
            if held.get("status") == 200:
                out = self._without_others(out, client, scope)
            headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
            await send({**held, "headers": [*headers, (b"content-length", str(len(out)).encode())]})
            await send({"type": "http.response.body", "body": out, "more_body": False})
        return wrapped

    def _without_others(self, raw: bytes, client: str, scope: Scope) -> bytes:
        """The status less every trace of a session the client may not reach: its line in any
        ``sessions`` map, and any record (an answer, a turn) whose ``session`` it is."""
        try:
            status = json.loads(raw)
        except (ValueError, RecursionError):
            return raw

        def keep(name: Any) -> bool:
            return not isinstance(name, str) or self.may_reach(name, client, scope)

        def clean(obj: Any) -> Any:
            if isinstance(obj, dict):
                return {k: ({n: clean(line) for n, line in v.items() if keep(n)}
                            if k == "sessions" and isinstance(v, dict) else clean(v)) for k, v in obj.items()}
            if isinstance(obj, list):
                return [clean(o) for o in obj if not (isinstance(o, dict) and not keep(o.get("session")))]
            return obj
        return json.dumps(clean(status)).encode()
