"""What an operator's tools read: ``/metrics`` (Prometheus), ``/health``, ``/ready``, and the live page.

Each is served at the root and under ``/v1/conductor/shadow``: the proxy passes only that prefix to
the shadow (every other path is the engine's, whose own ``/metrics`` and ``/health`` stay its own).

- ``GET /metrics``: the container's registry in Prometheus' text format (``shadow.adapters.metrics``).
- ``GET /health``: 200 while the process answers.
- ``GET /ready``: 503 with the reason until the model is loaded and warmed (the first chunk a
  request waits on is not a cold one), then 200.
- ``GET /`` (the page) and ``GET .../live`` (its sessions, as an HTML fragment the page fetches):
  templates under ``templates/``; the page's script follows ``GET .../narration`` with an
  ``EventSource``. The page holds no data, so it loads without the token; it asks for the token once
  and keeps it as a cookie for the browser's session, which the guard takes on GET requests.

The token guards all of it but the page; ``QWEN38_SHADOW_METRICS_PUBLIC`` opens ``/metrics``,
``/health`` and ``/ready`` to clients on loopback (a scraper beside the service).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from litestar import Controller, MediaType, Request, Response, get
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.openapi.datastructures import ResponseSpec
from litestar.response import Template
from litestar.template.config import TemplateConfig
from msgspec import Struct

from shadow.adapters.metrics import CONTENT_TYPE, Metrics
from shadow.adapters.service import ShadowService
from shadow.adapters.status import Status

BASE = "/v1/conductor/shadow"  # the API's (shadow.api.app.BASE)
OPERATOR = ("/metrics", "/health", "/ready")
OPERATOR_PATHS = frozenset(OPERATOR) | frozenset(BASE + p for p in OPERATOR)
PAGE_PATHS = frozenset({"/", BASE, BASE + "/"})
TOKEN_COOKIE = "shadow_token"
TEMPLATES = Path(__file__).parent / "templates"


class Health(Struct):
    status: str


class Readiness(Struct, omit_defaults=True):
    ready: bool
    state: str  # the model's slot: off, empty, loading, loaded, failed
    reason: str
    store: str = "off"  # the shared store (STORE): off, up, or down (sessions then followed here only, unshared)


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(directory=TEMPLATES, engine=JinjaTemplateEngine)


def readiness(service: ShadowService) -> Readiness:
    slot = service.slot
    if slot.state == "loaded":  # set once warm_up and the replay of early feeds are done
        shadow = slot.get()
        sharing = shadow.sharing() if shadow is not None else None
        if sharing is not None and sharing.store == "down":  # still ready: new sessions are followed here
            return Readiness(True, slot.state, "the model is loaded and warmed; the shared store is unreachable "
                             f"({sharing.last_error}): sessions are followed here only, unshared", "down")
        return Readiness(True, slot.state, "the model is loaded and warmed",
                         "off" if sharing is None else sharing.store)
    if slot.state == "off":
        why = "the shadow is off (QWEN38_SHADOW_MODEL is empty)"
    elif slot.state == "failed":
        why = f"the model failed to load: {slot.error}"
    elif not slot.wanted:
        why = "no profile follows sessions, so the model is not loaded"
    else:
        why = f"the model is {'loading and warming up' if slot.state == 'loading' else 'not loaded yet'}"
    return Readiness(False, slot.state, why)


def _pairs(path: str) -> list[str]:
    return [path, BASE + path]


def _mb(n: float | None) -> str:
    return "none" if n is None else f"{n / 2**20:,.1f} MiB"


def live_context(status: Status) -> dict[str, Any]:
    """What the page's fragment shows, from the status: each session, the windows, the cap."""
    router: dict[str, str] = {}
    for r in status.router.last if status.router is not None else []:  # oldest first: the last of each stays
        router[r.session] = (r.label if isinstance(r.label, str) else "") or (r.error if isinstance(r.error, str)
                                                                              else "")
    sessions = [{"name": name, "where": s.where, "ids": s.ids, "committed": s.committed, "behind": s.backlog,
                 "router": router.get(name, ""), "profile": s.profile or ""}
                for name, s in sorted(status.sessions.items())]
    w, store = status.windows, status.store
    return {"sessions": sessions, "slot": status.slot, "grid": status.slot.grid,
            "ration_ms": w.ration.spent_ms, "idle_ms": w.idle.spent_ms,
            "narrator_ms": status.narrator.spent_ms if status.narrator is not None else 0.0,
            "cap": _mb(store.cap_bytes if store is not None else None),
            "resident": _mb(store.resident_bytes if store is not None else 0), "backlog": status.backlog,
            "at": time.strftime("%H:%M:%S UTC", time.gmtime())}


class OperatorController(Controller):
    tags = ("operators",)

    @get(_pairs("/metrics"), media_type=CONTENT_TYPE, summary="Prometheus metrics (text format)",
         responses={401: ResponseSpec(None, description="QWEN38_SHADOW_TOKEN is set and not given")})
    async def metrics(self, metrics: Metrics) -> Response[bytes]:
        # off the loop: the gauges wait for the facade's lock, which a chunk being read holds
        return Response(await anyio.to_thread.run_sync(metrics.exposition), media_type=CONTENT_TYPE)

    @get(_pairs("/health"), summary="The process answers")
    async def health(self) -> Health:
        return Health("ok")

    @get(_pairs("/ready"), summary="200 once the model is loaded and warmed; 503 with the reason before",
         responses={503: ResponseSpec(Readiness, description="Not ready: the reason", generate_examples=False)})
    async def ready(self, service: ShadowService) -> Response[Readiness]:
        r = readiness(service)
        return Response(r, status_code=200 if r.ready else 503)

    @get(sorted(PAGE_PATHS - {BASE + "/"}), media_type=MediaType.HTML, include_in_schema=True,
         summary="The live page: each session, the narration as it comes")
    async def page(self, request: Request[Any, Any, Any], service: ShadowService) -> Template:
        return Template("live.html", context={"base": BASE, "token": bool(service.settings.token),
                                              "cookie": TOKEN_COOKIE})

    @get(BASE + "/live", media_type=MediaType.HTML, sync_to_thread=True,
         summary="The live page's sessions, as an HTML fragment")
    def live(self, service: ShadowService) -> Template:
        return Template("live_sessions.html", context=live_context(service.status()))
