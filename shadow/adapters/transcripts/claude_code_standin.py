"""The stand-in for Claude Code's system prompt and tool schemas (not the original), read from
``shadow/data/claude_code_standin/`` (its README says why it exists and what it holds).

Both are read once; every call returns a new object, so a caller may change what it gets.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib.resources import files
from typing import Any

PACKAGE = "shadow.data"
FOLDER = "claude_code_standin"


def _read(name: str) -> str:
    return files(PACKAGE).joinpath(FOLDER, name).read_text(encoding="utf-8")


@functools.cache
def _system() -> str:
    return _read("system_prompt.txt").removesuffix("\n")


@functools.cache
def _tools() -> list[dict[str, Any]]:
    tools = json.loads(_read("tools.json"))
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError(f"{PACKAGE}/{FOLDER}/tools.json must be a list of tool schemas")
    return tools


def system_prompt(cwd: str, git_branch: str | None, date: str, model: str | None) -> str:
    """The stand-in system prompt, with the session's environment filled in."""
    return (
        _system().replace("{cwd}", cwd)
        .replace("{is_git}", "Yes" if git_branch else "No")
        .replace("{branch}", git_branch or "(none)")
        .replace("{date}", date or "unknown")
        .replace("{model}", model or "an AI coding model")
    )


def tools() -> list[dict[str, Any]]:
    """The stand-in tool schemas: a fresh copy on every call."""
    return copy.deepcopy(_tools())
