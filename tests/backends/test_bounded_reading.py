"""Reading is bounded: over the cap with nowhere to park, reading converges instead of dropping one
session to read another without end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint

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
    dropped = [n for n in "abc" if sh.status()["sessions"][n]["where"] == "dropped"]
    assert len(dropped) == 1 and sh.resident_bytes() <= sh.cap_bytes  # the cap did force one out
    # Its backlog is real, but the idle window is not asked to read it: the host no longer uses it.
    assert sh.backlogs()[dropped[0]] == 2000 and dropped[0] not in sh.readable_backlogs()
    assert all(b < GRID for b in sh.readable_backlogs().values())
    # A use brings it back: fed again, the background reads it again, exactly.
    sh.feed_output(dropped[0], ids_for(9, 5))
    assert len(sh.read()) == 3 and sh.position(dropped[0]).committed == 1536
    assert_exact(sh, dropped[0])
