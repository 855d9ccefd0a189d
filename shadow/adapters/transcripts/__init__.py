"""Real agent sessions as per-request OpenAI-style prompts, and as Qwen3.5 token streams.

``load_transcript(path)`` reads any supported source (it looks at the content, not only the
name) and returns its sessions; ``render_turns`` turns one into prompt/output ids; ``discover``
lists every session source under the shared ``sessions/raw`` folder; ``demo_transcript`` is the
small MIT-licensed session shipped in ``shadow/data/demo``.

Supported sources, with the converter that documents each one's quirks:

==============================  =========================================  ================
source                          what to pass                               module
==============================  =========================================  ================
Claude Code session JSONL       the ``.jsonl`` file (main or sub-agent)    ``claude_code``
OpenHands evaluation output     ``output.jsonl`` (one session per line)    ``openhands``
OpenHands SDK LLM logs          the folder of per-request ``.json`` logs   ``openhands``
mini-swe-agent trajectory       the ``.traj.json`` file                    ``swe_agents``
SWE-agent trajectory            the ``.traj`` file                         ``swe_agents``
this package's transcript JSON  a ``.json`` from ``transcript_to_json``    ``model``
==============================  =========================================  ================
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from shadow.adapters.transcripts._common import read_json
from shadow.adapters.transcripts.claude_code import is_claude_code_line, load_claude_code
from shadow.adapters.transcripts.model import (
    JSON_FORMAT,
    Request,
    Transcript,
    transcript_from_json,
    transcript_to_json,
)
from shadow.adapters.transcripts.openhands import (
    is_openhands_output,
    is_sdk_log,
    load_openhands_output,
    load_sdk_logs,
)
from shadow.adapters.transcripts.render import (
    Turn,
    load_turns,
    render_texts,
    render_turn,
    render_turns,
    save_turns,
    turns_from_json,
    turns_to_json,
)
from shadow.adapters.transcripts.swe_agents import (
    is_mini_traj,
    is_swe_agent_traj,
    load_mini_traj,
    load_swe_agent_traj,
)

__all__ = [
    "Request",
    "Transcript",
    "Turn",
    "demo_transcript",
    "discover",
    "load_transcript",
    "load_turns",
    "render_texts",
    "render_turn",
    "render_turns",
    "save_turns",
    "transcript_from_json",
    "transcript_to_json",
    "turns_from_json",
    "turns_to_json",
]

DEMO_PACKAGE = "shadow.data"
DEMO_FOLDER = "demo"
DEMO_FILE = "session.json"


def _first_json_line(path: Path) -> object:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                return json.loads(line)
    return None


def _is_sdk_folder(folder: Path) -> bool:
    logs = [p for p in sorted(folder.glob("*.json")) if not p.name.endswith(".traj.json")]
    return bool(logs) and is_sdk_log(read_json(logs[0]))


def load_transcript(path: str | os.PathLike[str]) -> list[Transcript]:
    """Every session in ``path`` (a file, or a folder of SDK logs or of such folders)."""
    p = Path(path)
    if p.is_dir():
        if _is_sdk_folder(p):
            return [load_sdk_logs(p)]
        subs = [d for d in sorted(p.iterdir()) if d.is_dir() and _is_sdk_folder(d)]
        if subs:
            return [load_sdk_logs(d) for d in subs]
        raise ValueError(f"{p}: not a folder of OpenHands SDK LLM logs")
    if p.suffix == ".jsonl":
        first = _first_json_line(p)
        if is_openhands_output(first):
            return load_openhands_output(p)
        if is_claude_code_line(first):
            return [load_claude_code(p)]
        raise ValueError(f"{p}: unrecognised JSONL")
    d = read_json(p)
    if isinstance(d, dict) and d.get("format") == JSON_FORMAT:
        return [transcript_from_json(d)]
    if is_mini_traj(d):
        return [load_mini_traj(p, d)]
    if is_swe_agent_traj(d):
        return [load_swe_agent_traj(p, d)]
    raise ValueError(f"{p}: unrecognised session format")


def discover(root: str | os.PathLike[str], include_subagents: bool = False) -> list[Path]:
    """Every session source under ``root`` (``sessions/raw``), each one ``load_transcript``-able.

    One path can hold several sessions (an OpenHands ``output.jsonl``). Claude Code sub-agent
    files (``*/subagents/agent-*.jsonl``) are separate conversations launched by a ``Task`` call;
    they are listed only with ``include_subagents``, and the ``agent-acompact-*`` files never are
    (they are not conversations of their own: ``load_claude_code`` folds each into its main
    session as the compaction request). ``*-llm-message.json`` dumps duplicate the SDK logs and are
    skipped.
    """
    r = Path(root)
    found: list[Path] = []
    for p in sorted(r.rglob("*")):
        if p.is_dir():
            if _is_sdk_folder(p):
                found.append(p)
            continue
        name = p.name
        if name.endswith((".traj.json", ".traj")):
            found.append(p)
        elif name.endswith(".jsonl"):
            if p.parent.name == "subagents":
                if include_subagents and not name.startswith("agent-acompact-"):
                    found.append(p)
            else:
                found.append(p)
    return found


def demo_transcript() -> Transcript:
    """The shipped demo session (OpenHands SDK hello-world, 6 requests; see its ATTRIBUTION.md)."""
    folder = resources.files(DEMO_PACKAGE) / DEMO_FOLDER
    d = json.loads((folder / DEMO_FILE).read_text(encoding="utf-8"))
    return transcript_from_json(d, license_path=str(folder / "LICENSE"))
