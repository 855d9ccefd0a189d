"""The chunk attention in fp32 torch, written for reading rather than speed: what every backend is
checked against (``AttentionBackend.self_check``, the tests)."""

from __future__ import annotations

import torch


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """``softmax(q[t, h] . keys[:start + t + 1, h // G]) . values`` in fp32, for ``q`` of shape
    ``[n, H, D]`` and ``keys``/``values`` of shape ``[>= start + n, KV, D]``."""
    n, heads, d = q.shape
    g = heads // keys.shape[1]
    end = start + n
    k = keys[:end].float().repeat_interleave(g, dim=1)  # [end, H, D]
    v = values[:end].float().repeat_interleave(g, dim=1)
    scores = torch.einsum("thd,khd->htk", q.float(), k) * d ** -0.5
    allowed = torch.arange(end, device=q.device)[None, :] <= (start + torch.arange(n, device=q.device))[:, None]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("htk,khd->thd", scores.softmax(-1), v)
