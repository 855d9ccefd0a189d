"""A fleet of shadows that loses an instance now and then: what the shared store buys, replayed.

    python -m benchmarks.scale_out replay                 # 16 instances x 64 agents, 90 min, a loss every 30
    python -m benchmarks.scale_out replay --workers 16    # one process an instance (the run's wall / 16)
    python -m benchmarks.scale_out store --out DIR [--redis-server PATH] [--model 0.8B --ids 32768 --device cuda]
    python -m benchmarks.scale_out bytes                  # bytes per session of the 0.8B, 2B and 4B

``replay``: ``--instances`` shadow services, each following ``--agents`` agents that replay the real
timelines under ``../shared/data/sessions/raw`` (as ``benchmarks.concurrency`` does for one service:
its session shapes, its pass costs from the newest ``read_rate`` file, the service's own schedulers
through ``benchmarks.freshness_sim``; the default ration policy), each instance on its own simulated
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
restored state ``torch.equal`` to a fresh prefill (``benchmarks.scale_out_store``).

Writes ``benchmarks/results/scale_out.json`` (``replay``, ``--out``) or ``DIR/scale_out_store.json`` (``store``).
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import itertools
import json
import math
import multiprocessing
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shadow.backends.qwen35.config import Qwen35Config, reference_shape
from shadow.core.session import SessionBook

from .common import keep_newest
from .concurrency import PassCosts, SessionShape, load, newest_rate_file, parse_policy, pass_costs
from .freshness import commit
from .freshness_sim import Knobs, Policy, SimClock, SimReader, _build

REPO = Path(__file__).resolve().parents[1]
RAW = REPO.parent / "shared" / "data" / "sessions" / "raw"
RESULTS = REPO / "benchmarks" / "results"
POLICY = "device:8:spans:gather8/1000"  # the settings' defaults: RATION 0.08, RATION_SCOPE device, ...
ARMS = ("restore", "reread")
FRESH_TARGET = 0.90
NOTE = ("simulated: one service per instance, the service's own schedulers on simulated clocks, with a reader "
        "that costs the read_rate file's time per pass and a store pipe of the measured rate; not a fleet measured")


# ---- bytes per session ----------------------------------------------------------------------------

@dataclass(frozen=True)
class StateBytes:
    """What a parked session holds, from a model's config (``stores/parked.py``'s layout): the committed
    KV rows of the full-attention layers (bf16), one conv and one recurrent state a GDN layer (bf16 and
    fp32), the same again for each checkpoint, and the ids (int32)."""

    size: str
    kv_per_token: int
    gdn_state: int  # conv + recurrent of every GDN layer, once
    ids_per_token: int = 4

    def park(self, committed: int, ids: int, checkpoints: int) -> int:
        return committed * self.kv_per_token + ids * self.ids_per_token + (1 + checkpoints) * self.gdn_state


def state_bytes(size: str, dtype_bytes: int = 2) -> StateBytes:
    """A published size's (``reference_shape``), in bf16 unless told."""
    return state_bytes_of(Qwen35Config.from_dict(reference_shape(size)), size, dtype_bytes)


def state_bytes_of(cfg: Qwen35Config, name: str, dtype_bytes: int) -> StateBytes:
    kv = len(cfg.full_layers) * 2 * cfg.num_key_value_heads * cfg.head_dim * dtype_bytes
    recurrent = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4  # always fp32
    conv = cfg.conv_dim * cfg.linear_conv_kernel_dim * dtype_bytes
    return StateBytes(name, kv, len(cfg.linear_layers) * (recurrent + conv))


# ---- one instance ---------------------------------------------------------------------------------

@dataclass
class Move:
    """A session that reached this instance from a lost one."""

    at: float  # the loss
    old_line: int  # rows its lost holder had committed (what reading it again repeats)
    restore_line: int  # rows the store holds of it (0: nothing to restore)
    restore_done: float  # when those rows land here (inf: never)
    restore_bytes: int


