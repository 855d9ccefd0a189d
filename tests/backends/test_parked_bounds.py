"""The parked-file reader trusts no size (issue 56, points 6 and 7): every hostile file is refused
from its header, before a byte of its data is read or allocated, within a memory limit
(``RLIMIT_AS``) and a per-case CPU-time limit, as SQLite fuzzes its files; and a restored session
owns its memory (R3).

The issue's cases, made here (the holes sparse, small on disk): one tensor of 1,000 huge
dimensions (32 s to scan and 86 s to restore, quadratic, GIL held), a 1 GiB sparse hole (+1 GB a
restore, refused only by the checksum after), a 94 MB header of 1.6M tensors (+4.1 GB and 198 s).
Under the limits the reader before this change ran past the CPU limit on the first and past the
memory limit on the others. The fuzz runs in a process of its own, so that its limits bind it alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from shadow.backends.qwen35.checkpoint import demo_text_config, write_checkpoint

from .parking import ids_for, make

REPO = Path(__file__).parents[2]
CASE_CPU_S = 20  # CPU seconds a case may take (not wall time: the CI box is loaded); each takes milliseconds
MEMORY_MIB = 384  # address space a case may add to the process's (torch's and the model's mappings)

CHILD = textwrap.dedent("""
    import json, os, random, resource, signal, sys
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    import torch
    from shadow.backends.stores import DiskStore, parked
    from tests.backends.parking import make, ids_for, MIB, T0

    ckpt, work, case_cpu_s, memory_mib = Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    sh = make(ckpt, work / "src")
    sh.feed_prompt("s", ids_for(1, 370)); sh.read(); sh.park("s")  # 320 rows read, a checkpoint or two
    good = sh.disk._path("s").read_bytes()
    reader = sh.reader
    sh.close()
    folder = work / "case"
    path = folder / parked.file_name("s")

    def store():  # the default cap (DISK_GB=64), on the clock the park was made by (parking's T0): within its TTL
        return DiskStore(folder, reader, reader.weights_hash, max_bytes=64 * 1024 * MIB, clock=lambda: T0)

    folder.mkdir()
    path.write_bytes(good)
    st = store()
    want = reader.export(st.peek("s")[1])
    st.close()
    head_len = int.from_bytes(good[:8], "little")
    header = json.loads(good[8:8 + head_len])

    def file_of(header, data, pad_to=None):
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
        if pad_to is not None:  # a sparse hole: the file's size, not its blocks
            os.truncate(path, pad_to)

    data = good[8 + head_len:]
    cases = {}

    def huge_dims():  # R1: one tensor of 1,000 huge dimensions (4,000 digits each: 4 MB of header)
        h = dict(header)
        h["k.0"] = {"dtype": "F32", "shape": [int("9" * 4000)] * 1000, "data_offsets": [0, 0]}
        raw = json.dumps(h).encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)
    cases["1,000 huge dimensions"] = huge_dims

    def sparse_hole():  # R2: conv.0 claims 1 GiB, laid last, in a hole; every other range as it was
        h = json.loads(json.dumps(header))
        at, parts = 0, []
        for name, spec in sorted(((k, v) for k, v in h.items() if k not in ("__metadata__", "conv.0")),
                                 key=lambda kv: kv[1]["data_offsets"][0]):
            b, e = spec["data_offsets"]
            parts.append(data[b:e])
            spec["data_offsets"] = [at, at + e - b]
            at += e - b
        h["conv.0"].update(shape=[2**28], data_offsets=[at, at + 2**30])
        file_of(h, b"".join(parts))
        os.truncate(path, path.stat().st_size + 2**30)
    cases["1 GiB sparse hole"] = sparse_hole

    def consistent_hole():  # R2: a book and shapes that agree, claiming 1 GiB of rows in a hole
        h = json.loads(json.dumps(header))
        book = json.loads(h["__metadata__"]["book"])
        rows = 2**30 // (2 * 64)
        book.update(n_ids=rows, committed=rows // 64 * 64)
        h["__metadata__"]["book"] = json.dumps(book)
        at = 0
        for name, spec in sorted(((k, v) for k, v in h.items() if k != "__metadata__"),
                                 key=lambda kv: kv[1]["data_offsets"][0]):
            if name == "ids":
                spec["shape"] = [rows]
            elif name.split(".")[0] in ("k", "v"):
                spec["shape"][0] = rows // 64 * 64
            size = 4
            for d in spec["shape"]:
                size *= d
            spec["data_offsets"] = [at, at + size]
            at += size
        file_of(h, b"")
        os.truncate(path, path.stat().st_size + at)
    cases["a consistent 1 GiB hole"] = consistent_hole

    def many_tensors():  # R2: a 94 MB header of 1.6M empty tensors (under safetensors' 100 MB), 100,000 at a time
        def part(start):
            return b",".join(b'"t%07d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}' % i
                             for i in range(start, start + 100_000))
        n = 2 + 15 + sum(len(part(s)) for s in range(0, 1_600_000, 100_000))
        with open(path, "wb") as f:
            f.write(n.to_bytes(8, "little") + b"{")
            for s in range(0, 1_600_000, 100_000):
                f.write((b"," if s else b"") + part(s))
            f.write(b"}")
    cases["94 MB header of 1.6M tensors"] = many_tensors

    def unknown_name():
        h = dict(header)
        h["k.99"] = h.pop("k.0")
        file_of(h, data)
    cases["a name no park holds"] = unknown_name

    def wrong_dim():
        h = json.loads(json.dumps(header))
        shape = h["recurrent.0"]["shape"]
        shape[0], shape[1] = shape[1], shape[0]  # the same bytes, another shape
        file_of(h, data)
    cases["a dimension not the model's"] = wrong_dim

    def wrong_dtype():
        h = json.loads(json.dumps(header))
        spec = h["conv.0"]
        spec["dtype"], spec["shape"] = "I32", spec["shape"]
        file_of(h, data)
    cases["a dtype not the model's"] = wrong_dtype

    def long_header_claim():
        path.write_bytes((2**62).to_bytes(8, "little") + good[8:])
    cases["a header length past the file"] = long_header_claim

    hostile = list(cases)
    rng = random.Random(56)
    for i in range(120):  # mutations of the good file: a byte flipped, cut, grown, a length changed
        def mutate(i=i, kind=i % 4, at=rng.randrange(len(good)), byte=rng.randrange(1, 256)):
            raw = bytearray(good)
            if kind == 0:
                raw[at] ^= byte
            elif kind == 1:
                raw = raw[:at]
            elif kind == 2:
                raw += bytes([byte]) * (at % 4096 + 1)
            else:
                raw[:8] = (head_len + (at % 64) - 32).to_bytes(8, "little", signed=True)
            path.write_bytes(bytes(raw))
        cases[f"mutation {i}"] = mutate

    class Late(BaseException):  # not an Exception: nothing in the store may take it for a bad file
        pass

    def late(*_):
        raise Late()

    signal.signal(signal.SIGVTALRM, late)
    base = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (base + memory_mib * MIB, resource.RLIM_INFINITY))
    out = {}
    for name, make_file in cases.items():
        for p in folder.iterdir():
            p.unlink()
        make_file()
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        signal.setitimer(signal.ITIMER_VIRTUAL, case_cpu_s)  # this process's CPU time, all its threads
        try:
            st = store()
            found = st.names()
            got = st.peek("s") if found else None
            if got is None:
                outcome = "refused on opening" if not found else "refused on loading"
            else:
                state = reader.export(got[1])
                outcome = "loaded exact" if all(torch.equal(state[k], want[k]) for k in want) else "LOADED WRONG"
            why = st.refused[-1][1] if st.refused else ""
            st.close()
        except Late:
            outcome, why = "PAST THE CPU LIMIT", ""
        except MemoryError:
            outcome, why = "PAST THE MEMORY LIMIT", ""
        finally:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu_s = t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime
        out[name] = {"outcome": outcome, "why": why[:300], "cpu_s": cpu_s, "hostile": name in hostile}
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("bounds") / "model", demo_text_config(), dtype=torch.float32)


