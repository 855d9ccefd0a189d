"""The freshness replay on two real sessions (CPU, simulated chunk cost): an agent's tight loop
(OpenHands, 33 requests 0 to 2 s apart) and a Claude Code session with human pauses of minutes
to hours. The service's own schedulers decide when the reader reads; these check what they must
guarantee and what the policies must change."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.freshness.run import CostModel, flat, from_rate_file, main, plot, summarise
from benchmarks.freshness.sim import Knobs, Policy, SessionRun, replay_session
from benchmarks.freshness.timelines import TIMING_BOTH, SessionTimeline, timeline_of

GRID = 512
LADDER = (0.0, 0.5, 1.0, 2.0, 5.0)
SESSIONS = (("openhands-examples/output.jsonl", 1),
            ("claude-code-moredip-session-share/0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl", 0))


@pytest.fixture(scope="module")
def sessions(shared_data: Path) -> list[SessionTimeline]:
    return [timeline_of(shared_data / "sessions" / "raw", path, 36.0, index) for path, index in SESSIONS]


def runs(sessions: list[SessionTimeline], pct: float, cost: CostModel, knobs: Knobs | None = None) -> list[SessionRun]:
    return [replay_session(s, Policy(pct), cost, cost.chunk_ms, knobs) for s in sessions]


def fresh_share(rs: list[SessionRun]) -> float:
    share = summarise(rs, rs[0].policy, flat(rs[0].chunk_ms))["fresh_share"]
    assert share is not None
    return float(share)


def test_the_sessions_have_real_timelines(sessions: list[SessionTimeline]) -> None:
    for s in sessions:
        assert s.timing == TIMING_BOTH and len(s.turns) >= 10
        for a, b in zip(s.turns, s.turns[1:], strict=False):
            assert a.start_s <= a.first_token_s <= a.end_s and a.start_s <= b.start_s
            assert 0 < b.keep <= len(a.prompt_ids) + len(a.output_ids)


def test_a_huge_ration_with_a_cheap_chunk_keeps_every_turn_fresh(sessions: list[SessionTimeline]) -> None:
    rs = runs(sessions, 90.0, flat(0.5))
    assert fresh_share(rs) == 1.0
    assert all(t.behind < GRID for r in rs for t in r.turns)
    assert all(r.ration_chunks > 0 for r in rs)


def test_without_gaps_the_idle_window_never_opens_and_freshness_drops(sessions: list[SessionTimeline]) -> None:
    real = runs(sessions, 0.0, flat(3.0))
    none = runs(sessions, 0.0, flat(3.0), Knobs(gaps="none"))
    for r in none:
        assert r.idle_chunks == r.tail_chunks and r.ration_chunks == 0  # read only after the last turn
    assert all(r.idle_chunks > r.tail_chunks for r in real)
    assert fresh_share(none) < fresh_share(real)
    # nothing read before the last turn ends: each turn starts behind by all that its prompt keeps
    for r, s in zip(none, sessions, strict=True):
        assert [t.behind for t in r.turns] == [turn.keep for turn in s.turns]


@pytest.mark.parametrize("ms", [35.0, 3.0])
def test_the_ration_spends_at_most_its_share_plus_one_chunk(sessions: list[SessionTimeline], ms: float) -> None:
    for pct in LADDER:
        rs = runs(sessions, pct, flat(ms))
        for t in (t for r in rs for t in r.turns):
            assert t.spent_s <= pct / 100 * t.since_first_token_s + ms / 1e3 + 1e-12
        row = summarise(rs, Policy(pct), flat(ms))
        if pct == 0:
            assert row["spent_pct"] == 0 and all(r.ration_chunks == 0 for r in rs)
        else:
            assert 0 < row["spent_pct"] <= pct
        # a request that arrives during the idle window waits for the chunk in flight, no more
        assert all(t.request_wait_s <= ms / 1e3 + 1e-12 for r in rs for t in r.turns)


def test_fresh_share_grows_with_the_ration(sessions: list[SessionTimeline]) -> None:
    # At 3 ms every step of the ladder affords whole chunks inside a turn. (At 35 ms, 0.5 % of a
    # few seconds' decode never reaches one chunk: those rations read nothing and the pooled share
    # can move by a turn either way with the shifted idle windows.)
    shares = [fresh_share(runs(sessions, pct, flat(3.0))) for pct in LADDER]
    assert shares == sorted(shares) and shares[-1] > shares[0], shares


def test_behind_and_new_ids_follow_the_definitions(sessions: list[SessionTimeline]) -> None:
    for r, s in zip(runs(sessions, 2.0, flat(35.0)), sessions, strict=True):
        for t, turn in zip(r.turns, s.turns, strict=True):
            assert 0 <= t.behind <= turn.keep and t.new_ids == len(turn.prompt_ids) - turn.keep
            assert (t.read_s is None) == (t.prompt_line <= turn.keep or t.superseded)
        assert r.turns[0].behind == 0 and r.turns[0].read_s is not None and r.turns[0].read_s > 0


def test_chunk_cost_by_depth_from_a_read_rate_file(tmp_path: Path) -> None:
    path = tmp_path / "read_rate-2026-12-01.json"
    path.write_text(json.dumps({"gpu": "H200", "commit": "abc", "date": "2026-12-01", "rows": [
        {"model": "0.8B", "figure": "chunk", "depth": 0, "ours_ms": 4.0, "peer_ms": 3.0, "floor_ms": 1.0},
        {"model": "0.8B", "figure": "chunk", "depth": 65536, "ours_ms": 8.0, "peer_ms": 6.0, "floor_ms": 1.0},
        {"model": "2B", "figure": "chunk", "depth": 0, "ours_ms": 9.0, "peer_ms": 7.0, "floor_ms": 2.0},
        {"model": "0.8B", "figure": "ask", "depth": 0, "ours_ms": 99.0, "peer_ms": 1.0, "floor_ms": 1.0}]}))
    cost = from_rate_file(path)
    assert cost.chunk_ms == 4.0 and "H200" in cost.source and cost.gpu == "H200"
    assert (cost(0), cost(32768), cost(65536), cost(10**6)) == (0.004, 0.006, 0.008, 0.008)
    assert from_rate_file(path, "2B")(1000) == 0.009
    with pytest.raises(SystemExit, match="no rows of figure 'chunk' for model '4B'"):
        from_rate_file(path, "4B")


def test_the_benchmark_writes_its_json_and_skips_the_plot_without_matplotlib(
        shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "freshness-test.json"
    assert main(["--raw", str(shared_data / "sessions" / "raw"), "--only", "openhands-sdk-llm-logs/llm-logs",
                 "--chunk-ms", "35", "3", "--rations", "0", "2",
                 "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["simulated"] is True and "not a GPU measurement" in doc["note"]
    assert doc["gpu"] == "cpu" and doc["commit"] and doc["date"]  # flat costs: no GPU measured them
    assert [(r["ration_pct"], r["chunk_ms"]) for r in doc["rows"]] == [(0, 35), (2, 35), (0, 3), (2, 3)]
    for r in doc["rows"]:
        assert {"policy", "ration_pct", "chunk_ms", "fresh_share", "p50_behind", "p90_behind", "spent_pct"} <= set(r)
        assert r["turns"] == 5 and 0 <= r["fresh_share"] <= 1
    assert [s["session"] for s in doc["sources"]] == ["openhands-sdk-llm-logs/llm-logs"]
    err = capsys.readouterr().err
    assert "matplotlib is not installed: no plot" in err and not out.with_suffix(".png").exists()
    assert plot(doc["rows"], tmp_path / "x.png") is False