@dataclass
class Agent:
    index: int
    order: list[int]  # sessions in the order this agent replays them
    cycle: int = 0
    turn: int = 0
    held: list[int] = field(default_factory=list)
    next_at: float = 0.0  # its next turn's arrival, while it waits for it
    turn_end: float = 0.0  # its turn in flight's end on the host
    in_flight: bool = False
    move: Move | None = None  # set while its session is one that moved

    @property
    def session(self) -> str:
        return f"a{self.index}.{self.cycle}"


@dataclass
class Sample:
    t: float
    behind: int
    moved: bool


@dataclass
class Written:
    committed: int
    ids: int
    checkpoints: tuple[int, ...]


class FleetReader(SimReader):
    """The simulated reader, told which sessions a restore is bringing in: it commits their rows at no
    device cost when the restore lands (``restored``), and tallies the device time spent on chunks a
    moved session's lost holder had already read."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.moved: dict[int, int] = {}  # id(book) -> the rows its lost holder had committed
        self.reread_s = 0.0
        self.total_s = 0.0
        self.on_pass = self._tally

    def _tally(self, batch: Sequence[tuple[SessionBook, Any]], now: float, cost: float) -> None:
        self.total_s += cost
        share = cost / len(batch)
        seen: dict[int, int] = {}
        for book, _ in batch:  # (a span lists its session once a chunk, committed already past them all)
            k = seen[id(book)] = seen.get(id(book), 0) + 1
            row = book.committed - k * self.grid
            if row < self.moved.get(id(book), 0):
                self.reread_s += share

    def restored(self, book: SessionBook, line: int) -> None:
        """The store's rows of a moved session landed: commit what is not read yet below ``line``."""
        while book.committed < line and book.pending >= self.grid:
            book.committed_chunk()
            self.checkpoint_if_due(book, None)


