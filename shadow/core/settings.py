"""shadow's settings: environment and ``serve.env``, prefix ``QWEN38_SHADOW_``.

Every field is one key: ``grid`` is ``QWEN38_SHADOW_GRID``. The environment wins over ``serve.env``
(read from the working folder; ``ShadowSettings(_env_file=None)`` skips it, ``_env_file=path`` picks
another), and keyword arguments win over both. A bad value fails at once with a ``SettingsError``
that names the key, the value and where it came from (the file, or the environment).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ShadowError

PREFIX = "QWEN38_SHADOW_"
ENV_FILE = "serve.env"
DEFAULT_HOME = "~/.qwen38-spark-engine/shadow"
TRACE_EXPORTERS = ("none", "console", "jsonl", "otlp")
MAX_HOLD_S = 3600.0  # the longest hold: MAX_HOLD_S may lower it, not raise it (the API's schema states it)
AUTO_SPANS = (2, 4, 8, 16)  # one session's chunks a pass: the H200's span_chunk rows fall to 1.7 ms per 512 ids by 8
MAX_SPAN = 16  # the largest pass the fast path captures is 16 chunks of rows (8,192)
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


class SettingsError(ShadowError, ValueError):
    """A setting with a value shadow refuses; the message names the key and where it was set."""


class ShadowSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, env_file=ENV_FILE, extra="forbid")

    # ---- the shadow --------------------------------------------------------------------------
    model: str = Field("", description="checkpoint folder of the small Qwen3.5; empty: the shadow is off")
    dir: str = Field("", description="working folder (demo model, traces, journal); empty: " + DEFAULT_HOME)
    grid: int = Field(512, description="rows per chunk; state advances only at multiples of it")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (cuda when available)")
    dtype: Literal["float32", "bfloat16"] = Field("bfloat16", description="the small model's activations")
    fast: Literal["auto", "on", "off"] = Field(
        "auto", description="the fast path (fused kernels, CUDA graphs): auto = on when the device is CUDA; "
                            "off = the torch forward; on = also on the CPU (Triton's interpreter, for tests)")
    stream: Literal["own", "caller"] = Field(
        "own", description="the reader's CUDA stream: own (at the highest priority; a read waits for its own "
                           "kernels only) or caller (the current stream; a read synchronises the device)")
    spans: str = Field("auto", description="chunks of one session a pass may read, comma-separated (each captured "
                                           "and checked at warm-up); auto: 2,4,8,16 on CUDA's fast path, none "
                                           "elsewhere; off: none")
    gb: float = Field(4.0, description="cap on resident session state, GiB")
    disk: str = Field("auto", description="folder for parked sessions; auto: ~/.qwen38-spark-engine/cache/shadow")
    disk_gb: float = Field(64.0, description="cap on parked files, GiB")
    store: str = Field("", description="shared store of parked sessions and leases: redis://host:port/db or "
                                       "rediss://...; the password from QWEN38_SHADOW_STORE_PASSWORD or the URL, "
                                       "never logged; empty: the local disk only (docs/scale-out.md)")
    store_password: SecretStr = Field(SecretStr(""), description="the shared store's password (else the URL's); "
                                                                 "never logged or shown")
    store_cluster: bool = Field(False, description="STORE is a Redis Cluster node: talk through redis-py's "
                                                   "RedisCluster (a session's keys share one slot by hash tag)")
    lease_s: float = Field(5.0, description="a session's lease in the store, seconds (0 < LEASE_S <= 10): how "
                                            "long a lost instance keeps its sessions from the others")
    instance: str = Field("", description="this instance's name in leases (who holds a session); empty: host:pid")
    narrator_model: str = Field("", description="the host narrator's checkpoint: empty or MODEL's folder (one "
                                                "slot, one copy of the weights); another folder is refused")
    narrator: Literal["on", "off"] = Field(
        "off", description="the narrator (a one-line summary of each thought Qwen finishes) for profiles whose "
                           "shadow block does not say; a profile's `narrator:` overrides it")
    narrator_prompt: str = Field("", description="file holding the narrator's instruction; empty: the one "
                                                 "shipped in shadow/data/narrator/prompt.txt")
    narrator_share: float = Field(0.03, description="the narrator's share of the time since a turn's first token")
    narrator_max_tokens: int = Field(32, description="longest summary the narrator decodes, in tokens")
    sessions: str = Field("", description="folder of real agent sessions `shadow verify` checks when given "
                                          "no paths; empty: it asks for paths")

    # ---- the service -------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="address `shadow serve` listens on")
    port: int = Field(8011, description="port `shadow serve` listens on (`--port` overrides)")
    profiles: str = Field("", description="profile file (YAML or TOML) with named profiles and their "
                                          "`shadow:` blocks; empty: one profile `default` with mode on")
    profile: str = Field("default", description="the profile of a turn that names none")
    max_body_kb: int = Field(16384, description="largest request body the API accepts, KiB")
    token: str = Field("", description="bearer token every request must carry (Authorization: Bearer ...); "
                                       "empty: none, and `shadow serve` binds loopback only")
    allowed_origins: str = Field("", description="browser origins allowed to call the API, comma-separated "
                                                 "(https://app.example:443); empty: every Origin is refused")
    allowed_hosts: str = Field("", description="Host header names accepted besides localhost, 127.0.0.1, ::1 "
                                               "and HOST, comma-separated; * accepts any")
    max_holds: int = Field(64, description="holds live at once; one more is refused (429)")
    max_hold_s: float = Field(MAX_HOLD_S, description=f"longest time to live of a hold, seconds (at most "
                                                      f"{MAX_HOLD_S:g}, which the API's schema states)")
    metrics_public: bool = Field(False, description="/metrics, /health and /ready answer clients on loopback "
                                                    "without the token (a scraper beside the service)")
    max_session_ids: int = Field(2_000_000, description="most ids one session holds; a feed beyond is refused (400)")
    max_sessions: int = Field(1000, description="sessions known at once; beyond, the least recently used is "
                                                "forgotten (logged, counted in status)")
    max_arrived: int = Field(1024, description="requests announced (arrived) and not finished at once; one "
                                               "more is refused (429)")

    # ---- `shadow proxy` ------------------------------------------------------------------------
    proxy_max_body_kb: int = Field(32768, description="largest request body the proxy accepts and forwards, "
                                                      "KiB; a larger one is refused (413)")
    proxy_max_sessions: int = Field(1024, description="sessions the proxy's table remembers to find a "
                                                      "conversation by its prompt; least recently used first out")
    proxy_retry_s: float = Field(10.0, description="a client's retry of the same body within this many seconds "
                                                   "continues the same turn (counted as a retry)")

    # ---- when it reads (docs/architecture.md, promise 6) -------------------------------------
    idle_poll_s: float = Field(0.2, description="how often the idle window looks")
    idle_window_s: float = Field(2.0, description="longest idle read")
    ration: float = Field(0.08, description="share of the device's time the reader may use while any followed "
                                            "request decodes (RATION_SCOPE=turn: of each turn's time since its "
                                            "first token)")
    ration_scope: Literal["device", "turn"] = Field(
        "device", description="device: one ration for the device, spent on the turns in flight most behind "
                              "first, then the sessions used last; turn: one per turn, on its own session")
    slice_ms: float = Field(150.0, description="longest ration slice")
    ration_gather: int = Field(8, ge=1, description="device-wide ration: a slice waits for this many whole chunks "
                                                    "pending over all sessions (1: reads whatever is pending)")
    ration_gather_ms: float = Field(1000.0, ge=0.0, description="device-wide ration: the longest a slice waits to "
                                                             "gather RATION_GATHER chunks")
    ration_output_turns: int = Field(1, ge=0, description="the ration also reads Qwen's output while at most this "
                                                        "many followed requests run; with more, only up to each "
                                                        "session's latest prompt line (agents' next prompts mostly "
                                                        "rewrite the output)")
    ration_thread: bool = Field(True, description="a ration slice reads on a thread of its own: the engine's "
                                                   "round returns at once (its rounds stay quiet meanwhile)")

    # ---- traces ------------------------------------------------------------------------------
    trace: str = Field("none", description="span exporters, comma-separated: none, console, jsonl, otlp")
    trace_file: str = Field("", description="the jsonl exporter's file; empty: DIR/traces.jsonl")
    otlp_endpoint: str = Field("", description="OTLP/HTTP traces endpoint; empty: the exporter's default "
                                               "(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or localhost:4318)")

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise SettingsError(_explain(err, values)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _OurKeysOnly(dotenv_settings), file_secret_settings

    # ---- derived -------------------------------------------------------------------------------

    @property
    def home(self) -> Path:
        """The working folder: DIR, or ~/.qwen38-spark-engine/shadow."""
        return Path(self.dir or DEFAULT_HOME).expanduser()

    @property
    def instance_name(self) -> str:
        """Who this process is in the store's leases: INSTANCE, or host:pid."""
        import socket

        return self.instance.strip() or f"{socket.gethostname()}:{os.getpid()}"

    @property
    def on(self) -> bool:
        return bool(self.model.strip())

    @property
    def origins(self) -> set[str]:
        return {o.strip().rstrip("/").lower() for o in self.allowed_origins.split(",") if o.strip()}

    @property
    def hosts(self) -> set[str]:
        """Host header names accepted (no port); ``*`` among them accepts any."""
        extra = {h.strip().lower().strip("[]") for h in self.allowed_hosts.split(",") if h.strip()}
        return {"localhost", "127.0.0.1", "::1", self.host.strip().lower().strip("[]")} | extra

    @property
    def trace_exporters(self) -> list[str]:
        return [t for t in _split(self.trace) if t != "none"]

    @property
    def trace_path(self) -> Path:
        return Path(self.trace_file).expanduser() if self.trace_file else self.home / "traces.jsonl"

    @property
    def narrator_instruction(self) -> str:
        """The narrator's instruction: NARRATOR_PROMPT's file, or the one shipped with the package."""
        if self.narrator_prompt:
            return _prompt_text(self.narrator_prompt)
        from importlib.resources import files

        return files("shadow.data").joinpath("narrator", "prompt.txt").read_text(encoding="utf-8").strip()

    @property
    def shares_narrator_slot(self) -> bool:
        """MODEL names the narrator's model: both use one slot and one copy of the weights."""
        if not (self.on and self.narrator_model.strip()):
            return False
        return _same_folder(self.model, self.narrator_model)

    # ---- validators (each message is completed with the key and its source) -----------------

    @field_validator("grid")
    @classmethod
    def _grid_on_gdn_blocks(cls, v: int) -> int:
        if v <= 0 or v % 64:
            raise ValueError("grid must be a positive multiple of 64 (the GDN kernels' block)")
        return v

    @field_validator("store")
    @classmethod
    def _store_url(cls, v: str) -> str:
        v = v.strip()
        if v and not v.startswith(("redis://", "rediss://")):
            raise ValueError("STORE must be empty or a redis:// or rediss:// URL")
        return v

    @field_validator("lease_s")
    @classmethod
    def _lease(cls, v: float) -> float:
        if not 0 < v <= 10:
            raise ValueError("LEASE_S must be above 0 and at most 10 seconds")
        return v

    @field_validator("gb", "disk_gb", "idle_poll_s", "idle_window_s", "slice_ms", "max_hold_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be positive")
        return v

    @field_validator("max_hold_s")
    @classmethod
    def _hold_cap(cls, v: float) -> float:
        if v > MAX_HOLD_S:
            raise ValueError(f"must be at most {MAX_HOLD_S:g} s (a hold keeps the idle window shut; the API's "
                             "schema states this bound)")
        return v

    @field_validator("ration", "narrator_share")
    @classmethod
    def _share(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError("must be a share in [0, 1): 0.02 is 2 %")
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not _DEVICE.match(v):
            raise ValueError("must be auto, cpu, mps, cuda or cuda:N")
        return v

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 0 <= v <= 65535:
            raise ValueError("must be a TCP port in [0, 65535] (0: any free port)")
        return v

    @field_validator("host", "profile")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v

    @field_validator("narrator_model")
    @classmethod
    def _narrator_on_the_model(cls, v: str, info: ValidationInfo) -> str:
        # a second model is not loaded: one slot holds MODEL's weights; naming another folder was
        # once ignored in silence, which let a host believe a narrator of its choice ran
        model = str(info.data.get("model", "")).strip()
        if v.strip() and model and not _same_folder(model, v):
            raise ValueError(f"names another folder than {PREFIX}MODEL={model!r}; the narrator runs on the "
                             "shadow's own model (one slot, one copy of the weights), so leave it empty or "
                             "give MODEL's folder")
        return v

    @field_validator("narrator_prompt")
    @classmethod
    def _prompt_file(cls, v: str) -> str:
        if v:
            _prompt_text(v)
        return v

    @field_validator("max_body_kb", "max_holds", "max_session_ids", "narrator_max_tokens")
    @classmethod
    def _body(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be at least 1")
        return v

    @field_validator("max_sessions", "max_arrived", "proxy_max_body_kb", "proxy_max_sessions")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be at least 1")
        return v

    @field_validator("spans")
    @classmethod
    def _spans(cls, v: str) -> str:
        if v.strip() in ("auto", "off"):
            return v.strip()
        bad = [t for t in _split(v) if not t.isdigit() or not 2 <= int(t) <= MAX_SPAN]
        if bad or not _split(v):
            raise ValueError(f"{bad[0] if bad else v!r} is not a span: write auto, off, or chunk counts "
                             f"from 2 to {MAX_SPAN}, comma-separated")
        return v

    def span_sizes(self, cuda_fast: bool) -> tuple[int, ...]:
        """The span sizes to capture, given whether the reader is CUDA's fast path."""
        if self.spans == "auto":
            return AUTO_SPANS if cuda_fast else ()
        return () if self.spans == "off" else tuple(sorted({int(t) for t in _split(self.spans)}))

    @field_validator("trace")
    @classmethod
    def _trace(cls, v: str) -> str:
        bad = [t for t in _split(v) if t not in TRACE_EXPORTERS]
        if bad:
            raise ValueError(f"unknown exporter {bad[0]!r}; choose from {', '.join(TRACE_EXPORTERS)}")
        return v


class _OurKeysOnly(PydanticBaseSettingsSource):
    """``serve.env`` is the engine's file too: its other keys (``QWEN38_PORT``, ...) are not ours
    and pass silently, while an unknown ``QWEN38_SHADOW_*`` key (a typo) stays an error."""

    def __init__(self, inner: PydanticBaseSettingsSource) -> None:
        super().__init__(inner.settings_cls)
        self.inner = inner

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        fields = self.settings_cls.model_fields
        return {k: v for k, v in self.inner().items() if k in fields or k.upper().startswith(PREFIX)}


def _split(v: str) -> list[str]:
    return [t.strip().lower() for t in v.split(",") if t.strip()]


def _prompt_text(path: str) -> str:
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read the narrator's prompt file {str(p)!r}: {err}") from None
    if not text:
        raise ValueError(f"the narrator's prompt file {str(p)!r} is empty")
    return text


def _same_folder(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    try:
        return pa.resolve() == pb.resolve()
    except OSError:
        return pa == pb


def _dotenv(path: str | os.PathLike[str] | None) -> dict[str, str | None]:
    if path is None or not Path(path).is_file():
        return {}
    from dotenv import dotenv_values  # pydantic-settings' own reader

    return {k.upper(): v for k, v in dotenv_values(path).items()}


def _explain(err: ValidationError, values: dict[str, Any]) -> str:
    """One line per bad key: ``QWEN38_SHADOW_GRID='100' in serve.env: grid must be ...``."""
    env_file = values.get("_env_file", ShadowSettings.model_config.get("env_file"))
    if isinstance(env_file, list | tuple):
        env_file = env_file[-1] if env_file else None
    from_file = _dotenv(env_file)
    environ = {k.upper(): v for k, v in os.environ.items()}
    lines = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else "?"
        key = field.upper() if field.upper().startswith(PREFIX) else PREFIX + field.upper()
        if field in values:
            where, value = "given as an argument", values[field]
        elif key in environ:
            where, value = "in the environment", environ[key]
        elif key in from_file:
            where, value = f"in {Path(str(env_file)).resolve()}", from_file[key]
        else:
            where, value = "", e.get("input")
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            known = ", ".join(PREFIX + f.upper() for f in ShadowSettings.model_fields)
            msg = f"not a setting (known: {known})"
        lines.append(f"{key}={value!r} {where}: {msg}".replace("  ", " "))
    return "bad settings:\n  " + "\n  ".join(lines)
