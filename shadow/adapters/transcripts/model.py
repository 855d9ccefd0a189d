"""The converted-session data model, and its compact JSON form.

A ``Transcript`` is one agent session as the sequence of LLM requests it made. Each ``Request``
holds the full OpenAI-style prompt of that request (not a delta): agents rewrite history (the
chat template drops old reasoning, Claude Code compacts), so a request cannot be assumed to extend
the previous one. Consecutive requests share most of their message dicts, so the JSON form stores
every distinct message once, in a pool, and requests refer to it by index; that keeps a 200-request
session linear in size instead of quadratic.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

JSON_FORMAT = "shadow-transcript/1"


@dataclass
class Request:
    """One LLM request: the prompt the agent sent and the assistant message it got back.

    ``start_s`` / ``end_s`` are epoch seconds (``None`` where the source has no such time). The
    message dicts may be shared with other requests of the same transcript: treat them as frozen.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    response: dict[str, Any]
    start_s: float | None = None
    end_s: float | None = None


@dataclass
class Transcript:
    name: str
    source_format: str
    requests: list[Request]
    license_path: str | None = None
    notes: list[str] = field(default_factory=list)
    """What the converter had to approximate or skip for this session, in words."""


def _key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def transcript_to_json(t: Transcript) -> dict[str, Any]:
    """A JSON-ready dict; ``transcript_from_json`` reads it back to an equal ``Transcript``."""
    msg_pool: list[dict[str, Any]] = []
    msg_index: dict[str, int] = {}
    by_id: dict[int, int] = {}
    tool_pool: list[list[dict[str, Any]]] = []
    tool_index: dict[str, int] = {}

    def intern_msg(m: dict[str, Any]) -> int:
        # Shared dict objects are the common case: look them up by identity before hashing.
        i = by_id.get(id(m))
        if i is None:
            k = _key(m)
            i = msg_index.get(k)
            if i is None:
                i = msg_index[k] = len(msg_pool)
                msg_pool.append(m)
            by_id[id(m)] = i
        return i

    requests = []
    for r in t.requests:
        tools_ref = None
        if r.tools is not None:
            k = _key(r.tools)
            tools_ref = tool_index.get(k)
            if tools_ref is None:
                tools_ref = tool_index[k] = len(tool_pool)
                tool_pool.append(r.tools)
        requests.append(
            {
                "messages": [intern_msg(m) for m in r.messages],
                "tools": tools_ref,
                "response": r.response,
                "start_s": r.start_s,
                "end_s": r.end_s,
            }
        )
    return {
        "format": JSON_FORMAT,
        "name": t.name,
        "source_format": t.source_format,
        "license_path": t.license_path,
        "notes": t.notes,
        "message_pool": msg_pool,
        "tool_pool": tool_pool,
        "requests": requests,
    }


def transcript_from_json(d: dict[str, Any], license_path: str | None = None) -> Transcript:
    """Inverse of ``transcript_to_json``; ``license_path`` overrides the stored one."""
    if d.get("format") != JSON_FORMAT:
        raise ValueError(f"not a {JSON_FORMAT} document (format={d.get('format')!r})")
    pool: list[dict[str, Any]] = d["message_pool"]
    tool_pool: list[list[dict[str, Any]]] = d["tool_pool"]
    requests = [
        Request(
            messages=[pool[i] for i in r["messages"]],
            tools=tool_pool[r["tools"]] if r["tools"] is not None else None,
            response=r["response"],
            start_s=r["start_s"],
            end_s=r["end_s"],
        )
        for r in d["requests"]
    ]
    return Transcript(
        name=d["name"],
        source_format=d["source_format"],
        requests=requests,
        license_path=license_path if license_path is not None else d.get("license_path"),
        notes=list(d.get("notes", [])),
    )


def message_text(content: Any) -> str:
    """The text of an OpenAI ``content`` (a string or a list of parts), for converters."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)
