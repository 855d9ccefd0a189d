"""The fleet replay's members: bytes per session (from the configs) and one simulated instance
(``Instance``: a shadow service on a simulated clock of its own, its agents, what it writes to the store)."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import sessions_folder
from benchmarks.concurrency.costs import PassCosts
from benchmarks.concurrency.run import SessionShape
from benchmarks.freshness.sim import Knobs, Policy, SimClock, SimReader, _build
from shadow.backends.qwen35.config import Qwen35Config, reference_shape
from shadow.core.session import SessionBook

RAW = sessions_folder()  # ../shared/data's sessions beside the repo, else tests/data's subset
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


