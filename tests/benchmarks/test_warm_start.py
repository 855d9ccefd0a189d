"""The warm start on the CPU, under Triton's interpreter (where ``warm_paths`` itself does nothing:
nothing compiles there), its two steps called here: where forks run piecewise, the attention
launched at the depths of each of its variants for every captured row count, and a scratch session
through the reader's calls, leaving the reading exact; Triton's cache goes under DIR unless the
user set it; and ``benchmarks/warm_start.py`` walks every step it times on the GPU
(tests/backends/test_warm_start.py), so a Python error shows here first. No timing is judged here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.warm_start import main
from shadow import ShadowSettings, build_shadow
from shadow.backends.qwen35.attention import triton as attention
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.backends.qwen35.fast import warm
from shadow.container import triton_cache
from tests.backends.tiny import tiny

GRID = 64


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = tiny(vocab=248320, hidden=32, heads=2, kv_heads=1, layers=4, k_heads=2, v_heads=4)
    return write_checkpoint(tmp_path_factory.mktemp("warm") / "m", cfg, dtype=torch.float32, seed=3)


def fast_shadow(model: Path, home: Path) -> object:
    return build_shadow(ShadowSettings(_env_file=None, model=str(model), device="cpu", dtype="float32", grid=GRID,
                                       disk="off", fast="on", dir=str(home)))


def test_forks_through_a_table_leave_no_attention_call_to_warm(model: Path, tmp_path: Path) -> None:
    """A fork's pass from a table compiles its kernel when captured: nothing depends on the depth."""
    fast = fast_shadow(model, tmp_path).reader.fast  # type: ignore[attr-defined]
    assert fast.whole_forks and warm.attention_sizes(fast) == [] and warm._attention_variants(fast) == 0


def test_every_attention_variant_is_launched_at_each_captured_row_count(model: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where forks run piecewise, each of their row counts calls ``attend`` at every variant's depth."""
    sh = fast_shadow(model, tmp_path)
    fast = sh.reader.fast  # type: ignore[attr-defined]
    fast.fork_tables = False
    launched: dict[int, set[str]] = {}
    real = attention.attend

    def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, out: torch.Tensor,
               **kw: object) -> None:
        n, heads, _ = q.shape
        end = start + n
        splits = -(-end // attention.split_len(n * (heads // keys.shape[1]), keys.shape[1], end))
        launched.setdefault(n, set()).add("one" if splits == 1 else "split16" if splits % 16 == 0 else "split")
        real(q, keys, values, start, out, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(attention, "attend", attend)
    assert warm._attention_variants(fast) > 0
    cfg = fast.cfg
    big = warm.attention_sizes(fast)
    assert big == [32, 64] and max(fast.sizes) > GRID  # the batch passes' row counts are not attention's
    for n in big:
        want = set(warm.split_classes(n, cfg.num_attention_heads, cfg.num_key_value_heads, GRID, attention.BM))
        assert {"one", "split"} <= want and launched[n] >= want, (n, launched.get(n))
    assert "split16" in launched[32]  # the merge over 16 splits: reached by the small forks' shape


def test_reading_after_the_warm_up_is_exact(model: Path, tmp_path: Path) -> None:
    sh = fast_shadow(model, tmp_path)
    fast = sh.reader.fast  # type: ignore[attr-defined]
    # the scratch session through the static buffers (a small and a whole pass: each path once)
    warm._first_uses(sh.reader, (fast.sizes[0], fast.sizes[-1]))  # type: ignore[attr-defined]
    ids = [(5 + 17 * i) % 248000 for i in range(GRID + 20)]
    sh.feed_prompt("s", ids)  # type: ignore[attr-defined]
    sh.read()  # type: ignore[attr-defined]
    got, want = sh.export_state("s"), sh.fresh_state(sh.session_ids("s"))  # type: ignore[attr-defined]
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_tritons_cache_goes_under_dir_unless_the_user_set_it(tmp_path: Path) -> None:
    s = ShadowSettings(_env_file=None, dir=str(tmp_path))
    env: dict[str, str] = {}
    assert triton_cache(s, env) == str(tmp_path / "triton") == env["TRITON_CACHE_DIR"]
    env = {"TRITON_CACHE_DIR": "/somewhere/else"}
    assert triton_cache(s, env) == "/somewhere/else" == env["TRITON_CACHE_DIR"]


@pytest.mark.slow  # the warm-start measurement end to end on the CPU (about 13 s of the inner loop)
def test_the_gpu_measurement_walks_every_step_on_the_cpu(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "warm_start.json"
    assert main(["--model", str(model), "--out", str(out), "--device", "cpu", "--dtype", "float32",
                 "--grid", str(GRID), "--max-chunks", "1", "--repeat", "1", "--sizes", "64"]) == 0
    got = json.loads(out.read_text())
    assert got["sizes"] == [64] and got["chunks"] == 1 and got["warm_up_s"] > 0
    kinds = {"chunk", "question_text", "fork_decode"} | {f"question_{n}" for n in got["sizes"]}
    assert set(got["figures"]) == kinds
    for kind, f in got["figures"].items():
        assert f["first_ms"] > 0 and f["median_ms"] > 0 and f["ratio"] > 0, kind
    assert got["worst"]["kind"] in kinds
