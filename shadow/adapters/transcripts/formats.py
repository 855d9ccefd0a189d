"""The one registry of session formats: each one's name, how its files are named, how its content is
recognised (``sniff``) and how it is loaded. ``load_transcript`` and ``discover`` both read it, so a
new format is one entry here.

Order matters where names overlap: ``.traj.json`` (mini-swe-agent) before ``.json`` (this package's
transcript JSON). A folder is a format of its own (OpenHands SDK logs: no suffix).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadow.adapters.transcripts._common import read_json
from shadow.adapters.transcripts.claude_code import is_claude_code_line, load_claude_code
from shadow.adapters.transcripts.model import JSON_FORMAT, Transcript, transcript_from_json
from shadow.adapters.transcripts.openhands import (
    is_openhands_output,
    is_sdk_log,
    load_openhands_output,
    load_sdk_logs,
)
from shadow.adapters.transcripts.swe_agents import (
    is_mini_traj,
    is_swe_agent_traj,
    load_mini_traj,
    load_swe_agent_traj,
)


def _always(path: Path, include_subagents: bool) -> bool:
    return True


@dataclass(frozen=True)
class Format:
    name: str
    suffixes: tuple[str, ...]  # how its files' names end; () for a folder
    sniff: Callable[[Path], bool]  # the content is this format (its name already matched)
    load: Callable[[Path], list[Transcript]]
    # ``discover``: whether it lists a source of this format under ``sessions/raw`` (without opening
    # a file: ``sniff`` is for ``load_transcript``), and its rule beyond the name
    discovered: bool = True
    listed: Callable[[Path, bool], bool] = _always

    def named(self, path: Path) -> bool:
        return path.is_dir() if not self.suffixes else path.is_file() and path.name.endswith(self.suffixes)


def _first_json_line(path: Path) -> object:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return json.loads(line)
    return None


def is_sdk_folder(folder: Path) -> bool:
    logs = [p for p in sorted(folder.glob("*.json")) if not p.name.endswith(".traj.json")]
    return bool(logs) and is_sdk_log(read_json(logs[0]))


def _json_is(test: Callable[[Any], bool]) -> Callable[[Path], bool]:
    return lambda p: test(read_json(p))


def _package_json(d: Any) -> bool:
    return isinstance(d, dict) and d.get("format") == JSON_FORMAT


def _claude_code_listed(path: Path, include_subagents: bool) -> bool:
    """Sub-agent files (``*/subagents/agent-*.jsonl``) are conversations launched by a ``Task``
    call: listed only when asked; ``agent-acompact-*`` never (``load_claude_code`` folds each into
    its main session as the compaction request)."""
    if path.parent.name != "subagents":
        return True
    return include_subagents and not path.name.startswith("agent-acompact-")


FORMATS: tuple[Format, ...] = (
    Format("openhands-output", (".jsonl",), lambda p: is_openhands_output(_first_json_line(p)),
           load_openhands_output),
    Format("claude-code", (".jsonl",), lambda p: is_claude_code_line(_first_json_line(p)),
           lambda p: [load_claude_code(p)], listed=_claude_code_listed),
    Format("openhands-sdk-llm-logs", (), is_sdk_folder, lambda p: [load_sdk_logs(p)]),
    Format("mini-swe-agent", (".traj.json",), _json_is(is_mini_traj), lambda p: [load_mini_traj(p)]),
    Format("swe-agent", (".traj",), _json_is(is_swe_agent_traj), lambda p: [load_swe_agent_traj(p)]),
    # this package's own cache (``transcript_to_json``), not a raw source
    Format("transcript-json", (".json",), _json_is(_package_json), lambda p: [transcript_from_json(read_json(p))],
           discovered=False),
)


def format_of(path: Path) -> Format | None:
    """The format whose name and content ``path`` has."""
    return next((f for f in FORMATS if f.named(path) and f.sniff(path)), None)
