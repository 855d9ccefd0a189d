"""The concurrency replay's chunk costs: a pass's cost by its batch size and its sessions' depths,
from a read_rate result's ``batch_chunk`` and ``span_chunk`` rows; passes of sizes the reader did
not capture priced as the reader reads them (``shadow.core.costs.pass_plan``); and ``--faster``'s
what-if, which scales them."""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.common import RESULTS
from benchmarks.freshness.run import CostModel, from_rate_file
from shadow.core.costs import PAD_SLOTS, pass_plan


@dataclass
class PassCosts:
    """A pass's cost by its sessions' depths: ``by_batch[B]`` is the per-chunk cost by depth at batch B."""

    by_batch: dict[int, CostModel]
    source: str
    # span size -> how much a span of k chunks costs over a pass of k sessions at the same depths:
    # the worst ratio of the read_rate file's ``span_chunk`` rows to its ``batch_chunk`` rows
    span_ratio: dict[int, float] = field(default_factory=dict)
    grid: int = 512
    # Batch sizes read in one pass of their own (captured), B = 3 measured as the reader runs it
    # (a pass of 4, one slot empty) is not one; () for every measured size.
    captured: tuple[int, ...] = ()
    # How a pass of an unmeasured B reaches the device, as the reader runs it: in passes of the
    # captured sizes, planned by ``shadow.core.costs.pass_plan`` with this many empty slots at most
    # (0: the largest size first, then the rest); None: B between two measured sizes interpolated,
    # a what-if (every size captured), how this replay priced passes before 2026-12-06
    pad: int | None = PAD_SLOTS

    @property
    def max_batch(self) -> int:
        return max(self.by_batch)

    def per_chunk(self, batch: int, row: int) -> float:
        sizes = sorted(self.by_batch)
        i = bisect.bisect_left(sizes, batch)
        if (i < len(sizes) and sizes[i] == batch) or i == 0:
            return self.by_batch[sizes[min(i, len(sizes) - 1)]](row)
        if i == len(sizes):
            return self.by_batch[sizes[-1]](row)
        lo, hi = sizes[i - 1], sizes[i]
        a, b = self.by_batch[lo](row), self.by_batch[hi](row)
        return a + (b - a) * (batch - lo) / (hi - lo)

    def __call__(self, rows: Sequence[int]) -> float:
        if self.pad is None or len(rows) in self.by_batch:  # a measured size: what the reader took for it
            return sum(self.per_chunk(len(rows), r) for r in rows)
        cost, at = 0.0, 0
        for size, real in pass_plan(len(rows), self.captured or tuple(self.by_batch), self.pad):
            # an empty slot reads a placeholder chunk at depth 0
            cost += sum(self.per_chunk(size, r) for r in rows[at:at + real]) + (size - real) * self.per_chunk(size, 0)
            at += real
        return cost

    def span(self, chunks: int, row: int) -> float:
        """A span of ``chunks`` chunks of one session from ``row``: a pass of as many sessions at
        the same depths, times the span's measured ratio."""
        return self([row + i * self.grid for i in range(chunks)]) * self.span_ratio[chunks]


def faster(costs: PassCosts, text: str) -> PassCosts:
    """What if: ``base=Y,depth=X`` divides each batch size's shallowest cost by Y and what depth
    adds to it (attention, the one part batching cannot share) by X. Not a measurement: it says what
    a kernel would have to buy for a row of issue 18 to be met."""
    try:
        parts = dict(w.split("=") for w in text.split(","))
        base, depth = float(parts.pop("base", 1.0)), float(parts.pop("depth", 1.0))
    except ValueError:
        parts, base, depth = {"?": text}, 0.0, 0.0
    if parts or base <= 0 or depth <= 0:
        raise SystemExit(f"--faster {text!r}: write base=Y,depth=X (each a factor above 0; either may be left out)")

    def scaled(m: CostModel) -> CostModel:
        ms = tuple(m.ms[0] / base + (x - m.ms[0]) / depth for x in m.ms) if m.ms else ()
        return replace(m, chunk_ms=m.chunk_ms / base, ms=ms)

    return replace(costs, by_batch={b: scaled(m) for b, m in costs.by_batch.items()},
                   source=f"{costs.source}; what if: the shallowest cost / {base:g}, what depth adds / {depth:g}")


def newest_rate_file(folder: Path = RESULTS) -> Path | None:
    """``read_rate.json`` (the stable name), else the newest ``read_rate-*.json`` by the date it records."""
    if (folder / "read_rate.json").is_file():
        return folder / "read_rate.json"
    from benchmarks.freshness.run import newest_rate_file as dated

    return dated(folder)


def pass_costs(path: Path, model: str | None = None) -> PassCosts:
    d = json.loads(path.read_text(encoding="utf-8"))
    single = from_rate_file(path, model)
    rows = [r for r in d.get("rows", []) if r.get("figure") == "batch_chunk"
            and (model is None or r.get("model", model) == model)]
    by_batch: dict[int, CostModel] = {1: single}
    captured = {1}
    for b in sorted({int(r["batch"]) for r in rows}):
        mine = sorted((r for r in rows if int(r["batch"]) == b), key=lambda r: int(r["depth"]))
        depths, ms = tuple(int(r["depth"]) for r in mine), tuple(float(r["ours_ms"]) for r in mine)
        by_batch[b] = CostModel(f"B={b}", ms[0], path.name, depths, ms)
        if all(r.get("passes", [[b, b]]) == [[b, b]] for r in mine):  # files before 2026-12-06: one pass each
            captured.add(b)
    ratio: dict[int, list[float]] = {}
    for r in d.get("rows", []):
        if r.get("figure") == "span_chunk" and int(r["span"]) in by_batch and (model is None or
                                                                              r.get("model", model) == model):
            k, depth = int(r["span"]), int(r["depth"]) or 1024  # the 0-2k batch group's mean depth
            ratio.setdefault(k, []).append(float(r["ours_ms"]) / (by_batch[k](depth) * 1e3))
    span_ratio = {k: max(v) for k, v in sorted(ratio.items())}
    # the sizes the reader captured and its warm-up check let through, where the file says (since
    # every size up to 16 is captured, most are not measured: priced between the measured ones)
    name = model or (rows[0].get("model") if rows else None)
    batch_run = (d.get("startup", {}).get(name) or {}).get("batch", {}) if name else {}
    reported = (batch_run.get("fast_report") or {}).get("batches", {})
    if reported:
        captured = {int(b) for b, why in reported.items() if why == "ok"}
    if len(by_batch) > 1:
        src = (f"{path.name} at {d.get('commit', '?')} on {d.get('gpu', d.get('device', '?'))}: batch_chunk rows, "
               f"B = {', '.join(map(str, sorted(by_batch)))}")
    else:
        src = (f"{single.source}; no batch_chunk rows (batch costs not measured yet): one session a pass, "
               "max_batch 1")
    if span_ratio:
        src += f"; span_chunk rows, spans {', '.join(f'{k} (x{v:.3f})' for k, v in span_ratio.items())}"
    src += f"; other sizes as the reader reads them in passes of {', '.join(map(str, sorted(captured)))}"
    return PassCosts(by_batch, src, span_ratio, captured=tuple(sorted(captured)))
