"""The proxy's table of sessions: the rule that finds a conversation's session without a header,
on ids alone (no model): continuations of any length, rollbacks, new conversations, the bound."""

from __future__ import annotations

import random
from array import array

from shadow.adapters.tokens import IM_START
from shadow.proxy.sessions import Sessions, chain

GRID = 64
GEN = [IM_START, 77, 78]  # a generation prompt: <|im_start|>assistant\n


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 5000) for _ in range(n)]


def _turn(table: Sessions, prompt: list[int], output: list[int], header: str | None = None) -> str:
    found = table.find(prompt, header)
    name = table.record(found.name or table.new_name(), found, prompt)
    table.extend(name, output)
    return name


def test_finding_changes_nothing_until_the_turn_is_recorded() -> None:
    table = Sessions(GRID)
    prompt = _ids(10, 0) + GEN
    assert table.find(prompt, None).how == "new" and table.names() == []
    name = _turn(table, prompt, [9, 9])
    assert table.find(prompt + [9, 9, 5] + GEN, None).name == name and table.ids(name) == prompt + [9, 9]


def test_a_continuation_joins_whatever_its_length() -> None:
    table = Sessions(GRID)
    for length in (5, GRID - 1, GRID, 3 * GRID + 7):
        prompt = _ids(length, length) + GEN
        name = _turn(table, prompt, [1, 2, 3])
        # the next prompt renders the reply again (here differently) after the whole last prompt
        nxt = prompt[:-len(GEN)] + [IM_START, 5, 6, 7, 8] + _ids(4, 1) + GEN
        found = table.find(nxt, None)
        assert (found.name, found.how) == (name, "continued"), length
        assert _turn(table, nxt, [4]) == name
        assert table.find(nxt + [4] + GEN, None).name == name


def test_a_rollback_needs_a_chunk_and_the_first_prompt_a_shared_system_prompt_is_a_new_session() -> None:
    table = Sessions(GRID)
    system = _ids(3 * GRID, 7)
    first = system + _ids(20, 8) + GEN
    name = _turn(table, first, _ids(100, 9))
    later = first[:-len(GEN)] + _ids(200, 10) + GEN
    assert _turn(table, later, _ids(30, 11)) == name
    # the client cut the history back to after the first prompt: a rollback of the same session
    cut = first[:-len(GEN)] + _ids(50, 12) + GEN
    assert table.find(cut, None).name == name and table.find(cut, None).how == "rolled back"
    # another conversation with the same system prompt and tools, but its own first message: new
    other = system + _ids(20, 13) + GEN
    assert table.find(other, None).how == "new"


def test_the_table_is_bounded_least_recently_used_first_out_and_forget_drops_a_session() -> None:
    table = Sessions(GRID, limit=2)
    prompts = [_ids(30, i) + GEN for i in range(3)]
    names = [_turn(table, p, [1]) for p in prompts[:2]]
    _turn(table, prompts[0] + [1, 2] + GEN, [3])  # the first is used again: the second is oldest
    third = _turn(table, prompts[2], [1])
    assert table.names() == [names[0], third]
    assert table.status() == {"known": 2, "limit": 2, "evicted": 1}
    assert table.find(prompts[1] + [1, 5] + GEN, None).how == "new"
    assert table.forget(third) and not table.forget(third)
    assert table.find(prompts[2] + [1, 5] + GEN, None).how == "new"


def test_a_thousand_conversations_sharing_a_long_prefix_each_find_their_own() -> None:
    grid, shared = 512, _ids(16 * 1024, 99)
    table = Sessions(grid, limit=2000)
    convs = []
    for i in range(200):
        prompt = shared + _ids(64, 1000 + i) + GEN
        output = _ids(600, 5000 + i)
        convs.append((_turn(table, prompt, output), prompt + output))
    for name, ids in convs[::17]:
        nxt = ids + [IM_START] + _ids(10, 1) + GEN
        found = table.find(nxt, None)
        assert (found.name, found.how) == (name, "continued")


def test_the_table_holds_ids_as_int32_and_finds_as_it_did() -> None:
    """A known conversation's ids live as long as it is known: an int32 array each, not an int
    object per id; the blocks hash as before, and a prompt given as an array is found as a list is."""
    table = Sessions(GRID)
    prompt = _ids(3 * GRID + 5, 7) + GEN
    name = _turn(table, prompt, _ids(2 * GRID, 8))
    held = table._known[name].ids
    assert isinstance(held, array) and held.typecode == "i" and table.ids(name) == list(held)
    assert table._known[name].blocks == chain(table.ids(name), GRID)  # as a list of ints hashes
    nxt = table.ids(name) + _ids(10, 9) + GEN
    assert table.find(nxt, None).name == name and table.find(array("i", nxt), None).name == name
    assert _turn(table, nxt, _ids(5, 11)) == name
    rolled = prompt[:-len(GEN)] + _ids(GRID, 10) + GEN  # its history cut after the first prompt
    assert table.find(rolled, None) == table.find(array("i", rolled), None)
    assert (table.find(rolled, None).name, table.find(rolled, None).how) == (name, "rolled back")
    assert table.find(prompt[:GRID] + [2**31] + GEN, None).how == "new"  # ids no session holds
