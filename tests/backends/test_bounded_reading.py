"""Reading is bounded: over the cap with nowhere to park, reading converges instead of dropping one
session to read another without end; a question over a long unread tail never attends over more
than one chunk of the session at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.qwen35.model import Qwen35

from .parking import MIB, assert_exact, ids_for, make

GRID = 512


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("bounded") / "model", demo_text_config(), dtype=torch.float32)


def test_over_the_cap_without_a_disk_reading_converges(ckpt):
    one = make(ckpt, None, grid=GRID)
    one.feed_prompt("x", ids_for(0, 2000))
    one.read()
    size = one.resident_bytes()
    sh = make(ckpt, None, cap_mib=2.5 * size / MIB, grid=GRID)  # room for two of the three
    for i, name in enumerate("abc"):
        sh.feed_prompt(name, ids_for(i, 2000))
    per_call = [len(sh.read()) for _ in range(20)]
    assert sum(per_call) <= 3 * (2000 // GRID), per_call  # what the ids need, read once
    assert per_call[1:] == [0] * 19
    dropped = [n for n in "abc" if sh.status().sessions[n].where == "dropped"]
    assert len(dropped) == 1 and sh.resident_bytes() <= sh.cap_bytes  # the cap did force one out
    # Its backlog is real, but the idle window is not asked to read it: the host no longer uses it.
    assert sh.backlogs()[dropped[0]] == 2000 and dropped[0] not in sh.readable_backlogs()
    assert all(b < GRID for b in sh.readable_backlogs().values())
    # A use brings it back: fed again, the background reads it again, exactly.
    sh.feed_output(dropped[0], ids_for(9, 5))
    assert len(sh.read()) == 3 and sh.position(dropped[0]).committed == 1536
    assert_exact(sh, dropped[0])


def test_a_question_over_a_long_tail_attends_one_chunk_at_a_time(ckpt, monkeypatch):
    shapes: list[tuple[int, int]] = []
    mask = Qwen35._causal_mask

    def spy(self, start: int, n: int):
        # Fail before the allocation, not after: the old path built a 32k x 32k mask here.
        assert n <= GRID, f"a forward of {n} rows at {start}: an attention mask past one chunk"
        shapes.append((start, n))
        return mask(self, start, n)

    tail = ids_for(7, 32 * 1024 + 100)
    sh = make(ckpt, None, grid=GRID)
    sh.feed_prompt("long", tail)
    monkeypatch.setattr(Qwen35, "_causal_mask", spy)
    question = ids_for(8, 700)  # longer than a chunk too: the fork runs it in pieces
    answer = sh.ask("long", question, ["A", "B"])
    monkeypatch.undo()
    assert answer.behind == len(tail)  # asked with nothing read ...
    assert sh.position("long").committed == 64 * GRID  # ... its whole chunks are read, on the grid
    assert max(n for _, n in shapes) == GRID and len(shapes) == 64 + 2  # 64 chunks, the fork in two pieces
    assert shapes[-2:] == [(64 * GRID, GRID), (65 * GRID, 100 + 700 - GRID)]
    # What was read is what a plain read leaves, and the answer is what asking after it gives.
    same = make(ckpt, None, grid=GRID)
    same.feed_prompt("long", tail)
    same.read()
    assert same.ask("long", question, ["A", "B"]).probs == answer.probs
    got, want = sh.export_state("long"), same.export_state("long")
    assert all(torch.equal(got[k], want[k]) for k in want)
