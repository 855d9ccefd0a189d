"""``Turns`` built and checked alone (no service, no model): each session's profile, the checks on a
feed, and the feeds kept while the model loads. And the service's ``started``, which checks a prompt
once: the messages are rendered one time on the way to the request's first token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from shadow.adapters.turns import Turns
from shadow.core.errors import BadInput, UnknownSession
from shadow.core.profiles import Profiles, ShadowBlock
from shadow.core.scheduling import NullTelemetry
from shadow.core.slot import ModelSlot
from tests.conftest import ids, make_container, make_settings


def _never_loaded() -> Any:
    raise AssertionError("Turns never loads the model: the idle window does")


class Renders:
    """A renderer that counts its calls (the ids it answers: one per message)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
                 enable_thinking: bool | None) -> list[int]:
        self.calls += 1
        return [300 + i for i in range(len(messages))]


def turns(render: Renders | None = None, max_ids: int = 1000) -> Turns:
    profiles = Profiles({"on": ShadowBlock(mode="on"), "off": ShadowBlock(mode="off")}, "(test)")
    return Turns(ModelSlot(_never_loaded), profiles, "on", max_ids, NullTelemetry(), render or Renders())


def test_a_prompt_is_checked_once_and_a_bad_one_changes_nothing() -> None:
    render = Renders()
    t = turns(render, max_ids=10)
    p = t.check("s", None, [{"role": "user", "content": "hi"}] * 3, None, None, None)
    assert (p.session, p.ids, p.profile, p.block.follows) == ("s", [300, 301, 302], "on", True)
    assert render.calls == 1
    fed = t.feed_prompt(p)  # the checked prompt: not rendered or checked again
    assert render.calls == 1 and fed.queued and fed.ids == 3 and fed.behind_at_start is None
    for bad, match in [((None, None), "one of the two"), (([1], [{"role": "user"}]), "one of the two"),
                       (([], None), "empty prompt"), ((None, []), "messages is empty"),
                       ((list(range(11)), None), "MAX_SESSION_IDS=10")]:
        with pytest.raises(BadInput, match=match):
            t.check("s", bad[0], bad[1], None, None, None)
    with pytest.raises(BadInput, match="unknown profile 'nope'"):
        t.check("s", [5], None, None, None, "nope")
    assert t.bookkeeping() == ({"s": "on"}, {"s": 3})  # as it was


def test_feeds_are_kept_until_the_model_loads() -> None:
    t = turns(max_ids=10)
    with pytest.raises(UnknownSession):
        t.feed_output("s", [7])  # nothing kept for it yet
    t.feed_prompt(t.check("s", ids(4), None, None, None, None))
    out = t.feed_output("s", [7, 8])
    assert out.queued and out.ids == 6 and out.backlog == 6
    with pytest.raises(BadInput, match="would hold 11 ids"):
        t.feed_output("s", list(range(5)))
    again = t.feed_prompt(t.check("s", ids(5, 1), None, None, None, None))  # the next turn's prompt
    assert again.behind_at_start == 6 and again.ids == 5  # the latest prompt replaces what was kept
    assert t.follows("s") and not t.narrates("s")  # followed (the model loads soon), its profile narrates not
    assert t.bookkeeping() == ({"s": "on"}, {"s": 5})
    t.forget("s")
    assert t.bookkeeping() == ({}, {})
    with pytest.raises(UnknownSession):
        t.forget("s")


def test_a_profile_that_does_not_follow_keeps_nothing() -> None:
    t = turns()
    fed = t.feed_prompt(t.check("s", ids(4), None, None, None, "off"))
    assert not fed.followed and fed.reason == "profile"
    assert t.feed_output("s", [7]).reason == "profile"
    assert t.bookkeeping() == ({"s": "off"}, {})


def test_started_renders_the_messages_once(checkpoint: Path, tmp_path: Path) -> None:
    svc = make_container(make_settings(checkpoint, tmp_path)).service()
    render = Renders()
    svc.turns.render = render
    turn, fed = svc.started("r1", "s", messages=[{"role": "user", "content": "hi"}] * 4)
    assert render.calls == 1 and turn.prompt_len == 4 and fed.followed and fed.ids == 4
    svc.feed_prompt("s", messages=[{"role": "user", "content": "hi"}] * 5)
    assert render.calls == 2
