"""What one read does (``ReadPlan``): the schedulers decide it, ``Shadow.read`` carries it out.

A round that reads is then schedule -> read -> account: the scheduler builds the plan from its
window or its ration (``IdleScheduler.plan``, ``RationedScheduler.plan``), the facade reads what the
plan allows, and the scheduler charges what was read. A plan is a value: a test checks a
scheduler's decision by its plan, without reading."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """Which sessions a read takes, in which order, and within what.

    - ``session``: a use of that one session (a question's, the narrator's, a replay's); ``None``:
      every session with a whole chunk pending but those dropped and not used since.
    - ``favoured``: uses too (the turns in flight), read first, the one nearest to fresh first; the
      rest most recently used first.
    - ``budget_s``: a pass starts only while its estimated cost still fits (``None``: no bound);
      with ``first_pass_free`` the first pass always starts (the idle window's: on a slow box one
      pass may cost more than the window).
    - ``max_chunks``: at most this many chunks in all.
    - ``whole``: a pass takes the line's whole head (up to the reader's ``max_batch``) or waits for
      the budget to cover it, rather than read fewer sessions now (a batch costs less per session:
      the device-wide ration's way to spend its share on throughput).
    - ``yields``: a background read; it stops once another caller waits for the facade, so that
      caller waits at most the pass in flight, not the slice.
    - ``settled``: only below each session's settled end (the ration with several turns running:
      the next prompt mostly rewrites what lies past it, Qwen's latest output).
    """

    session: str | None = None
    favoured: Sequence[str] = ()
    budget_s: float | None = None
    max_chunks: int | None = None
    first_pass_free: bool = False
    whole: bool = False
    yields: bool = False
    settled: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.favoured, str) or not isinstance(self.favoured, Sequence):
            raise TypeError(f"favoured is a sequence of session names, got {self.favoured!r}")
        object.__setattr__(self, "favoured", tuple(self.favoured))  # a value: equal plans compare equal
        if self.session is not None and self.favoured:
            raise ValueError("a plan reads one session (session) or favours some of all (favoured), not both")
        if self.max_chunks is not None and self.max_chunks < 0:
            raise ValueError(f"max_chunks must not be negative, got {self.max_chunks}")

    @property
    def uses(self) -> frozenset[str]:
        """The sessions this read uses (a host waits on them); the rest are read in the background."""
        return frozenset({self.session} if self.session is not None else self.favoured)


ALL_READY = ReadPlan()  # every session with a whole chunk pending, no bound: ``Shadow.read()``
