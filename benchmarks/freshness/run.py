"""How fresh the shadow is at each turn start of the real sessions, per policy and chunk cost.

    python -m benchmarks.freshness                       # every session, chunk costs 35 and 3 ms
    python -m benchmarks.freshness --chunk-ms 50 35 20 10 5 3 --only openhands

A replay on a simulated clock (``benchmarks.freshness.sim``) of every session under
``../shared/data/sessions/raw`` through the service's own idle and rationed schedulers, with a
reader that costs a given time per chunk: these are figures *simulated from a chunk cost*, not
GPU measurements. The chunk cost comes from ``--chunk-ms``, else from the newest
``benchmarks/results/read_rate.json`` (rows of figure ``chunk``: ``ours_ms`` by ``depth``), else
35 ms (today's, measured on the H200 by ``shadow demo``) and 3 ms.

Per policy (the idle window alone; with the ration at 0.5, 1, 2, 5 %) and chunk cost:

- ``fresh_share``: turn starts (each session's first excepted: nothing was fed before it) at which
  the shadow was less than one chunk behind;
- ``p50_behind``, ``p90_behind``: the ids the host had fed before the turn, as far as the turn's
  prompt keeps them, not read when it started;
- ``spent_pct``: the ration spent, as a share of the turns' time from first token to finish (the
  ration's own base);
- apart, the turn's new prompt ids: the time from the turn's start until its prompt's last grid
  line is read (``new_read_*``), and each session's first long prompt's (``first_long_*``).
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import keep_newest, pyplot, sessions_folder
from benchmarks.freshness.sim import Knobs, Policy, SessionRun, percentile, replay_session
from benchmarks.freshness.timelines import FIRST_TOKEN, SessionTimeline, Skipped, timelines

REPO = Path(__file__).resolve().parents[2]
RAW = sessions_folder()
RESULTS = REPO / "benchmarks" / "results"
RATIONS = (0.0, 0.5, 1.0, 2.0, 5.0)
DEFAULT_CHUNK_MS = (35.0, 3.0)
LONG_IDS = 8192  # a "long" prompt: the router's default min tokens in shadow mode
NOTE = ("simulated: the service's schedulers on a simulated clock, with a reader that costs the given time "
        "per chunk; not a GPU measurement")


@dataclass
class CostModel:
    label: str  # how the table names it
    chunk_ms: float  # the cost at the shallowest depth (the row's chunk_ms)
    source: str
    depths: tuple[int, ...] = ()
    ms: tuple[float, ...] = ()
    gpu: str = "cpu"  # where the cost was measured: a flat cost is no GPU's

    def __call__(self, row: int) -> float:
        if not self.depths:
            return self.chunk_ms / 1e3
        i = bisect.bisect_left(self.depths, row)
        if i == 0:
            return self.ms[0] / 1e3
        if i == len(self.depths):
            return self.ms[-1] / 1e3
        d0, d1, m0, m1 = self.depths[i - 1], self.depths[i], self.ms[i - 1], self.ms[i]
        return (m0 + (m1 - m0) * (row - d0) / (d1 - d0)) / 1e3


def flat(ms: float) -> CostModel:
    return CostModel(f"{ms:g}", ms, "flag")


def measured_rate_file(folder: Path = RESULTS) -> Path | None:
    """The newest ``read_rate`` result (``read_rate.json``; older runs live in ``history/``)."""
    path = folder / "read_rate.json"
    return path if path.is_file() else None


def from_rate_file(path: Path, model: str | None = None) -> CostModel:
    """The chunk cost by depth from a ``read_rate`` result: rows of figure ``chunk``, one model."""
    d = json.loads(path.read_text(encoding="utf-8"))
    rows = [r for r in d.get("rows", []) if r.get("figure") == "chunk"]
    if model is not None:
        rows = [r for r in rows if r.get("model") == model]
    if not rows:
        raise SystemExit(f"{path}: no rows of figure 'chunk'" + (f" for model {model!r}" if model else ""))
    model = model or rows[0]["model"]
    rows = sorted((r for r in rows if r["model"] == model), key=lambda r: r["depth"])
    depths, ms = tuple(int(r["depth"]) for r in rows), tuple(float(r["ours_ms"]) for r in rows)
    src = f"{path.name}: {model} on {d.get('gpu', '?')} at {d.get('commit', '?')}, ours_ms by depth"
    return CostModel(f"{model}@{d.get('gpu', '?')}", ms[0], src, depths, ms, str(d.get("gpu", "?")))


def _first_long(run: SessionRun, long_ids: int) -> float | None:
    for t in run.turns:
        if t.new_ids >= long_ids and t.read_s is not None:
            return t.read_s
    return None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def summarise(runs: Sequence[SessionRun], policy: Policy, cost: CostModel, long_ids: int = LONG_IDS,
              grid: int = 512) -> dict[str, Any]:
    counted = [t for r in runs for t in r.turns[1:]]
    behind = [t.behind for t in counted]
    reads = [t.read_s for r in runs for t in r.turns if t.read_s is not None]
    longs = [x for x in (_first_long(r, long_ids) for r in runs) if x is not None]
    spent = sum(t.spent_s for r in runs for t in r.turns)
    base = sum(t.since_first_token_s for r in runs for t in r.turns)
    return {
        "policy": policy.name, "ration_pct": policy.ration_pct, "chunk_ms": cost.chunk_ms, "cost": cost.label,
        "fresh_share": _r(sum(b < grid for b in behind) / len(behind) if behind else None, 4),
        "p50_behind": percentile(behind, 50), "p90_behind": percentile(behind, 90),
        "spent_pct": _r(100 * spent / base if base else 0.0, 4),
        "new_read_p50_s": _r(percentile(reads, 50)), "new_read_p90_s": _r(percentile(reads, 90)),
        "first_long_p50_s": _r(percentile(longs, 50)), "first_long_max_s": _r(max(longs, default=None)),
        "first_long_sessions": len(longs),
        "request_wait_max_ms": _r(1e3 * max((t.request_wait_s for r in runs for t in r.turns), default=0.0)),
        "turns": len(counted), "sessions": len(runs),
        "idle_chunks": sum(r.idle_chunks for r in runs), "ration_chunks": sum(r.ration_chunks for r in runs),
    }


def run_all(sessions: Sequence[SessionTimeline], costs: Sequence[CostModel], rations: Sequence[float],
            knobs: Knobs, progress: bool = False) -> dict[tuple[float, str], list[SessionRun]]:
    """Every session under every (ration, cost); runs keyed by (ration_pct, cost label)."""
    out: dict[tuple[float, str], list[SessionRun]] = {(p, c.label): [] for p in rations for c in costs}
    for s in sessions:
        for key, runs in replay_all(s, costs, rations, knobs, progress).items():
            out[key].extend(runs)
    return out


def replay_all(s: SessionTimeline, costs: Sequence[CostModel], rations: Sequence[float], knobs: Knobs,
               progress: bool = False) -> dict[tuple[float, str], list[SessionRun]]:
    t0 = time.perf_counter()
    out = {(p, c.label): [replay_session(s, Policy(p), c, c.chunk_ms, knobs)] for p in rations for c in costs}
    if progress:
        ids = max((len(t.prompt_ids) for t in s.turns), default=0)
        print(f"  {s.name}: {len(s.turns)} turns, longest prompt {ids:,} ids, {len(out)} replays in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return out


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(rows: Sequence[dict[str, Any]]) -> str:
    cols = [("policy", "policy"), ("ration %", "ration_pct"), ("chunk ms", "cost"), ("fresh", "fresh_share"),
            ("p50 behind", "p50_behind"), ("p90 behind", "p90_behind"), ("spent %", "spent_pct"),
            ("new p50 s", "new_read_p50_s"), ("new p90 s", "new_read_p90_s"),
            ("1st long p50 s", "first_long_p50_s"), ("1st long max s", "first_long_max_s"),
            ("wait max ms", "request_wait_max_ms")]
    lines = [[h for h, _ in cols]] + [["-" if r[k] is None else f"{r[k]:,}" if isinstance(r[k], int)
                                        else f"{r[k]:g}" if isinstance(r[k], float) else str(r[k])
                                        for _, k in cols] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    out = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    """Fresh share against the ration, one line per chunk cost; False (and a message) without matplotlib."""
    plt = pyplot(path)
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label in dict.fromkeys(r["cost"] for r in rows):
        mine = sorted((r for r in rows if r["cost"] == label), key=lambda r: r["ration_pct"])
        ax.plot([r["ration_pct"] for r in mine], [100 * r["fresh_share"] for r in mine], marker="o",
                label=f"{label} ms a chunk" if label.replace(".", "").isdigit() else label)
    ax.set_xlabel("ration, % of the time since the first token (0: idle window only)")
    ax.set_ylabel("fresh at turn start, %")
    ax.set_title("Shadow freshness on the real timelines (simulated chunk cost)", fontsize=10)
    ax.set_ylim(0, 101)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--raw", type=Path, default=RAW, help="the sessions folder (default: ../shared/data/sessions/raw, "
                    "else tests/data's subset)")
    ap.add_argument("--only", nargs="*", default=[], help="sessions whose path contains one of these")
    ap.add_argument("--chunk-ms", type=float, nargs="*", help="chunk costs in ms (default: the newest read_rate "
                    "file, else 35 and 3)")
    ap.add_argument("--rate-file", type=Path, help="a read_rate JSON to take the chunk cost by depth from")
    ap.add_argument("--rate-model", help="the model's rows in the read_rate file (default: its first)")
    ap.add_argument("--rations", type=float, nargs="*", default=list(RATIONS), help="ration, %% (0: idle only)")
    ap.add_argument("--decode-tps", type=float, default=36.0, help="the host's decode rate, for the first "
                    "token and missing ends (default 36: the spec's Qwen)")
    ap.add_argument("--round-ids", type=int, default=8, help="output ids per decode round")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--gaps", choices=("real", "none"), default="real",
                    help="none: each request arrives as the one before ends")
    ap.add_argument("--long-ids", type=int, default=LONG_IDS, help="new prompt ids that make a prompt long")
    ap.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/freshness.json; the one before "
                    "moves to history/)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    at = commit()  # the code that runs, before anything changes during a long run
    if not args.raw.is_dir():
        raise SystemExit(f"{args.raw} is absent: the real sessions live in ../shared/data beside the repo, "
                         "a subset in tests/data")

    rate_file = args.rate_file or (None if args.chunk_ms else measured_rate_file())
    if rate_file is not None:
        costs = [from_rate_file(rate_file, args.rate_model)]
    else:
        costs = [flat(ms) for ms in (args.chunk_ms or DEFAULT_CHUNK_MS)]
    knobs = Knobs(grid=args.grid, round_ids=args.round_ids, gaps=args.gaps)
    rations = sorted(set(args.rations))
    print(f"freshness: {len(rations)} policies x {len(costs)} chunk costs, sessions from {args.raw}",
          file=sys.stderr)
    runs: dict[tuple[float, str], list[SessionRun]] = {(p, c.label): [] for p in rations for c in costs}
    sources: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for item in timelines(args.raw, args.decode_tps, args.only):
        if isinstance(item, Skipped):
            skipped.append({"session": item.name, "reason": item.reason})
            print(f"  {item.name}: skipped: {item.reason}", file=sys.stderr)
            continue
        sources.append({"session": item.name, "format": item.source_format, "timing": item.timing,
                        "turns": len(item.turns)})
        for key, got in replay_all(item, costs, rations, knobs, progress=True).items():
            runs[key].extend(got)
    if not sources:
        raise SystemExit("no session with a timeline to replay")
    rows = [summarise(runs[(p, c.label)], Policy(p), c, args.long_ids, args.grid) for c in costs for p in rations]
    print(table(rows))

    date = datetime.date.today().isoformat()
    out = args.out or RESULTS / "freshness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    keep_newest(out, (".png",))
    doc = {
        "benchmark": "freshness", "date": date, "commit": at,
        # the replay runs on the CPU; the GPU is the one the chunk costs were measured on
        "gpu": ", ".join(sorted({c.gpu for c in costs})), "simulated": True, "note": NOTE,
        "chunk_cost": [c.source if c.depths else f"{c.chunk_ms:g} ms a chunk, flat ({c.source})" for c in costs],
        "first_token": FIRST_TOKEN, "decode_tps": args.decode_tps, "round_ids": args.round_ids, "grid": args.grid,
        "gaps": args.gaps, "idle_poll_s": knobs.idle_poll_s, "idle_window_s": knobs.idle_window_s,
        "slice_ms": knobs.slice_ms, "long_ids": args.long_ids,
        "counted": "turn starts after each session's first; fresh: less than one grid chunk behind",
        "sources": sources, "skipped": skipped, "rows": rows,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    if not args.no_plot and plot(rows, out.with_suffix(".png")):
        print(f"wrote {out.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
