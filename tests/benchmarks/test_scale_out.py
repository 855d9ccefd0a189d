"""The fleet replay, tiny (CPU): a few instances of a few agents on the real OpenHands timelines, a loss
every two simulated minutes, both arms; its accounting checked. And the bytes a park holds, against a
real parked file."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path
from typing import Any

import pytest

from benchmarks.concurrency.costs import pass_costs
from benchmarks.concurrency.run import load, parse_policy
from benchmarks.scale_out.fleet import fleet
from benchmarks.scale_out.members import POLICY, FleetKnobs, state_bytes, state_bytes_of
from benchmarks.scale_out.run import report
from shadow.backends.qwen35.config import Qwen35Config
from tests.backends.parking import ids_for, make
from tests.benchmarks.test_concurrency import BATCH, SINGLE, rate_file

GRID = 512


def test_bytes_per_session_follow_the_configs() -> None:
    small = state_bytes("0.8B")
    assert small.kv_per_token == 12_288  # 6 full-attention layers x K and V x 2 heads x 256 x bf16
    # 18 GDN layers: a recurrent state of 16 x 128 x 128 fp32 and a conv state of 6,144 x 4 bf16 each
    assert small.gdn_state == 18 * (16 * 128 * 128 * 4 + 6144 * 4 * 2)
    assert state_bytes("4B").kv_per_token == 8 * 2 * 4 * 256 * 2


def test_the_bytes_are_those_of_a_real_parked_file(checkpoint: Path, tmp_path: Path) -> None:
    sh = make(checkpoint, tmp_path / "disk", grid=64)
    sh.feed_prompt("s", ids_for(1, 64 * 5 + 10))
    sh.read()
    sh.feed_prompt("s", [*sh.session_ids("s"), *ids_for(2, 64 * 2)])  # a second turn: a checkpoint
    sh.read()
    pos = sh.position("s")
    sh.park("s")
    (path,) = (tmp_path / "disk").rglob("*.safetensors")
    head = path.read_bytes()[:8]
    tensors = path.stat().st_size - 8 - struct.unpack("<Q", head)[0]
    cfg = Qwen35Config.from_folder(checkpoint)
    assert pos.checkpoints and pos.committed == 64 * 7
    assert tensors == state_bytes_of(cfg, "tiny", 4).park(pos.committed, pos.length, len(pos.checkpoints))
    sh.close()


def _run(shared_data: Path, tmp_path: Path, arm: str, workers: bool = False) -> tuple[dict[str, Any], FleetKnobs]:
    sessions, _ = load(shared_data / "sessions" / "raw", ["openhands-examples"], 36.0)
    costs = pass_costs(rate_file(tmp_path, SINGLE + BATCH))
    k = FleetKnobs(instances=3, agents=3, minutes=6, loss_every_min=2, arm=arm, store_gbps=0.5)
    return fleet(sessions, parse_policy(POLICY), costs, k, workers=workers), k


@pytest.fixture(scope="module")
def arms(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], FleetKnobs]]:
    return {arm: _run(shared_data, tmp_path_factory.mktemp(arm), arm) for arm in ("restore", "reread")}


@pytest.mark.parametrize("arm", ["restore", "reread"])
def test_a_tiny_fleet_keeps_its_books(arms: dict[str, Any], arm: str) -> None:
    run, k = arms[arm]
    assert k.losses == [120.0, 240.0] and len(run["losses"]) == 2
    alive = [r for r in run["instances"] if r["alive"]]
    lost = {x["instance"] for x in run["losses"]}
    assert len(alive) == k.instances - 2 and lost == {r["index"] for r in run["instances"] if not r["alive"]}
    # every agent held by one live instance, and every session followed by one
    held = [a for r in alive for a in r["agents"]]
    assert sorted(held) == list(range(k.instances * k.agents))
    assert all(not r["agents"] and not r["sessions"] for r in run["instances"] if not r["alive"])
    names = [s for r in alive for s in r["sessions"]]
    assert len(names) == len(set(names))
    assert sum(x["agents_moved"] for x in run["losses"]) >= k.agents  # the first loss moves an instance's all
    for r in run["instances"]:  # device time conserved: every pass the reader charged, the ration's or the idle's
        assert r["reader_s"] == pytest.approx(r["ration_s"] + r["idle_s"], rel=1e-9, abs=1e-9)
        assert 0.0 <= r["reread_s"] <= r["reader_s"]
    row = report(run, k, copy_gbps=None)
    assert row["turns"] == sum(len(r["samples"]) for r in run["instances"]) > 0
    assert 0.0 <= row["moved_fresh_share"] <= 1.0 and 0.0 <= row["fresh_share"] <= 1.0
    assert row["reread_device_s"] > 0  # the moved sessions' lost rows: some read again
    for x in row["losses"]:
        assert x["back_above_90_s"] is None or 0 <= x["back_above_90_s"] <= 120
    pipe = run["pipe"]
    if arm == "reread":
        assert not pipe and row["store"]["writes"] == 0 and row["restore_GB"] == 0
        return
    # restores: after the lost holder's lease, one at a time through the store, each its bytes' time
    assert pipe and row["store"]["writes"] > 0 and row["store"]["write_new_GB"] <= row["store"]["write_GB"]
    for (b0, e0, n0), (b1, _, _) in itertools.pairwise(pipe):
        assert b1 >= e0 and e0 - b0 == pytest.approx(n0 / (k.store_gbps * 1e9))
    assert all(b >= min(k.losses) + k.lease_s for b, _, _ in pipe)
    assert row["restore_GB"] == pytest.approx(sum(n for _, _, n in pipe) / 1e9, abs=1e-3)
    assert row["store"]["peak_1s_GBps"] >= row["store"]["peak_10s_GBps"] > 0
    assert row["restore_wait_at_feed_s"]["restores_used"] > 0


def test_restores_spare_the_reading_again_and_the_lease_leaves_turns_unfollowed(arms: dict[str, Any]) -> None:
    rows = {arm: report(run, k, copy_gbps=None) for arm, (run, k) in arms.items()}
    # the same fleet, the same losses: the store's rows are not read again
    assert [x["instance"] for x in rows["restore"]["losses"]] == [x["instance"] for x in rows["reread"]["losses"]]
    assert rows["restore"]["reread_device_s"] < rows["reread"]["reread_device_s"]
    assert rows["restore"]["device_s"]["reader_s"] < rows["reread"]["device_s"]["reader_s"]
    for run, _ in arms.values():  # turns of moved sessions while the lost holder's lease ran: unfollowed
        assert sum(r["unfollowed"] for r in run["instances"]) > 0
