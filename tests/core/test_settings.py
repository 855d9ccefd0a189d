"""Settings: every key from the environment and from serve.env; bad values name the key and where
it was set; profiles; with MODEL empty nothing of torch is imported (checked in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import SecretStr

from shadow.cli import main
from shadow.core.profiles import ProfileError, ShadowBlock, load_profiles
from shadow.core.settings import PREFIX, SettingsError, ShadowSettings
from shadow.data import __file__ as _data

NARRATOR_PROMPT = Path(_data).parent / "narrator" / "prompt.txt"  # a real file: the setting checks it

# One value per key, unlike its default, in the form the environment gives it.
SAMPLES = {
    "model": ("/models/Qwen3.5-0.8B", "/models/Qwen3.5-0.8B"),
    "dir": ("/srv/shadow", "/srv/shadow"),
    "grid": ("1024", 1024),
    "device": ("cuda:1", "cuda:1"),
    "dtype": ("float32", "float32"),
    "fast": ("off", "off"),
    "stream": ("caller", "caller"),
    "spans": ("4, 2", "4, 2"),
    "gb": ("2.5", 2.5),
    "disk": ("/nvme/shadow", "/nvme/shadow"),
    "disk_gb": ("12", 12.0),
    "store": ("redis://10.0.0.5:6379/2", "redis://10.0.0.5:6379/2"),
    "store_password": ("s3cret", SecretStr("s3cret")),
    "store_cluster": ("true", True),
    "lease_s": ("2.5", 2.5),
    "instance": ("gpu-3", "gpu-3"),
    "narrator_model": ("/models/narrator", "/models/narrator"),
    "narrator": ("on", "on"),
    "narrator_prompt": (str(NARRATOR_PROMPT), str(NARRATOR_PROMPT)),
    "narrator_share": ("0.05", 0.05),
    "narrator_max_tokens": ("24", 24),
    "sessions": ("/data/sessions/raw", "/data/sessions/raw"),
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9011", 9011),
    "profiles": ("/etc/qwen38/profiles.yaml", "/etc/qwen38/profiles.yaml"),
    "profile": ("coding", "coding"),
    "max_body_kb": ("512", 512),
    "token": ("s3cret", "s3cret"),
    "allowed_origins": ("https://app.example", "https://app.example"),
    "allowed_hosts": ("shadow.lan,*", "shadow.lan,*"),
    "max_holds": ("8", 8),
    "metrics_public": ("true", True),
    "max_hold_s": ("60", 60.0),
    "max_session_ids": ("100000", 100000),
    "max_sessions": ("500", 500),
    "max_arrived": ("64", 64),
    "proxy_max_body_kb": ("64", 64),
    "proxy_max_sessions": ("16", 16),
    "proxy_retry_s": ("2.5", 2.5),
    "idle_poll_s": ("0.5", 0.5),
    "idle_window_s": ("1.5", 1.5),
    "ration": ("0.03", 0.03),
    "slice_ms": ("100", 100.0),
    "ration_gather": ("4", 4),
    "ration_gather_ms": ("250", 250.0),
    "ration_thread": ("false", False),
    "ration_output_turns": ("4", 4),
    "ration_scope": ("turn", "turn"),
    "trace": ("jsonl,console", "jsonl,console"),
    "trace_file": ("/tmp/t.jsonl", "/tmp/t.jsonl"),
    "otlp_endpoint": ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in list(os.environ):
        if k.upper().startswith(PREFIX):
            monkeypatch.delenv(k)
    monkeypatch.chdir(tmp_path)  # no stray serve.env


def test_samples_cover_every_key() -> None:
    assert set(SAMPLES) == set(ShadowSettings.model_fields)
    defaults = ShadowSettings(_env_file=None)
    for key, (_, want) in SAMPLES.items():
        assert getattr(defaults, key) != want, f"the sample for {key} equals its default"


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_every_key_from_env_and_from_serve_env(key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    raw, want = SAMPLES[key]
    name = PREFIX + key.upper()
    (tmp_path / "serve.env").write_text(f"# the engine's own keys pass\nQWEN38_PORT=8000\n{name}={raw}\n")
    assert getattr(ShadowSettings(), key) == want  # ./serve.env, the default file
    assert getattr(ShadowSettings(_env_file=tmp_path / "serve.env"), key) == want
    (tmp_path / "serve.env").unlink()
    monkeypatch.setenv(name, raw)
    assert getattr(ShadowSettings(_env_file=None), key) == want


def test_env_wins_over_file_and_arguments_over_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "serve.env").write_text("QWEN38_SHADOW_PORT=9000\nQWEN38_SHADOW_GRID=1024\n")
    monkeypatch.setenv("QWEN38_SHADOW_PORT", "9001")
    s = ShadowSettings()
    assert (s.port, s.grid) == (9001, 1024)
    assert ShadowSettings(port=9002).port == 9002


def test_defaults() -> None:
    s = ShadowSettings(_env_file=None)
    assert (s.model, s.host, s.port, s.grid, s.gb, s.disk) == ("", "127.0.0.1", 8011, 512, 4.0, "auto")
    assert (s.idle_poll_s, s.idle_window_s, s.ration, s.slice_ms) == (0.2, 2.0, 0.08, 150.0)
    assert not s.on and s.trace_exporters == [] and s.home == Path("~/.qwen38-spark-engine/shadow").expanduser()


@pytest.mark.parametrize("line, says", [
    ("QWEN38_SHADOW_GRID=100", "multiple of 64"),
    ("QWEN38_SHADOW_GB=-1", "must be positive"),
    ("QWEN38_SHADOW_DTYPE=float8", "float32"),
    ("QWEN38_SHADOW_DEVICE=gpu", "cuda:N"),
    ("QWEN38_SHADOW_FAST=fastest", "'auto', 'on' or 'off'"),
    ("QWEN38_SHADOW_SPANS=2,32", "'32' is not a span"),
    ("QWEN38_SHADOW_SPANS=1", "'1' is not a span"),
    ("QWEN38_SHADOW_PORT=70000", "TCP port"),
    ("QWEN38_SHADOW_RATION=2", "share"),
    ("QWEN38_SHADOW_MAX_HOLD_S=7200", "at most 3600 s"),
    ("QWEN38_SHADOW_TRACE=jaeger", "unknown exporter 'jaeger'"),
    ("QWEN38_SHADOW_NARRATOR=yes", "'on' or 'off'"),
    ("QWEN38_SHADOW_NARRATOR_SHARE=3", "share"),
    ("QWEN38_SHADOW_NARRATOR_MAX_TOKENS=0", "at least 1"),
    ("QWEN38_SHADOW_NARRATOR_PROMPT=/nowhere/prompt.txt", "cannot read the narrator's prompt file"),
    ("QWEN38_SHADOW_GIRD=512", "not a setting"),
])
def test_bad_value_names_key_and_file(line: str, says: str, tmp_path: Path) -> None:
    env = tmp_path / "serve.env"
    env.write_text(f"QWEN38_SHADOW_MODEL=\n{line}\n")
    with pytest.raises(SettingsError) as err:
        ShadowSettings(_env_file=env)
    msg = str(err.value)
    key, value = line.split("=")
    assert key in msg and repr(value) in msg and str(env.resolve()) in msg and says in msg


def test_a_narrator_model_other_than_the_model_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "small").mkdir()
    (tmp_path / "other").mkdir()
    monkeypatch.setenv("QWEN38_SHADOW_MODEL", str(tmp_path / "small"))
    monkeypatch.setenv("QWEN38_SHADOW_NARRATOR_MODEL", str(tmp_path / "other"))
    with pytest.raises(SettingsError) as err:
        ShadowSettings(_env_file=None)
    msg = str(err.value)
    assert f"QWEN38_SHADOW_NARRATOR_MODEL={str(tmp_path / 'other')!r} in the environment" in msg
    assert f"QWEN38_SHADOW_MODEL={str(tmp_path / 'small')!r}" in msg and "leave it empty" in msg
    # MODEL's own folder (written another way) shares its slot
    monkeypatch.setenv("QWEN38_SHADOW_NARRATOR_MODEL", str(tmp_path / "other" / ".." / "small"))
    assert ShadowSettings(_env_file=None).shares_narrator_slot


def test_bad_value_from_the_environment_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWEN38_SHADOW_IDLE_WINDOW_S", "soon")
    with pytest.raises(SettingsError, match=r"QWEN38_SHADOW_IDLE_WINDOW_S='soon' in the environment"):
        ShadowSettings(_env_file=None)


def test_serve_fails_at_start_naming_key_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = tmp_path / "serve.env"
    env.write_text("QWEN38_SHADOW_GRID=500\n")
    assert main(["serve", "--env-file", str(env)]) == 2
    err = capsys.readouterr().err
    assert "QWEN38_SHADOW_GRID='500'" in err and str(env.resolve()) in err
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("profiles:\n  coding:\n    shadow: {mode: maybe}\n")
    env.write_text(f"QWEN38_SHADOW_PROFILES={profiles}\n")
    assert main(["serve", "--env-file", str(env)]) == 2
    err = capsys.readouterr().err
    assert str(profiles.resolve()) in err and "'coding'" in err and "shadow.mode" in err and "'maybe'" in err


# ---- profiles ---------------------------------------------------------------------------------------

def test_profiles_yaml_on_off_words_and_absent_blocks(tmp_path: Path) -> None:
    p = tmp_path / "profiles.yaml"
    p.write_text(textwrap.dedent("""\
        profiles:
          coding:
            model: qwen3.8-27b      # the host's own keys pass
            shadow: {mode: on, narrator: off, router: shadow, router_min_tokens: 4096}
          chat: {}
          quiet:
            shadow: {}
          writer:
            shadow: {mode: on, narrator: on}
        """))
    prof = load_profiles(p)
    assert prof.get("coding") == ShadowBlock("on", "off", "shadow", 4096)
    assert prof.get("chat") == prof.get("quiet") == ShadowBlock()  # absent: off
    assert prof.get("writer") == ShadowBlock("on", "on", "off", 8192)
    assert prof.any_on and prof.source == str(p.resolve())
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        prof.get("nope")


def test_the_narrator_setting_is_the_default_of_every_block_that_does_not_say(tmp_path: Path) -> None:
    p = tmp_path / "profiles.yaml"
    p.write_text("coding:\n  shadow: {mode: on}\nquiet:\n  shadow: {mode: on, narrator: off}\nchat: {}\n")
    assert load_profiles(p).get("coding").narrator == "off"  # the setting's default: off
    on = load_profiles(p, narrator="on")
    assert (on.get("coding").narrator, on.get("quiet").narrator, on.get("chat").follows) == ("on", "off", False)
    assert load_profiles("", narrator="on").get("default") == ShadowBlock("on", "on")
    s = ShadowSettings(_env_file=None)
    assert (s.narrator, s.narrator_share, s.narrator_max_tokens) == ("off", 0.03, 32)
    assert s.narrator_instruction == NARRATOR_PROMPT.read_text().strip() and "one short line" in s.narrator_instruction
    mine = tmp_path / "prompt.txt"
    mine.write_text("  Say it in five words.\n")
    assert ShadowSettings(_env_file=None, narrator_prompt=str(mine)).narrator_instruction == "Say it in five words."
    mine.write_text(" \n")
    with pytest.raises(SettingsError, match=r"QWEN38_SHADOW_NARRATOR_PROMPT=.* given as an argument: .*is empty"):
        ShadowSettings(_env_file=None, narrator_prompt=str(mine))


def test_profiles_toml_and_json_and_builtin(tmp_path: Path) -> None:
    t = tmp_path / "p.toml"
    t.write_text('[coding.shadow]\nmode = "on"\nrouter = "shadow"\n[chat]\nx = 1\n')
    assert load_profiles(t).get("coding").router == "shadow" and not load_profiles(t).get("chat").follows
    j = tmp_path / "p.json"
    j.write_text('{"profiles": {"a": {"shadow": {"mode": "off"}}}}')
    assert not load_profiles(j).any_on
    assert load_profiles("").get("default").follows  # no file: one profile, mode on


@pytest.mark.parametrize("block, says", [
    ("{mode: maybe}", "shadow.mode: 'maybe' is not one of off, on"),
    ("{narrator: 3}", "shadow.narrator: 3"),
    ("{router: on}", "shadow.router: True is not one of off, shadow"),
    ("{router_min_tokens: -5}", "shadow.router_min_tokens: -5"),
    ("{router_min_tokens: many}", "shadow.router_min_tokens: 'many'"),
    ("{colour: red}", "shadow.colour: not a shadow key"),
    ("[on]", "the shadow block must be a mapping"),
])
def test_bad_profile_names_file_profile_and_key(block: str, says: str, tmp_path: Path) -> None:
    p = tmp_path / "profiles.yaml"
    p.write_text(f"coding:\n  shadow: {block}\n")
    with pytest.raises(ProfileError) as err:
        load_profiles(p)
    assert str(p.resolve()) in str(err.value) and "'coding'" in str(err.value) and says in str(err.value)


def test_unreadable_or_invalid_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profiles(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("coding: [unclosed\n")
    with pytest.raises(ProfileError, match=r"bad\.yaml: not valid yaml"):
        load_profiles(bad)


# ---- off means off ----------------------------------------------------------------------------------

NO_TORCH = """
import sys
from litestar.testing import TestClient
from shadow.api.app import create_app
from shadow.cli import main
from shadow.container import build_container
from shadow.core.settings import ShadowSettings

