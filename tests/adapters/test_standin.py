"""The Claude Code stand-in is data: read from the package's data folder, handed out as copies."""

from __future__ import annotations

from shadow.adapters.transcripts import claude_code_standin as standin


def test_tools_are_copies() -> None:
    first = standin.tools()
    names = [t["function"]["name"] for t in first]
    assert len(names) == len(set(names)) == 32 and {"Bash", "Read", "Edit", "Task"} <= set(names)
    first[0]["function"]["name"] = "changed"
    first.clear()
    again = standin.tools()
    assert [t["function"]["name"] for t in again] == names
    assert again is not standin.tools()


def test_system_prompt_fills_the_environment() -> None:
    text = standin.system_prompt("/home/me/repo", "main", "2025-06-01", "claude-test")
    assert "/home/me/repo" in text and "2025-06-01" in text and "claude-test" in text
    assert "{cwd}" not in text and "{branch}" not in text and "{model}" not in text
    assert "(none)" in standin.system_prompt("/x", None, "", None)
