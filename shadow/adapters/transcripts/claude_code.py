"""Claude Code session JSONL -> one ``Transcript`` (one ``Request`` per API response).

How the file is read (sessions/FORMATS.md, checked against the marot-spotter and moredip files):

* One line per content block. Assistant blocks of one API response share ``message.id`` and are
  merged into one assistant message: ``text`` blocks become ``content`` (stripped, joined by a blank
  line), ``thinking`` blocks ``reasoning_content``, ``tool_use`` blocks OpenAI ``tool_calls`` (the
  ``input`` dict kept as ``arguments``). ``redacted_thinking`` and synthetic API-error messages are
  dropped.
* User lines become a ``user`` message (a string, or text parts; an image part becomes the text
  ``[image]``, the shadow being text-only) or, for ``tool_result`` blocks, ``tool`` messages (text
  parts joined by newlines).
* **Which lines a request saw** is decided by the ``parentUuid`` chain, not file order: the prompt of
  a request is the chain of lines above its first block. Claude Code runs tools while the response
  still streams, so a parallel call's result hangs off its own ``tool_use`` line rather than the
  chain; results whose ``tool_use_id`` answers a call in the chain are added back, in call order.
  Queued messages
  that were interrupted sit on a side branch and so stay out (moredip 0ccf1a04 has one).
* **Compaction.** A ``system/compact_boundary`` line has no parent, so the chain of every later
  request stops there: those prompts restart as system + the ``isCompactSummary`` user message +
  new turns. The summarising request itself is logged in ``<session>/subagents/agent-acompact-*.jsonl``;
  when that file is present it is added as one more request whose prompt is the pre-compaction
  conversation plus the summary instruction (its usage shows it reused the full pre-compaction
  prompt cache, so it did extend that prompt). The hook reminders logged in that file are not
  added: the main file never records them either.
* System lines (``local_command``, ``turn_duration``, ``api_error`` ...), ``progress``,
  ``file-history-snapshot`` and ``queue-operation`` lines are not part of any prompt.
* Timeline: a request starts at the timestamp of the last user / tool-result line of its prompt and
  ends at the timestamp of its last block.

The transcripts carry neither the system prompt nor the tool schemas. Every request gets the
stand-in from ``claude_code_standin`` (a system prompt and OpenAI schemas for Claude Code's tools,
written for this project, about 20k Qwen tokens), with the session's working directory, git branch
and date filled in. Sub-agent files get the same stand-in, although the real sub-agents had a
shorter prompt and fewer tools.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from shadow.adapters.transcripts import claude_code_standin as standin
from shadow.adapters.transcripts._common import iso_to_epoch, license_str, read_jsonl, session_name
from shadow.adapters.transcripts.model import Request, Transcript

SOURCE_FORMAT = "claude-code"


def is_claude_code_line(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and "type" in obj
        and ("sessionId" in obj or "uuid" in obj or "messageId" in obj)
    )


def _is_real_assistant(line: dict[str, Any]) -> bool:
    if line.get("type") != "assistant" or line.get("isApiErrorMessage"):
        return False
    msg = line.get("message") or {}
    return msg.get("model") != "<synthetic>" and bool(msg.get("id"))


def _blocks_text(blocks: Iterable[Any]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, str):
            parts.append(b)
        elif isinstance(b, dict):
            if b.get("type") == "text":
                parts.append(b.get("text", ""))
            elif b.get("type") == "image":
                parts.append("[image]")
    return "\n".join(parts)


def _merge_assistant(lines: list[dict[str, Any]]) -> dict[str, Any]:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for line in lines:
        for b in line["message"].get("content") or []:
            kind = b.get("type")
            if kind == "text" and b.get("text", "").strip():
                texts.append(b["text"].strip())
            elif kind == "thinking" and b.get("thinking", "").strip():
                thoughts.append(b["thinking"].strip())
            elif kind == "tool_use":
                calls.append(
                    {
                        "id": b["id"],
                        "type": "function",
                        "function": {"name": b["name"], "arguments": b.get("input") or {}},
                    }
                )
    msg: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "\n\n".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user_messages(line: dict[str, Any]) -> list[dict[str, Any]]:
    content = (line.get("message") or {}).get("content")
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    text_parts: list[dict[str, Any]] = []
    for b in content or []:
        kind = b.get("type")
        if kind == "tool_result":
            c = b.get("content")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id"),
                    "content": c if isinstance(c, str) else _blocks_text(c or []),
                }
            )
        elif kind == "text":
            text_parts.append({"type": "text", "text": b.get("text", "")})
        elif kind == "image":
            text_parts.append({"type": "text", "text": "[image]"})
    if text_parts:
        out.append({"role": "user", "content": text_parts})
    return out


def _tool_result_ids(line: dict[str, Any]) -> list[str] | None:
    """The tool_use ids a user line answers, or None when it holds anything else."""
    content = (line.get("message") or {}).get("content")
    if not isinstance(content, list) or not content:
        return None
    ids = []
    for b in content:
        if b.get("type") != "tool_result":
            return None
        ids.append(b.get("tool_use_id"))
    return ids


class _Session:
    """One JSONL file, indexed for prompt reconstruction."""

    def __init__(self, lines: list[dict[str, Any]]) -> None:
        self.lines = lines
        self.index: dict[str, int] = {}
        for i, line in enumerate(lines):
            u = line.get("uuid")
            if u is not None and u not in self.index:
                self.index[u] = i
        self.blocks: dict[str, list[int]] = {}
        for i, line in enumerate(lines):
            if _is_real_assistant(line):
                self.blocks.setdefault(line["message"]["id"], []).append(i)
        self.merged = {mid: _merge_assistant([lines[i] for i in idx]) for mid, idx in self.blocks.items()}
        self._user_cache: dict[int, list[dict[str, Any]]] = {}

    def user_messages(self, i: int) -> list[dict[str, Any]]:
        if i not in self._user_cache:
            self._user_cache[i] = _user_messages(self.lines[i])
        return self._user_cache[i]

    def chain(self, uuid: str | None) -> set[str]:
        seen: set[str] = set()
        while uuid is not None and uuid not in seen:
            seen.add(uuid)
            i = self.index.get(uuid)
            if i is None:
                break
            uuid = self.lines[i].get("parentUuid")
        return seen

    def context(self, chain: set[str], limit: int) -> tuple[list[dict[str, Any]], float | None]:
        """Messages of lines before ``limit`` that the chain saw, and the last user line's time."""
        mids = set()
        for u in chain:
            line = self.lines[self.index[u]] if u in self.index else None
            if line is not None and _is_real_assistant(line):
                mids.add(line["message"]["id"])
        call_ids = {c["id"] for mid in mids for c in self.merged[mid].get("tool_calls", [])}
        out: list[dict[str, Any]] = []
        done_mids: set[str] = set()
        answered: set[str] = set()
        last_user: float | None = None
        for i in range(limit):
            line = self.lines[i]
            kind = line.get("type")
            if kind == "assistant":
                if _is_real_assistant(line):
                    mid = line["message"]["id"]
                    if mid in mids and mid not in done_mids:
                        done_mids.add(mid)
                        out.append(self.merged[mid])
            elif kind == "user":
                ids = _tool_result_ids(line)
                if line.get("uuid") in chain:
                    pass
                elif ids is not None and all(x in call_ids and x not in answered for x in ids):
                    pass  # a parallel call's result, hanging off its own tool_use line
                else:
                    continue
                if ids is not None:
                    answered.update(ids)
                out.extend(self.user_messages(i))
                if line.get("timestamp"):
                    last_user = iso_to_epoch(line["timestamp"])
        return _order_results(out), last_user


