"""The shipped demo session: loads from package data, with its license, and renders."""

from __future__ import annotations

from pathlib import Path

from shadow.adapters.tokens import IM_END, IM_START, THINK, get_tokens
from shadow.adapters.transcripts import (
    demo_transcript,
    render_texts,
    render_turns,
    transcript_from_json,
    transcript_to_json,
)

from .conftest import nfc


def test_demo_loads_and_renders() -> None:
    t = demo_transcript()
    assert t.source_format == "openhands-sdk-llm-logs" and len(t.requests) == 6
    assert t.license_path is not None and "MIT License" in Path(t.license_path).read_text()
    assert (Path(t.license_path).parent / "ATTRIBUTION.md").is_file()
    starts = [r.start_s for r in t.requests if r.start_s is not None]
    assert len(starts) == 6 and starts == sorted(starts)
    tk = get_tokens()
    turns = render_turns(t, tk)
    assert [len(tu.output_ids) > 0 for tu in turns] == [True] * 6
    for r, tu in zip(t.requests, turns, strict=True):
        prompt, output, fallback = render_texts(r)
        assert not fallback
        assert tk.decode(tu.prompt_ids) == nfc(prompt) and tk.decode(tu.output_ids) == nfc(output)
        assert tu.prompt_ids[0] == IM_START and tu.prompt_ids[-2] == THINK and tu.output_ids[-1] == IM_END
    assert transcript_from_json(transcript_to_json(t)).requests == t.requests


def test_demo_matches_the_raw_logs(raw: Path) -> None:
    src = raw / "openhands-sdk-llm-logs" / "llm-logs"
    from shadow.adapters.transcripts import load_transcript

    [fresh] = load_transcript(src)
    assert fresh.requests == demo_transcript().requests
