"""The serving process's collector: frozen once the model is loaded and warm, after the service's
own callbacks, so a later full collection walks only what came after."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from shadow.adapters import collector
from shadow.core.slot import Slot


@pytest.fixture
def unfrozen() -> Iterator[None]:
    assert gc.get_freeze_count() == 0, "another test left objects frozen"
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test process collects as before


def test_the_collector_freezes_after_the_callbacks_registered_before_it(unfrozen: None) -> None:
    seen: list[int] = []
    slot = Slot(lambda: object())  # type: ignore[arg-type,return-value]  # any facade will do
    slot.on_loaded(lambda _shadow: seen.append(gc.get_freeze_count()))  # the service's warm-up and replay
    collector.freeze_when_loaded(slot)
    assert gc.get_freeze_count() == 0  # nothing until the model loads
    slot.load()
    assert seen == [0]
    assert gc.get_freeze_count() > 1000  # the test process's modules, at least


def test_a_slot_that_fails_to_load_freezes_nothing(unfrozen: None) -> None:
    def broken() -> object:
        raise RuntimeError("no weights")

    slot = Slot(broken)  # type: ignore[arg-type]
    collector.freeze_when_loaded(slot)
    assert slot.load() is None and slot.state == "failed"
    assert gc.get_freeze_count() == 0


def test_freezing_says_what_it_did(unfrozen: None) -> None:
    line = collector.freeze_loaded()
    assert line.startswith("collector: ") and str(gc.get_freeze_count()) in line
