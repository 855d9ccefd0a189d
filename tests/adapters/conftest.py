"""Fixtures for the adapter tests: the real sessions in ../shared/data, loaded and rendered once."""

from __future__ import annotations

import functools
import unicodedata
from pathlib import Path

import pytest

from shadow.adapters.tokens import Tokens, get_tokens
from shadow.adapters.transcripts import Transcript, Turn, load_transcript, render_turns

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
RAW = SHARED_DATA / "sessions" / "raw"


@pytest.fixture(scope="session")
def raw() -> Path:
    if not RAW.is_dir():
        pytest.skip(
            f"{RAW} is absent: the real sessions live in ../shared/data beside the repo, not inside it"
        )
    return RAW


@pytest.fixture(scope="session")
def tokens() -> Tokens:
    return get_tokens()


@functools.cache
def load_one(relpath: str) -> Transcript:
    [t] = load_transcript(RAW / relpath)
    return t


@functools.cache
def turns_of(relpath: str) -> list[Turn]:
    return render_turns(load_one(relpath))


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)
