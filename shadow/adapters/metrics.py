"""Prometheus metrics: counted where the work happens (the ``Telemetry`` calls), served at ``/metrics``.

Every name, its type and meaning is in docs/operations.md; ``NAMES`` is the list the tests check.
Counters and histograms are fed by ``count``/``observe``/``chunk`` on the telemetry (the schedulers,
the facade, the residency, the disk store, the narrator, the service), never by walking the status.
Gauges are states, read from the live facade when Prometheus scrapes (``Gauges``). Labels are
bounded: a window, a where, a refusal's reason; never a session or a request.

The registry is the container's (``container.metrics()``), never prometheus_client's global one, so
two services in one process (the tests) count apart.

For the proxy (and any host in process), the named methods below are the way in::

    metrics = container.metrics()
    metrics.proxy_turn()               # one chat completion followed as a turn
    metrics.render_mismatch()          # the engine's prompt differed from the rendered one
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from shadow.core.shadow import ChunkRead, Shadow

CONTENT_TYPE = "text/plain; version=0.0.4"  # the server adds the charset
PREFIX = "shadow_"
WINDOWS = ("idle", "ration", "narrator", "ask")
WHERE = ("resident", "parked", "dropped")

# name (without the prefix) -> (help, label names); counters get ``_total`` from prometheus_client
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "chunks": ("Whole chunks read, by the window that read them", ("window",)),
    "ids_read": ("Ids read (rows committed by chunks), rereads included", ()),
    "ids_reread": ("Committed ids a rollback sent back to be read again", ()),
    "rollbacks": ("Prompts that differed from what was read and rolled the state back", ()),
    "parks": ("Sessions parked on disk (written) to keep under the cap or at a planned stop", ()),
    "restores": ("Parked sessions brought back to the device from their file", ()),
    "parked_files_refused": ("Parked files refused (and removed) instead of loaded, by reason", ("reason",)),
    "ration_seconds": ("Device seconds the ration read inside turns", ()),
    "narrator_seconds": ("Seconds the narrator's summaries took (their chunks and the fork)", ()),
    "questions": ("Questions answered (a host's and the router's)", ()),
    "narrations": ("Summaries the narrator wrote", ()),
    "proxy_turns": ("Chat completions the proxy followed as turns", ()),
    "proxy_render_mismatches": ("Turns whose rendered prompt differed from the engine's", ()),
    # the shared store (STORE, docs/scale-out.md)
    "store_parks": ("Parks sent to the shared store (beside the local file)", ()),
    "store_park_failures": ("Parks kept on the local disk only because the shared store could not be reached", ()),
    "store_restores": ("Sessions restored from the shared store's parts", ()),
    "store_parks_refused": ("Parks in the shared store refused on reading (and deleted), by reason", ("reason",)),
    "stale_parks_refused": ("Parks the shared store refused because a newer holder had the session", ()),
    "leases_lost": ("Sessions dropped here because another instance took their lease", ()),
}
# ``behind_at_turn_start_ids``' buckets are grid multiples minus one, so that ``le="<grid-1>"`` counts
# the fresh turn starts (less than one chunk behind)
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "behind_at_turn_start_ids": ("Ids of the session not yet read when a turn's prompt came", ()),
    "chunk_seconds": ("One chunk's measured device time, by window", ("window",)),
    "question_seconds": ("One question's latency, the tail's chunks included", ()),
    "park_seconds": ("One park (the file written and synced)", ()),
    "restore_seconds": ("One restore (the file read and checked, the state on the device)", ()),
}
GAUGES: dict[str, str] = {
    "sessions": "Sessions known, by where their state is (resident, parked, dropped)",
    "resident_bytes": "Device bytes resident sessions hold",
    "resident_cap_bytes": "The cap on resident bytes (QWEN38_SHADOW_GB)",
    "disk_bytes": "Bytes of parked files",
    "backlog_ids": "Ids held and not yet read, all sessions together",
    "model_loaded": "1 once the model is loaded and warmed (the readiness gate), else 0",
    "store_up": "The shared store (STORE): 1 reachable at the last look, 0 not, -1 no store set",
    "sessions_unshared": "Resident sessions followed without a lease in the shared store (taken while it was down)",
}
SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
NAMES = sorted([PREFIX + n + "_total" for n in COUNTERS] + [PREFIX + n for n in HISTOGRAMS]
               + [PREFIX + n for n in GAUGES])


def behind_buckets(grid: int) -> tuple[float, ...]:
    return (0.0, *(float(grid * 2**k - 1) for k in range(9)))


class Gauges(Collector):
    """The gauges, read when scraped from the live facade (``source``: None while not loaded)."""

    def __init__(self, source: Callable[[], Shadow | None], cap_bytes: int | None) -> None:
        self.source = source
        self.cap_bytes = cap_bytes

    def collect(self) -> Iterator[Metric]:
        shadow = self.source()
        where = dict.fromkeys(WHERE, 0)
        resident = disk = backlog = 0
        if shadow is not None:
            residency = shadow.residency
            with residency.lock:  # one consistent view; the facade holds it while it reads a chunk
                for name in residency.names():
                    w = residency.where(name)
                    where[w] = where.get(w, 0) + 1
                    backlog += residency.position(name).pending
                    disk += residency.bytes_on_disk(name)
                resident = residency.resident_bytes()
        g = GaugeMetricFamily(PREFIX + "sessions", GAUGES["sessions"], labels=["where"])
        for place, n in where.items():
            g.add_metric([place], n)
        yield g
        yield GaugeMetricFamily(PREFIX + "resident_bytes", GAUGES["resident_bytes"], value=resident)
        yield GaugeMetricFamily(PREFIX + "resident_cap_bytes", GAUGES["resident_cap_bytes"],
                                value=self.cap_bytes if self.cap_bytes is not None else float("inf"))
        yield GaugeMetricFamily(PREFIX + "disk_bytes", GAUGES["disk_bytes"], value=disk)
        yield GaugeMetricFamily(PREFIX + "backlog_ids", GAUGES["backlog_ids"], value=backlog)
        yield GaugeMetricFamily(PREFIX + "model_loaded", GAUGES["model_loaded"], value=int(shadow is not None))
        sharing = shadow.sharing() if shadow is not None else None
        up = -1 if sharing is None or sharing.store == "off" else int(sharing.store == "up")
        yield GaugeMetricFamily(PREFIX + "store_up", GAUGES["store_up"], value=up)
        yield GaugeMetricFamily(PREFIX + "sessions_unshared", GAUGES["sessions_unshared"],
                                value=sharing.unshared if sharing is not None else 0)


class Metrics:
    """The container's registry of shadow's metrics (see the module docstring)."""

    def __init__(self, grid: int = 512, cap_bytes: int | None = None) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # a ``_created`` series per counter doubles the scrape and tells nothing here
        self.registry = CollectorRegistry(auto_describe=True)
        self.counters = {n: Counter(PREFIX + n, h, labels, registry=self.registry)
                         for n, (h, labels) in COUNTERS.items()}
        buckets = {"behind_at_turn_start_ids": behind_buckets(grid)}
        self.histograms = {n: Histogram(PREFIX + n, h, labels, registry=self.registry,
                                        buckets=buckets.get(n, SECONDS))
                           for n, (h, labels) in HISTOGRAMS.items()}
        for n, labels in (("chunks", WINDOWS), ("chunk_seconds", WINDOWS)):
            metric = self.counters.get(n) or self.histograms[n]
            for value in labels:  # every series from the start: a rate over a series born late misses its start
                metric.labels(value)
        self._source: Callable[[], Shadow | None] = lambda: None
        self.registry.register(Gauges(lambda: self._source(), cap_bytes))

    def watch(self, source: Callable[[], Shadow | None]) -> None:
        """Where the gauges read from: the live facade (None while the model is not loaded and warmed)."""
        self._source = source

    def count(self, name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        c = self.counters[name]
        (c.labels(**labels) if labels else c).inc(value)

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        h = self.histograms[name]
        (h.labels(**labels) if labels else h).observe(value)

    def chunk(self, window: str, chunk: ChunkRead) -> None:
        self.count("chunks", 1, {"window": window})
        self.count("ids_read", chunk.rows)
        self.observe("chunk_seconds", chunk.cost_s, {"window": window})
        if window == "ration":
            self.count("ration_seconds", chunk.cost_s)

    # ---- for the proxy --------------------------------------------------------------------------

    def proxy_turn(self) -> None:
        self.count("proxy_turns")

    def render_mismatch(self) -> None:
        self.count("proxy_render_mismatches")

    # ---- reading --------------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (what ``GET /metrics`` answers)."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """A counter's or a histogram's count as it stands (for tests and the demo)."""
        got = self.registry.get_sample_value(name, dict(labels or {}))
        return 0.0 if got is None else got


class MeteredTelemetry:
    """A ``Telemetry``: spans go to ``inner``, counts and observations to ``metrics``."""

    def __init__(self, inner: Any, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    def span(self, name: str, attributes: Mapping[str, Any]) -> Any:
        return self.inner.span(name, attributes)

    def chunk(self, window: Any, chunk: ChunkRead, backlog_after: int, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        self.metrics.chunk(window, chunk)
        self.inner.chunk(window, chunk, backlog_after, start_ns, end_ns, attributes)

    def count(self, name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        self.metrics.count(name, value, labels)

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        self.metrics.observe(name, value, labels)
