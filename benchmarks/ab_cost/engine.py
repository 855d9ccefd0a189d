"""The host's side of ``ab_cost``: a main model that serves turns as an engine does, and the calls
it makes to the shadow through the host interface.

``MainModel`` is this project's Qwen3.5 forward with random weights drawn straight on the device
(no checkpoint file: ``Qwen35`` is built from the tensors). On CUDA it runs through ``FastForward``'s
fork: the prompt in passes of ``grid`` rows, then one token a step through the captured one-row
pieces (the GPU-speed issue's graphs), at an engine's pace. Elsewhere (the CPU smoke run) it runs
the torch forward, the same way in pieces. Each step samples greedily and reads the token back
(``int(argmax)``): a device sync per token, as an engine's sampler does. The ids fed to the next
step and reported to the shadow are the turn's real output ids (teacher forcing): the shadow gets
the session's real ids, the same in every run; the main model's own choices do not matter, its
pace does.

``serve_turn`` is one request as an engine reports it (``shadow.core.host.Host``): ``arrived``, then
``started`` with the prompt ids, the prefill, ``first_token``, ``round_ended`` after every round with
that round's new id (the prefill's token is the first round), ``finished``. With ``host=None`` (the
arm with the shadow off) the same work runs and no call is made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from shadow.backends.qwen35 import ModelState, Qwen35, Qwen35Config
from shadow.backends.qwen35.checkpoint import demo_text_config, random_tensors
from shadow.backends.qwen35.config import reference_shape
from shadow.core.host import Host

if TYPE_CHECKING:  # importing it here would import Triton on the CPU path
    from shadow.backends.qwen35.fast.forward import FastForward

SHAPES: dict[str, Callable[[], dict[str, Any]]] = {
    "9b": lambda: reference_shape("9B"), "4b": lambda: reference_shape("4B"), "2b": lambda: reference_shape("2B"),
    "0.8b": lambda: reference_shape("0.8B"), "tiny": demo_text_config,
}


def shape(name: str) -> dict[str, Any]:
    if name not in SHAPES:
        raise SystemExit(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
    return SHAPES[name]()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MainModel:
    """The main model: ``prefill(prompt)`` then ``step(id)`` per token, each returning the greedy
    token (read back to the host). One sequence at a time; ``prefill`` starts a new one."""

    def __init__(self, model: Qwen35, grid: int, fast: bool) -> None:
        self.model = model
        self.grid = grid
        self.device = model.device
        self.fast: FastForward | None = None
        if fast:
            from shadow.backends.qwen35.fast.forward import FastForward

            # one sequence at a time: no batch sizes to capture, no state slots for them
            self.fast = FastForward(model, grid, batches=(1,))
        self.state: ModelState = model.new_state()  # reused: its KV capacity, once grown, stays
        self._fork: Any = None

    @property
    def path(self) -> str:
        if self.fast is None:
            return "eager"
        return "fast, CUDA graphs" if self.fast.graphs.enabled else "fast, no graphs"

    def warm_up(self) -> float:
        """Capture the fast path's graphs (seconds; 0 on the torch forward)."""
        return self.fast.warm_up() if self.fast is not None else 0.0

    def _end(self) -> None:
        if self._fork is not None:
            self._fork.close()
            self._fork = None
        self.state.truncate(0)
        if self.fast is None:  # the torch forward advanced them in place (the fork never writes them)
            for t in (*self.state.conv, *self.state.recurrent):
                t.zero_()

    def prefill(self, ids: Sequence[int]) -> int:
        if not ids:
            raise ValueError("an empty prompt")
        self._end()
        if self.fast is not None:
            self._fork = self.fast.fork(list(ids), self.state)
            logits = self._fork.logits
        else:
            logits = None
            for pos in range(0, len(ids), self.grid):
                piece = torch.tensor(list(ids[pos:pos + self.grid]), dtype=torch.long)
                last = pos + self.grid >= len(ids)
                logits = self.model.forward(piece, self.state, logits_at=[-1] if last else None)
        assert logits is not None
        return int(logits.reshape(-1, logits.shape[-1])[-1].argmax())

    def step(self, token: int) -> int:
        return self.launch(token)()

    def launch(self, token: int) -> Callable[[], int]:
        """One step of ``token``, queued; returns what waits for it and reads its argmax. On the
        fast path the GPU runs the step while the host does other work (an overlapped engine's
        host reports the round before meanwhile); the torch forward is done on return."""
        if self.fast is not None:
            if self._fork is None:
                raise RuntimeError("step before prefill")
            fork = self._fork.extend([token])
            return lambda: _argmax(fork.logits)
        value = _argmax(self.model.forward(torch.tensor([token], dtype=torch.long), self.state, logits_at=[-1]))
        return lambda: value

    def finish(self) -> None:
        self._end()


