"""The soak's short form: a real `shadow serve` on loopback for 3 minutes under the demo model, 50
sessions from the real timelines (../shared/data, else tests/data's subset), the disk full
for 20 s, one kill -9 and restart; no 5xx, the cap never passed, every live session equal to a
fresh prefill of the ids it read. The recorded 60-minute run: benchmarks/README.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak.run import main


@pytest.mark.slow
def test_a_three_minute_soak_with_the_disk_full_and_a_kill(shared_data: Path, tmp_path: Path) -> None:
    out = main(["--minutes", "3", "--sessions", "50", "--threads", "10", "--turns", "2", "--max-ids", "4000",
                "--disk-full-s", "20", "--data", str(shared_data), "--work", str(tmp_path / "work"),
                "--out", str(tmp_path / "soak.json")])
    events = [e["event"] for e in out["events"]]
    assert {"disk full", "disk no longer full", "kill -9", "restarted and loaded"} <= set(events)
    assert out["errors_5xx"] == 0, out["errors"]
    assert out["operations_total"] > 0 and out["operations"].get("started", 0) > 0
    assert out["cap"]["samples"] > 0 and out["cap"]["samples_over_limit"] == 0
    assert out["cap"]["peak_held_bytes"] <= out["cap"]["limit_bytes"]
    end = out["end"]
    assert end["live_sessions"] > 0 and end["failures"] == [], end["failures"]
    assert end["equal_to_fresh_prefill"] == end["live_sessions"]
    # uvicorn ends a graceful stop by raising the SIGTERM it caught again: -15 once shutdown completed
    assert out["server_exit_at_planned_stop"] in (0, -15)
