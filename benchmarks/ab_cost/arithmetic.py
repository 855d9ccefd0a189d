"""The A/B's arithmetic: paired changes between the off and on arms and their spread, and the
shadow's cost read back from the chunk and turn spans of the same runs."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks.ab_cost.engine import TurnTiming
from benchmarks.ab_cost.spans import costs_of


def spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        raise ValueError("no values")
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "mean": statistics.fmean(values), "values": list(values)}


def pct_changes(off: Sequence[float], on: Sequence[float]) -> list[float]:
    """100 (on - off) / off, pair by pair (run i of each arm)."""
    if len(off) != len(on) or not off:
        raise ValueError(f"pairs need as many runs in each arm, got {len(off)} off and {len(on)} on")
    if any(x <= 0 for x in off):
        raise ValueError(f"an off-run figure is not positive: {list(off)}")
    return [100.0 * (b - a) / a for a, b in zip(off, on, strict=True)]


def overlaps(span: Mapping[str, Any], windows: Iterable[tuple[int, int]]) -> bool:
    return any(span["start_ns"] < end and span["end_ns"] > start for start, end in windows)


def chunk_spans(spans: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [s for s in spans if s["name"] == "shadow.chunk"]


def trace_cost(spans: Sequence[Mapping[str, Any]], turns: Sequence[TurnTiming], overlap: bool = False
               ) -> dict[str, Any]:
    """The shadow's cost during these turns' decodes, from the spans: the device time of the
    ration's chunks of these requests and of any idle-window chunk that overlaps one of the decodes
    (an overlapped host's cost), and the time inside the shadow's calls from their ``shadow.turn``
    spans (a waiting host's cost)."""
    rids = {t.request_id for t in turns}
    decodes = [(t.decode_start_ns, t.decode_end_ns) for t in turns]
    mine = [s for s in chunk_spans(spans)
            if s["attributes"].get("shadow.request.id") in rids
            or (s["attributes"]["shadow.window"] == "idle" and overlaps(s, decodes))]
    costs = costs_of(mine)
    decode_s = {t.request_id: t.decode_s for t in turns}
    total_s = sum(decode_s.values())
    shares = costs.ration_share(decode_s)
    host = costs_of(s for s in spans if s["name"] == "shadow.turn"
                    and s["attributes"].get("shadow.request.id") in rids).host_by_request_ms
    chunks_pct = 100.0 * costs.total_ms / (1e3 * total_s) if total_s > 0 else 0.0
    host_pct = 100.0 * sum(host.values()) / (1e3 * total_s) if total_s > 0 else 0.0
    return {"ration_ms": costs.device_ms["ration"], "ration_chunks": costs.chunks["ration"],
            "idle_in_decode_ms": costs.device_ms["idle"], "idle_in_decode_chunks": costs.chunks["idle"],
            "turn_spans": len(host), "trace_chunks_pct": chunks_pct, "trace_host_pct": host_pct,
            "trace_cost_pct": chunks_pct if overlap else host_pct,
            "trace_estimator": "chunk spans (overlapped host)" if overlap else "turn spans' host time (waiting host)",
            "ration_share_max_pct": 100.0 * max(shares.values(), default=0.0)}
