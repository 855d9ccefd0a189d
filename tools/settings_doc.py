"""Write docs/settings.md from the settings model itself: every ``QWEN38_SHADOW_*`` key of
``shadow.core.settings.ShadowSettings`` with its type, default and description, grouped under the
section comments (``# ---- name ----``) of the class's source.

    python tools/settings_doc.py            # print the page
    python tools/settings_doc.py --write    # write docs/settings.md
    python tools/settings_doc.py --check    # exit 1 when docs/settings.md differs from the model

The page is never edited by hand: a setting's words live in its ``Field(description=...)``, and
``tests/tools/test_settings_doc.py`` fails when the file and the model part.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: the package of this checkout
    sys.path.insert(0, str(ROOT))

from pydantic.fields import FieldInfo  # noqa: E402

from shadow.core.settings import ENV_FILE, PREFIX, ShadowSettings  # noqa: E402

DOC = ROOT / "docs" / "settings.md"
_SECTION = re.compile(r"^    # ---- (.+?) -*$")
_FIELD = re.compile(r"^    (\w+)\s*:")
TABLE = "| key | type | default | what |\n| --- | --- | --- | --- |\n"

HEAD = f"""# Settings

<!-- Written by tools/settings_doc.py from shadow/core/settings.py: do not edit by hand.
     After changing a setting: python tools/settings_doc.py --write -->

Every setting is an environment variable `{PREFIX}` + the key (`GRID` is `{PREFIX}GRID`), read
from the environment, then from `{ENV_FILE}` in the current folder; the environment wins. Other keys
in `{ENV_FILE}` (the engine's own `QWEN38_*`) pass untouched. A bad value, or an unknown
`{PREFIX}*` key, fails at start with a message naming the key, the value and where it was set.
In Python, `ShadowSettings(grid=512, ...)` takes the same keys in lower case and wins over both.
"""


def sections() -> list[tuple[str, list[str]]]:
    """The class's fields in source order, under the section comment above each."""
    out: list[tuple[str, list[str]]] = [("settings", [])]
    fields = ShadowSettings.model_fields
    for line in inspect.getsource(ShadowSettings).splitlines():
        if m := _SECTION.match(line):
            out.append((m.group(1), []))
        elif (m := _FIELD.match(line)) and m.group(1) in fields:
            out[-1][1].append(m.group(1))
    return [(title, names) for title, names in out if names]


def kind(info: FieldInfo) -> str:
    ann = info.annotation
    if typing.get_origin(ann) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(ann))
    name = getattr(ann, "__name__", str(ann))
    return {"str": "text", "int": "integer", "float": "number", "bool": "`true` \\| `false`"}.get(name, name)


def default(value: Any) -> str:
    if value == "":
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def bounds(info: FieldInfo) -> str:
    found = [f"{word} {getattr(m, attr):g}" for m in info.metadata
             for attr, word in (("ge", "at least"), ("gt", "above"), ("le", "at most"), ("lt", "below"))
             if getattr(m, attr, None) is not None]
    return f" ({', '.join(found)})" if found else ""


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """The page, from the model's fields as they are now."""
    fields = ShadowSettings.model_fields
    listed = [n for _, names in sections() for n in names]
    missing = sorted(set(fields) - set(listed))
    if missing:  # a field declared where the source scan cannot see it (not one line `name: type = ...`)
        raise SystemExit(f"settings not found in the class's source: {', '.join(missing)}")
    parts = [HEAD]
    for title, names in sections():
        parts.append(f"\n## {title[0].upper()}{title[1:]}\n\n{TABLE}")
        for name in names:
            info = fields[name]
            if not info.description:
                raise SystemExit(f"{PREFIX}{name.upper()} has no description: every setting says what it is")
            parts.append(f"| `{name.upper()}` | {kind(info)} | {default(info.default)} | "
                         f"{cell(info.description)}{bounds(info)} |\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help=f"write {DOC.relative_to(ROOT)}")
    what.add_argument("--check", action="store_true", help="exit 1 when the file differs from the model")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page to write or check")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        args.doc.write_text(text, encoding="utf-8")
    elif args.check:
        have = args.doc.read_text(encoding="utf-8") if args.doc.is_file() else ""
        if have != text:
            print(f"{args.doc} differs from the settings model: run python tools/settings_doc.py --write",
                  file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
