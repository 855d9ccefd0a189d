"""Profiles: named sets of switches a host serves requests under, each with an optional ``shadow:`` block.

The file (``QWEN38_SHADOW_PROFILES``) is YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON
(``.json``), and holds the profiles either under a top-level ``profiles:`` key or at the top level.
A profile may carry any other keys (the host's own); only its ``shadow`` block is read here::

    profiles:
      coding:
        shadow: {mode: on, narrator: off, router: shadow, router_min_tokens: 8192}
      chat: {}            # no shadow block: the shadow is off for this profile

Absent block or key: off (``router_min_tokens``: 8192; ``narrator``: the ``NARRATOR`` setting's value,
off by default). YAML's ``on``/``off`` (booleans in YAML
1.1) read as the words. A bad value fails at start with ``ProfileError`` naming the file, the
profile and the key. Without a file there is one profile, ``default``, with ``mode: on``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import ShadowError

Mode = Literal["off", "on"]
RouterMode = Literal["off", "shadow"]
ROUTER_MIN_TOKENS = 8192
DEFAULT_PROFILE = "default"
_BLOCK_KEYS = ("mode", "narrator", "router", "router_min_tokens")


class ProfileError(ShadowError, ValueError):
    """A profile file shadow cannot use; the message names the file, the profile and the key."""


@dataclass(frozen=True, slots=True)
class ShadowBlock:
    mode: Mode = "off"
    narrator: Mode = "off"
    router: RouterMode = "off"
    router_min_tokens: int = ROUTER_MIN_TOKENS

    @property
    def follows(self) -> bool:
        return self.mode == "on"


@dataclass(frozen=True, slots=True)
class Profiles:
    blocks: Mapping[str, ShadowBlock]
    source: str  # the file, or "(built in)"

    def get(self, name: str) -> ShadowBlock:
        try:
            return self.blocks[name]
        except KeyError:
            known = ", ".join(sorted(self.blocks)) or "none"
            raise ProfileError(f"unknown profile {name!r} (profiles in {self.source}: {known})") from None

    @property
    def any_on(self) -> bool:
        """Some profile follows sessions: the model should load soon after start."""
        return any(b.follows for b in self.blocks.values())


def builtin_profiles(narrator: Mode = "off") -> Profiles:
    return Profiles({DEFAULT_PROFILE: ShadowBlock(mode="on", narrator=narrator)}, "(built in)")


def _word(value: Any, words: tuple[str, ...], where: str) -> str:
    if value is True and "on" in words:
        value = "on"
    elif value is False:
        value = "off"
    if isinstance(value, str) and value.strip().lower() in words:
        return value.strip().lower()
    raise ProfileError(f"{where}: {value!r} is not one of {', '.join(words)}")


def parse_block(raw: Any, where: str, narrator: Mode = "off") -> ShadowBlock:
    """One ``shadow:`` block; ``where`` prefixes error messages (file, profile); ``narrator`` is the
    narrator's value where the block does not say."""
    if raw is None:
        return ShadowBlock(narrator=narrator)
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where}: the shadow block must be a mapping, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in _BLOCK_KEYS]
    if unknown:
        raise ProfileError(f"{where}.{unknown[0]}: not a shadow key (keys: {', '.join(_BLOCK_KEYS)})")
    min_tokens = raw.get("router_min_tokens", ROUTER_MIN_TOKENS)
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise ProfileError(f"{where}.router_min_tokens: {min_tokens!r} is not a whole number >= 0")
    mode = _word(raw.get("mode", "off"), ("off", "on"), f"{where}.mode")
    narrates = _word(raw.get("narrator", narrator), ("off", "on"), f"{where}.narrator")
    router = _word(raw.get("router", "off"), ("off", "shadow"), f"{where}.router")
    return ShadowBlock(mode=mode, narrator=narrates, router=router,  # type: ignore[arg-type]
                       router_min_tokens=min_tokens)


def parse_profiles(data: Any, source: str, narrator: Mode = "off") -> Profiles:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: profiles must be a mapping of name -> profile")
    if "profiles" in data:
        data = data["profiles"] or {}
        if not isinstance(data, Mapping):
            raise ProfileError(f"{source}: profiles: must be a mapping of name -> profile")
    blocks: dict[str, ShadowBlock] = {}
    for name, profile in data.items():
        where = f"{source}: profile {name!r}: shadow"
        if profile is None:
            profile = {}
        if not isinstance(profile, Mapping):
            raise ProfileError(f"{source}: profile {name!r} must be a mapping, got {type(profile).__name__}")
        blocks[str(name)] = parse_block(profile.get("shadow"), where, narrator)
    return Profiles(blocks, source)


def load_profiles(path: str | Path | None, narrator: Mode = "off") -> Profiles:
    """The profiles in ``path``; none given: the built-in ``default`` profile with mode on.
    ``narrator`` (the setting) is the narrator's value of every block that does not say."""
    if path is None or not str(path).strip():
        return builtin_profiles(narrator)
    p = Path(path).expanduser()
    source = str(p.resolve())
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ProfileError(f"{source}: cannot read the profile file ({err.strerror or err})") from None
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as err:  # every parser's own error type: say which file and why
        raise ProfileError(f"{source}: not valid {p.suffix.lstrip('.') or 'YAML'}: {err}") from None
    return parse_profiles(data, source, narrator)