def _order_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put each run of tool results in the order of the calls they answer.

    Parallel calls finish in any order and are logged as they finish; the API request carries the
    results in call order, one per call.
    """
    out = list(messages)
    order: dict[str, int] = {}
    i = 0
    while i < len(out):
        m = out[i]
        if m["role"] == "assistant":
            order = {c["id"]: n for n, c in enumerate(m.get("tool_calls", []))}
        elif m["role"] == "tool":
            j = i
            while j < len(out) and out[j]["role"] == "tool":
                j += 1
            out[i:j] = sorted(out[i:j], key=lambda x: order.get(x.get("tool_call_id") or "", len(order)))
            i = j
            continue
        i += 1
    return out


def _first(lines: list[dict[str, Any]], key: str) -> Any:
    return next((line[key] for line in lines if line.get(key)), None)


def _compaction_request(
    path: Path, sess: _Session, boundary: int, head: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> Request | None:
    line = sess.lines[boundary]
    folder = path.parent / path.stem / "subagents"
    if not folder.is_dir():
        return None
    t_boundary = iso_to_epoch(line["timestamp"])
    best: tuple[float, list[dict[str, Any]]] | None = None
    for f in sorted(folder.glob("agent-acompact-*.jsonl")):
        lines = read_jsonl(f)
        stamps = [iso_to_epoch(x["timestamp"]) for x in lines if _is_real_assistant(x)]
        if (
            stamps
            and abs(stamps[-1] - t_boundary) < 600
            and (best is None or abs(stamps[-1] - t_boundary) < best[0])
        ):
            best = (abs(stamps[-1] - t_boundary), lines)
    if best is None:
        return None
    lines = best[1]
    prompts = [x for x in lines if x.get("type") == "user" and not x.get("isMeta")]
    answer = [x for x in lines if _is_real_assistant(x)]
    if not prompts or not answer:
        return None
    start = line.get("logicalParentUuid")
    if start not in sess.index:
        # The logical parent can be a hook attachment that the file never recorded (4d5611e5):
        # fall back to the last conversation line before the boundary.
        start = next(
            (
                x.get("uuid")
                for x in reversed(sess.lines[:boundary])
                if x.get("type") in ("user", "assistant")
            ),
            None,
        )
    chain = sess.chain(start)
    ctx, _ = sess.context(chain, boundary)
    return Request(
        messages=[*head, *ctx, *_user_messages(prompts[-1])],
        tools=tools,
        response=_merge_assistant(answer),
        start_s=iso_to_epoch(prompts[-1]["timestamp"]),
        end_s=iso_to_epoch(answer[-1]["timestamp"]),
    )


def _session_id(path: Path) -> str:
    if path.parent.name == "subagents":
        return f"{path.parent.parent.name}/{path.stem}"
    return path.stem


def load_claude_code(path: Path, include_compaction: bool = True) -> Transcript:
    lines = read_jsonl(path)
    sess = _Session(lines)
    date = (_first(lines, "timestamp") or "")[:10]
    system = standin.system_prompt(
        cwd=_first(lines, "cwd") or "/home/user/project",
        git_branch=_first(lines, "gitBranch"),
        date=date,
        model=next((x["message"]["model"] for x in lines if _is_real_assistant(x)), None),
    )
    head: list[dict[str, Any]] = [{"role": "system", "content": system}]
    tools = standin.tools()
    notes = ["system prompt and tool schemas are the claude_code_standin stand-in"]

    ordered: list[tuple[int, Request]] = []
    for mid, idx in sess.blocks.items():
        first = idx[0]
        ctx, start = sess.context(sess.chain(lines[first].get("parentUuid")), first)
        if not any(m["role"] == "user" for m in ctx):
            notes.append(f"skipped response {mid}: no user message in its prompt")
            continue
        ordered.append(
            (
                first,
                Request(
                    messages=[*head, *ctx],
                    tools=tools,
                    response=sess.merged[mid],
                    start_s=start if start is not None else iso_to_epoch(lines[first]["timestamp"]),
                    end_s=iso_to_epoch(lines[idx[-1]]["timestamp"]),
                ),
            )
        )
    for i, line in enumerate(lines):
        if line.get("type") == "system" and line.get("subtype") == "compact_boundary":
            req = _compaction_request(path, sess, i, head, tools) if include_compaction else None
            if req is not None:
                ordered.append((i, req))
                notes.append(f"compaction request added from subagents/agent-acompact-* at line {i}")
            else:
                notes.append(f"compaction at line {i}: summarising request not found")
    ordered.sort(key=lambda x: x[0])
    return Transcript(
        name=session_name(path, _session_id(path)),
        source_format=SOURCE_FORMAT,
        requests=[r for _, r in ordered],
        license_path=license_str(path),
        notes=notes,
    )
