"""The grid bookkeeping alone (no torch)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shadow.core.session import (
    MAX_CHECKPOINTS,
    Position,
    SessionBook,
    checked_meta,
    checkpoint_line,
    first_difference,
    grid_line_at_or_below,
)


@given(st.lists(st.integers(0, 3), max_size=9000), st.lists(st.integers(0, 3), max_size=9000))
def test_first_difference(a, b):
    i = first_difference(a, b)
    assert a[:i] == b[:i]
    assert i == min(len(a), len(b)) or a[i] != b[i]
    # the same count on the other kinds it is given: the router's arrays, text
    assert first_difference(array("I", a), array("I", b)) == i
    assert first_difference("".join(map(str, a)), "".join(map(str, b))) == i


def test_checkpoint_line_is_the_grid_line_at_or_below_what_the_next_prompt_keeps():
    assert grid_line_at_or_below(1023, 512) == 512
    assert grid_line_at_or_below(1024, 512) == 1024
    assert [checkpoint_line(n, 512) for n in (1, 513, 514, 1025, 1026, 1300)] == [0, 0, 512, 512, 1024, 1024]
    book = SessionBook(grid=512)
    book.feed_prompt(list(range(1300)))
    assert book.wanted == [1024]
    book = SessionBook(grid=512)
    first = list(range(1025))  # ends 1 past a line: the next prompt keeps 1,023 of it
    book.feed_prompt(first)
    assert book.wanted == [512]
    book.committed_chunk()
    book.took_checkpoint()
    book.committed_chunk()  # 1,024 read, then the template drops the generation prompt's 2 ids
    rb = book.feed_prompt(first[:-2] + [7] * 300)
    assert rb is not None and rb.resume_at == 512 and rb.reread == 512


def test_rollback_goes_to_newest_checkpoint_at_or_below_the_cut():
    book = SessionBook(grid=64)
    prompt = list(range(200))  # line 192
    book.feed_prompt(prompt)
    for _ in range(3):
        book.committed_chunk()
        if book.checkpoint_due():
            book.took_checkpoint()
    assert book.checkpoints == [192] and book.committed == 192
    book.feed_output(list(range(1000, 1100)))
    book.committed_chunk()
    book.committed_chunk()  # 320
    rb = book.feed_prompt(prompt + [1000, 1001, 7, 7, 7])
    assert rb is not None and rb.diverged_at == 202 and rb.resume_at == 192 and rb.reread == 128
    assert book.committed == 192


def test_divergence_in_the_tail_needs_no_rollback():
    book = SessionBook(grid=64)
    book.feed_prompt(list(range(100)))
    book.committed_chunk()  # 64 committed, 36 pending
    assert book.feed_prompt(list(range(70)) + [5, 5]) is None
    assert book.committed == 64 and list(book.ids[-2:]) == [5, 5]


def test_the_settled_end_is_the_latest_prompts_line_and_survives_a_parked_file():
    book = SessionBook(grid=64)
    assert book.settled_end == 0
    book.feed_prompt(list(range(200)))  # line 192
    book.feed_output(list(range(1000, 1300)))
    assert book.settled_end == 192 and book.pending == 500
    assert book.position().settled == 192
    back = Position.from_meta(checked_meta(book.meta(), 64))
    assert back == book.position()
    book.feed_prompt(list(range(198)) + [7] * 400)  # the next prompt drops the output: line 576
    assert book.settled_end == 576
    book.feed_prompt(list(range(30)))  # a compaction: the line falls to 0 with the prompt
    assert book.settled_end == 0
    assert SessionBook(grid=64, ids=list(range(300))).settled_end == 300  # ids alone (a fresh prefill's)


def test_a_session_whose_prompts_keep_the_output_is_settled_to_its_end():
    book, held = SessionBook(grid=64), list(range(200))
    book.feed_prompt(held)
    for turn in range(3):  # an agent whose template keeps Qwen's output verbatim
        book.feed_output([1000 + turn] * 100)
        assert book.settled_end == (192 if turn == 0 else len(book.ids))
        held = list(book.ids) + [7] * 30
        book.feed_prompt(held)
    assert book.outputs_kept == [3, 0]
    book.feed_output([5] * 100)
    book.feed_prompt(held[:-2] + [9] * 50)  # then one that drops it: still more kept than not
    assert book.outputs_kept == [3, 1] and book.settled_end == len(book.ids)


def test_a_book_parked_before_the_settled_fields_reads_as_one_that_never_saw_them():
    book = SessionBook(grid=64)
    book.feed_prompt(list(range(200)))
    old = {k: v for k, v in book.meta().items() if k not in ("prompt_len", "outputs_kept")}
    back = SessionBook.from_meta(checked_meta(old, 64), book.ids)
    assert back.prompt_len == 0 and back.outputs_kept == [0, 0] and back.settled_end == 192
    back.outputs_kept[0] += 1  # its own list, not the defaults'
    assert SessionBook.from_meta(old, book.ids).outputs_kept == [0, 0]
    with pytest.raises(ValueError, match="outputs_kept"):
        checked_meta({**book.meta(), "outputs_kept": [1]}, 64)


def test_at_most_six_checkpoints_the_first_turns_kept():
    book = SessionBook(grid=64)
    ids: list[int] = []
    dropped = []
    for turn in range(MAX_CHECKPOINTS + 3):
        ids = ids + [turn] * 64 + [-1, -2]  # each prompt ends in a generation tail the next one drops
        book.feed_prompt(ids)
        ids = ids[:-2]
        book.committed_chunk()
        if book.checkpoint_due():
            dropped.append(book.took_checkpoint())
    assert book.checkpoints == [64, *(64 * t for t in range(5, 10))]
    assert dropped == [None] * MAX_CHECKPOINTS + [128, 192, 256]


def test_a_compaction_that_keeps_the_first_prompt_resumes_at_its_line():
    """Compactions as the real timelines make them: of the 24 prompts in the 35 that cut the
    previous one short by more than its generation tail, 14 kept the first prompt (system prompt,
    task) less its last two ids."""
    book = SessionBook(grid=64)
    first = list(range(1000, 1200)) + [-1, -2]  # its line: 192
    ids = first
    for turn in range(3 * MAX_CHECKPOINTS):
        book.feed_prompt(ids)
        book.feed_output([turn] * 100)
        while book.whole_chunks_pending:
            book.committed_chunk()
            if book.checkpoint_due():
                book.took_checkpoint()
        ids = list(book.ids) + [turn] * 10
    assert book.checkpoints[0] == 192 and book.committed > 1500
    rb = book.feed_prompt(first[:-2] + [5] * 300)  # the summary replaces all but the first prompt
    assert rb is not None and rb.resume_at == 192 and book.committed == 192


def held_as_int32(book: SessionBook) -> bool:
    return isinstance(book.ids, array) and book.ids.typecode == "i"


def test_a_book_holds_its_ids_as_int32_and_takes_a_list_or_an_array_alike():
    """A session's ids live as long as it does: held as an int32 array, not an int object per id
    (those pinned CPython's small-object arenas in the soaks). A prompt given as an array must roll
    back as the same prompt given as a list does (an array never equals a list)."""
    books = {kind: SessionBook(grid=64) for kind in ("list", "array")}
    prompt = list(range(5000, 5200))
    turns = [prompt, prompt + [7] * 40, prompt[:150] + [9] * 90]  # the last one diverges below committed
    outcomes = {}
    for kind, book in books.items():
        seen = []
        for i, turn in enumerate(turns):
            seen.append(book.feed_prompt(turn if kind == "list" else array("i", turn)))
            assert held_as_int32(book)
            book.feed_output([100 + i] * 30 if kind == "list" else array("i", [100 + i] * 30))
            assert held_as_int32(book)
            while book.whole_chunks_pending:
                book.committed_chunk()
                if book.checkpoint_due():
                    book.took_checkpoint()
        outcomes[kind] = (seen, list(book.ids), book.meta())
    assert outcomes["list"] == outcomes["array"]
    seen, ids, meta = outcomes["list"]
    assert seen[0] is None and seen[1] is None and seen[2] is not None and seen[2].diverged_at == 150
    assert ids == turns[2] + [102] * 30
    again = SessionBook.from_meta(meta, ids)
    assert held_as_int32(again) and list(again.ids) == ids and again.meta() == meta
    assert held_as_int32(SessionBook.from_meta(meta, array("i", ids)))
    assert SessionBook.ID_BYTES == array("i").itemsize == 4


@pytest.mark.parametrize("bad", [[1, 2.5], [1, 2**31], [1, "2"], [1, None]])
def test_ids_past_int32_are_refused_and_change_nothing(bad):
    book = SessionBook(grid=64)
    book.feed_prompt(list(range(100)))
    before = (list(book.ids), book.meta())
    with pytest.raises(ValueError, match="int32 token ids"):
        book.feed_prompt(list(range(50)) + bad)
    with pytest.raises(ValueError, match="int32 token ids"):
        book.feed_output(bad)
    assert (list(book.ids), book.meta()) == before