def _argmax(logits: torch.Tensor | None) -> int:
    assert logits is not None
    return int(logits.reshape(-1, logits.shape[-1])[-1].argmax())


def random_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 1) -> tuple[Qwen35, int]:
    """Random weights at shape ``name``, drawn on ``device``; the model and its parameter count."""
    cfg = Qwen35Config.from_dict(shape(name))
    tensors = random_tensors(cfg, seed=seed, dtype=dtype, device=device)
    params = sum(t.numel() for t in tensors.values())
    return Qwen35(cfg, tensors, device, dtype), params  # the model holds what it needs of the tensors


def build_main(name: str, device: torch.device, dtype: torch.dtype, grid: int, fast: bool,
               seed: int = 1) -> tuple[MainModel, dict[str, Any]]:
    """Random weights at shape ``name``, drawn on ``device``; returns the model and its start-up."""
    t0 = time.perf_counter()
    model, params = random_model(name, device, dtype, seed)
    main = MainModel(model, grid, fast)
    _sync(device)
    built = time.perf_counter() - t0
    capture = main.warm_up()
    return main, {"shape": name, "params": params, "build_s": built, "capture_s": capture, "path": main.path,
                  "grid": grid, "dtype": str(dtype).removeprefix("torch.")}


@dataclass
class TurnTiming:
    """One served turn, as the host timed it. ``*_ns`` are epoch nanoseconds (the spans' clock)."""

    request_id: str
    session: str
    prompt_ids: int
    output_ids: int
    ttft_s: float  # arrival to the first token read back (host calls, barrier, prefill)
    decode_s: float  # the first token to the last, the round calls included
    decode_tokens: int  # tokens after the first (one step each)
    calls_s: float = 0.0  # time inside the host's calls during the decode
    start_calls_s: float = 0.0  # time inside ``arrived`` and ``started`` (part of the TTFT)
    ration_ms: float = 0.0  # what the turn's account says the ration read (chunks' measured cost)
    ration_chunks: int = 0
    decode_start_ns: int = 0
    decode_end_ns: int = 0
    calls: list[str] = field(default_factory=list)  # the host calls in order (compressed: rounds counted)

    @property
    def tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def serve_turn(main: MainModel, host: Host | None, request_id: str, session: str, prompt: Sequence[int],
               output: Sequence[int], overlap: bool = False) -> TurnTiming:
    """One request: prefill ``prompt``, then decode ``len(output)`` tokens, reporting to ``host``.
    ``overlap``: each round is reported while the GPU runs the next step (as SGLang's overlap
    scheduler and vLLM's async scheduling run their host work), not after it; the same calls with
    the same ids in the same order."""
    if not output:
        raise ValueError(f"{request_id}: a turn without output ids has no decode to measure")
    calls: list[str] = []
    t_arr = time.perf_counter()
    if host is not None:
        host.arrived(request_id)
        host.started(request_id, session, ids=list(prompt))
        calls += ["arrived", "started"]
    t_fed = time.perf_counter()
    main.prefill(prompt)
    t_first = time.perf_counter()
    first_ns = time.time_ns()
    calls_s = ration_ms = 0.0
    chunks = 0

    def round_ended(new: int) -> None:
        nonlocal calls_s
        t0 = time.perf_counter()
        assert host is not None
        host.round_ended(request_id, [new])
        calls_s += time.perf_counter() - t0

    if host is not None:
        t0 = time.perf_counter()
        host.first_token(request_id)
        calls_s += time.perf_counter() - t0
        calls.append("first_token")
        if not overlap:
            round_ended(output[0])
    for i in range(1, len(output)):
        if overlap:
            wait = main.launch(output[i - 1])
            if host is not None:
                round_ended(output[i - 1])  # the round before, while this step runs
            wait()
            continue
        main.step(output[i - 1])
        if host is not None:
            round_ended(output[i])
    if overlap and host is not None:
        round_ended(output[-1])
    t_end = time.perf_counter()
    end_ns = time.time_ns()
    if host is not None:
        calls.append(f"round_ended x{len(output)}")
        done = host.finished(request_id)
        calls.append("finished")
        # the turn's own account: a slice read on the ration's thread is charged to it when it
        # ends, not in the round that decided it (a slice that ends after the turn, only in spans)
        ration_ms, chunks = done.spent_s * 1e3, done.chunks
    main.finish()
    return TurnTiming(request_id, session, len(prompt), len(output), t_first - t_arr, t_end - t_first,
                      len(output) - 1, calls_s, t_fed - t_arr, ration_ms, chunks, first_ns, end_ns, calls)
