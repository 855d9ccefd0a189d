"""A parked file is bound to its session (name, book, ids under the checksum; the file's name;
one process per folder), every field is checked when it opens, and it outlives a crash."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint
from shadow.backends.stores.disk import REFUSED_KEPT
from shadow.backends.stores.parked import checksum as _checksum
from shadow.backends.stores.parked import write
from shadow.core.slot import ModelSlot

from .parking import T0, assert_exact, ids_for, make

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("parked") / "model", demo_text_config(), dtype=torch.float32)


def _two_parked(ckpt: Path, disk: Path):
    """Two sessions of equal length (the case that loaded the wrong one without a word), parked."""
    sh = make(ckpt, disk)
    for name, seed in (("alpha", 1), ("bravo", 2)):
        sh.feed_prompt(name, ids_for(seed, 300))
        sh.read()
        sh.park(name)
    return sh, {name: sh.disk._path(name) for name in ("alpha", "bravo")}


def _read(file: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    with safe_open(str(file), framework="pt") as f:
        return dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def _rewrite(file: Path, book_changes: dict, changes: dict[str, str]) -> None:
    """Change metadata and write the checksum again: a file as a faulty writer would leave it, whose
    checksum is right and whose fields are not (only the checks on opening can tell)."""
    meta, data = _read(file)
    if book_changes:
        meta["book"] = json.dumps({**json.loads(meta["book"]), **book_changes})
    meta.update(changes)
    meta["checksum"] = _checksum(data, meta)
    save_file(data, str(file), metadata=meta)


def _flip_in_header(file: Path, old: bytes, new: bytes) -> None:
    raw = file.read_bytes()
    header_end = 8 + int.from_bytes(raw[:8], "little")
    at = raw.index(old)
    assert at < header_end and len(old) == len(new)
    file.write_bytes(raw[:at] + new + raw[at + len(old):])


# ---- bound to its session ------------------------------------------------------------------


def test_exchanged_files_are_refused_in_this_process_and_the_next(ckpt, tmp_path):
    sh, files = _two_parked(ckpt, tmp_path / "d")
    a, b = files["alpha"].read_bytes(), files["bravo"].read_bytes()
    files["alpha"].write_bytes(b)
    files["bravo"].write_bytes(a)
    assert_exact(sh, "alpha")  # not bravo's tensors under alpha's ids: refused
    assert list(sh.session_ids("alpha")) == []  # its ids were in its file: the host's next prompt brings them
    sh.feed_prompt("alpha", ids_for(1, 300))
    assert_exact(sh, "alpha")
    assert any("holds session 'bravo'" in why for _, why in sh.disk.refused)
    sh.close()
    files["alpha"].write_bytes(b)  # and again, for a process that finds them at its start
    files["bravo"].write_bytes(a)
    sh2 = make(ckpt, tmp_path / "d")
    assert sh2.sessions() == [] and not files["alpha"].exists() and not files["bravo"].exists()
    assert len(sh2.disk.refused) == 2 and all("whose file is" in why for _, why in sh2.disk.refused)


def test_a_flipped_name_byte_is_refused(ckpt, tmp_path):
    sh, files = _two_parked(ckpt, tmp_path / "d")
    _flip_in_header(files["alpha"], b'"session":"alpha"', b'"session":"alphc"')
    assert_exact(sh, "alpha")
    assert sh.disk.refused and not files["alpha"].exists()
    sh.park("alpha")
    sh.close()
    _flip_in_header(files["alpha"], b'"session":"alpha"', b'"session":"alphc"')
    sh2 = make(ckpt, tmp_path / "d")
    assert sh2.sessions() == ["bravo"]  # no "alphc" made up from a damaged file
    assert_exact(sh2, "bravo")


def test_the_checksum_covers_the_name_and_the_book(ckpt, tmp_path):
    sh, files = _two_parked(ckpt, tmp_path / "d")
    sh.close()
    # A name changed and the file renamed to match: every check on opening passes; the checksum does not.
    _flip_in_header(files["alpha"], b'"session":"alpha"', b'"session":"alphc"')
    files["alpha"].rename(sh.disk._path("alphc"))
    # A book changed within what the checks on opening allow (another turn count).
    meta, data = _read(files["bravo"])
    meta["book"] = json.dumps({**json.loads(meta["book"]), "turns": 7})
    save_file(data, str(files["bravo"]), metadata=meta)
    sh2 = make(ckpt, tmp_path / "d")
    assert sorted(sh2.sessions()) == ["alphc", "bravo"]  # found: the headers look right
    for name in ("alphc", "bravo"):
        sh2.restore(name)
    assert [why for _, why in sh2.disk.refused] == ["checksum mismatch", "checksum mismatch"]
    assert sh2.position("bravo").turns == 0 and sh2.disk.names() == []


def test_two_processes_never_share_a_folder(ckpt, tmp_path):
    disk = tmp_path / "d"
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from tests.backends.parking import make, ids_for
        sh = make(Path({str(ckpt)!r}), Path({str(disk)!r}))
        sh.feed_prompt("s", ids_for(1, 300)); sh.read(); sh.park("s")
        print(sh.disk.root, flush=True)
        sys.stdin.readline()  # hold the folder until told
        sh.close()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdin is not None
        assert other.stdout.readline().strip() == str(disk)
        sh = make(ckpt, disk)  # the same folder asked for: this process gets one of its own
        assert sh.disk.root == disk / "also-1" and sh.sessions() == []
        sh.feed_prompt("s", ids_for(2, 300))  # the same session name, other ids
        sh.read()
        sh.park("s")
        assert _read(disk / sh.disk._path("s").name)[1]["ids"].tolist() == ids_for(1, 300)  # untouched
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(60) == 0
    finally:
        other.kill()
        other.wait()
    sh.close()
    again = make(ckpt, disk)  # both gone: the folder is free, and holds the first process's session
    assert again.disk.root == disk and list(again.session_ids("s")) == ids_for(1, 300)
    assert_exact(again, "s")


# ---- every field checked on opening ---------------------------------------------------------

BAD_FIELDS = {
    "book grid 513": ({"grid": 513}, {}, "book grid is 513"),
    "committed past the ids": ({"committed": 384}, {}, "book committed is 384"),
    "committed off the grid": ({"committed": 200}, {}, "not a grid line"),
    "committed against the tensors": ({"committed": 256, "checkpoints": []}, {}, "KV rows are [320]"),
    "fewer ids than the book": ({"n_ids": 350}, {}, "the book holds 350"),
    "a checkpoint not held": ({"checkpoints": [64, 128]}, {}, "the book holds [64, 128]"),
    "a negative count": ({"rollbacks": -1}, {}, "book rollbacks is -1"),
    "an unknown book field": ({"extra": 1}, {}, "unknown ['extra']"),
    "parked in the future": ({}, {"parked_at": repr(T0 + 3600)}, "not a time at or before now"),
    "parked at NaN": ({}, {"parked_at": "nan"}, "not a time at or before now"),
    "not JSON": ({}, {"book": "{"}, "bad metadata"),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_bad_metadata_is_refused_on_opening(ckpt, tmp_path, case):
    book, meta, why = BAD_FIELDS[case]
    sh = make(ckpt, tmp_path / "d")
    sh.feed_prompt("s", ids_for(1, 370))
    sh.read()
    sh.park("s")
    file = sh.disk._path("s")
    _rewrite(file, book, meta)
    sh.restore("s")  # in this process: refused on opening; the session waits for the host's next prompt
    assert not file.exists() and why in sh.disk.refused[-1][1] and sh.session_ids("s") == ()
    sh.feed_prompt("s", ids_for(1, 370))
    assert_exact(sh, "s")
    sh.park("s")
    sh.close()
    _rewrite(file, book, meta)
    sh2 = make(ckpt, tmp_path / "d")  # a new process refuses it when it looks at the folder
    assert sh2.sessions() == [] and why in sh2.disk.refused[-1][1] and not file.exists()


# ---- a crash costs the reading since the last park --------------------------------------------


def test_a_kill_while_sessions_are_resident_leaves_their_last_park(ckpt, tmp_path):
    disk = tmp_path / "d"
    p_a, p_b = ids_for(1, 330), ids_for(2, 300)
    o_b = ids_for(3, 120)
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from tests.backends.parking import make, ids_for
        sh = make(Path({str(ckpt)!r}), Path({str(disk)!r}))
        sh.feed_prompt("a", {p_a!r}); sh.feed_prompt("b", {p_b!r}); sh.read()
        sh.park("a"); sh.park("b")
        sh.feed_prompt("a", {p_a!r} + ids_for(4, 200))  # both resident again and read past their parks
        sh.feed_output("b", {o_b!r}); sh.read()
        assert sh.status().sessions["b"].where == "resident" and sh.position("b").committed == 384
        print("ready", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(60)
    finally:
        worker.kill()
        worker.wait()
    sh = make(ckpt, disk)
    assert sh.disk.root == disk  # the kill let go of the folder
    assert sorted(sh.sessions()) == ["a", "b"] and sh.disk.refused == []
    assert (sh.position("a").length, sh.position("a").committed) == (330, 320)  # as of the last park
    assert (sh.position("b").length, sh.position("b").committed) == (300, 256)
    # The host's next prompts bring them up to date: a extends its parked ids; b's re-render differs
    # from what was parked below its committed rows, so it rolls back (to the start: no checkpoint below).
    sh.feed_prompt("a", p_a + ids_for(4, 200) + ids_for(5, 40))
    b_now = p_b[:100] + ids_for(6, 400)
    sh.feed_prompt("b", b_now)
    assert sh.position("a").rollbacks == 0 and sh.position("b").rollbacks == 1
    for name in ("a", "b"):
        assert_exact(sh, name)
    assert list(sh.session_ids("b")) == b_now


# ---- nothing a file holds raises out of the store ---------------------------------------------

DEEP_BOOK = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on it, not ValueError


def test_a_deeply_nested_book_is_refused_and_the_slot_loads(ckpt, tmp_path):
    disk = tmp_path / "d"
    sh = make(ckpt, disk)
    sh.feed_prompt("s", ids_for(1, 370))
    sh.feed_prompt("t", ids_for(2, 300))
    sh.read()
    sh.park("s")
    sh.park("t")
    file = sh.disk._path("s")
    _rewrite(file, {}, {"book": DEEP_BOOK})  # checksum right: only the checks on opening can tell
    sh.restore("s")  # in this process: refused, not raised; the session is read again from its next prompt
    assert not file.exists() and "RecursionError" in sh.disk.refused[-1][1]
    sh.feed_prompt("s", ids_for(1, 370))
    assert_exact(sh, "s")
    sh.park("s")
    sh.close()
    _rewrite(file, {}, {"book": DEEP_BOOK})
    slot = ModelSlot(lambda: make(ckpt, disk), model=str(ckpt))  # what a new process's service loads
    again = slot.load()
    assert slot.state == "loaded" and again is not None, slot.error
    assert again.sessions() == ["t"] and not file.exists()
    assert "RecursionError" in again.disk.refused[-1][1]
    assert_exact(again, "t")


def test_metadata_fields_are_bounded_before_they_are_parsed(ckpt, tmp_path):
    sh = make(ckpt, tmp_path / "d")
    sh.feed_prompt("s", ids_for(1, 370))
    sh.read()
    sh.park("s")
    _rewrite(sh.disk._path("s"), {}, {"parked_at": "1" * 5000})
    sh.restore("s")
    assert "longer than allowed" in sh.disk.refused[-1][1] and "parked_at" in sh.disk.refused[-1][1]


# ---- restoring takes the park this process made ------------------------------------------------


def test_an_older_park_put_back_is_refused_here_and_taken_by_a_new_process(ckpt, tmp_path):
    disk = tmp_path / "d"
    sh = make(ckpt, disk)
    first = ids_for(1, 300)
    sh.feed_prompt("s", first)
    sh.read()
    sh.park("s")
    file = sh.disk._path("s")
    older = file.read_bytes()
    now = first + ids_for(2, 250)
    sh.feed_prompt("s", now)
    sh.read()
    sh.park("s")
    file.write_bytes(older)  # a valid file of this session, checksum and all: not the last park
    sh.restore("s")  # refused, not put under the newer bookkeeping
    assert "not the last park" in sh.disk.refused[-1][1] and not file.exists()
    sh.feed_prompt("s", now)  # the host's next prompt, whole as always
    assert_exact(sh, "s")
    assert list(sh.session_ids("s")) == now
    assert sh.ask("s", ids_for(3, 20), ["A", "B"]).label in ("A", "B")
    sh.feed_output("s", ids_for(4, 100))
    sh.read()  # the next read is fine
    assert_exact(sh, "s")
    sh.park("s")
    sh.close()
    file.write_bytes(older)  # a new process has no record of the last park: the file on disk is what it has
    again = make(ckpt, disk)
    assert again.sessions() == ["s"] and again.position("s").length == 300
    assert_exact(again, "s")
    assert again.disk.refused == []


# ---- what parking costs the process ------------------------------------------------------------


def _ctypes_types() -> int:
    # ctypes' own array and pointer types only: a whole-process count of classes also counts what an
    # unrelated module imports meanwhile (under pytest-xdist a worker's first test of a kind imports
    # thousands), which says nothing about parking
    gc.collect()
    return sum(isinstance(o, type) and issubclass(o, (ctypes.Array, ctypes._Pointer)) for o in gc.get_objects())


def test_parking_sessions_of_many_lengths_makes_no_class_per_length(ckpt, tmp_path):
    """safetensors.torch.save_file made a ctypes array type and a pointer type per byte length it
    wrote, kept for the life of the process: a server parking sessions of ever new lengths grew
    without end (the soak: about 4 classes a second). Each park here has ids of a new length."""
    sh = make(ckpt, tmp_path / "d")
    sh.feed_prompt("warm", ids_for(0, 64))  # the first park's one-off imports and caches
    sh.read()
    sh.park("warm")
    before = _ctypes_types()
    for n in range(20):
        sh.feed_prompt(f"s{n}", ids_for(n, 65 + n))
        sh.park(f"s{n}")
    # the tensors' bytes, each park's own length (a file's whole size may repeat: its header holds the
    # park's time, whose digits vary, padded to 8 bytes)
    raw = [sh.disk._path(f"s{n}").read_bytes() for n in range(20)]
    assert len({len(r) - 8 - int.from_bytes(r[:8], "little") for r in raw}) == 20
    assert _ctypes_types() - before < 5  # save_file: 3 a park, 60 here


def test_a_parked_file_is_byte_for_byte_what_safetensors_writes(tmp_path):
    """The writer that makes no class writes the file safetensors.torch.save_file does (files
    parked before it load as they did): every dtype a park holds, a transposed view, an empty tensor."""
    data = {"k.3": torch.randn(7, 2, 4), "conv.0": torch.randn(6, 4).t(), "ids": torch.arange(9, dtype=torch.int32),
            "recurrent.0": torch.randn(2, 3, 3).to(torch.bfloat16), "empty": torch.empty(0, 4)}
    meta = {"session": "s", "book": "{}"}
    write(tmp_path / "ours.safetensors", data, meta)
    save_file({k: t.contiguous() for k, t in data.items()}, str(tmp_path / "theirs.safetensors"), metadata=meta)
    ours, theirs = ((tmp_path / f"{w}.safetensors").read_bytes() for w in ("ours", "theirs"))
    header = [8 + int.from_bytes(raw[:8], "little") for raw in (ours, theirs)]
    # the header as JSON (its metadata's order is the writer's hash map's), then every byte of the tensors
    assert json.loads(ours[8:header[0]]) == json.loads(theirs[8:header[1]])
    assert ours[header[0]:] == theirs[header[1]:] and len(ours) == len(theirs)


def test_the_refusals_kept_are_bounded(ckpt, tmp_path):
    """Each refused file was kept in a list for the life of the process; a folder someone keeps
    writing bad files to grew it without end. The newest are kept, with their reasons."""
    disk = tmp_path / "d"
    disk.mkdir()
    for i in range(REFUSED_KEPT + 40):
        (disk / f"{i:040d}.safetensors").write_bytes(b"not a parked file")
    sh = make(ckpt, disk)
    assert len(sh.disk.refused) == REFUSED_KEPT and all("unreadable" in why for _, why in sh.disk.refused)
    assert sh.disk.refused[-1][0] == f"{REFUSED_KEPT + 39:040d}.safetensors"
    assert not list(disk.glob("*.safetensors"))  # each one refused is gone
