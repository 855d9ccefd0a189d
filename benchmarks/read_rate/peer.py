"""The peer in ``read_rate``: transformers' ``Qwen3_5ForCausalLM`` on the same checkpoint folder, with
its own cache, walked through the same steps as the shadow (``steps.run_steps``).

What each figure is for the peer:

- chunk at depth d: one forward of 512 ids on its cache at d (``logits_to_keep=1``, as a prefill
  that wants no logits would run it), consecutive chunks from d, the median;
- question300: a forward of the 300 ids on a copy of the cache at d (the copy made outside the
  clock), logits of the last row;
- fork decode per token: single-id forwards, greedy, on a copy of the cache at d, the median step.

The cache is brought to each depth untimed, in pieces of ``PREFILL`` ids (its fast way there).
"""

from __future__ import annotations

import copy
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PREFILL = 4096


def load(ckpt: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    import transformers

    t0 = time.perf_counter()
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(ckpt, dtype=dtype).to(device).eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    info = {"load_s": time.perf_counter() - t0, "transformers": transformers.__version__,
            "attention": getattr(model.config, "_attn_implementation", None),
            "gdn_kernel": _gdn_kernel(model), "fla_installed": importlib.util.find_spec("fla") is not None}
    return model, info


def _gdn_kernel(model: Any) -> str:
    """Where the GDN layers' chunked rule comes from: fla's module, or transformers' torch fallback."""
    for mod in model.modules():
        fn = getattr(mod, "chunk_gated_delta_rule", None)
        if fn is not None:
            return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', type(fn).__name__)}"
    return "not on the layer (this transformers picks it per call: see fla_installed)"


class PeerSide:
    """The peer's cache and the calls ``steps.PeerRunner`` walks it with."""

    def __init__(self, model: Any, ids: list[int], sync: Callable[[], None]) -> None:
        import transformers

        self.model = model
        self.ids = ids
        self.sync = sync
        self.device = next(model.parameters()).device
        self._new_cache = lambda: transformers.DynamicCache(config=model.config)
        self.cache = self._new_cache()
        # Counted here, not asked of the cache: a hybrid cache's length API has moved between
        # transformers versions, and its first layer is a linear-attention one.
        self.length = 0

    def _forward(self, cache: Any, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def restart(self) -> None:
        self.cache = self._new_cache()
        self.length = 0

    @torch.inference_mode()
    def advance_to(self, depth: int) -> None:
        while self.length < depth:
            piece = self.ids[self.length:min(depth, self.length + PREFILL)]
            self._forward(self.cache, piece)
            self.length += len(piece)
        self.sync()

    @torch.inference_mode()
    def chunk(self, rows: int) -> None:
        self._forward(self.cache, self.ids[self.length:self.length + rows])
        self.length += rows

    @torch.inference_mode()
    def fork(self) -> Any:
        return copy.deepcopy(self.cache)

    @torch.inference_mode()
    def question(self, fork: Any, ids: list[int]) -> None:
        self._forward(fork, ids)

    @torch.inference_mode()
    def decode_steps(self, fork: Any, prompt: list[int], steps: int) -> list[float]:
        """Greedy steps after ``prompt`` (untimed); ms of each single-id forward."""
        token = int(self._forward(fork, prompt).argmax())
        times = []
        for _ in range(steps):
            self.sync()
            t0 = time.perf_counter()
            token = int(self._forward(fork, [token]).argmax())  # the argmax syncs, as a decoder's would
            times.append((time.perf_counter() - t0) * 1e3)
        return times
