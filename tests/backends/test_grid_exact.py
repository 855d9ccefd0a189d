"""Promises 1-4 (docs/architecture.md): grid, exact replay, fork purity, rollback. Checked with
torch.equal on every tensor."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow import ShadowSettings, build_shadow
from shadow.backends.qwen35.checkpoint import write_checkpoint
from shadow.core.errors import BadInput, UnknownSession

from .tiny import tiny

VOCAB = 248320  # the real vocabulary, so real token ids (and the template's) pass as they are


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    cfg = tiny(vocab=VOCAB, hidden=32, heads=2, kv_heads=1, layers=4, k_heads=2, v_heads=4)
    return {dtype: write_checkpoint(root / dtype, cfg, dtype=getattr(torch, dtype), seed=3)
            for dtype in ("float32", "bfloat16")}


def _shadow(checkpoints, dtype: str, grid: int):
    return build_shadow(ShadowSettings(_env_file=None, model=str(checkpoints[dtype]), device="cpu",
                                       dtype=dtype, grid=grid, disk="off"))


def _assert_exact(sh, session: str) -> int:
    ids = list(sh.session_ids(session))
    got, want = sh.export_state(session), sh.fresh_state(ids)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name} differs from a fresh prefill"
    return len(want)


# A session: turns of (how the prompt relates to what was read, prompt growth, output length).
_turn = st.tuples(st.sampled_from(["extend", "drop_reasoning", "compact"]),
                  st.integers(1, 300), st.integers(0, 200))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(turns=st.lists(_turn, min_size=1, max_size=5), dtype=st.sampled_from(["float32", "bfloat16"]),
       grid=st.sampled_from([64, 512]), seed=st.integers(0, 2**16), read_every_turn=st.booleans())
def test_replay_equals_fresh_prefill(checkpoints, turns, dtype, grid, seed, read_every_turn):
    sh = _shadow(checkpoints, dtype, grid)
    rng = random.Random(seed)
    held: list[int] = []
    last_output: tuple[int, int] = (0, 0)  # where the last output sits in `held`
    for kind, grow, out_len in turns:
        if kind == "drop_reasoning" and last_output[1] > last_output[0]:
            # The template drops the last answer's reasoning once a new user message comes.
            a, b = last_output
            cut = rng.randrange(a, b)
            prompt = held[:cut] + held[cut + (b - cut) // 2:]
        elif kind == "compact" and held:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 40))]  # a new summary prefix
        else:
            prompt = list(held)
        prompt += [rng.randrange(VOCAB) for _ in range(grow)]
        sh.feed_prompt("s", prompt)
        output = [rng.randrange(VOCAB) for _ in range(out_len)]
        if read_every_turn:
            sh.read()
        sh.feed_output("s", output)
        held = prompt + output
        last_output = (len(prompt), len(held))
        if read_every_turn:
            sh.read()
        book = sh.position("s")
        assert (book.committed % grid == 0 and book.pending < grid) or not read_every_turn
    sh.read()
    assert _assert_exact(sh, "s") == 4 * 2


def test_kv_growth_past_8192_rows(checkpoints):
    sh = _shadow(checkpoints, "bfloat16", 512)
    rng = random.Random(1)
    ids = [rng.randrange(VOCAB) for _ in range(9000)]
    sh.feed_prompt("s", ids[:5000])
    sh.read()
    sh.feed_output("s", ids[5000:6000])
    sh.read()
    sh.feed_prompt("s", ids[:9000])
    sh.read()
    assert sh.position("s").committed == 8704 > 8192
    _assert_exact(sh, "s")


def test_rollback_rereads_only_from_the_checkpoint(checkpoints):
    sh = _shadow(checkpoints, "float32", 64)
    rng = random.Random(2)
    prompt = [rng.randrange(VOCAB) for _ in range(300)]  # checkpoint line: 256
    output = [rng.randrange(VOCAB) for _ in range(200)]
    sh.feed_prompt("s", prompt)
    sh.feed_output("s", output)
    sh.read()
    book = sh.position("s")
    assert book.committed == 448 and 256 in book.checkpoints
    cut = 300 + 37  # the re-rendered prompt drops part of the answer
    sh.feed_prompt("s", prompt + output[:37] + output[90:] + [7] * 20)
    book = sh.position("s")  # a view: read it again after the feed
    assert book.rollbacks == 1 and book.reread == 448 - 256  # committed minus the cut's checkpoint
    assert book.committed == 256 <= cut
    sh.read()
    _assert_exact(sh, "s")


def test_no_checkpoint_starts_over(checkpoints):
    sh = _shadow(checkpoints, "float32", 64)
    ids = list(range(1000, 1300))
    sh.feed_prompt("s", ids)
    sh.read()
    sh.feed_prompt("s", [5] + ids[1:])
    assert sh.position("s").committed == 0 and sh.position("s").reread == 256
    sh.read()
    _assert_exact(sh, "s")


def test_checkpoints_are_capped_the_first_turns_kept(checkpoints):
    sh = _shadow(checkpoints, "float32", 64)
    ids: list[int] = []
    for turn in range(8):
        ids = ids + [turn + 10] * 70
        sh.feed_prompt("s", ids)
        sh.read()
    assert sh.position("s").checkpoints == (64, 256, 320, 384, 448, 512)  # lines of 68, 278 .. 558 ids
    sh.feed_prompt("s", ids[:68] + [9] * 100)  # a compaction that keeps the first prompt
    assert sh.position("s").committed == 64 and sh.position("s").reread == 512 - 64
    sh.read()
    _assert_exact(sh, "s")


def test_ask_is_pure_and_equals_one_turn_session(checkpoints):
    sh = _shadow(checkpoints, "bfloat16", 64)
    rng = random.Random(4)
    p1 = [rng.randrange(VOCAB) for _ in range(150)]
    o1 = [rng.randrange(VOCAB) for _ in range(90)]
    p2 = p1 + o1 + [rng.randrange(VOCAB) for _ in range(100)]
    sh.feed_prompt("a", p1)
    sh.read()
    sh.feed_output("a", o1)
    sh.feed_prompt("a", p2)
    sh.read()
    before = sh.export_state("a")
    ans = sh.ask("a", "Which file changed?", ["A", "B", "C"])
    after = sh.export_state("a")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert ans.behind == len(p2) % 64 and ans.label in "ABC"

    sh.feed_prompt("b", p2)  # the same ids in one turn
    sh.read()
    again = sh.ask("b", "Which file changed?", ["A", "B", "C"])
    assert torch.equal(torch.tensor(list(ans.probs.values())), torch.tensor(list(again.probs.values())))
    assert sh.ask("a", [1, 2, 3], ["A", "B"]).probs.keys() == {"A", "B"}


def test_fork_decode_leaves_state(checkpoints):
    sh = _shadow(checkpoints, "float32", 64)
    sh.feed_prompt("s", list(range(500, 700)))
    sh.read()
    before = sh.export_state("s")
    out = sh.decode("s", "Summarise.", max_new=5)
    assert 1 <= len(out) <= 5
    after = sh.export_state("s")
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda sh: sh.ask("nope", "q", ["A"]), UnknownSession, "unknown session 'nope'"),
    (lambda sh: sh.ask("s", "q", []), BadInput, "choices is empty"),
    (lambda sh: sh.ask("s", "q", [chr(65 + i % 26) + str(i) for i in range(27)]), BadInput, "at most 26"),
    (lambda sh: sh.ask("s", "q", ["A", "not one token at all"]), BadInput, "is not one token"),
    (lambda sh: sh.feed_prompt("s", [1, VOCAB]), BadInput, "prompt[1]"),
    # past the ids the session holds (only those are checked again), counted from the prompt's start
    (lambda sh: sh.feed_prompt("s", [*range(100, 250), VOCAB]), BadInput, f"prompt[150] = {VOCAB}"),
    (lambda sh: sh.feed_prompt("s", [*range(100, 250), 7, "x"]), BadInput, "prompt[151] = 'x'"),
    (lambda sh: sh.feed_prompt("s", [*range(100, 200), -3]), BadInput, "prompt[100] = -3"),
    # not int32 (the book holds int32 ids): the same message, whatever the array refused
    (lambda sh: sh.feed_prompt("s", [*range(100, 250), 2**40]), BadInput, f"prompt[150] = {2**40} is not a token id"),
    (lambda sh: sh.feed_prompt("s", [*range(100, 250), 2.5]), BadInput, "prompt[150] = 2.5 is not a token id"),
    (lambda sh: sh.feed_output("s", [7, 2**31]), BadInput, f"output[1] = {2**31} is not a token id"),
    (lambda sh: sh.feed_output("s", [-1]), BadInput, "output[0]"),
    (lambda sh: sh.feed_prompt("s", []), BadInput, "empty prompt"),
    (lambda sh: sh.feed_output("other", [1]), UnknownSession, "unknown session 'other'"),
])
def test_bad_input_is_refused_and_changes_nothing(checkpoints, call, error, message):
    sh = _shadow(checkpoints, "float32", 64)
    sh.feed_prompt("s", list(range(100, 250)))
    sh.read()
    def book_view() -> tuple:
        book = sh.memory.peek("s")[0]  # the whole book, wanted lines included: nothing of it may change
        return (list(book.ids), {k: v for k, v in book.meta().items() if k != "last_used"})  # a copy

    before, book_before = sh.export_state("s"), book_view()
    with pytest.raises(error) as err:
        call(sh)
    assert message in str(err.value)
    after = sh.export_state("s")
    assert book_view() == book_before
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_ask_at_a_position_equals_asking_a_session_that_ends_there(checkpoints):
    sh = _shadow(checkpoints, "float32", 64)
    rng = random.Random(8)
    prompt = [rng.randrange(VOCAB) for _ in range(200)]
    later = [rng.randrange(VOCAB) for _ in range(50)]
    sh.feed_prompt("a", prompt + later)
    sh.read()  # committed 192 <= 200
    at = sh.ask("a", [1, 2, 3], ["A", "B"], at=200)
    sh.feed_prompt("b", prompt)
    sh.read()
    plain = sh.ask("b", [1, 2, 3], ["A", "B"])
    assert at.probs == plain.probs and at.behind == plain.behind == 8
    with pytest.raises(BadInput, match="cannot ask at 100"):
        sh.ask("a", [1], ["A"], at=100)  # rows up to 192 are read already


def test_backlogs_forget_and_warm_up(checkpoints):
    sh = _shadow(checkpoints, "float32", 64)
    sh.warm_up()
    sh.feed_prompt("a", list(range(1000, 1100)))
    sh.feed_prompt("b", list(range(1000, 1030)))
    assert sh.backlogs() == {"a": 100, "b": 30}
    sh.read()
    assert sh.backlogs() == {"a": 36, "b": 30}
    sh.forget("a")
    assert sh.sessions() == ["b"] and "a" not in sh.status().sessions
    with pytest.raises(UnknownSession):
        sh.ask("a", [1], ["A"])