settings = ShadowSettings()
assert settings.model == "" and not settings.on
with TestClient(create_app(build_container(settings)), base_url="http://localhost") as client:
    status = client.get("/v1/conductor/shadow/status")
    asked = client.post("/v1/conductor/shadow/ask", json={"session": "s", "question": "q", "choices": ["A"]})
    fed = client.post("/v1/conductor/shadow/feed/prompt", json={"session": "s", "prompt": [1, 2, 3]})
    host = client.post("/v1/conductor/shadow/host/started", json={"request_id": "r", "session": "s", "prompt": [1]})
assert status.json()["slot"]["state"] == "off", status.text
assert asked.status_code == 503 and "off" in asked.json()["detail"], asked.text
assert fed.json()["followed"] is False and fed.json()["reason"] == "off", fed.text
assert host.status_code == 200, host.text
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "fla", "transformers", "safetensors"))
print(loaded)
sys.exit(1 if loaded else 0)
"""


def test_model_empty_imports_no_torch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(PREFIX)}
    env["QWEN38_SHADOW_MODEL"] = ""
    r = subprocess.run([sys.executable, "-c", NO_TORCH], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_span_sizes_follow_the_path() -> None:
    """auto: spans only on CUDA's fast path (the CPU's fast path is Triton's interpreter, for tests);
    a list is taken as given, sorted, on any fast path; off: none."""
    assert ShadowSettings(_env_file=None).span_sizes(cuda_fast=True) == (2, 4, 8, 16)
    assert ShadowSettings(_env_file=None).span_sizes(cuda_fast=False) == ()
    assert ShadowSettings(_env_file=None, spans="8, 2,8").span_sizes(cuda_fast=False) == (2, 8)
    assert ShadowSettings(_env_file=None, spans="off").span_sizes(cuda_fast=True) == ()


def test_the_store_settings_refuse_what_cannot_work_and_never_show_the_password() -> None:
    with pytest.raises(SettingsError, match="QWEN38_SHADOW_STORE="):
        ShadowSettings(_env_file=None, store="http://cache:6379")
    for bad in (0, 10.5):
        with pytest.raises(SettingsError, match="QWEN38_SHADOW_LEASE_S="):
            ShadowSettings(_env_file=None, lease_s=bad)
    s = ShadowSettings(_env_file=None, store="rediss://cache:6380/1", store_password="hunter2", lease_s=10)
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert s.instance_name == f"{__import__('socket').gethostname()}:{os.getpid()}"
    from shadow.backends.stores.redis_parks import masked

    assert masked("redis://u:hunter2@cache:6379/0") == "redis://u:***@cache:6379/0"
    assert masked("redis://cache:6379/0") == "redis://cache:6379/0"
