"""What an operator's tools read: ``/metrics`` (Prometheus), ``/health``, ``/ready``; the paths they and the
live page (``page.py``) are served at.

Each is served at the root and under ``/v1/conductor/shadow``: the proxy passes only that prefix to
the shadow (every other path is the engine's, whose own ``/metrics`` and ``/health`` stay its own).

- ``GET /metrics``: the container's registry in Prometheus' text format (``shadow.adapters.metrics``).
- ``GET /health``: 200 while the process answers; 503 with the reason once the model failed to load
  (``shadow serve`` exits 1 then, unless ``--stay-up``).
- ``GET /ready``: 503 with the reason until the model is loaded and warmed (the first chunk a
  request waits on is not a cold one), then 200.
- ``GET /``: the live page (``page.py``).

The token guards all of it but the page; ``QWEN38_SHADOW_METRICS_PUBLIC`` opens ``/metrics``,
``/health`` and ``/ready`` to clients on loopback (a scraper beside the service).
"""

from __future__ import annotations

from pathlib import Path

import anyio.to_thread
from litestar import Controller, Response, get
from litestar.contrib.jinja import JinjaTemplateEngine
from litestar.openapi.datastructures import ResponseSpec
from litestar.template.config import TemplateConfig
from msgspec import Struct

from shadow.adapters.metrics import CONTENT_TYPE, Metrics
from shadow.adapters.service import ShadowService

from .paths import BASE

OPERATOR = ("/metrics", "/health", "/ready")
OPERATOR_PATHS = frozenset(OPERATOR) | frozenset(BASE + p for p in OPERATOR)
PAGE_PATHS = frozenset({"/", BASE, BASE + "/"})
ASSETS = {"page.js": "text/javascript", "page.css": "text/css"}  # the page's own script and style (CSP: 'self')
ASSET_PATHS = frozenset(f"{BASE}/{name}" for name in ASSETS)
LOGIN_PATH = BASE + "/token"  # the page's form: POST token=...&next=/ -> 303 with Set-Cookie (``guard.py``)
TOKEN_COOKIE = "shadow_token"
COOKIE_PATH = "/v1/conductor"  # the page's reads: the shadow's paths and the proxy's status
PAGE_READS = frozenset({BASE + "/live", BASE + "/narration", BASE + "/status", "/v1/conductor/proxy/status"})
TEMPLATES = Path(__file__).parent / "templates"


class Health(Struct, omit_defaults=True):
    status: str  # ok, or failed: the model failed to load (``shadow serve --stay-up`` kept the process up)
    reason: str = ""


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


class OperatorController(Controller):
    tags = ("operators",)

    @get(_pairs("/metrics"), media_type=CONTENT_TYPE, summary="Prometheus metrics (text format)",
         responses={401: ResponseSpec(None, description="QWEN38_SHADOW_TOKEN is set and not given")})
    async def metrics(self, metrics: Metrics) -> Response[bytes]:
        # off the loop: the gauges wait for the facade's lock, which a chunk being read holds
        return Response(await anyio.to_thread.run_sync(metrics.exposition), media_type=CONTENT_TYPE)

    @get(_pairs("/health"), summary="200 while the process answers; 503 once the model failed to load",
         responses={503: ResponseSpec(Health, description="The model failed to load: the reason",
                                      generate_examples=False)})
    async def health(self, service: ShadowService) -> Response[Health]:
        # a failed load is not fixed by waiting: a liveness probe that restarts the process retries it
        if service.slot.state == "failed":
            return Response(Health("failed", f"the model failed to load: {service.slot.error}"), status_code=503)
        return Response(Health("ok"), status_code=200)

    @get(_pairs("/ready"), summary="200 once the model is loaded and warmed; 503 with the reason before",
         responses={503: ResponseSpec(Readiness, description="Not ready: the reason", generate_examples=False)})
    async def ready(self, service: ShadowService) -> Response[Readiness]:
        r = readiness(service)
        return Response(r, status_code=200 if r.ready else 503)
