"""Real agent sessions as per-request OpenAI-style prompts, and as Qwen3.5 token streams.

``load_transcript(path)`` reads any supported source (it looks at the content, not only the
name: the registry ``formats.FORMATS`` says how each is named, recognised and loaded) and returns
its sessions; ``render_turns`` turns one into prompt/output ids; ``discover``
lists every session source under the shared ``sessions/raw`` folder; ``demo_transcript`` is the
small MIT-licensed session shipped in ``shadow/data/demo``.

Supported sources (``FORMATS``, in the order a name is tried), with the converter that documents
each one's quirks:

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

from shadow.adapters.transcripts.formats import FORMATS, Format, format_of, is_sdk_folder
from shadow.adapters.transcripts.model import (
    Request,
    Transcript,
    transcript_from_json,
    transcript_to_json,
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

__all__ = [
    "FORMATS",
    "Format",
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


def load_transcript(path: str | os.PathLike[str]) -> list[Transcript]:
    """Every session in ``path`` (a file, or a folder of SDK logs or of such folders), in the format
    its name and content say (``formats.FORMATS``)."""
    p = Path(path)
    fmt = format_of(p)
    if fmt is not None:
        return fmt.load(p)
    if p.is_dir():
        subs = [d for d in sorted(p.iterdir()) if d.is_dir() and is_sdk_folder(d)]
        if subs:
            return [t for d in subs for t in load_transcript(d)]
        raise ValueError(f"{p}: not a folder of OpenHands SDK LLM logs, nor a folder of such folders")
    named = [f.name for f in FORMATS if f.named(p)]
    if named:
        raise ValueError(f"{p}: named as {' or '.join(named)}, but its content is none of them")
    raise ValueError(f"{p}: unrecognised session format (known: "
                     + ", ".join(f"{f.name} {'/'.join(f.suffixes) or '(folder)'}" for f in FORMATS) + ")")


def discover(root: str | os.PathLike[str], include_subagents: bool = False) -> list[Path]:
    """Every session source under ``root`` (``sessions/raw``), each one ``load_transcript``-able: a
    file whose name a raw format's suffixes match (not opened), a folder that one sniffs as its own.

    One path can hold several sessions (an OpenHands ``output.jsonl``). A format's own rule may leave
    a path out (Claude Code's sub-agent files unless ``include_subagents``); ``*-llm-message.json``
    dumps duplicate the SDK logs and no raw format names them.
    """
    raw = [f for f in FORMATS if f.discovered]
    found: list[Path] = []
    for p in sorted(Path(root).rglob("*")):
        named = [f for f in raw if f.named(p)]
        if p.is_dir():
            named = [f for f in named if f.sniff(p)]  # a folder's name says nothing
        if named and all(f.listed(p, include_subagents) for f in named):
            found.append(p)
    return found


def demo_transcript() -> Transcript:
    """The shipped demo session (OpenHands SDK hello-world, 6 requests; see its ATTRIBUTION.md)."""
    folder = resources.files(DEMO_PACKAGE) / DEMO_FOLDER
    d = json.loads((folder / DEMO_FILE).read_text(encoding="utf-8"))
    return transcript_from_json(d, license_path=str(folder / "LICENSE"))
