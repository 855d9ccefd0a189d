"""A park says which arithmetic made it (issue 53, point 3): the reader's fingerprint, carried in
the parked file, and a restore under another fingerprint refused and read again, exactly.

The issue's case, on the CPU as a user would try it: one process with ``FAST=on`` (the Triton
kernels under Triton's interpreter) parks a session of 1,636 ids; a second process with
``FAST=off`` on the same disk restored it without a word, and after two more chunks two of its
eight tensors differed from its own fresh prefill."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from shadow.backends.fingerprint import fingerprint, sequence
from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.stores import parked
from shadow.core.errors import StateLost

from .parking import ids_for, make

REPO = Path(__file__).parents[2]
N_IDS = 1_636  # the session: 25 whole chunks of 64 and a tail


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("fp") / "model", demo_text_config(), dtype=torch.float32)


def _park_in_a_process(ckpt: Path, disk: Path, fast: str) -> str:
    """A process of its own (``FAST=fast``) feeds the session, reads it and stops (which parks it);
    returns its fingerprint."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from tests.backends.parking import make, ids_for
        sh = make(Path({str(ckpt)!r}), Path({str(disk)!r}), fast={fast!r})
        sh.feed_prompt("s", ids_for(1, {N_IDS}))
        sh.read()
        assert sh.position("s").committed == {N_IDS // 64 * 64}
        print(sh.reader.fingerprint, flush=True)
        sh.close()
    """)], capture_output=True, text=True, timeout=1800, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def _exact_after_two_more_chunks(sh) -> None:
    ids = ids_for(1, N_IDS) + ids_for(2, 128)
    sh.feed_prompt("s", ids)
    sh.read()
    got, want = sh.export_state("s"), sh.fresh_state(ids)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), f"{k} differs from this process's fresh prefill"


@pytest.mark.slow
def test_a_park_under_another_fingerprint_is_read_again_exactly(ckpt, tmp_path):
    disk = tmp_path / "d"
    theirs = _park_in_a_process(ckpt, disk, "on")
    sh = make(ckpt, disk, fast="off")
    ours = sh.reader.fingerprint
    assert theirs != ours  # the Triton kernels' bits are not the torch forward's
    assert sh.sessions() == ["s"]  # found: a whole file, its ids the session's
    sh.restore("s")
    (_, why), = sh.disk.refused
    assert why.startswith("fingerprint is") and "read again" in why
    assert not sh.disk._path("s").exists()
    # its ids came back from the file; its state did not: all of it is behind, and a question says so
    assert list(sh.session_ids("s")) == ids_for(1, N_IDS)
    p = sh.position("s")
    assert (p.committed, p.reread) == (0, N_IDS // 64 * 64)
    answer = sh.ask("s", ids_for(3, 20), ["A", "B"])
    assert answer.behind == N_IDS  # never behind: 0 from no context
    _exact_after_two_more_chunks(sh)


@pytest.mark.slow
def test_a_park_under_the_same_fingerprint_is_taken(ckpt, tmp_path):
    disk = tmp_path / "d"
    theirs = _park_in_a_process(ckpt, disk, "off")
    sh = make(ckpt, disk, fast="off")
    assert theirs == sh.reader.fingerprint  # two instances of one arithmetic: equal, so they share parks
    sh.restore("s")
    p = sh.position("s")
    assert sh.disk.refused == [] and (p.committed, p.reread) == (N_IDS // 64 * 64, 0)  # 0 ids read again
    _exact_after_two_more_chunks(sh)


def test_the_fingerprint_is_in_the_park_and_checked_before_its_state_is_used(ckpt, tmp_path):
    """In one process: a park's file names the reader's fingerprint; the same file under another
    fingerprint (written as another reader would, checksum and all) is refused on restoring, and the
    session is read again from its ids, exactly."""
    sh = make(ckpt, tmp_path / "d")
    ids = ids_for(1, 300)
    sh.feed_prompt("s", ids)
    sh.read()
    sh.park("s")
    file = sh.disk._path("s")
    header = json.loads(file.read_bytes()[8:8 + int.from_bytes(file.read_bytes()[:8], "little")])
    assert header["__metadata__"][parked.FINGERPRINT] == sh.reader.fingerprint
    sh.close()
    other = "0" * 64
    meta = dict(header["__metadata__"])
    with safe_open(str(file), framework="pt") as f:
        data = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    meta[parked.FINGERPRINT] = other
    meta["checksum"] = parked.checksum(data, meta)
    parked.write(file, data, meta)
    again = make(ckpt, tmp_path / "d")
    assert again.sessions() == ["s"] and again.position("s").committed == 256
    again.restore("s")
    assert again.disk.refused[-1][1].startswith(f"fingerprint is {other[:16]}")
    assert list(again.session_ids("s")) == ids and again.position("s").committed == 0
    again.read("s")
    got, want = again.export_state("s"), again.fresh_state(ids)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    again.park("s")  # parked again, now under this reader's fingerprint: taken from here on
    again.restore("s")
    assert again.position("s").committed == 256 and len(again.disk.refused) == 1


def test_the_fingerprint_follows_the_bits_and_nothing_else(ckpt):
    """Equal for two readers of one arithmetic; another when the weights' bits differ by one ulp;
    computed once per reader; from a fixed sequence below the vocabulary."""
    a, b = make(ckpt, None), make(ckpt, None)
    assert a.reader.fingerprint == b.reader.fingerprint == fingerprint(a.reader)
    assert len(a.reader.fingerprint) == 64
    first = sequence(1, b.reader.vocab_size)[0]
    w = b.reader.model.embed[first]  # the first id's embedding, one element one ulp up
    w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))
    assert fingerprint(b.reader) != a.reader.fingerprint
    ids = sequence(1000, 248320)
    assert ids == sequence(1000, 248320) and all(0 <= i < 248320 for i in ids) and len(set(ids)) > 900


def test_a_session_whose_refused_park_took_its_ids_is_a_409_not_behind_0(ckpt, tmp_path):
    """R4: a damaged park (its checksum fails) is refused and its ids go with it. A question then
    has no context at all: it is refused with ``StateLost`` (409 on the API), not answered with
    ``behind: 0``; the host's next prompt brings the session back, exactly."""
    sh = make(ckpt, tmp_path / "d")
    ids = ids_for(1, 300)
    sh.feed_prompt("s", ids)
    sh.read()
    sh.park("s")
    file = sh.disk._path("s")
    raw = bytearray(file.read_bytes())
    raw[-1] ^= 0xFF  # the data's last byte: the checksum fails
    file.write_bytes(bytes(raw))
    with pytest.raises(StateLost, match="holds no ids"):
        sh.ask("s", ids_for(3, 20), ["A", "B"])
    assert sh.disk.refused[-1][1] == "checksum mismatch"
    with pytest.raises(StateLost):
        sh.decode("s", ids_for(3, 20), max_new=2)
    sh.feed_prompt("s", ids)
    assert sh.ask("s", ids_for(3, 20), ["A", "B"]).behind == len(ids)
    got, want = sh.export_state("s"), sh.fresh_state(ids)
    for k in want:
        assert torch.equal(got[k], want[k]), k


def test_status_and_metrics_show_the_fingerprint(ckpt, tmp_path):
    from shadow.adapters.metrics import Metrics

    sh = make(ckpt, tmp_path / "d")
    sh.warm_up()
    assert sh.status().store.fingerprint == sh.reader.fingerprint
    metrics = Metrics(64)
    metrics.watch(lambda: sh)
    assert metrics.value("shadow_arithmetic_info", {"fingerprint": sh.reader.fingerprint}) == 1.0
    metrics.watch(lambda: None)  # not loaded: no series
    assert f'fingerprint="{sh.reader.fingerprint}"' not in metrics.exposition().decode()
