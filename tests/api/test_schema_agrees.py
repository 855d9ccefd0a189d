"""The OpenAPI schema and the body decoder agree on what a name is. The decoder checks a name's
pattern with Python's re, the schema's readers (clients, schemathesis, validators) with ECMA-262
regexes, where ``\\s``, ``.`` and ``$`` mean other things: ``^\\S(.*\\S)?$`` took "abc\\n", "a\\rb",
"\\ufeffabc" and "a\\u2028b" in the decoder that the schema refuses, and refused "\\x1cabc" and
"abc\\x85" that the schema allows. The pattern now spells its blanks and line breaks out."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shadow.api.app import create_app
from shadow.api.models import NAME_PATTERN, Arrived
from tests.conftest import make_container, make_settings

NAMES = {  # name: taken
    "abc": True, "a b": True, "a\tb": True, "soak-07/turn 3": True, "é ü": True, "x": True,
    "abc\n": False, "a\rb": False, "\ufeffabc": False, "a\u2028b": False, "a\u2029b": False, "\x1cabc": False,
    "abc\x85": False, "\xa0abc": False, " a": False, "a ": False, "a\nb": False, "\n": False, "": False,
}


def _taken(name: str) -> bool:
    try:
        msgspec.convert({"request_id": name}, Arrived)
    except msgspec.ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    app = create_app(make_container(make_settings(Path("/absent"), tmp_path_factory.mktemp("schema"))))
    return app.openapi_schema.to_schema()  # type: ignore[no-any-return]


def test_the_decoder_takes_one_line_names_without_blanks_at_either_end() -> None:
    assert {name: _taken(name) for name in NAMES} == NAMES


def _patterns(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["pattern"]] if isinstance(node.get("pattern"), str) else []) + \
            [p for v in node.values() for p in _patterns(v)]
    return [p for v in node for p in _patterns(v)] if isinstance(node, list) else []


def test_every_pattern_in_the_schema_is_the_decoders(schema: dict[str, Any]) -> None:
    found = _patterns(schema)
    assert len(found) >= 10 and set(found) == {NAME_PATTERN}


@pytest.mark.skipif(shutil.which("node") is None, reason="node absent: no ECMA-262 regex engine to compare with")
def test_an_ecma_regex_engine_reads_the_pattern_as_the_decoder_does() -> None:
    script = ("const p = new RegExp(process.argv[1], 'u');"
              "console.log(JSON.stringify(JSON.parse(process.argv[2]).map(s => p.test(s))));")
    for flags in ("u", ""):  # validators differ on the unicode flag; both readings must agree
        out = subprocess.run(["node", "-e", script.replace("'u'", repr(flags)), NAME_PATTERN, json.dumps(list(NAMES))],
                             capture_output=True, text=True, check=True, timeout=60)
        assert dict(zip(NAMES, json.loads(out.stdout), strict=True)) == NAMES, flags
