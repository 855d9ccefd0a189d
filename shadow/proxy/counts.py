"""The proxy's counters, in one place: its status route shows them (``GET /v1/conductor/proxy/status``)
and a metrics exporter reads them through ``ProxyCounts.as_dict()``.

- ``turns``: chat completions the engine accepted (2xx) and the shadow followed as a turn; a client's
  retry of the same body within ``QWEN38_SHADOW_PROXY_RETRY_S`` counts in ``retries`` instead.
- ``refused``: chat completions the engine answered with an error status; ``unreachable``: ones it
  never answered (502/504 from the proxy). Neither touched a session.
- ``not_followed``: why a chat completion the engine accepted was not followed as a turn, or why
  its following stopped part way (the bytes kept flowing to the client unchanged), by reason:
  ``undecodable_body``, ``no_messages``, ``render``, ``unparseable_event``, ``shadow_refused``
  (the shadow refused a feed: a session over ``MAX_SESSION_IDS``, ...), ``shadow_error``,
  ``no_choice`` (a 2xx answer that ended before any choice: an engine failing inside its stream;
  no session was touched).
- ``render_mismatch``: turns whose rendered prompt length differs from the engine's
  ``usage.prompt_tokens`` (or whose ids differ from the engine's own ids).
- ``engine_ids``: turns fed with the ids the engine returned rather than a render.
- ``refused_requests``: requests the proxy itself refused, by status (400, 401, 403, 413, 415).
- ``sessions_new`` / ``sessions_joined`` / ``sessions_branched``: how a turn found its session (a
  branch: a conversation that parted from another before its latest prompt; ``sessions.py``). The
  index's own figures (known, evicted) are in the status' ``sessions``.
- ``engine_fallbacks``: times the engine refused the id fields the proxy added and the proxy fell
  back to rendering (``app.ProxyApp.fallback`` says when and why).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

KEEP = 16  # the last render mismatches shown in status


class ProxyCounts:
    """``metrics`` (the in-process service's ``shadow.adapters.metrics.Metrics``, or None) is told of
    each followed turn and each render mismatch, so ``GET /metrics`` counts them too."""

    def __init__(self, metrics: Any = None) -> None:
        self.metrics = metrics
        self._mu = threading.Lock()
        self._n: Counter[str] = Counter()
        self._not_followed: Counter[str] = Counter()
        self._refused_requests: Counter[int] = Counter()
        self.mismatches: deque[dict[str, Any]] = deque(maxlen=KEEP)

    def add(self, key: str, n: int = 1) -> None:
        with self._mu:
            self._n[key] += n
        if key == "turns" and self.metrics is not None:
            for _ in range(n):
                self.metrics.proxy_turn()
        if key == "engine_fallbacks" and self.metrics is not None:
            for _ in range(n):
                self.metrics.engine_fallback()

    def not_followed(self, reason: str) -> None:
        with self._mu:
            self._not_followed[reason] += 1

    def refused_request(self, status: int) -> None:
        with self._mu:
            self._refused_requests[status] += 1

    def mismatch(self, record: dict[str, Any]) -> None:
        with self._mu:
            self._n["render_mismatch"] += 1
            self.mismatches.append(record)
        if self.metrics is not None:
            self.metrics.render_mismatch()

    def __getitem__(self, key: str) -> int:
        with self._mu:
            return self._n[key]

    def as_dict(self) -> dict[str, Any]:
        with self._mu:
            keys = ("turns", "retries", "refused", "unreachable", "render_mismatch", "engine_ids",
                    "sessions_new", "sessions_joined", "sessions_branched", "engine_fallbacks")
            return {**{k: self._n[k] for k in keys},
                    "not_followed": dict(self._not_followed),
                    "refused_requests": {str(k): v for k, v in sorted(self._refused_requests.items())},
                    "last_mismatches": list(self.mismatches)}
