"""OpenTelemetry for shadow: a tracer provider from settings, a JSONL file exporter, and the spans.

Spans (names and attributes; ``gen_ai.*`` follow the OpenTelemetry GenAI conventions where one
exists, ``shadow.*`` are this project's):

- ``shadow.chunk``: one whole chunk read. ``gen_ai.conversation.id`` (the session),
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` (rows read), ``shadow.chunk.first_row``,
  ``shadow.chunk.rows``, ``shadow.window`` (``idle``, ``ration``; ``narrator`` or ``ask``: a fork's
  tail, read first), ``shadow.chunk.device_ms`` (the reader's measured cost, which already includes
  its device sync), ``shadow.backlog_after`` (ids of the session still not read). Its start and
  end are the wall clock around the read.
- ``shadow.ration``: one ration slice, parent of its chunks: ``shadow.ration.budget_ms``,
  ``shadow.ration.spent_ms``, ``shadow.ration.chunks``, ``shadow.ration.since_first_token_ms``.
- ``shadow.window``: one idle window, parent of its chunks: ``shadow.window.budget_ms``,
  ``shadow.window.spent_ms``, ``shadow.window.chunks``.
- ``shadow.ask``: one question. ``gen_ai.operation.name`` = ``chat``, ``gen_ai.conversation.id``,
  ``gen_ai.request.model``, ``shadow.ask.choices``, ``shadow.ask.label``,
  ``shadow.ask.probability``, ``shadow.ask.behind``, ``shadow.ask.latency_ms``.

No attribute is computed from a device tensor: they come from numbers the reading measured anyway,
so tracing never adds a device sync. Exporters (``QWEN38_SHADOW_TRACE``, comma-separated):
``console``, ``jsonl`` (``QWEN38_SHADOW_TRACE_FILE``), ``otlp`` (OTLP over HTTP, needs
``pip install 'shadow[otlp]'``; endpoint ``QWEN38_SHADOW_OTLP_ENDPOINT``). The provider is the
container's, never the process-wide global one.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace import format_span_id, format_trace_id

from shadow.core.records import ChunkRead
from shadow.core.scheduling import Telemetry, Window
from shadow.core.settings import ShadowSettings

SCOPE = "shadow"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """One finished span as a flat JSON-ready dict (the JSONL exporter's line)."""
    ctx = span.get_span_context()
    start, end = span.start_time or 0, span.end_time or 0
    return {
        "name": span.name,
        "trace_id": format_trace_id(ctx.trace_id) if ctx else None,
        "span_id": format_span_id(ctx.span_id) if ctx else None,
        "parent_id": format_span_id(span.parent.span_id) if span.parent else None,
        "start_ns": start,
        "end_ns": end,
        "duration_ms": (end - start) / 1e6,
        "status": span.status.status_code.name,
        "attributes": dict(span.attributes or {}),
    }


class JsonlSpanExporter(SpanExporter):
    """Appends one JSON line per span to a file (created with its folder)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._mu = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans)
        with self._mu:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._mu:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._mu:
            if not self._file.closed:
                self._file.flush()
        return True


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _otlp_exporter(endpoint: str) -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise RuntimeError("QWEN38_SHADOW_TRACE=otlp needs the OTLP exporter: "
                           "pip install 'shadow[otlp]' (opentelemetry-exporter-otlp-proto-http)") from None
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    return exporter


def exporters(settings: ShadowSettings) -> list[SpanExporter]:
    out: list[SpanExporter] = []
    for name in settings.trace_exporters:
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            out.append(ConsoleSpanExporter(service_name=SCOPE))
        elif name == "jsonl":
            out.append(JsonlSpanExporter(settings.trace_path))
        elif name == "otlp":
            out.append(_otlp_exporter(settings.otlp_endpoint))
    return out


def tracer_provider(settings: ShadowSettings) -> Iterator[TracerProvider | None]:
    """The container's resource: a provider with the configured exporters (None: traces off),
    flushed and shut down with the container's resources."""
    chosen = exporters(settings)
    if not chosen:
        yield None
        return
    provider = TracerProvider(resource=Resource.create({"service.name": SCOPE}))
    for exporter in chosen:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    try:
        yield provider
    finally:
        provider.force_flush()
        provider.shutdown()


class _Span:
    __slots__ = ("span",)

    def __init__(self, span: OtelSpan) -> None:
        self.span = span

    def set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)


class SpanTelemetry:
    """The ``Telemetry`` the schedulers and the service report to, over an OpenTelemetry provider."""

    def __init__(self, provider: Any, model: str = "") -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)
        self.model = Path(model).name if model else ""

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[_Span]:
        attrs = {"gen_ai.request.model": self.model, **attributes}
        with self.tracer.start_as_current_span(name, attributes=attrs) as span:
            yield _Span(span)

    def chunk(self, window: Window, chunk: ChunkRead, backlog_after: int, start_ns: int, end_ns: int,
              attributes: Mapping[str, Any] | None = None) -> None:
        attrs: dict[str, Any] = {
            "gen_ai.conversation.id": chunk.session,
            "gen_ai.request.model": self.model,
            "gen_ai.usage.input_tokens": chunk.rows,
            "shadow.window": window,
            "shadow.chunk.first_row": chunk.first_row,
            "shadow.chunk.rows": chunk.rows,
            "shadow.chunk.device_ms": chunk.cost_s * 1e3,
            "shadow.backlog_after": backlog_after,
        }
        if attributes:
            attrs.update(attributes)
        span = self.tracer.start_span("shadow.chunk", start_time=start_ns, attributes=attrs)
        span.end(end_time=max(end_ns, start_ns))

    def count(self, name: str, value: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        pass  # metrics are ``shadow.adapters.metrics``' (the container wraps this telemetry in them)

    def observe(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> None:
        pass


def telemetry(provider: TracerProvider | None, settings: ShadowSettings) -> Telemetry:
    """``SpanTelemetry`` over ``provider``, or ``NullTelemetry`` when traces are off."""
    if provider is None:
        from shadow.core.scheduling import NullTelemetry

        return NullTelemetry()
    return SpanTelemetry(provider, settings.model)