class Instance:
    """One shadow service and the agents it follows, on a clock of its own."""

    def __init__(self, index: int, sessions: Sequence[SessionShape], policy: Policy, costs: PassCosts,
                 k: FleetKnobs, home: str) -> None:
        self.index, self.sessions, self.k = index, sessions, k
        self.bytes = state_bytes(k.model)
        self.clock = SimClock()
        self.reader = FleetReader(k.grid, lambda row: costs.per_chunk(1, row), self.clock, costs.max_batch, costs,
                                  spans=tuple(costs.span_ratio) if policy.spans else (), span_cost=costs.span)
        self.container, self.service = _build(policy, Knobs(grid=k.grid, round_ids=k.round_ids,
                                                             idle_poll_s=k.idle_poll_s), self.reader, self.clock, home)
        self.shadow = self.container.slot().get()
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.rids = itertools.count()
        self.agents: dict[int, Agent] = {}
        self.samples: list[Sample] = []
        self.written: dict[str, Written] = {}  # the store's last park of each session this instance holds
        self.writes: list[tuple[float, int, int]] = []  # (when, the park's bytes, bytes new since the last)
        self.restores: list[tuple[float, float, int]] = []  # (asked, landed, bytes)
        self.alive = True
        self.idle_s = 0.0
        self.unfollowed_turns = 0
        self.at(0.0, self.look)

    # ---- the loop ----

    def at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (t, next(self.seq), action))

    def run_until(self, t_end: float) -> None:
        while self.alive and self.events and self.events[0][0] < t_end:
            t, _, action = heapq.heappop(self.events)
            self.clock.advance_to(t)  # (an event due while the device was held happens when it is free)
            action()

    def look(self) -> None:
        chunks = self.service.idle_step()
        self.idle_s += sum(c.cost_s for c in chunks)
        if self.clock() < self.k.end_s:
            self.at(self.clock() + self.k.idle_poll_s, self.look)

    # ---- agents ----

    def adopt(self, agents: Sequence[Agent]) -> None:
        for a in agents:
            self.agents[a.index] = a
            self.arrive(a, a.next_at)

    def arrive(self, a: Agent, t: float) -> None:
        a.next_at, a.in_flight = t, False
        if t >= self.k.end_s:
            return
        s = self.sessions[a.order[a.cycle % len(a.order)]]
        if self.leased_elsewhere(a, t):
            self.at(t, lambda: self.unfollowed(a, s))
            return
        rid = f"r{next(self.rids)}"
        self.clock.at(t, lambda: self.service.arrived(rid))
        self.at(t, lambda: self.start(a, s, rid))

    def leased_elsewhere(self, a: Agent, t: float) -> bool:
        """A moved session not held here yet, while its lost holder's lease runs: the store refuses
        it to this instance (a 409 naming the holder), so the host's turn goes unfollowed."""
        return a.move is not None and t < a.move.at + self.k.lease_s and a.session not in self.shadow.sessions()

    def unfollowed(self, a: Agent, s: SessionShape) -> None:
        """A turn the host serves while no shadow may follow its session: counted, not fresh."""
        turn = s.turns[a.turn]
        if a.turn:
            self.samples.append(Sample(self.clock(), turn.keep, True))
        self.unfollowed_turns += 1
        a.held, a.in_flight = a.held[:turn.keep] + turn.new.tolist() + turn.output.tolist(), True
        a.turn_end = self.clock() + (turn.end_s - turn.start_s)

        def ended() -> None:
            self.arrive(a, self.clock() + self.next_turn(a))

        self.at(a.turn_end, ended)

    def start(self, a: Agent, s: SessionShape, rid: str) -> None:
        turn = s.turns[a.turn]
        prompt = a.held[:turn.keep] + turn.new.tolist()
        fresh_here = a.move is not None and a.session not in self.shadow.sessions()
        self.service.started(rid, a.session, ids=prompt)
        landed = self.moved_in(a, turn.keep) if fresh_here and a.move is not None else True
        if a.turn:
            committed = self.shadow.counts(a.session)[1] if landed else 0
            self.samples.append(Sample(self.clock(), max(0, turn.keep - committed), a.move is not None))
        a.held, a.in_flight = prompt, True
        a.turn_end = self.clock() + (turn.end_s - turn.start_s)
        self.at(self.clock() + (turn.first_token_s - turn.start_s), lambda: self.first(a, s, rid))

    def moved_in(self, a: Agent, keep: int) -> bool:
        """The first turn of a moved session here, its lease taken: the feed restores its rows from
        the store (as the tiered store does, within the feed), or they are read again. Whether the
        rows had landed when the turn started: a turn that waits for its restore is not fresh (the
        wait is the store pipe's, reported apart)."""
        assert a.move is not None
        book = self.shadow.residency.held_book(a.session)
        assert book is not None
        kept = keep // self.k.grid * self.k.grid  # rows past the prompt's agreement are read again anyway
        self.reader.moved[id(book)] = min(a.move.old_line, kept)
        line = min(a.move.restore_line, kept)
        if line <= 0:
            return True
        self.restores.append((self.clock(), a.move.restore_done, a.move.restore_bytes))
        self.reader.restored(book, line)
        return a.move.restore_done <= self.clock()

    def first(self, a: Agent, s: SessionShape, rid: str) -> None:
        turn = s.turns[a.turn]
        self.service.first_token(rid)
        decode_s = turn.end_s - turn.first_token_s
        out = turn.output.tolist()
        n = max(1, math.ceil(len(out) / self.k.round_ids), math.ceil(decode_s / self.k.max_round_s))
        pieces = [out[j * len(out) // n:(j + 1) * len(out) // n] for j in range(n)]
        a.turn_end = self.clock() + decode_s
        self.at(self.clock() + decode_s / n, lambda: self.rounds(a, s, rid, pieces, 0, decode_s / n))

    def rounds(self, a: Agent, s: SessionShape, rid: str, pieces: list[list[int]], j: int, dt: float) -> None:
        self.service.round_ended(rid, pieces[j])
        a.held.extend(pieces[j])
        if j + 1 < len(pieces):
            self.at(self.clock() + dt, lambda: self.rounds(a, s, rid, pieces, j + 1, dt))
            return
        self.service.finished(rid)
        if self.k.arm == "restore":
            self.write(a.session)
        self.arrive(a, self.clock() + self.next_turn(a))

    def next_turn(self, a: Agent) -> float:
        """Move ``a`` on to its next turn; the host's gap before it (a new session starts at once)."""
        s = self.sessions[a.order[a.cycle % len(a.order)]]
        end_s = s.turns[a.turn].end_s
        a.turn += 1
        if a.turn < len(s.turns):
            return max(0.0, s.turns[a.turn].start_s - end_s)
        if a.session in self.shadow.sessions():
            self.service.forget(a.session)
        self.written.pop(a.session, None)
        a.cycle, a.turn, a.held, a.move = a.cycle + 1, 0, [], None
        return 0.0

    def write(self, session: str) -> None:
        """Write-behind: the session's park to the store at its turn's end."""
        pos = self.shadow.position(session)
        now = Written(pos.committed, pos.length, tuple(pos.checkpoints))
        last = self.written.get(session, Written(0, 0, ()))
        new = ((now.committed - last.committed) * self.bytes.kv_per_token + (now.ids - last.ids) * 4
               + (1 + len(set(now.checkpoints) - set(last.checkpoints))) * self.bytes.gdn_state)
        self.writes.append((self.clock(), self.bytes.park(now.committed, now.ids, len(now.checkpoints)), new))
        self.written[session] = now

    # ---- a loss ----

    def lose(self, t: float) -> list[tuple[Agent, int, Written | None]]:
        """This instance is gone at ``t``: its agents, each with the rows it had committed of the
        agent's session and the store's last park of it, for the survivors."""
        self.alive = False
        out = []
        for a in sorted(self.agents.values(), key=lambda a: a.index):
            session = a.session
            old = self.shadow.counts(session)[1] if session in self.shadow.sessions() else 0
            stored = self.written.get(session)
            if a.in_flight:  # the host finishes the turn; no shadow sees its output
                a.held = self._held_after(a, self.sessions[a.order[a.cycle % len(a.order)]])
                a.next_at = max(t, a.turn_end) + self.next_turn(a)
                if a.session != session:  # that was the session's last turn: the next is a new one
                    old, stored = 0, None
            a.in_flight = False
            out.append((a, old, stored))
        self.agents.clear()
        return out

    @staticmethod
    def _held_after(a: Agent, s: SessionShape) -> list[int]:
        """What the host holds once the turn in flight has ended: its prompt and its whole output."""
        turn = s.turns[a.turn]
        prompt_len = turn.keep + len(turn.new)
        return a.held[:prompt_len] + turn.output.tolist()

    # ---- the run's figures ----

    def result(self) -> dict[str, Any]:
        self.run_until(math.inf)
        ration = self.service.stats["ration"]
        out = {"index": self.index, "samples": [(s.t, s.behind, s.moved) for s in self.samples],
               "ration_s": ration.spent_s, "idle_s": self.idle_s, "reader_s": self.reader.total_s,
               "reread_s": self.reader.reread_s, "unfollowed": self.unfollowed_turns,
               "decoding_s": self.container.activity().decoding_s(),
               "writes": self.writes, "restores": self.restores, "agents": sorted(self.agents),
               "sessions": sorted(self.shadow.sessions()) if self.alive else [], "alive": self.alive}
        self.container.shutdown_resources()
        return out


@dataclass
class FleetKnobs:
    instances: int = 16
    agents: int = 64  # each instance's, at the start
    minutes: float = 90.0
    loss_every_min: float = 30.0
    arm: str = "restore"
    store_gbps: float = 1.0  # the store pipe's rate (measured: ``store``)
    lease_s: float = 5.0
    model: str = "0.8B"
    grid: int = 512
    round_ids: int = 8
    max_round_s: float = 1.0
    idle_poll_s: float = 0.2
    seed: int = 0

    @property
    def end_s(self) -> float:
        return 60.0 * self.minutes

    @property
    def losses(self) -> list[float]:
        every = 60.0 * self.loss_every_min
        return [every * i for i in range(1, math.ceil(self.end_s / every)) if every * i < self.end_s]


# ---- the fleet ------------------------------------------------------------------------------------

class _Here:
    """An instance in this process: a call's answer kept for ``recv``."""

    def __init__(self, *args: Any) -> None:
        self.instance = Instance(*args)
        self.answer: Any = None

    def send(self, name: str, *args: Any) -> None:
        self.answer = getattr(self.instance, name)(*args)

    def recv(self) -> Any:
        return self.answer


def _serve(conn: Any, args: tuple[Any, ...]) -> None:
    instance = Instance(*args)
    while True:
        name, a = conn.recv()
        conn.send(getattr(instance, name)(*a))
        if name == "result":
            return


class _Apart:
    """An instance in a process of its own (forked: the sessions are not copied): calls to all
    instances run at once, answered in turn."""

    def __init__(self, *args: Any) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, args), daemon=True)
        self.process.start()

    def send(self, name: str, *args: Any) -> None:
        self.conn.send((name, args))

    def recv(self) -> Any:
        answer = self.conn.recv()
        return answer


