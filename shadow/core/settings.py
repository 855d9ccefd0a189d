"""shadow's settings: environment and ``serve.env``, prefix ``QWEN38_SHADOW_``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ShadowSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="QWEN38_SHADOW_", env_file="serve.env", extra="forbid")

    model: str = Field("", description="checkpoint folder of the small Qwen3.5; empty: the shadow is off")
    dir: str = Field("", description="working folder (demo model, traces); empty: ~/.qwen38-spark-engine/shadow")
    grid: int = Field(512, description="rows per chunk; state advances only at multiples of it")
    device: str = Field("auto", description="cpu, cuda, cuda:N, or auto (cuda when available)")
    dtype: Literal["float32", "bfloat16"] = Field("bfloat16", description="the small model's activations")
    gb: float = Field(4.0, description="cap on resident session state, GiB")
    disk: str = Field("auto", description="folder for parked sessions; auto: ~/.qwen38-spark-engine/cache/shadow")
    disk_gb: float = Field(64.0, description="cap on parked files, GiB")
    host: str = "127.0.0.1"
    port: int = 8011

    @field_validator("grid")
    @classmethod
    def _grid_on_gdn_blocks(cls, v: int) -> int:
        if v <= 0 or v % 64:
            raise ValueError("grid must be a positive multiple of 64 (the GDN kernels' block)")
        return v

    @field_validator("gb", "disk_gb")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be positive")
        return v
