"""An out-of-process host's side of the HTTP API: one method per endpoint (httpx)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from .app import BASE


def _prompt(prompt: Sequence[int] | Mapping[str, Any]) -> Any:
    return dict(prompt) if isinstance(prompt, Mapping) else list(prompt)


class ShadowHTTPError(RuntimeError):
    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"{status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


class ShadowClient:
    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        self.http = httpx.Client(base_url=base_url.rstrip("/") + BASE, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ShadowClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        r = self.http.request(method, path, json=body)
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise ShadowHTTPError(r.status_code, str(detail))
        return r.json() if r.content else None

    # ---- questions and status ----
    def ask(self, session: str, question: str | Sequence[int], choices: Sequence[str]) -> dict[str, Any]:
        q = question if isinstance(question, str) else list(question)
        return dict(self._call("POST", "/ask", {"session": session, "question": q, "choices": list(choices)}))

    def status(self) -> dict[str, Any]:
        return dict(self._call("GET", "/status"))

    def narrate(self, session: str, prompt: str, max_new: int = 64) -> dict[str, Any]:
        return dict(self._call("POST", "/narrate", {"session": session, "prompt": prompt, "max_new": max_new}))

    # ---- feeding ----
    def feed_prompt(self, session: str, prompt: Sequence[int] | Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        """``prompt``: token ids, or ``{"messages": [...], "tools": [...], "enable_thinking": ...}``."""
        body = {"session": session, "prompt": _prompt(prompt), **kw}
        return dict(self._call("POST", "/feed/prompt", body))

    def feed_output(self, session: str, ids: Sequence[int]) -> dict[str, Any]:
        return dict(self._call("POST", "/feed/output", {"session": session, "ids": list(ids)}))

    # ---- host activity ----
    def arrived(self, request_id: str) -> dict[str, Any]:
        return dict(self._call("POST", "/host/arrived", {"request_id": request_id}))

    def started(self, request_id: str, session: str, prompt: Sequence[int] | Mapping[str, Any],
                **kw: Any) -> dict[str, Any]:
        body = {"request_id": request_id, "session": session, "prompt": _prompt(prompt), **kw}
        return dict(self._call("POST", "/host/started", body))

    def first_token(self, request_id: str) -> dict[str, Any]:
        return dict(self._call("POST", "/host/first-token", {"request_id": request_id}))

    def round(self, request_id: str, ids: Sequence[int] = ()) -> dict[str, Any]:
        return dict(self._call("POST", "/host/round", {"request_id": request_id, "ids": list(ids)}))

    def finished(self, request_id: str, ids: Sequence[int] = ()) -> dict[str, Any]:
        return dict(self._call("POST", "/host/finished", {"request_id": request_id, "ids": list(ids)}))

    def add_hold(self, ttl_s: float = 600.0) -> str:
        return str(self._call("POST", "/host/holds", {"ttl_s": ttl_s})["hold_id"])

    def release_hold(self, hold_id: str) -> None:
        self._call("DELETE", f"/host/holds/{hold_id}")
