"""The proxy's table of sessions: the rule that finds a conversation's session without a header,
on ids alone (no model): continuations of any length, branches, new conversations, the bound,
clients kept apart. Each runs on every index: in memory, on disk, in a real Redis."""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from shadow.adapters.tokens import IM_START
from shadow.proxy.index import LocalIndex, chain
from shadow.proxy.redis_index import RedisIndex
from shadow.proxy.sessions import Sessions

GRID = 64
GEN = [IM_START, 77, 78]  # a generation prompt: <|im_start|>assistant\n


Make = Callable[..., Sessions]


@pytest.fixture(params=["memory", "disk", "redis"])
def table_of(request: pytest.FixtureRequest, tmp_path: Path) -> Make:
    """``table_of(grid=GRID, limit=1024)``: a table over one kind of index (the same one each call)."""
    kind = request.param
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""

    def make(grid: int = GRID, limit: int = 1024) -> Sessions:
        if kind == "redis":
            return Sessions(grid, index=RedisIndex.from_url(url, grid, limit))
        return Sessions(grid, index=LocalIndex(grid, limit, tmp_path / "index" if kind == "disk" else None))
    return make


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 5000) for _ in range(n)]


def _turn(table: Sessions, prompt: list[int], output: list[int], header: str | None = None, client: str = "") -> str:
    found = table.find(prompt, header, client)
    name = table.record(found.name or table.new_name(prompt, client, found.parent), found, prompt, client)
    table.extend(name, output)
    return name


def test_finding_changes_nothing_until_the_turn_is_recorded(table_of: Make) -> None:
    table = table_of()
    prompt = _ids(10, 0) + GEN
    assert table.find(prompt, None).how == "new" and table.names() == []
    name = _turn(table, prompt, [9, 9])
    assert table.find(prompt + [9, 9, 5] + GEN, None).name == name and table.ids(name) == prompt + [9, 9]


def test_a_continuation_joins_whatever_its_length(table_of: Make) -> None:
    table = table_of()
    for length in (5, GRID - 1, GRID, 3 * GRID + 7):
        prompt = _ids(length, length) + GEN
        name = _turn(table, prompt, [1, 2, 3])
        # the next prompt renders the reply again (here differently) after the whole last prompt
        nxt = prompt[:-len(GEN)] + [IM_START, 5, 6, 7, 8] + _ids(4, 1) + GEN
        found = table.find(nxt, None)
        assert (found.name, found.how) == (name, "continued"), length
        assert _turn(table, nxt, [4]) == name
        assert table.find(nxt + [4] + GEN, None).name == name


def test_a_parting_needs_a_chunk_and_the_first_prompt_and_branches_a_shared_system_prompt_is_new(
        table_of: Make) -> None:
    table = table_of()
    system = _ids(3 * GRID, 7)
    first = system + _ids(20, 8) + GEN
    name = _turn(table, first, _ids(100, 9))
    later = first[:-len(GEN)] + _ids(200, 10) + GEN
    assert _turn(table, later, _ids(30, 11)) == name
    # the history cut back to after the first prompt (or a twin rollout of the same task): it
    # would roll the session back to before its latest prompt, so it branches off instead
    cut = first[:-len(GEN)] + _ids(50, 12) + GEN
    found = table.find(cut, None)
    assert (found.name, found.how, found.parent) == (None, "branched", name)
    branch = _turn(table, cut, _ids(10, 14))
    assert branch == name + "-2" and table.ids(name) == later + _ids(30, 11)  # the first one untouched
    # another conversation with the same system prompt and tools, but its own first message: new
    other = system + _ids(20, 13) + GEN
    assert table.find(other, None).how == "new"


def test_the_table_is_bounded_least_recently_used_first_out_and_forget_drops_a_session(table_of: Make) -> None:
    table = table_of(limit=2)
    prompts = [_ids(30, i) + GEN for i in range(3)]
    names = [_turn(table, p, [1]) for p in prompts[:2]]
    _turn(table, prompts[0] + [1, 2] + GEN, [3])  # the first is used again: the second is oldest
    third = _turn(table, prompts[2], [1])
    assert table.names() == [names[0], third]
    assert {k: table.status()[k] for k in ("known", "limit", "evicted")} == {"known": 2, "limit": 2, "evicted": 1}
    assert table.find(prompts[1] + [1, 5] + GEN, None).how == "new"
    assert table.forget(third) and not table.forget(third)
    assert table.find(prompts[2] + [1, 5] + GEN, None).how == "new"


def test_a_thousand_conversations_sharing_a_long_prefix_each_find_their_own(table_of: Make) -> None:
    grid, shared = 512, _ids(16 * 1024, 99)
    table = table_of(grid=grid, limit=2000)
    convs = []
    for i in range(200):
        prompt = shared + _ids(64, 1000 + i) + GEN
        output = _ids(600, 5000 + i)
        convs.append((_turn(table, prompt, output), prompt + output))
    for name, ids in convs[::17]:
        nxt = ids + [IM_START] + _ids(10, 1) + GEN
        found = table.find(nxt, None)
        assert (found.name, found.how) == (name, "continued")


