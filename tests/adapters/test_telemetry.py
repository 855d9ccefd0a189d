"""Exporters from settings (none, console, jsonl, otlp), the JSONL lines, and no global provider;
and `shadow serve` as a process, from settings, with --port overriding QWEN38_SHADOW_PORT."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry import trace

from shadow.adapters.telemetry import SpanTelemetry, exporters, read_jsonl, telemetry, tracer_provider
from shadow.core.records import ChunkRead
from shadow.core.scheduling import NullTelemetry
from shadow.core.settings import PREFIX, ShadowSettings


def test_trace_none_records_nothing() -> None:
    s = ShadowSettings(_env_file=None)
    gen = tracer_provider(s)
    provider = next(gen)
    assert provider is None and isinstance(telemetry(provider, s), NullTelemetry)


def test_exporters_from_settings(tmp_path: Path) -> None:
    s = ShadowSettings(_env_file=None, trace="console,jsonl", trace_file=str(tmp_path / "x.jsonl"))
    assert [type(e).__name__ for e in exporters(s)] == ["ConsoleSpanExporter", "JsonlSpanExporter"]


def test_jsonl_spans_from_settings(tmp_path: Path) -> None:
    path = tmp_path / "t" / "spans.jsonl"
    s = ShadowSettings(_env_file=None, model="/m/Qwen3.5-0.8B", trace="jsonl", trace_file=str(path))
    before = trace.get_tracer_provider()
    gen = tracer_provider(s)
    provider = next(gen)
    tel = telemetry(provider, s)
    assert isinstance(tel, SpanTelemetry)
    with tel.span("shadow.ration", {"shadow.ration.budget_ms": 12.5}) as sl:
        tel.chunk("ration", ChunkRead("s", 512, 512, 0.0375), 100, 10, 20, {"shadow.request.id": "r"})
        sl.set("shadow.ration.spent_ms", 37.5)
    with pytest.raises(StopIteration):
        next(gen)  # flushes and shuts down
    assert trace.get_tracer_provider() is before  # the process-wide provider was never set
    chunk, ration = read_jsonl(path)
    assert chunk["name"] == "shadow.chunk" and chunk["parent_id"] == ration["span_id"]
    assert chunk["attributes"] == {
        "gen_ai.conversation.id": "s", "gen_ai.request.model": "Qwen3.5-0.8B", "gen_ai.usage.input_tokens": 512,
        "shadow.window": "ration", "shadow.chunk.first_row": 512, "shadow.chunk.rows": 512,
        "shadow.chunk.device_ms": 37.5, "shadow.backlog_after": 100, "shadow.request.id": "r"}
    assert (chunk["start_ns"], chunk["end_ns"]) == (10, 20)
    assert ration["attributes"]["shadow.ration.spent_ms"] == 37.5


def test_otlp_exporter_sends_spans_to_a_collector() -> None:
    """A real OTLP/HTTP exchange with a receiver on loopback standing in for the collector."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    received: list[tuple[str, str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, self.headers.get("Content-Type", ""), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        s = ShadowSettings(_env_file=None, trace="otlp", otlp_endpoint=endpoint)
        [exporter] = exporters(s)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with provider.get_tracer("test").start_as_current_span("shadow.chunk") as span:
            span.set_attribute("shadow.chunk.rows", 512)
        provider.shutdown()
    finally:
        server.shutdown()
    [(path, content_type, body)] = received
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    assert b"shadow.chunk" in body and b"shadow.chunk.rows" in body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_shadow_serve_runs_from_settings(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "serve.env").write_text("QWEN38_SHADOW_MODEL=\nQWEN38_SHADOW_PORT=1\nQWEN38_SHADOW_HOST=127.0.0.1\n")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIX)}
    proc = subprocess.Popen([sys.executable, "-m", "shadow.cli", "serve", "--port", str(port), "--log-level",
                             "warning"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/conductor/shadow/status", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "shadow serve did not answer within 60 s"
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["slot"]["state"] == "off" and r.json()["where"]["port"] == port
        assert httpx.get(f"http://127.0.0.1:{port}/schema/openapi.json").json()["info"]["title"] == "shadow"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    assert proc.returncode == 0
