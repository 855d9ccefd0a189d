"""The demo's pace: the session's real pace, slowed by the chunk cost measured on this machine
against a user's (the 0.8B on an H200) within the replay's bound; and the demo run end to end,
printing the chunk cost it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

from shadow.adapters.timeline import USER_CHUNK_S, demo_stretch
from shadow.cli import DEMO_REPLAY_S, main


def test_the_pace_is_real_where_the_reader_is_as_fast_as_a_users() -> None:
    assert demo_stretch(USER_CHUNK_S / 2, 25.0, 75.0) == 1.0  # never faster than it happened
    assert demo_stretch(USER_CHUNK_S, 25.0, 75.0) == 1.0


def test_a_slower_reader_slows_the_replay_as_much_within_its_bound() -> None:
    assert demo_stretch(2 * USER_CHUNK_S, 25.0, 75.0) == pytest.approx(2.0)
    assert demo_stretch(100 * USER_CHUNK_S, 25.0, 75.0) == pytest.approx(3.0)  # 75 s at most
    assert demo_stretch(100 * USER_CHUNK_S, 80.0, 75.0) == 1.0  # a session longer than the bound: real pace
    assert DEMO_REPLAY_S * 1.0 < 120.0


@pytest.mark.slow  # the whole demo on its timeline (about 9 s of the inner loop)
def test_the_demo_prints_the_chunk_cost_it_measured(checkpoint: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--model", str(checkpoint), "--home", str(tmp_path), "--grid", "64", "--speed", "20"])
    out = capsys.readouterr().out
    assert code == 0, out
    [line] = [x for x in out.splitlines() if x.startswith("chunk cost measured here: ")]
    assert float(line.split()[4]) > 0 and "a user's 0.8B on an H200: 2.80 ms" in line
    assert line.endswith("replayed at 20 times faster than it happened")
    assert "bit for bit: yes" in out


def test_a_speed_that_is_not_a_positive_factor_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--speed", "0"])
    assert "--speed wants auto or a positive factor, got '0'" in capsys.readouterr().err
