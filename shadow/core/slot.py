"""The model's slot: the facade is built (and the weights loaded) once, lazily, in an idle window.

States: ``off`` (no model configured), ``empty`` (configured, not loaded), ``loading``, ``loaded``,
``failed`` (the error is kept for status; the next idle window does not retry, a restart does).
The idle scheduler loads it soon after the start when some profile has ``shadow.mode: on``; a
request never waits for it: feeds that come before it are kept and replayed once it is loaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

from .shadow import Shadow

SlotState = Literal["off", "empty", "loading", "loaded", "failed"]


class ModelSlot:
    """Where the service's facade lives: built once, lazily, in an idle window (the states above);
    ``get`` never loads."""

    def __init__(self, load: Callable[[], Shadow] | None, *, model: str = "", wanted: bool = True,
                 shared_with: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic) -> None:
        self._load = load
        self.model = model
        self.wanted = wanted  # some profile follows sessions: load soon after start
        self.shared_with = shared_with
        self.clock = clock
        self.state: SlotState = "off" if load is None else "empty"
        self.error = ""
        self.load_s: float | None = None
        self._shadow: Shadow | None = None
        self._mu = threading.Lock()
        self._on_loaded: list[Callable[[Shadow], None]] = []

    def get(self) -> Shadow | None:
        """The facade when loaded; never loads."""
        return self._shadow

    @property
    def due(self) -> bool:
        """The idle window should load it now."""
        return self.state == "empty" and self.wanted

    def on_loaded(self, callback: Callable[[Shadow], None]) -> None:
        self._on_loaded.append(callback)

    def load(self) -> Shadow | None:
        """Build the facade now (the caller holds the idle window); idempotent, thread-safe."""
        with self._mu:
            if self.state != "empty" or self._load is None:
                return self._shadow
            self.state = "loading"
            t0 = self.clock()
            try:
                shadow = self._load()
            except Exception as err:  # kept for status; a restart retries
                self.state, self.error = "failed", f"{type(err).__name__}: {err}"
                return None
            self.load_s = self.clock() - t0
            for callback in self._on_loaded:
                callback(shadow)
            self._shadow, self.state = shadow, "loaded"
            return shadow
