"""A fleet of shadows that loses an instance now and then: what the shared store buys, replayed.

    python -m benchmarks.scale_out replay                 # 16 instances x 64 agents, 90 min, a loss every 30
    python -m benchmarks.scale_out replay --workers 16    # one process an instance (the run's wall / 16)
    python -m benchmarks.scale_out store --out DIR [--redis-server PATH] [--model 0.8B --ids 32768 --device cuda]
    python -m benchmarks.scale_out bytes                  # bytes per session of the 0.8B, 2B and 4B

``replay``: ``--instances`` shadow services, each following ``--agents`` agents that replay the real
timelines under ``../shared/data/sessions/raw`` (as ``benchmarks.concurrency`` does for one service:
its session shapes, its pass costs from the newest ``read_rate`` file, the service's own schedulers
through ``benchmarks.freshness.sim``; the default ration policy), each instance on its own simulated
clock. Every ``--loss-every`` simulated minutes one instance, drawn at random, is lost (a kill -9):
its agents move to the survivors, fewest agents first, and keep them for the rest of the run (the
fleet runs one instance short, as until an orchestrator's replacement has warmed up). A moved
agent's turn in flight finishes on the host unseen by any shadow; its next turn reaches its new
instance, which holds none of the session. Two arms, each a whole run:

- ``restore``: each turn's end writes its session's park to the store (write-behind: the store's
  parks are whole, the same bytes as a parked file; the bytes new since the session's last write
  are counted beside them). While the lost holder's lease runs (``--lease-s``) the store refuses a
  moved session to its new instance (a 409 naming the holder): its turns then go unfollowed and count
  as not fresh. Its first turn after that takes the lease, and the feed restores the session's last
  write (as the tiered store does, within the feed). The transfers go through one store pipe of the
  measured ``--store-gbps`` shared by the whole fleet, first come first served, each begun once the
  lease has lapsed and a turn of the session has reached its new instance; a turn that starts before
  its restore has landed counts as not fresh, and the time a feed waits for its restore is reported
  (``restore_wait_at_feed_s``). A restore holds no device: the device
  time it costs is the host-to-device copy at ``--copy-gbps`` (measured by ``store`` on a GPU).
- ``reread``: no store: a moved session is read again from its start, once the lease has lapsed.

Reported per arm: the fresh share at turn starts (a turn start after the session's first, less than
one grid chunk behind what the prompt keeps) overall, for the minute before and the minute after each
loss (the fleet's, and the moved sessions' alone), and the time after each loss until every 10-s
window of turn starts is back at or above 90 % fresh (fleet; moved sessions); the device time spent
re-reading what a moved session held (chunks below the line its lost holder had committed) against the
restores' copy time; the store's peak GB/s in 1-s and 10-s windows (write-behind and restores).
Figures simulated from measured costs, not a fleet measured.

``store``: one session through a real ``redis-server`` on loopback, started by the script on a free port:
park and restore through Redis against the local disk and against reading the session again, each
restored state ``torch.equal`` to a fresh prefill (``store.py``).

Writes ``benchmarks/results/scale_out.json`` (``replay``, ``--out``) or ``DIR/scale_out_store.json`` (``store``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, keep_newest
from benchmarks.concurrency.costs import newest_rate_file, pass_costs
from benchmarks.concurrency.run import load, parse_policy
from benchmarks.freshness.run import commit

from .fleet import fleet
from .members import ARMS, FRESH_TARGET, NOTE, POLICY, RAW, FleetKnobs, state_bytes


def share(samples: Sequence[tuple[float, int, bool]], grid: int) -> float | None:
    return round(sum(b < grid for _, b, _ in samples) / len(samples), 4) if samples else None


def back_above(samples: Sequence[tuple[float, int, bool]], t0: float, t1: float, grid: int,
               window_s: float = 10.0, target: float = FRESH_TARGET) -> float | None:
    """Seconds from ``t0`` to the end of the last ``window_s`` window before ``t1`` whose turn starts
    were under ``target`` fresh (0: none was); None when no window held a turn start."""
    bins: dict[int, list[tuple[float, int, bool]]] = {}
    for s in samples:
        if t0 <= s[0] < t1:
            bins.setdefault(int((s[0] - t0) // window_s), []).append(s)
    if not bins:
        return None
    under = [w for w, got in bins.items() if (share(got, grid) or 0.0) < target]
    return (max(under) + 1) * window_s if under else 0.0


def under(samples: Sequence[tuple[float, int, bool]], t0: float, t1: float, grid: int,
          window_s: float = 10.0) -> list[dict[str, Any]]:
    """The ``window_s`` windows from ``t0`` to ``t1`` whose turn starts were under 90 % fresh: where each
    begins (s after ``t0``), its turn starts, how many of them fresh, and of the moved sessions."""
    out = []
    for w in range(math.ceil((t1 - t0) / window_s)):
        got = [s for s in samples if t0 + w * window_s <= s[0] < t0 + (w + 1) * window_s]
        if got and (share(got, grid) or 0.0) < FRESH_TARGET:
            out.append({"from_s": w * window_s, "turns": len(got), "fresh": sum(b < grid for _, b, _ in got),
                        "moved": sum(m for _, _, m in got), "moved_fresh": sum(m and b < grid for _, b, m in got)})
    return out


def peaks(events: Sequence[tuple[float, float, int]], windows: Sequence[int] = (1, 10)) -> dict[str, float]:
    """Peak GB/s over windows of each length: an event (begin, end, bytes) spread evenly over its
    time (begin == end: all at once)."""
    per_s: dict[int, float] = {}
    for begin, end, size in events:
        if end <= begin:
            per_s[int(begin)] = per_s.get(int(begin), 0.0) + size
            continue
        s = int(begin)
        while s < end:
            part = min(end, s + 1) - max(begin, s)
            per_s[s] = per_s.get(s, 0.0) + size * part / (end - begin)
            s += 1
    out = {}
    for w in windows:
        best = max((sum(per_s.get(s + j, 0.0) for j in range(w)) for s in per_s), default=0.0)
        out[f"peak_{w}s_GBps"] = round(best / w / 1e9, 3)
    return out


def report(run: dict[str, Any], k: FleetKnobs, copy_gbps: float | None) -> dict[str, Any]:
    """The arm's row: fresh shares, each loss's windows, device time, the store's traffic."""
    g = k.grid
    samples = sorted(s for r in run["instances"] for s in r["samples"])
    ends = [*k.losses[1:], k.end_s]
    losses = []
    for loss, t_next in zip(run["losses"], ends, strict=True):
        t = loss["at_s"]
        moved = [s for s in samples if s[2]]
        losses.append(loss | {
            "fresh_minute_before": share([s for s in samples if t - 60 <= s[0] < t], g),
            "fresh_minute_after": share([s for s in samples if t <= s[0] < t + 60], g),
            "moved_fresh_minute_after": share([s for s in moved if t <= s[0] < t + 60], g),
            "moved_turn_starts_minute_after": sum(1 for s in moved if t <= s[0] < t + 60),
            "back_above_90_s": back_above(samples, t, t_next, g),
            "under_90_windows": under(samples, t, t_next, g),
            "moved_back_above_90_s": back_above(moved, t, t_next, g)})
    sums = {key: sum(r[key] for r in run["instances"]) for key in ("ration_s", "idle_s", "reader_s", "reread_s",
                                                                    "decoding_s")}
    writes = [w for r in run["instances"] for w in r["writes"]]
    restore_bytes = sum(b for _, _, b in run["pipe"])
    traffic = [(t, t, b) for t, b, _ in writes] + list(run["pipe"])
    waits = sorted(end - begin for begin, end, _ in run["pipe"])
    # a moved session's first feed here waits for its restore to land (the tiered store restores within the feed)
    blocked = sorted(max(0.0, done - asked) for r in run["instances"] for asked, done, _ in r["restores"])
    return {
        "arm": k.arm, "instances": k.instances, "agents_each": k.agents, "minutes": k.minutes,
        "fresh_share": share(samples, g), "turns": len(samples),
        "unfollowed_turns": sum(r["unfollowed"] for r in run["instances"]),
        "moved_fresh_share": share([s for s in samples if s[2]], g),
        "losses": losses,
        "met": {"fresh_95": (share(samples, g) or 0.0) >= 0.95,
                "back_above_90_within_60s": all(x["back_above_90_s"] is not None and x["back_above_90_s"] <= 60
                                                for x in losses),
                "moved_back_above_90_within_60s": all(x["moved_back_above_90_s"] is not None
                                                      and x["moved_back_above_90_s"] <= 60 for x in losses)},
        "device_s": {key: round(v, 3) for key, v in sums.items()},
        "device_share_pct": round(100 * sums["ration_s"] / sums["decoding_s"], 3) if sums["decoding_s"] else 0.0,
        "reread_device_s": round(sums["reread_s"], 3),
        "restores": len(run["pipe"]), "restore_GB": round(restore_bytes / 1e9, 3),
        "restore_transfer_s": {"median": waits[len(waits) // 2] if waits else None,
                               "max": waits[-1] if waits else None},
        "restore_wait_at_feed_s": {"median": blocked[len(blocked) // 2] if blocked else None,
                                   "max": blocked[-1] if blocked else None, "restores_used": len(blocked)},
        "restore_device_s": None if copy_gbps is None else round(restore_bytes / (copy_gbps * 1e9), 3),
        "store": {"writes": len(writes), "write_GB": round(sum(b for _, b, _ in writes) / 1e9, 2),
                  "write_new_GB": round(sum(n for _, _, n in writes) / 1e9, 2),
                  "write_mean_GBps": round(sum(b for _, b, _ in writes) / k.end_s / 1e9, 3),
                  "write_new_mean_GBps": round(sum(n for _, _, n in writes) / k.end_s / 1e9, 3),
                  **peaks(traffic),
                  **{f"new_only_{key}": v for key, v in peaks([(t, t, n) for t, _, n in writes]).items()}},
        "wall_s": round(run["wall_s"], 1),
    }


# ---- the command ----------------------------------------------------------------------------------

def bytes_table(ids: Sequence[int] = (32768, 100_000), checkpoints: int = 1) -> list[dict[str, Any]]:
    rows = []
    for size in ("0.8B", "2B", "4B"):
        b = state_bytes(size)
        rows.append({"model": size, "kv_per_token": b.kv_per_token, "gdn_state": b.gdn_state,
                     **{f"park_{n}": b.park(n // 512 * 512, n, checkpoints) for n in ids}})
    return rows


def measured_rate(path: Path, key: str) -> float | None:
    """A rate a ``store`` run measured (its JSON under results/), if there is one."""
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("rates", {}).get(key)
    return float(value) if value else None


def replay_main(args: argparse.Namespace) -> int:
    if not args.raw.is_dir():
        raise SystemExit(f"{args.raw} is absent: the real sessions live in ../shared/data beside the repo")
    rate_file = args.rate_file or newest_rate_file()
    if rate_file is None:
        raise SystemExit("no read_rate result under benchmarks/results: run benchmarks/read_rate.py first")
    gpu_src, store_src = RESULTS / "scale_out_store-gpu.json", RESULTS / "scale_out_store.json"
    if gpu_src.is_file():  # the GPU machine's figure, where measured: this box's CPUs are shared
        store_src = gpu_src
    store_gbps = args.store_gbps or measured_rate(store_src, "redis_restore_GBps")
    if not store_gbps:
        raise SystemExit(f"no store rate: give --store-gbps, or run `python -m benchmarks.scale_out store` first "
                         f"({store_src} holds its figure)")
    copy_src = gpu_src
    copy_gbps = args.copy_gbps or measured_rate(copy_src, "host_to_device_GBps")
    costs = pass_costs(rate_file, args.rate_model)
    policy = parse_policy(args.policy)
    sessions, skipped = load(args.raw, args.only, args.decode_tps)
    doc: dict[str, Any] = {
        "benchmark": "scale_out", "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit(), "device": "simulated (costs: see chunk_cost)", "simulated": True, "note": NOTE,
        "gpu": json.loads(rate_file.read_text(encoding="utf-8")).get("gpu", "unknown"),
        "chunk_cost": costs.source, "policy": args.policy, "decode_tps": args.decode_tps,
        "store_gbps": store_gbps,
        "store_gbps_from": "--store-gbps" if args.store_gbps else f"{store_src.name}: redis_restore_GBps",
        "copy_gbps": copy_gbps, "copy_gbps_from": ("--copy-gbps" if args.copy_gbps else
                                                   f"{copy_src.name}: host_to_device_GBps" if copy_gbps else
                                                   "not measured yet: restore_device_s is None"),
        "counted": "turn starts after each session's first; fresh: less than one grid chunk behind",
        "bytes_per_session": bytes_table(), "sessions": [s.name for s in sessions], "skipped": skipped,
        "rows": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    keep_newest(args.out)  # the run before goes to history/ first: this one writes as it goes
    for arm in args.arms:
        k = FleetKnobs(args.instances, args.agents, args.minutes, args.loss_every, arm, store_gbps, args.lease_s,
                       args.model, seed=args.seed)
        print(f"scale_out: {arm}: {k.instances} x {k.agents} agents, {k.minutes:g} min, losses at "
              f"{[round(t / 60) for t in k.losses]} min", file=sys.stderr, flush=True)
        row = report(fleet(sessions, policy, costs, k, workers=args.workers > 1), k, copy_gbps)
        doc["rows"].append(row)
        print(json.dumps({key: row[key] for key in ("arm", "fresh_share", "moved_fresh_share", "device_share_pct",
                                                     "reread_device_s", "restore_GB", "met")}), file=sys.stderr)
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")  # a long run keeps what it has
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("replay", help="the fleet replay on simulated clocks")
    r.add_argument("--raw", type=Path, default=RAW, help="the sessions folder (default: ../shared/data/sessions/raw)")
    r.add_argument("--only", nargs="*", default=[], help="sessions whose path contains one of these")
    r.add_argument("--instances", type=int, default=16)
    r.add_argument("--agents", type=int, default=64, help="agents each instance follows at the start")
    r.add_argument("--minutes", type=float, default=90.0, help="simulated minutes")
    r.add_argument("--loss-every", type=float, default=30.0, help="simulated minutes between losses")
    r.add_argument("--arms", nargs="*", default=list(ARMS), choices=ARMS)
    r.add_argument("--policy", default=POLICY, help=f"the ration (benchmarks.concurrency's form; default {POLICY})")
    r.add_argument("--store-gbps", type=float, help="the store's rate (default: results/scale_out_store-gpu.json's,\n"
                                                    "else scale_out_store.json's)")
    r.add_argument("--copy-gbps", type=float, help="host to device copy rate (default: scale_out_store-gpu.json's)")
    r.add_argument("--lease-s", type=float, default=5.0, help="the lost holder's lease (LEASE_S's default: 5)")
    r.add_argument("--model", default="0.8B", choices=("0.8B", "2B", "4B"), help="whose bytes a park holds")
    r.add_argument("--rate-file", type=Path, help="a read_rate JSON (default: the newest)")
    r.add_argument("--rate-model", help="the model's rows in the read_rate file (default: its first)")
    r.add_argument("--decode-tps", type=float, default=36.0, help="the host's decode rate (default 36)")
    r.add_argument("--workers", type=int, default=1, help="above 1: one process an instance")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, default=RESULTS / "scale_out.json")
    s = sub.add_parser("store", help="park and restore through a real redis-server, the disk, and reading again",
                       add_help=False)
    b = sub.add_parser("bytes", help="bytes per session of the 0.8B, 2B and 4B")
    b.add_argument("--ids", type=int, nargs="*", default=[32768, 100_000])
    args, rest = ap.parse_known_args(argv)
    if args.what == "store":
        from .store import main as store_main

        return int(store_main(rest))
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.what == "bytes":
        print(json.dumps(bytes_table(args.ids), indent=1))
        return 0
    del s
    return replay_main(args)


if __name__ == "__main__":
    sys.exit(main())
