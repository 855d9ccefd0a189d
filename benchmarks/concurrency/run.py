"""Many agents at once on one device: how fresh the shadow stays, and what it costs the host.

    python -m benchmarks.concurrency                      # N = 1, 4, 16, 64, 128; 30 simulated minutes
    python -m benchmarks.concurrency --agents 16 64 --minutes 10 --policies turn:2 device:2 device:4

N agents replay the real timelines under ``../shared/data/sessions/raw`` at once, each cycling
through the sessions from a random offset (a new session each time round; the one it leaves is
forgotten, as a host forgets a closed conversation), for ``--minutes`` of simulated time. The parts
are the service's own: the container builds the ``ShadowService`` with its ``HostActivity``, idle
window, ration and ``Shadow`` facade, with a simulated clock and a ``SimReader`` (no maths; a pass
costs a given time: ``benchmarks.freshness.sim``). Each agent's turn goes through the host
interface as an engine drives it (``arrived``, ``started``, ``first_token``, ``round_ended`` every
8 output ids, ``finished``); the idle loop looks every 0.2 s. A ration slice or an idle pass
holds the device, so every agent's event that falls inside it happens when it ends: the delays the
shadow causes push the agents later.

Chunk costs come from the newest ``read_rate`` result (``--rate-file`` names one): rows of figure
``batch_chunk`` (``ours_ms`` per 512 ids by ``batch`` and ``depth``) give a pass of B sessions the
sum of its chunks at batch B; a B not measured is priced as the reader reads it (``pass_plan``: in
the next captured size up with one slot empty, a placeholder at depth 0, or in passes of the
captured sizes, the largest first); the largest measured size is the reader's ``max_batch``.
Without them, the single-session rows (figure ``chunk``) with ``max_batch`` 1, and the output says
so. Figures simulated from those costs, not GPU measurements.

Policies: ``turn:S`` is the first design (``RATION_SCOPE=turn``: S % of each turn's time since
its first token, on its own session); ``device:S`` is one ration for the device (S % of the time
during which any request decodes, the turns in flight most behind first, then the sessions used
last). Per (agents, policy):

- ``fresh_share``: turn starts (each session's first excepted) at which the shadow was less than
  one chunk behind what the turn's prompt keeps; ``p90_behind``: the ids it was behind there;
- ``device_share_pct``: the ration's device time over the time during which some request decoded
  (what the shadow costs the host's decode; the idle window reads when nothing runs).
- ``ids_reread``: committed ids that the prompts' rollbacks sent back to be read again (rows read
  past what the next prompt kept: mostly Qwen's output, which agents' templates re-render).
- ``cost_by_pass_pct``, ``cost_by_depth_pct``: every pass's cost (ration and idle window) split by
  the pass's shape (B sessions, or ``span k``) and by its deepest chunk's depth: where the share goes.

Writes ``benchmarks/results/concurrency.json`` (``--out``) and a plot beside it (matplotlib optional).
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import itertools
import json
import math
import random
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.common import keep_newest, pyplot, sessions_folder
from benchmarks.concurrency.costs import PassCosts, faster, newest_rate_file, pass_costs
from benchmarks.freshness.run import commit
from benchmarks.freshness.sim import Knobs, Policy, SimClock, SimReader, _build, percentile
from benchmarks.freshness.timelines import SessionTimeline, Skipped, timelines
from shadow.core.costs import PAD_SLOTS

REPO = Path(__file__).resolve().parents[2]
RAW = sessions_folder()
RESULTS = REPO / "benchmarks" / "results"
AGENTS = (1, 4, 16, 64, 128)
POLICIES = ("turn:2", "device:2", "device:3", "device:4", "device:5")
# (upper bound, name) of the depth groups a row's ``cost_by_depth_pct`` splits the passes' cost into
DEPTH_BUCKETS = ((4096, "0-4k"), (16384, "4-16k"), (49152, "16-48k"), (102400, "48-100k"))
NOTE = ("simulated: the service's schedulers on a simulated clock, N agents at once, with a reader that costs "
        "the read_rate file's time per pass; not a GPU measurement")


# ---- the timelines, compact --------------------------------------------------------------------

@dataclass
class TurnShape:
    keep: int  # ids of what the host held before (last prompt and its output) the prompt keeps
    new: array  # the prompt's ids past ``keep``
    output: array
    start_s: float
    first_token_s: float
    end_s: float


@dataclass
class SessionShape:
    name: str
    turns: list[TurnShape]


def shape(tl: SessionTimeline) -> SessionShape:
    """A timeline held as each prompt's new ids (a long session's whole prompts take hundreds of MB)."""
    return SessionShape(tl.name, [TurnShape(t.keep, array("I", t.prompt_ids[t.keep:]), array("I", t.output_ids),
                                            t.start_s, t.first_token_s, t.end_s) for t in tl.turns])


# ---- the replay ----------------------------------------------------------------------------------

@dataclass
class Knobs2:
    agents: int
    minutes: float = 30.0
    round_ids: int = 8
    max_round_s: float = 1.0
    idle_poll_s: float = 0.2
    seed: int = 0


@dataclass
class Run:
    agents: int
    policy: str
    behind: list[int] = field(default_factory=list)
    turns: int = 0
    ration_s: float = 0.0
    idle_s: float = 0.0
    decoding_s: float = 0.0
    ration_chunks: int = 0
    idle_chunks: int = 0
    passes: int = 0
    batched_chunks: int = 0
    ids_reread: int = 0  # committed ids the prompts' rollbacks sent back to be read again
    sim_s: float = 0.0
    wall_s: float = 0.0
    # every pass's cost (ration and idle window alike) by its shape and by its deepest chunk's depth:
    # where the device share goes
    cost_by_pass: Counter[str] = field(default_factory=Counter)
    cost_by_depth: Counter[str] = field(default_factory=Counter)

    def count_pass(self, batch: Sequence[tuple[Any, Any]], cost: float, grid: int) -> None:
        self.passes += 1
        self.batched_chunks += len(batch)
        books = {id(book): book for book, _ in batch}
        shape = str(len(batch)) if len(books) == len(batch) else f"span {len(batch)}"
        deepest = max(book.committed for book in books.values()) - grid  # committed: after the pass
        self.cost_by_pass[shape] += cost
        self.cost_by_depth[next((name for top, name in DEPTH_BUCKETS if deepest < top), "100k+")] += cost

    def row(self, grid: int) -> dict[str, Any]:
        fresh = sum(b < grid for b in self.behind) / len(self.behind) if self.behind else None
        return {
            "agents": self.agents, "policy": self.policy,
            "fresh_share": None if fresh is None else round(fresh, 4),
            "p90_behind": percentile(self.behind, 90),
            "device_share_pct": round(100 * self.ration_s / self.decoding_s, 3) if self.decoding_s else 0.0,
            "turns": len(self.behind), "ration_chunks": self.ration_chunks, "idle_chunks": self.idle_chunks,
            "idle_s": round(self.idle_s, 3), "decoding_s": round(self.decoding_s, 1), "ids_reread": self.ids_reread,
            "mean_batch": round(self.batched_chunks / self.passes, 2) if self.passes else None,
            "simulated_s": round(self.sim_s, 1), "wall_s": round(self.wall_s, 1),
            "cost_by_pass_pct": _shares(self.cost_by_pass), "cost_by_depth_pct": _shares(self.cost_by_depth),
        }


def _shares(costs: Counter[str]) -> dict[str, float]:
    total = sum(costs.values())
    return {k: round(100 * v / total, 1) for k, v in sorted(costs.items(), key=lambda kv: -kv[1])} if total else {}


def parse_policy(text: str) -> Policy:
    """``turn:S`` or ``device:S``, then ``:spans`` to read spans, then (device) ``:gatherN/MS``: a slice
    waits for N chunks pending, at most MS ms (``RATION_GATHER``, ``RATION_GATHER_MS``); ``:outK``: the
    ration reads Qwen's output too while at most K requests run (``RATION_OUTPUT_TURNS``, 1)."""
    scope, _, rest = text.partition(":")
    pct, _, extra = rest.partition(":")
    words = extra.split(":") if extra else []
    spans = "spans" in words
    out = [w for w in words if w.startswith("out")]
    try:
        output_turns = int(out[0][3:]) if out else 1
    except ValueError:
        output_turns = -1
    gather = [w for w in words if w.startswith("gather")]
    try:
        n, ms = (int(gather[0][6:].split("/")[0]), float(gather[0].split("/")[1])) if gather else (1, 0.0)
    except (ValueError, IndexError):
        n, ms = 0, -1.0
    if scope not in ("turn", "device") or not pct or len(words) != spans + len(gather) + len(out) \
            or len(gather) > 1 or len(out) > 1 or output_turns < 0 \
            or n < 1 or ms < 0 or (gather and scope != "device"):
        raise SystemExit(f"policy {text!r}: write turn:S or device:S, then :spans to read spans, then (device) "
                         f":gatherN/MS, then :outK to read Qwen's output while at most K requests run "
                         f"(S the share in %)")
    return Policy(float(pct), scope, spans, n, ms, output_turns)


