"""The shadow's device cost, read back from the spans the service wrote (its JSONL exporter).

``span_costs(path)`` sums the ``shadow.chunk`` spans' ``shadow.chunk.device_ms`` (the reader's
measured cost of each chunk, device synchronised): per window (``idle``, ``ration``), per
session, and per request for the ration (its chunks carry ``shadow.request.id``; the idle
window's belong to no request). ``ration_share`` relates a request's ration to its decode time,
which the host knows and the spans do not. Questions (``shadow.ask``) are summed apart: they run
on the caller's thread, not in either window. Each finished request's ``shadow.turn`` span gives the
time its host spent inside the shadow's calls during its decode (``host_by_request_ms``).

    python -m benchmarks.ab_cost.spans ~/.qwen38-spark-engine/shadow/traces.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadow.adapters.telemetry import read_jsonl


@dataclass
class SpanCosts:
    chunks: dict[str, int] = field(default_factory=lambda: {"idle": 0, "ration": 0})
    device_ms: dict[str, float] = field(default_factory=lambda: {"idle": 0.0, "ration": 0.0})
    rows: int = 0
    max_chunk_ms: float = 0.0
    by_session_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    by_request_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # ration only
    slices: int = 0  # ration slices (``shadow.ration``), read or not
    host_by_request_ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # shadow.turn
    asks: int = 0
    ask_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return sum(self.device_ms.values())

    def ration_share(self, decode_s: Mapping[str, float]) -> dict[str, float]:
        """Each request's ration as a share of its decode time (``decode_s``: seconds per request
        id, from the host). A request with no ration chunk spent 0."""
        return {rid: self.by_request_ms.get(rid, 0.0) / (1e3 * s) for rid, s in decode_s.items() if s > 0}

    def as_dict(self) -> dict[str, Any]:
        return {"chunks": dict(self.chunks), "device_ms": {k: round(v, 3) for k, v in self.device_ms.items()},
                "total_ms": round(self.total_ms, 3), "rows": self.rows, "max_chunk_ms": round(self.max_chunk_ms, 3),
                "slices": self.slices,
                "by_session_ms": {k: round(v, 3) for k, v in self.by_session_ms.items()},
                "by_request_ms": {k: round(v, 3) for k, v in self.by_request_ms.items()},
                "asks": self.asks, "ask_ms": round(self.ask_ms, 3),
                "host_by_request_ms": {k: round(v, 3) for k, v in self.host_by_request_ms.items()}}


def costs_of(spans: Iterable[Mapping[str, Any]]) -> SpanCosts:
    """Sum span records (the JSONL exporter's lines, ``span_record``'s shape)."""
    out = SpanCosts()
    for s in spans:
        a = s.get("attributes", {})
        if s["name"] == "shadow.chunk":
            window = a["shadow.window"]
            if window not in out.chunks:
                raise ValueError(f"span {s.get('span_id')}: unknown window {window!r}")
            ms = float(a["shadow.chunk.device_ms"])
            out.chunks[window] += 1
            out.device_ms[window] += ms
            out.rows += int(a["shadow.chunk.rows"])
            out.max_chunk_ms = max(out.max_chunk_ms, ms)
            out.by_session_ms[a["gen_ai.conversation.id"]] += ms
            if window == "ration":
                rid = a.get("shadow.request.id")
                if rid is None:
                    raise ValueError(f"span {s.get('span_id')}: a ration chunk without shadow.request.id")
                out.by_request_ms[rid] += ms
        elif s["name"] == "shadow.ration":
            out.slices += 1
        elif s["name"] == "shadow.turn":
            out.host_by_request_ms[a["shadow.request.id"]] += float(a["shadow.turn.host_ms"])
        elif s["name"] == "shadow.ask" and "shadow.ask.latency_ms" in a:
            out.asks += 1
            out.ask_ms += float(a["shadow.ask.latency_ms"])
    return out


def span_costs(path: str | Path) -> SpanCosts:
    return costs_of(read_jsonl(path))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m benchmarks.ab_cost.spans TRACES.jsonl")
    print(json.dumps(span_costs(sys.argv[1]).as_dict(), indent=1))
