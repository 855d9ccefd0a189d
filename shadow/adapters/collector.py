"""Python's cycle collector in a serving process: what is loaded by the end of warm-up is frozen out
of its full collections.

A full collection walks every object the collector tracks, and every thread of the process waits
while it runs (it holds the GIL): the server's routes, the ration's thread, an engine's thread in
the same process. The serving imports alone (torch, triton, fla, the service) are about 330,000
such objects: a full collection of them took about 130 ms on the 2-core CPU box. Collections of
every generation come as the process allocates; in a replay of 64 agents' host work through the
service's own schedulers (``benchmarks/probes/gc_pauses.py``, ``benchmarks/results/gc_pauses.json``)
two full collections came in the 30 simulated minutes, the longest 120 ms; with what was loaded
frozen first, 31 ms.

``gc.freeze`` moves every object tracked at that moment to a permanent generation that no
collection walks; whatever comes after is collected as before, and objects freed by their
reference count (most of them) are freed as before. What it costs: a cycle among the frozen
objects that later becomes garbage is never freed. Collected just before freezing, what is frozen
is the process's libraries, the model, its graphs and kernels, which live as long as the process.

Only the processes shadow runs as a whole (``shadow serve``, ``shadow proxy`` with the model in
it) freeze; an engine that embeds the service keeps its own collector's policy.
"""

from __future__ import annotations

import gc
import logging

from shadow.core.slot import Slot

log = logging.getLogger(__name__)


def freeze_loaded() -> str:
    """Collect, then freeze what is left out of later collections; says what it did."""
    gc.collect()
    gc.freeze()
    return f"collector: {gc.get_freeze_count()} objects loaded by warm-up kept out of its collections (gc.freeze)"


def freeze_when_loaded(slot: Slot) -> None:
    """Freeze once the slot's model is loaded and warm: after the callbacks already registered (the
    service's warm-up and replay of kept feeds), so register this last."""
    slot.on_loaded(lambda _shadow: log.info("%s", freeze_loaded()))
