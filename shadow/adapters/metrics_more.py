"""The metrics read from the parts' own counts when Prometheus scrapes (``metrics.py`` registers them):

- ``shadow_model_info``: 1, labelled with what the service runs (model, weights hash, grid, dtype,
  the device and attention kernel the reader resolved, the version); ``device`` is the setting and
  ``weights_hash`` and ``kernel`` are empty until the model is loaded.
- the status' counts that are no telemetry event: sessions forgotten to stay within the bounds,
  parks that failed, the host's running and waiting requests and holds, the turns finished, the
  narrator's failures and skips by reason (every reason at 0 from the start);
- on ``shadow proxy`` (``ProxyCollector``): its counters, every reason and refused status at 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .logs import runs_on

if TYPE_CHECKING:
    from shadow.core.shadow import Shadow

PREFIX = "shadow_"
# the parked-file refusals' reasons (``shadow.backends.stores.disk.REASONS``, and "other")
REFUSAL_REASONS = ("unreadable", "format", "weights", "grid", "dtype", "metadata", "checksum", "not_last_park",
                   "session", "vocabulary", "model", "fingerprint", "other")
SKIPS = ("budget", "not_loaded", "request_gone")  # the narrator's (``shadow.adapters.narrator``)
INFO_LABELS = ("model", "weights_hash", "grid", "dtype", "device", "kernel", "version")
NOT_FOLLOWED = ("undecodable_body", "no_messages", "render", "unparseable_event", "shadow_refused", "shadow_error")
PROXY_REFUSED = ("400", "401", "403", "413", "415")


class InfoAndCounts(Collector):
    NAMES: ClassVar[tuple[str, ...]] = tuple(
        PREFIX + n for n in ("model_info", "sessions_forgotten_total", "park_failures_total", "host_requests", "holds",
                             "turns_finished_total", "narrator_failures_total", "narrator_skipped_total"))

    def __init__(self, source: Callable[[], Shadow | None], info: Mapping[str, str]) -> None:
        self.source = source
        self.info = dict(info)
        self.service: Any = None  # the ShadowService, once built (``Metrics.watch_service``)

    def collect(self) -> Iterator[Metric]:
        shadow = self.source()
        device, kernel = runs_on(shadow)
        labels = {**dict.fromkeys(INFO_LABELS, ""), **self.info}
        if shadow is not None:
            labels.update(device=device or labels["device"], kernel=kernel,
                          weights_hash=str(getattr(shadow.reader, "weights_hash", "")))
        info = GaugeMetricFamily(PREFIX + "model_info", "What the service runs: model, weights, grid, dtype, "
                                 "device and attention kernel resolved, version", labels=list(INFO_LABELS))
        info.add_metric([labels[k] for k in INFO_LABELS], 1)
        yield info
        forgotten = failures = 0
        if shadow is not None:
            forgotten, failures = shadow.residency.forgotten, shadow.residency.park_failures
        yield CounterMetricFamily(PREFIX + "sessions_forgotten", "Sessions forgotten to stay within the cap or "
                                  "MAX_SESSIONS (least recently used first)", value=forgotten)
        yield CounterMetricFamily(PREFIX + "park_failures", "Parks that failed (the session stayed resident or "
                                  "was dropped, to be read again)", value=failures)
        yield from self._service()

    def _service(self) -> Iterator[Metric]:
        host = self.service.activity.status() if self.service is not None else None
        requests = GaugeMetricFamily(PREFIX + "host_requests", "The host's requests now, by state",
                                     labels=["state"])
        requests.add_metric(["running"], host.running if host is not None else 0)
        requests.add_metric(["waiting"], host.waiting if host is not None else 0)
        yield requests
        yield GaugeMetricFamily(PREFIX + "holds", "Holds live now (the idle window shut)",
                                value=host.holds if host is not None else 0)
        yield CounterMetricFamily(PREFIX + "turns_finished", "Turns the host finished",
                                  value=host.finished_turns if host is not None else 0)
        narrator = self.service.narrator if self.service is not None else None
        st = narrator.status() if narrator is not None else None
        yield CounterMetricFamily(PREFIX + "narrator_failures", "Summaries that failed",
                                  value=st.failed if st is not None else 0)
        skipped = CounterMetricFamily(PREFIX + "narrator_skipped", "Summaries skipped, by reason: budget (still "
                                      "waiting when the turn finished), not_loaded, request_gone", labels=["reason"])
        for reason in sorted({*SKIPS, *(st.skipped if st is not None else {})}):
            skipped.add_metric([reason], st.skipped.get(reason, 0) if st is not None else 0)
        yield skipped


class ProxyCollector(Collector):
    NAMES: ClassVar[tuple[str, ...]] = tuple(
        PREFIX + n for n in ("proxy_retries_total", "proxy_engine_refused_total", "proxy_unreachable_total",
                             "proxy_not_followed_total", "proxy_refused_requests_total", "proxy_in_flight"))

    def __init__(self, counts: Callable[[], Mapping[str, Any]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        c = self.counts()
        for key, name, text in (("retries", "proxy_retries", "A client's retries of a turn (the same body again)"),
                                ("refused", "proxy_engine_refused", "Chat completions the engine answered with "
                                                                   "an error status"),
                                ("unreachable", "proxy_unreachable", "Chat completions the engine never answered "
                                                                     "(502/504 from the proxy)")):
            yield CounterMetricFamily(PREFIX + name, text, value=int(c.get(key, 0)))
        nf = CounterMetricFamily(PREFIX + "proxy_not_followed", "Chat completions not followed (or whose following "
                                 "stopped), by reason", labels=["reason"])
        got = dict(c.get("not_followed", {}))
        for reason in sorted({*NOT_FOLLOWED, *got}):
            nf.add_metric([reason], int(got.get(reason, 0)))
        yield nf
        refused = CounterMetricFamily(PREFIX + "proxy_refused_requests", "Requests the proxy itself refused, by "
                                      "HTTP status", labels=["status"])
        got = dict(c.get("refused_requests", {}))
        for status in sorted({*PROXY_REFUSED, *got}):
            refused.add_metric([status], int(got.get(status, 0)))
        yield refused
        yield GaugeMetricFamily(PREFIX + "proxy_in_flight", "Chat completions being followed now",
                                value=int(c.get("in_flight", 0)))