def first_agents(k: FleetKnobs, sessions: int) -> list[list[Agent]]:
    """Each instance's agents at the start: each cycles through the sessions from an offset of its own."""
    out = []
    for i in range(k.instances):
        mine = []
        for a in range(i * k.agents, (i + 1) * k.agents):
            offset = random.Random(f"{k.seed}:{a}").randrange(sessions)
            mine.append(Agent(a, list(range(offset, sessions)) + list(range(offset))))
        out.append(mine)
    return out


def fleet(sessions: Sequence[SessionShape], policy: Policy, costs: PassCosts, k: FleetKnobs,
          workers: bool = False) -> dict[str, Any]:
    """The fleet's run: every instance to each loss, the loss, its agents to the survivors; then the end."""
    wall = time.perf_counter()
    rng = random.Random(k.seed)
    with tempfile.TemporaryDirectory(prefix="shadow-scale-out-") as home:
        make = _Apart if workers else _Here
        fleet_ = [make(i, sessions, policy, costs, k, f"{home}/{i}") for i in range(k.instances)]
        held = {}
        for i, agents in enumerate(first_agents(k, len(sessions))):
            fleet_[i].send("adopt", agents)
            held[i] = len(agents)
        for f in fleet_:
            f.recv()
        bytes_ = state_bytes(k.model)
        pipe: list[tuple[float, float, int]] = []  # (begin, end, bytes) of each restore through the store
        pipe_free, losses = 0.0, []
        for t in k.losses:
            alive = sorted(held)
            for i in alive:
                fleet_[i].send("run_until", t)
            for i in alive:
                fleet_[i].recv()
            lost = rng.choice(alive)
            fleet_[lost].send("lose", t)
            moved = fleet_[lost].recv()
            del held[lost]
            to: dict[int, list[Agent]] = {i: [] for i in held}
            asked = sorted(moved, key=lambda m: (max(m[0].next_at, t + k.lease_s), m[0].index))
            restored = 0
            for a, old, stored in asked:
                line, done, size = 0, math.inf, 0
                if k.arm == "restore" and stored is not None and stored.committed and a.next_at < k.end_s:
                    line, size = stored.committed, bytes_.park(stored.committed, stored.ids, len(stored.checkpoints))
                    begin = max(a.next_at, t + k.lease_s, pipe_free)
                    done = pipe_free = begin + size / (k.store_gbps * 1e9)
                    pipe.append((begin, done, size))
                    restored += size
                a.move = Move(t, old, line, done, size) if old or line else None
                i = min(held, key=lambda j: (held[j], j))  # the survivor following fewest agents
                held[i] += 1
                to[i].append(a)
            for i, agents in to.items():
                fleet_[i].send("adopt", agents)
            for i in to:
                fleet_[i].recv()
            losses.append({"at_s": t, "instance": lost, "agents_moved": len(moved),
                           "sessions_with_rows": sum(1 for _, old, _ in moved if old),
                           "rows_lost_holder_had": sum(old for _, old, _ in moved),
                           "restores": sum(1 for a, _, _ in moved if a.move is not None and a.move.restore_line),
                           "restore_GB": round(restored / 1e9, 3),
                           "store_busy_until_s": round(pipe_free - t, 3) if restored else 0.0})
        for f in fleet_:
            f.send("result")
        results = [f.recv() for f in fleet_]
    return {"losses": losses, "instances": results, "pipe": pipe, "wall_s": time.perf_counter() - wall}


# ---- figures --------------------------------------------------------------------------------------

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
        from .scale_out_store import main as store_main

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