def test_the_table_holds_ids_as_int32_and_finds_as_it_did(table_of: Make) -> None:
    """A known conversation's ids live as long as it is known: an int32 array each, not an int
    object per id; the blocks hash as before, and a prompt given as an array is found as a list is."""
    table = table_of()
    prompt = _ids(3 * GRID + 5, 7) + GEN
    name = _turn(table, prompt, _ids(2 * GRID, 8))
    held = table.index.ids(name)
    assert isinstance(held, array) and held.typecode == "i" and table.ids(name) == list(held)
    meta = table.index.meta(name)
    assert meta is not None and meta.last_block == chain(table.ids(name), GRID)[-1]  # as a list of ints hashes
    nxt = table.ids(name) + _ids(10, 9) + GEN
    assert table.find(nxt, None).name == name and table.find(array("i", nxt), None).name == name
    assert _turn(table, nxt, _ids(5, 11)) == name
    rolled = prompt[:-len(GEN)] + _ids(GRID, 10) + GEN  # its history cut after the first prompt
    assert table.find(rolled, None) == table.find(array("i", rolled), None)
    assert (table.find(rolled, None).parent, table.find(rolled, None).how) == (name, "branched")
    assert table.find(prompt[:GRID] + [2**31] + GEN, None).how == "new"  # ids no session holds


def test_names_come_from_the_first_prompt_and_the_client_and_clients_never_join_each_other(table_of: Make) -> None:
    table = table_of()
    prompt = _ids(2 * GRID + 9, 21) + GEN
    a = _turn(table, prompt, _ids(40, 22), client="key-a")
    b = _turn(table, prompt, _ids(40, 23), client="key-b")  # the same first prompt, another engine key
    assert a != b and a.startswith("proxy-") and b.startswith("proxy-")
    assert table.new_name(prompt, "key-a") == a + "-2"  # taken: the next suffix
    nxt = table.ids(a) + _ids(12, 24) + GEN
    assert table.find(nxt, None, "key-a").name == a
    assert table.find(nxt, None, "key-b").name == b  # its own conversation's, never a's
    assert table.find(nxt, None, "").name is None  # no key is a client of its own too
    # the same name in a new table over nothing: a digest, not a counter
    assert table_of().new_name(prompt, "key-a").startswith(a[: len("proxy-")])


def test_a_request_without_a_header_never_joins_a_session_a_header_named(table_of: Make) -> None:
    table = table_of()
    prompt = _ids(3 * GRID, 31) + GEN
    _turn(table, prompt, _ids(20, 32), header="mine")
    nxt = table.ids("mine") + _ids(10, 33) + GEN
    found = table.find(nxt, None)
    assert (found.name, found.how) == (None, "new")
    assert table.find(nxt, "mine").name == "mine" and table.owner("mine") == (True, "")


def test_the_disk_index_outlives_the_process_and_a_bad_file_is_left_aside(tmp_path: Path) -> None:
    folder = tmp_path / "index"
    table = Sessions(GRID, index=LocalIndex(GRID, 16, folder))
    a_first = _ids(GRID + 30, 41) + GEN
    a = _turn(table, a_first, _ids(70, 42))
    a_second = table.ids(a) + _ids(25, 43) + GEN
    assert _turn(table, a_second, _ids(50, 44)) == a
    table.settle(a)
    table.index.close()
    (folder / "junk.idx").write_bytes(b'{"name": "x"}\n\x00')
    liar = {"name": "liar", "first_prompt": 1, "last_prompt": 10 * GRID, "owner": "", "named": False, "n": 2,
            "last_block": "", "used": 1}  # a last prompt past its ids
    liar_file = folder / (hashlib.blake2b(b"liar", digest_size=16).hexdigest() + ".idx")
    liar_file.write_bytes(json.dumps(liar).encode() + b"\n" + bytes(8))
    again = Sessions(GRID, index=LocalIndex(GRID, 16, folder))
    assert again.names() == [a] and again.ids(a) == table.ids(a) and again.status()["unreadable"] == 2
    b = _turn(again, _ids(GRID + 30, 45) + GEN, [1])  # another conversation after the restart
    assert b != a
    found = again.find(again.ids(a) + _ids(9, 46) + GEN, None)
    assert (found.name, found.how) == (a, "continued")


def test_two_tables_on_one_redis_agree_on_a_session(redis_url: str) -> None:
    one = Sessions(GRID, index=RedisIndex.from_url(redis_url, GRID))
    two = Sessions(GRID, index=RedisIndex.from_url(redis_url, GRID))
    first = _ids(2 * GRID + 3, 51) + GEN
    name = _turn(one, first, _ids(GRID + 5, 52), client="k")
    nxt = one.ids(name) + _ids(8, 53) + GEN
    assert two.find(nxt, None, "k").name == name
    assert _turn(two, nxt, _ids(30, 54), client="k") == name
    assert one.ids(name) == two.ids(name) == nxt + _ids(30, 54)
    assert one.index.meta(name) == two.index.meta(name)
    keys = one.index.r.keys("*")  # type: ignore[attr-defined]
    assert keys and all(k.startswith(b"shadow:{proxy-index}:") for k in keys)  # one hash tag: one Cluster slot
    assert two.forget(name) and one.names() == [] and not one.knows(name)
