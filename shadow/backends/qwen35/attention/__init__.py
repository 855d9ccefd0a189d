"""The fast path's chunk attention: kernels behind one registry, chosen by the ``ATTENTION`` setting.

- ``triton`` (``triton.py``): a Triton kernel, on any CUDA GPU and under Triton's interpreter.
- ``gluon-wg`` (``gluon_wg.py``): Gluon for Hopper, 128 rows a program, two warpgroups sharing each
  key and value tile; the Triton kernel for the chunks it does not serve (other than bf16 at head
  dim 256).
- ``gluon-ws`` (``gluon_ws.py``): the same programs warp-specialised, for a read's table launch; the
  same bits as ``gluon-wg``.
- ``naive.py``: the reference in fp32 torch that every backend's self-check compares with.

``auto`` takes the available backend of the highest priority: ``gluon-ws`` on a Hopper whose
Triton has Gluon's Hopper module, ``triton`` elsewhere. The container resolves the setting once,
before the first read: the kernel and its split rule decide a session's bits, so one process reads
with one backend throughout, and the status names it.
"""

from __future__ import annotations

import importlib

import torch

from .backend import AttentionBackend

SETTINGS = ("auto", "triton", "gluon-wg", "gluon-ws")  # the ATTENTION setting's values
_WHERE = {"triton": ("triton", "TritonAttention"), "gluon-wg": ("gluon_wg", "WarpgroupAttention"),
          "gluon-ws": ("gluon_ws", "SpecialisedAttention")}


def backend_class(name: str) -> type[AttentionBackend]:
    """The class of the backend called ``name``, its module imported now (a Gluon one fails to
    import on a Triton without Gluon's Hopper module)."""
    module, cls = _WHERE[name]
    found: type[AttentionBackend] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def why_unavailable(name: str, device: torch.device) -> str:
    """Why the backend called ``name`` cannot run on ``device`` ("" where it can)."""
    try:
        cls = backend_class(name)
    except Exception as e:  # a Triton without Gluon's Hopper module, say
        return f"its module does not import here: {type(e).__name__}: {str(e)[:200]}"
    return cls.why_unavailable(device)


def choose(setting: str, device: torch.device) -> AttentionBackend:
    """The backend ``setting`` names (one of ``SETTINGS``), for ``device``: ``auto`` takes the
    available one of the highest priority; a named one that cannot run there is a clear error."""
    if setting not in SETTINGS:
        raise ValueError(f"attention must be one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting != "auto":
        why = why_unavailable(setting, device)
        if why:
            raise ValueError(f"attention {setting!r} cannot run on {device}: {why}")
        return backend_class(setting)()
    usable = [name for name in _WHERE if not why_unavailable(name, device)]
    if not usable:
        raise ValueError(f"no attention backend runs on {device}: "
                         + "; ".join(f"{name}: {why_unavailable(name, device)}" for name in _WHERE))
    return backend_class(max(usable, key=lambda name: backend_class(name).priority))()
