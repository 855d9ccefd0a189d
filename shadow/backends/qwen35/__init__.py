"""Qwen3.5 (0.8B, 2B, 4B, 9B) text model: config, weights, the forward, the GDN kernels."""

from .config import Qwen35Config
from .model import Qwen35, resolve_dtype
from .state import KV_STEP, ModelState

__all__ = ["KV_STEP", "ModelState", "Qwen35", "Qwen35Config", "resolve_dtype"]