def replay(sessions: Sequence[SessionShape], policy: Policy, costs: PassCosts, k: Knobs2,
           grid: int = 512) -> Run:
    """``k.agents`` agents on one service, one simulated clock, for ``k.minutes``."""
    wall = time.perf_counter()
    clock = SimClock()
    if policy.spans and not costs.span_ratio:
        raise SystemExit("a :spans policy needs span_chunk rows in the read_rate file")
    reader = SimReader(grid, lambda row: costs.per_chunk(1, row), clock, costs.max_batch, costs,
                       spans=tuple(costs.span_ratio) if policy.spans else (), span_cost=costs.span)
    gather = f":gather{policy.gather}/{policy.gather_ms:g}" if policy.gather > 1 else ""
    run = Run(k.agents, f"{policy.scope}:{policy.ration_pct:g}{':spans' if policy.spans else ''}{gather}"
                        f"{'' if policy.output_turns == 1 else f':out{policy.output_turns}'}")

    def on_pass(batch: Sequence[Any], now: float, cost: float) -> None:
        run.count_pass(batch, cost, grid)

    reader.on_pass = on_pass
    end_s = 60.0 * k.minutes
    rng = random.Random(k.seed)
    events: list[tuple[float, int, Callable[[], None]]] = []
    seq = itertools.count()

    def at(t: float, action: Callable[[], None]) -> None:
        heapq.heappush(events, (t, next(seq), action))

    with tempfile.TemporaryDirectory(prefix="shadow-concurrency-") as home:
        knobs = Knobs(grid=grid, round_ids=k.round_ids, idle_poll_s=k.idle_poll_s)
        container, service = _build(policy, knobs, reader, clock, home)
        shadow = container.slot().get()
        ids = itertools.count()

        def agent(a: int) -> None:
            order = list(range(len(sessions)))
            offset = rng.randrange(len(sessions))
            order = order[offset:] + order[:offset]
            state = {"cycle": 0, "turn": 0, "held": [], "session": ""}

            def next_session() -> None:
                if state["session"]:
                    service.forget(state["session"])
                state["session"] = f"a{a}.{state['cycle']}"
                state["turn"], state["held"] = 0, []

            def arrive(t: float) -> None:
                """The next turn at ``t``: announced on the clock (an idle pass under way when it
                comes is the last), started by the loop."""
                if t >= end_s:
                    return
                s = sessions[order[state["cycle"] % len(order)]]
                turn = s.turns[state["turn"]]
                rid = f"r{next(ids)}"
                clock.at(t, lambda: service.arrived(rid))
                at(t, lambda: start(s, turn, rid))

            def start(s: SessionShape, turn: TurnShape, rid: str) -> None:
                prompt = state["held"][:turn.keep] + turn.new.tolist()
                service.started(rid, state["session"], ids=prompt)
                if state["turn"]:
                    committed = shadow.counts(state["session"])[1]
                    run.behind.append(max(0, turn.keep - committed))
                state["held"] = prompt
                at(clock() + (turn.first_token_s - turn.start_s), lambda: first(s, turn, rid))

            def first(s: SessionShape, turn: TurnShape, rid: str) -> None:
                service.first_token(rid)
                decode_s = turn.end_s - turn.first_token_s
                out = turn.output.tolist()
                n = max(1, math.ceil(len(out) / k.round_ids), math.ceil(decode_s / k.max_round_s))
                pieces = [out[j * len(out) // n:(j + 1) * len(out) // n] for j in range(n)]
                at(clock() + decode_s / n, lambda: rounds(s, turn, rid, pieces, 0, decode_s / n))

            def rounds(s: SessionShape, turn: TurnShape, rid: str, pieces: list[list[int]], j: int, dt: float) -> None:
                service.round_ended(rid, pieces[j])
                state["held"].extend(pieces[j])
                if j + 1 < len(pieces):
                    at(clock() + dt, lambda: rounds(s, turn, rid, pieces, j + 1, dt))
                    return
                service.finished(rid)
                state["turn"] += 1
                if state["turn"] < len(s.turns):
                    gap = max(0.0, s.turns[state["turn"]].start_s - turn.end_s)
                else:
                    state["cycle"] += 1
                    next_session()
                    gap = 0.0
                arrive(clock() + gap)

            next_session()
            arrive(0.0)

        for a in range(k.agents):
            agent(a)

        def look() -> None:
            chunks = service.idle_step()
            run.idle_chunks += len(chunks)
            run.idle_s += sum(c.cost_s for c in chunks)
            if events and clock() < end_s:
                at(clock() + k.idle_poll_s, look)

        at(0.0, look)
        while events:
            t, _, action = heapq.heappop(events)
            clock.advance_to(t)  # (an event due while the device was held happens when it is free)
            action()
        ration = service.stats["ration"]
        run.ration_s, run.ration_chunks = ration.spent_s, ration.chunks
        run.decoding_s = container.activity().decoding_s()
        run.ids_reread = int(container.metrics().value("shadow_reread_tokens_total"))
        run.sim_s = clock()
        container.shutdown_resources()
    run.wall_s = time.perf_counter() - wall
    return run


# ---- output --------------------------------------------------------------------------------------

def table(rows: Sequence[dict[str, Any]]) -> str:
    cols = ("agents", "policy", "fresh_share", "p90_behind", "device_share_pct", "mean_batch", "turns", "wall_s")
    cols += tuple(c for c in ("what_if", "pad") if any(c in r for r in rows))
    lines = [list(cols)] + [["-" if r.get(c) is None else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> bool:
    plt = pyplot(path)
    if plt is None:
        return False
    fig, (fresh, share) = plt.subplots(1, 2, figsize=(10, 4))
    def variant(r: dict[str, Any]) -> str | None:
        return f"if {r['what_if']}" if "what_if" in r else f"pad {r['pad']}" if "pad" in r else None

    for policy, what_if in dict.fromkeys((r["policy"], variant(r)) for r in rows):
        mine = [r for r in rows if r["policy"] == policy and variant(r) == what_if]
        xs = [r["agents"] for r in mine]
        label = policy if what_if is None else f"{policy} {what_if}"
        fresh.plot(xs, [100 * (r["fresh_share"] or 0) for r in mine], marker="o", label=label)
        share.plot(xs, [r["device_share_pct"] for r in mine], marker="o", label=label)
    for ax, label in ((fresh, "fresh at turn start, %"), (share, "device share while decoding, %")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("agents at once")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Many agents on one device (simulated from read_rate chunk costs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def load(raw: Path, only: Sequence[str], decode_tps: float) -> tuple[list[SessionShape], list[dict[str, str]]]:
    shapes, skipped = [], []
    for item in timelines(raw, decode_tps, only):
        if isinstance(item, Skipped):
            skipped.append({"session": item.name, "reason": item.reason})
        else:
            shapes.append(shape(item))
    if not shapes:
        raise SystemExit(f"no session with a timeline to replay under {raw}")
    return shapes, skipped


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--raw", type=Path, default=RAW, help="the sessions folder (default: ../shared/data/sessions/raw, "
                    "else tests/data's subset)")
    ap.add_argument("--only", nargs="*", default=[], help="sessions whose path contains one of these")
    ap.add_argument("--agents", type=int, nargs="*", default=list(AGENTS))
    ap.add_argument("--policies", nargs="*", default=list(POLICIES), help="turn:S or device:S, S in %%")
    ap.add_argument("--minutes", type=float, default=30.0, help="simulated minutes per run")
    ap.add_argument("--rate-file", type=Path, help="a read_rate JSON (default: the newest)")
    ap.add_argument("--rate-model", help="the model's rows in the read_rate file (default: its first)")
    ap.add_argument("--decode-tps", type=float, default=36.0, help="the host's decode rate (default 36)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "concurrency.json")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--faster", nargs="*", default=[],
                    help="what if (not measured): base=Y,depth=X divides the shallowest chunk cost by Y and\n"
                         "what depth adds by X; one replay set per value")
    ap.add_argument("--pad", nargs="*", default=[],
                    help="how a pass of a size not captured is priced: N (at most N empty slots, then split;\n"
                         f"the reader's is {PAD_SLOTS}) or none (interpolated, as if every size were captured);\n"
                         "one replay set per value")
    args = ap.parse_args(argv)
    if args.pad and args.faster:
        raise SystemExit("--pad and --faster each make their own replay sets: give one of them")
    try:
        pads = [None if v == "none" else int(v) for v in args.pad]
    except ValueError:
        raise SystemExit(f"--pad takes whole numbers of empty slots or none, got {args.pad}") from None
    at = commit()
    if not args.raw.is_dir():
        raise SystemExit(f"{args.raw} is absent: the real sessions live in ../shared/data beside the repo, "
                         "a subset in tests/data")
    rate_file = args.rate_file or newest_rate_file()
    if rate_file is None:
        raise SystemExit("no read_rate result under benchmarks/results: run python -m benchmarks.read_rate first")
    costs = pass_costs(rate_file, args.rate_model)
    print(f"concurrency: chunk costs from {costs.source}", file=sys.stderr)
    sessions, skipped = load(args.raw, args.only, args.decode_tps)
    doc = {
        "benchmark": "concurrency", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": at, "device": "simulated (costs: see chunk_cost)", "simulated": True, "note": NOTE,
        # the device whose measured costs the replay charges (it runs on the CPU, on a simulated clock)
        "gpu": json.loads(rate_file.read_text(encoding="utf-8")).get("gpu", "unknown"),
        "chunk_cost": costs.source, "batch_costs_measured": costs.max_batch > 1, "max_batch": costs.max_batch,
        "minutes": args.minutes, "decode_tps": args.decode_tps, "round_ids": 8, "grid": 512, "seed": args.seed,
        "counted": "turn starts after each session's first; fresh: less than one grid chunk behind",
        "sessions": [s.name for s in sessions], "skipped": skipped, "rows": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    keep_newest(args.out, (".png",))  # the run before goes to history/ first: this one writes as it goes
    variants = [({"what_if": text}, faster(costs, text)) for text in args.faster]
    variants += [({"pad": "none" if pad is None else pad}, replace(costs, pad=pad)) for pad in pads]
    if args.faster:
        doc["note"] = NOTE + "; what if: each row's costs are the measured ones made faster as its what_if says"
    if pads:
        doc["note"] = NOTE + ("; each row's pad: how its passes of sizes the reader did not capture were priced "
                              "(``PassCosts.pad``)")
    for extra, priced in variants or [({}, costs)]:
        for n in args.agents:
            for text in args.policies:
                run = replay(sessions, parse_policy(text), priced, Knobs2(n, args.minutes, seed=args.seed))
                doc["rows"].append(run.row(512) | extra)
                print(table(doc["rows"][-1:]).splitlines()[-1], file=sys.stderr, flush=True)
                args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")  # a long run keeps what it has
    rows = doc["rows"]
    print(table(rows))
    print(f"wrote {args.out}", file=sys.stderr)
    if not args.no_plot and plot(rows, args.out.with_suffix(".png")):
        print(f"wrote {args.out.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
