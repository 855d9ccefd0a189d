"""``shadow verify`` on real sessions (a tiny model, CPU): the replayed state equals a fresh prefill."""

from __future__ import annotations

import pytest

from shadow.cli import main

RAW = "sessions/raw"
CASES = {
    # The end of a long Claude Code session: its compaction request (which extends the ~99k-id
    # conversation) and the restart as system + summary, then new turns.
    "claude-code-compaction": ("claude-code-marot-spotter/8463c716-a2ea-4c14-9efa-87158ebd9f20.jsonl", "-8:"),
    "openhands": ("openhands-examples/output.jsonl", ":"),
    "mini-swe-agent": ("mini-swe-agent-gemini3-swebench/django__django-16527.traj.json", ":"),
}


# the compaction replay reads ~99k ids on the CPU and the OpenHands one ~30 s: among the suite's slowest, so
# `make check` leaves them out
SLOW_CASES = ("claude-code-compaction", "openhands")
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in sorted(CASES)])
def test_verify_real_session(shared_data, tmp_path, capsys, case):
    path, turns = CASES[case]
    code = main(["verify", str(shared_data / RAW / path), f"--turns={turns}", "--home", str(tmp_path)])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:] if line.strip()]
    assert rows, out
    for row in rows:
        assert row[-2:] == ["yes", "0"], out  # equal, largest difference
    assert code == 0
    if case == "claude-code-compaction":
        assert int(rows[0][3]) >= 1 and int(rows[0][1]) > 90_000  # the restart rolled back; a long session


def test_verify_without_paths_asks_for_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no serve.env
    monkeypatch.delenv("QWEN38_SHADOW_SESSIONS", raising=False)
    assert main(["verify", "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no sessions to check" in err and "QWEN38_SHADOW_SESSIONS" in err
    monkeypatch.setenv("QWEN38_SHADOW_SESSIONS", str(tmp_path / "empty"))
    assert main(["verify", "--home", str(tmp_path)]) == 2
    assert f"no sessions found under {tmp_path / 'empty'}" in capsys.readouterr().err
