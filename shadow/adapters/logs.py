"""The lines an operator reads in the log: one INFO line per thing that happened, WARNING or ERROR
where someone should act (docs/operations.md lists each line and what to do about it).

- ``shadow.serve``: the start (the model, device, grid, the narrator's state, the token, TLS), the
  stop (sessions parked at a planned stop).
- ``shadow.model``: the load's start and end (seconds, device, dtype, attention kernel) or its
  failure (ERROR), the warm-up, and the sessions a previous run parked and this one restores.
- ``shadow.proxy``: a render mismatch (WARNING, at most one line a minute; the rest counted in it).

The slot's load is wrapped here (``Loading``), the service's warm-up is seen through the slot's
``on_loaded`` callbacks (``warmed``), so neither the slot nor the service logs itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shadow.core.settings import ShadowSettings
    from shadow.core.shadow import Shadow

model_log = logging.getLogger("shadow.model")
serve_log = logging.getLogger("shadow.serve")
proxy_log = logging.getLogger("shadow.proxy")
MISMATCH_EVERY_S = 60.0  # at most one render-mismatch line this often


def runs_on(shadow: Shadow | None) -> tuple[str, str]:
    """(device, attention kernel) the loaded reader resolved: ``cuda:0``, ``ws``; ("", "") before."""
    if shadow is None:
        return "", ""
    info = getattr(shadow.reader, "runs_on", None)
    return info() if callable(info) else ("", "")


class Loading:
    """The slot's load callable, with a line before and after it (ERROR with the reason on failure)."""

    def __init__(self, load: Callable[[], Shadow], settings: ShadowSettings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.load = load
        self.settings = settings
        self.clock = clock
        self.done_at = 0.0

    def __call__(self) -> Shadow:
        s = self.settings
        model_log.info("loading the model %s (device %s, %s, grid %d)", s.model, s.device, s.dtype, s.grid)
        t0 = self.clock()
        try:
            shadow = self.load()
        except Exception as err:
            model_log.error("the model failed to load after %.1f s: %s: %s (/ready and /health say so; a "
                            "restart retries)", self.clock() - t0, type(err).__name__, err)
            raise
        self.done_at = self.clock()
        device, kernel = runs_on(shadow)
        model_log.info("model loaded in %.1f s: device %s, %s, attention kernel %s", self.done_at - t0,
                       device or s.device, s.dtype, kernel or "-")
        return shadow

    def warmed(self, shadow: Shadow) -> None:
        """After the service's warm-up (its ``on_loaded`` callback runs first): the line that says ready."""
        parked = [n for n in shadow.residency.names() if shadow.residency.where(n) == "parked"]
        model_log.info("warm-up done in %.1f s; ready (%d sessions parked by the last run, restored when "
                       "next used)", self.clock() - self.done_at, len(parked))


def starting(command: str, settings: ShadowSettings, container: Any) -> None:
    """The start's line, and the narrator's state."""
    s = settings
    serve_log.info("shadow %s on %s:%d: model %s, token %s", command, s.host, s.port, s.model or "off (MODEL empty)",
                   "set" if s.token else "none (loopback only)")
    profiles = container.profiles()
    narrated = sorted(n for n, b in profiles.blocks.items() if getattr(b, "narrator", "off") == "on")
    serve_log.info("narrator: %s", f"on for profiles {', '.join(narrated)}" if narrated else "off")


class Stopping:
    """The stop's lines: ``begin`` when the server begins to stop (then the service's own ``closing``),
    ``done`` once the service stopped, saying what its planned stop parked."""

    def __init__(self, container: Any) -> None:
        self.metrics = container.metrics()
        self.closing = container.service().closing
        self.before: float | None = None

    def _parks(self) -> float:
        return float(self.metrics.value("shadow_parks_total"))

    def begin(self) -> None:
        self.before = self._parks()
        serve_log.info("stopping: the resident sessions are parked for the next start")
        self.closing()

    def done(self) -> None:
        total = self._parks()
        at_stop = total - self.before if self.before is not None else 0.0
        serve_log.info("stopped; the planned stop parked %d sessions (%d parks in all by this run)",
                       int(at_stop), int(total))


class Throttled:
    """A WARNING at most once per ``every_s``, saying how many it stood for."""

    def __init__(self, logger: logging.Logger, every_s: float = MISMATCH_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every_s = every_s
        self.clock = clock
        self._mu = threading.Lock()
        self._last = -float("inf")
        self._held = 0

    def warn(self, message: str) -> bool:
        """Logs ``message`` (with the count held back since the last line) or holds it; True when logged."""
        with self._mu:
            self._held += 1
            now = self.clock()
            if now - self._last < self.every_s:
                return False
            held, self._held, self._last = self._held, 0, now
        self.logger.warning("%s (%d since the last such line)", message, held)
        return True
