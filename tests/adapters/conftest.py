"""Fixtures for the adapter tests: the real sessions under the shared data folder, loaded and
rendered once per test run (skipped, saying why, when the folder is absent)."""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable
from pathlib import Path

import pytest

from shadow.adapters.tokens import Tokens, get_tokens
from shadow.adapters.transcripts import Transcript, Turn, load_transcript, render_turns


@pytest.fixture(scope="session")
def raw(shared_data: Path) -> Path:
    folder = shared_data / "sessions" / "raw"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent: the real sessions live in the shared data folder beside the repo")
    return folder


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return get_tokens()


@pytest.fixture(scope="session")
def load_one(raw: Path) -> Callable[[str], Transcript]:
    """The one transcript in a session file under ``raw``, loaded once."""

    @functools.cache
    def load(relpath: str) -> Transcript:
        [t] = load_transcript(raw / relpath)
        return t

    return load


@pytest.fixture(scope="session")
def turns_of(load_one: Callable[[str], Transcript]) -> Callable[[str], list[Turn]]:
    """A session file's rendered turns, rendered once."""
    return functools.cache(lambda relpath: render_turns(load_one(relpath)))


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
