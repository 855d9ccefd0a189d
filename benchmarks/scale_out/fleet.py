"""The fleet replay itself: instances on clocks of their own (in this process or one process each),
one lost every ``loss_every`` simulated minutes, its agents moved to the survivors."""

from __future__ import annotations

import math
import multiprocessing
import random
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.concurrency.costs import PassCosts
from benchmarks.concurrency.run import SessionShape
from benchmarks.freshness.sim import Policy

from .members import Agent, FleetKnobs, Instance, Move, state_bytes


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

