"""The concurrency replay, tiny (CPU): a few agents on the real OpenHands timelines for a few simulated
minutes, through the service's own schedulers, both rations, with chunk costs from a read_rate file
with and without batch rows."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from benchmarks.concurrency.costs import faster, pass_costs
from benchmarks.concurrency.run import Run, main, parse_policy
from benchmarks.freshness.sim import Policy

SINGLE = [{"figure": "chunk", "model": "0.8b", "depth": 0, "ours_ms": 3.0},
          {"figure": "chunk", "model": "0.8b", "depth": 100_000, "ours_ms": 7.0}]
BATCH = [{"figure": "batch_chunk", "model": "0.8b", "batch": b, "depth": d, "ours_ms": ms}
         for b, per in ((2, 2.0), (4, 1.0)) for d, ms in ((0, per), (100_000, per + 4.0))]


def rate_file(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "read_rate.json"
    path.write_text(json.dumps({"date": "2026-12-01", "commit": "abc", "gpu": "test", "rows": rows}))
    return path


def test_pass_costs_by_batch_and_depth_interpolate_and_fall_back_to_one_session(tmp_path: Path) -> None:
    single = pass_costs(rate_file(tmp_path, SINGLE))
    assert single.max_batch == 1 and "not measured" in single.source
    assert single([0]) == pytest.approx(0.003) and single([50_000]) == pytest.approx(0.005)
    batched = pass_costs(rate_file(tmp_path, SINGLE + BATCH))
    assert batched.max_batch == 4 and "batch_chunk" in batched.source
    assert batched([0, 0]) == pytest.approx(2 * 0.002)
    assert batched([0, 100_000, 0, 0]) == pytest.approx((3 * 1.0 + 5.0) / 1e3)
    # B = 3, not captured: as the reader reads it, a pass of 4 whose empty slot reads at depth 0
    assert batched([0, 100_000, 0]) == pytest.approx((2 * 1.0 + 5.0 + 1.0) / 1e3)
    assert "in passes of 1, 2, 4" in batched.source
    assert replace(batched, pad=0)([0, 0, 0]) == pytest.approx((2 * 2.0 + 3.0) / 1e3)  # 2, then 1
    assert replace(batched, pad=None)([0, 0, 0]) == pytest.approx(3 * 0.0015)  # what if: interpolated
    # B = 3 measured as the reader ran it (its ``passes``): that figure, and 3 is no captured size
    three = [{"figure": "batch_chunk", "model": "0.8b", "batch": 3, "depth": d, "ours_ms": ms,
              "passes": [[4, 3]]} for d, ms in ((0, 1.2), (100_000, 5.2))]
    measured = pass_costs(rate_file(tmp_path, SINGLE + BATCH + three))
    assert measured.captured == (1, 2, 4) and measured([0, 0, 0]) == pytest.approx(3 * 0.0012)


def test_what_if_divides_the_shallowest_cost_and_what_depth_adds_apart(tmp_path: Path) -> None:
    costs = pass_costs(rate_file(tmp_path, SINGLE + BATCH))
    quick = faster(costs, "base=2,depth=4")
    assert quick([0]) == pytest.approx(0.0015) and quick([100_000]) == pytest.approx((1.5 + 1.0) / 1e3)
    assert quick([0, 100_000]) == pytest.approx((2 * 1.0 + 1.0) / 1e3)  # B = 2: 2 ms / 2, then 4 ms / 4
    assert faster(costs, "depth=2")([50_000]) == pytest.approx(0.004)  # 3 + 2 / 2
    assert "what if" in quick.source and costs([0]) == pytest.approx(0.003)  # the measured ones untouched
    for bad in ("base=0", "speed=2", "base"):
        with pytest.raises(SystemExit, match="base=Y,depth=X"):
            faster(costs, bad)


@pytest.mark.parametrize("rows", [SINGLE, SINGLE + BATCH], ids=["single", "batched"])
def test_a_tiny_replay_writes_both_rations_rows(shared_data: Path, tmp_path: Path, rows: list) -> None:
    out = tmp_path / "concurrency.json"
    assert main(["--raw", str(shared_data / "sessions" / "raw"), "--only", "openhands-examples",
                 "--agents", "1", "3", "--policies", "turn:2", "device:2", "--minutes", "4",
                 "--rate-file", str(rate_file(tmp_path, rows)), "--out", str(out), "--no-plot"]) == 0
    doc = json.loads(out.read_text())
    assert {"date", "commit", "device", "rows", "chunk_cost"} <= set(doc)
    assert doc["batch_costs_measured"] == (rows is not SINGLE)
    assert [(r["agents"], r["policy"]) for r in doc["rows"]] == [(1, "turn:2"), (1, "device:2"),
                                                                  (3, "turn:2"), (3, "device:2")]
    for r in doc["rows"]:
        assert {"agents", "policy", "fresh_share", "p90_behind", "device_share_pct"} <= set(r)
        assert r["turns"] > 0 and 0.0 <= r["fresh_share"] <= 1.0 and r["ration_chunks"] > 0
        for split in (r["cost_by_pass_pct"], r["cost_by_depth_pct"]):  # every pass's cost, split once
            assert sum(split.values()) == pytest.approx(100.0, abs=0.5)
        if r["policy"].startswith("device"):  # one share for the device: 2 %, one slice carried, one pass
            assert r["device_share_pct"] <= 2.0 + 100 * (0.150 + 0.02) / r["decoding_s"]
    three = doc["rows"][3]
    if rows is not SINGLE:
        assert three["mean_batch"] > 1.0  # several sessions a pass
        assert set(three["cost_by_pass_pct"]) - {"1"}
    else:
        assert three["mean_batch"] == 1.0 and set(three["cost_by_pass_pct"]) == {"1"}


def test_a_what_if_replay_labels_its_rows_and_costs_less(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "what_if.json"
    assert main(["--raw", str(shared_data / "sessions" / "raw"), "--only", "openhands-examples",
                 "--agents", "2", "--policies", "device:5", "--minutes", "3", "--faster", "base=1", "base=2,depth=2",
                 "--rate-file", str(rate_file(tmp_path, SINGLE + BATCH)), "--out", str(out), "--no-plot"]) == 0
    doc = json.loads(out.read_text())
    assert "what if" in doc["note"]
    same, quick = doc["rows"]
    assert (same["what_if"], quick["what_if"]) == ("base=1", "base=2,depth=2")
    assert same["ration_chunks"] > 0 and quick["device_share_pct"] < same["device_share_pct"]


def test_a_policy_names_its_share_spans_gathering_and_output_turns() -> None:
    assert parse_policy("device:8:spans:gather8/1000") == Policy(8.0, "device", True, 8, 1000.0, 1)
    assert parse_policy("device:8:spans:gather8/1000:out1000").output_turns == 1000
    assert parse_policy("turn:2:out0") == Policy(2.0, "turn", False, 1, 0.0, 0)
    for bad in ("device:8:outx", "device:8:out1:out2", "turn:2:gather8/10", "device:8:fast"):
        with pytest.raises(SystemExit, match="write turn:S or device:S"):
            parse_policy(bad)


def test_reading_only_settled_ids_leaves_less_to_read_again(shared_data: Path, tmp_path: Path) -> None:
    """OpenHands' next prompt re-renders Qwen's output: what the ration read of it is read again
    after the rollback, unless the ration stops at the prompt's line (``:out0``: at any load; the
    idle window still reads the output, so some is read again either way)."""
    out = tmp_path / "concurrency.json"
    assert main(["--raw", str(shared_data / "sessions" / "raw"), "--only", "openhands-examples",
                 "--agents", "2", "--policies", "device:8:out1000", "device:8:out0", "--minutes", "4",
                 "--rate-file", str(rate_file(tmp_path, SINGLE + BATCH)), "--out", str(out), "--no-plot"]) == 0
    every, settled = json.loads(out.read_text())["rows"]
    assert (every["policy"], settled["policy"]) == ("device:8:out1000", "device:8:out0")
    assert every["ids_reread"] > settled["ids_reread"]
    assert settled["ration_chunks"] < every["ration_chunks"]


def test_pad_replays_one_set_per_way_of_pricing_uncaptured_sizes(shared_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "concurrency.json"
    args = ["--raw", str(shared_data / "sessions" / "raw"), "--only", "openhands-examples", "--agents", "3",
            "--policies", "device:8", "--minutes", "2", "--rate-file", str(rate_file(tmp_path, SINGLE + BATCH)),
            "--out", str(out), "--no-plot"]
    assert main([*args, "--pad", "0", "none"]) == 0
    assert [r["pad"] for r in json.loads(out.read_text())["rows"]] == [0, "none"]
    for bad in (["--pad", "two"], ["--pad", "1", "--faster", "base=2"]):
        with pytest.raises(SystemExit):
            main([*args, *bad])


def test_a_pass_is_counted_by_its_shape_and_its_deepest_chunk() -> None:
    @dataclass
    class Book:
        committed: int  # after the pass, as the reader leaves it

    run = Run(agents=1, policy="device:2")
    run.count_pass([(Book(1024), None), (Book(20_480), None)], 0.004, 512)  # deepest chunk at 19,968
    span = Book(5120)
    run.count_pass([(span, None)] * 4, 0.006, 512)  # one session's 4 chunks: a span, deepest at 4,608
    run.count_pass([(Book(512), None)], 0.010, 512)
    assert run.passes == 3 and run.batched_chunks == 7
    row = run.row(512)
    assert row["cost_by_pass_pct"] == {"1": 50.0, "span 4": 30.0, "2": 20.0}
    assert row["cost_by_depth_pct"] == {"0-4k": 50.0, "4-16k": 30.0, "16-48k": 20.0}