def test_hostile_parked_files_are_refused_from_their_header_within_limits(ckpt, tmp_path):
    run = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(ckpt), str(tmp_path), str(CASE_CPU_S),
                          str(MEMORY_MIB)], capture_output=True, text=True, timeout=3600, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(results) == 128
    for name, r in results.items():
        assert r["outcome"] in ("refused on opening", "refused on loading", "loaded exact"), (name, r)
        assert "MemoryError" not in r["why"], (name, r)
        if r["hostile"] and name != "a consistent 1 GiB hole":  # the cases and a few like them:
            assert r["outcome"] == "refused on opening" and "checksum" not in r["why"], (name, r)  # the header alone
    hostile = {name: r["why"] for name, r in results.items() if r["hostile"]}
    assert "at most" in hostile["94 MB header of 1.6M tensors"]  # its length, before its JSON is parsed
    assert "digits" in hostile["1,000 huge dimensions"]
    assert "conv.0" in hostile["1 GiB sparse hole"]  # a dimension not the model's
    # a header that agrees with itself and claims 1 GiB in a hole: its checksum, a block at a time,
    # refuses it before the gigabyte is allocated (the memory limit would have stopped that)
    assert results["a consistent 1 GiB hole"]["outcome"] == "refused on loading"
    assert hostile["a consistent 1 GiB hole"] == "checksum mismatch"
    # byte flips in the data section pass every check on opening: the checksum refuses them on loading
    assert any(r["outcome"] == "refused on loading" for r in results.values())


def test_a_restored_session_owns_its_memory(ckpt, tmp_path):
    """R3: a restored session's checkpoints were views of the whole parked file's buffer (13 MB
    outside the cap beside 16 MB counted, on the CPU). Each restored tensor now holds only its own
    bytes, so what the residency counts is what the session keeps alive."""
    sh = make(ckpt, tmp_path / "d")
    ids = ids_for(1, 300) + ids_for(2, 200)
    sh.feed_prompt("s", ids[:300])
    sh.feed_prompt("s", ids)  # a second turn: a checkpoint at each turn's line
    sh.read()
    sh.park("s")
    with sh.residency.using("s") as (book, tensors):  # restored from its file
        assert book.checkpoints and tensors.checkpoints
        for conv, rec in tensors.checkpoints.values():
            for t in (*conv, *rec):  # what ``nbytes`` counts for it, and nothing more kept alive
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    got, want = sh.export_state("s"), sh.fresh_state(ids)
    for k in want:
        assert torch.equal(got[k], want[k]), k
