"""The torch reader: a session's tensors, advanced one whole grid chunk at a time.

Every chunk is the forward of ``grid`` ids at absolute positions ``k*grid ...`` on the state left
by chunk ``k-1``, so a session read over many turns runs exactly the chunks a fresh prefill of
the same ids on the same grid runs, and ends in the same bits. Questions and fork decodes run
above the committed rows and put the conv and recurrent state back.
"""

from __future__ import annotations

import functools
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Concatenate, Literal, ParamSpec, TypeVar

import torch

from shadow.core.costs import pass_plan
from shadow.core.session import SessionBook

from . import tensor_file
from .qwen35 import ModelState, Qwen35

if TYPE_CHECKING:
    from .qwen35.attention.backend import AttentionBackend
    from .qwen35.fast.forward import FastForward

Saved = tuple[list[torch.Tensor], list[torch.Tensor]]
P = ParamSpec("P")
R = TypeVar("R")


def _on_own_stream(method: Callable[Concatenate[TorchReader, P], R]) -> Callable[Concatenate[TorchReader, P], R]:
    """Run a reader call on the reader's CUDA stream (no-op off CUDA). Everything the reader
    allocates, launches or copies goes there, so its tensors are only ever used on the stream they
    were made on, and the caching allocator never hands a block to another stream early."""
    def on_stream(self: TorchReader, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with torch.cuda.stream(self._stream):
            return method(self, *args, **kwargs)
    functools.update_wrapper(on_stream, method)
    return on_stream


def long_ids(ids: array[int]) -> torch.Tensor:
    """A slice of a book's int32 ids as the int64 tensor a forward takes, from its bytes (no int
    object per id). ``frombuffer`` refuses an empty buffer, and its view is converted at once."""
    return torch.frombuffer(ids, dtype=torch.int32).long() if ids else torch.empty(0, dtype=torch.long)


@dataclass
class SessionTensors:
    state: ModelState
    checkpoints: dict[int, Saved] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Bytes held on the device. A checkpoint is a copy of the conv and recurrent state (the
        same shapes, ``save_recurrent``; a parked file's are checked against them on loading), so
        it is counted as that, not tensor by tensor: the residency asks this after every pass, for
        every resident session, and summing 36 tensors per checkpoint took 0.2 ms a session."""
        s = self.state
        fixed = sum(t.numel() * t.element_size() for t in (*s.conv, *s.recurrent))
        kv = sum(t.numel() * t.element_size() for t in (*s.k, *s.v))
        return kv + fixed * (1 + len(self.checkpoints))


class TorchReader:
    """``fast=True`` reads and forks through ``FastForward`` (fused kernels; CUDA graphs on CUDA),
    otherwise through the torch forward. Either way a chunk is the same function of the ids below
    it, so incremental and fresh reads agree bit for bit on one path; the two paths agree with
    each other within bf16 rounding."""

    def __init__(self, model: Qwen35, grid: int, fast: bool = False,
                 timer: Callable[[], float] = time.perf_counter, max_batch: int = 1,
                 stream: Literal["own", "caller"] = "own", spans: Sequence[int] = (),
                 attention: AttentionBackend | None = None) -> None:
        if grid <= 0 or grid % 64:
            raise ValueError(f"grid must be a positive multiple of 64, got {grid}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if stream not in ("own", "caller"):
            raise ValueError(f"stream must be 'own' or 'caller', got {stream!r}")
        self.model = model
        self.grid = grid
        self.timer = timer  # what a chunk's cost is measured with: injectable, as the schedulers' clock is
        self._eager_batch = max_batch  # the torch forward reads a pass's sessions one after the other
        self.fast: FastForward | None = None
        self._fingerprint: str | None = None
        if fast:
            from .qwen35.fast.forward import FastForward

            self.fast = FastForward(model, grid, spans=spans, attention=attention)
        # A stream of the reader's own: where the shadow shares a process with an engine (library
        # use, ab_cost), a read then waits for its own kernels only. Synchronising the device waited
        # for the engine's queued decode step too, and held the engine's host thread until then.
        # At the highest priority: the GPU schedules a chunk's blocks before those of a decode step
        # running beside it, so the step waits about the chunk's time, as when the two ran one
        # after the other; at equal priority they shared the GPU and the step lost more (ab_cost,
        # one agent: 1.41 % against 0.80 %). Kernels, shapes and order are the same on any stream
        # and at any priority, so the bits are too.
        # stream="caller" keeps the caller's current stream and synchronises the device.
        self._stream: torch.cuda.Stream | None = None
        if model.device.type == "cuda" and stream == "own":
            # -100: below the device's range, so torch maps it to the highest priority there is
            self._stream = torch.cuda.Stream(model.device, priority=-100)  # type: ignore[no-untyped-call]
            self._stream.wait_stream(torch.cuda.current_stream(model.device))  # the weights, the static buffers

    @_on_own_stream
    def warm_up(self) -> float:
        """Capture the fast path's graphs, then launch what runs outside them (``qwen35.fast.warm``);
        seconds taken (0 when there is nothing to capture)."""
        from .qwen35.fast.warm import warm_paths

        return (self.fast.warm_up() if self.fast is not None else 0.0) + warm_paths(self)

    def fast_report(self) -> dict[str, object] | None:
        """What the fast path holds for this model (static buffers, graph pool), and which batch
        sizes its warm-up check let through (``batches``: "ok", or why a size is not used)."""
        return self.fast.report() if self.fast is not None else None

    @property
    def attention(self) -> str:
        """The chunk attention backend that makes this reader's bits (``ATTENTION``); "torch" on the
        torch forward."""
        return self.fast.attention.name if self.fast is not None else "torch"

    def runs_on(self) -> tuple[str, str]:
        """(the device resolved, the chunk attention backend): ``("cuda:0", "gluon-ws")``; ``"torch"`` for
        the torch forward (fast path off). What the status page and the load's log line show."""
        return str(self.model.device), self.attention

    def batch_sizes(self) -> dict[int, str]:
        """The fast path's batch sizes and their warm-up check ("ok", "unchecked", or why a size is
        refused); the torch forward, which reads a pass's sessions one after the other, needs no check."""
        if self.fast is not None:
            return self.fast.batch_sizes()
        return dict.fromkeys(sorted({1, self._eager_batch}), "ok")

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def fingerprint(self) -> str:
        """The SHA-256 of the bits this reader makes (``fingerprint.py``), computed on first use (the
        warm-up's, or else the first park's or restore's) and kept: parks carry it, and a park
        made under another is read again rather than restored."""
        if self._fingerprint is None:
            from .fingerprint import fingerprint

            self._fingerprint = fingerprint(self)
        return self._fingerprint

    @property
    def weights_hash(self) -> str:
        return self.model.weights_hash

    @property
    def dtype(self) -> str:
        return str(self.model.dtype).removeprefix("torch.")

    @_on_own_stream
    def new_session(self) -> SessionTensors:
        return SessionTensors(self.model.new_state())

    # ---- a session as host tensors (what a parked file holds) ------------------------------

    @_on_own_stream
    def serialise(self, book: SessionBook, tensors: SessionTensors) -> dict[str, torch.Tensor]:
        """Committed KV rows (not the spare capacity), conv and recurrent state, checkpoints."""
        s = tensors.state
        if s.length != book.committed:
            raise ValueError(f"state and book disagree on the committed length: {s.length} != {book.committed}")
        out: dict[str, torch.Tensor] = {}
        for j in range(len(s.k)):
            out[f"k.{j}"] = s.k[j][:s.length].contiguous().cpu()
            out[f"v.{j}"] = s.v[j][:s.length].contiguous().cpu()
        for j in range(len(s.conv)):
            out[f"conv.{j}"] = s.conv[j].cpu()
            out[f"recurrent.{j}"] = s.recurrent[j].cpu()
        for pos, (conv, rec) in tensors.checkpoints.items():
            for j in range(len(conv)):
                out[f"checkpoint.{pos}.conv.{j}"] = conv[j].cpu()
                out[f"checkpoint.{pos}.recurrent.{j}"] = rec[j].cpu()
        return out

    def state_specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """``serialise``'s names for a session with no rows and no checkpoint, each with its dtype's
        safetensors name and its shape (KV tensors: 0 rows); from an empty state's own tensors."""
        return {name: (tensor_file.NAMES[t.dtype], tuple(t.shape))
                for name, t in self.serialise(SessionBook(self.grid), self.new_session()).items()}

    @_on_own_stream
    def deserialise(self, book: SessionBook, data: Mapping[str, torch.Tensor]) -> SessionTensors:
        model = self.model
        state = model.new_state()
        rows = book.committed
        for j in range(len(state.k)):
            for buf, key in ((state.k, "k"), (state.v, "v")):
                src = data[f"{key}.{j}"]
                if src.shape[0] != rows or src.shape[1:] != buf[j].shape[1:]:
                    raise ValueError(f"{key}.{j} has shape {list(src.shape)}")
        state.reserve(rows)
        for j in range(len(state.k)):
            state.k[j][:rows].copy_(data[f"k.{j}"])
            state.v[j][:rows].copy_(data[f"v.{j}"])
        state.length = rows
        for j in range(len(state.conv)):
            state.conv[j].copy_(data[f"conv.{j}"])
            state.recurrent[j].copy_(data[f"recurrent.{j}"])
        tensors = SessionTensors(state)
        n = len(state.conv)
        for pos in book.checkpoints:
            saved: Saved = ([], [])
            for part, kind, like in ((saved[0], "conv", state.conv), (saved[1], "recurrent", state.recurrent)):
                for j in range(n):
                    src = data[f"checkpoint.{pos}.{kind}.{j}"]
                    if src.shape != like[j].shape or src.dtype != like[j].dtype:  # nbytes counts on it
                        raise ValueError(f"checkpoint.{pos}.{kind}.{j} has shape {list(src.shape)} and dtype "
                                         f"{src.dtype}, the state's {list(like[j].shape)} and {like[j].dtype}")
                    part.append(src.to(model.device))
            tensors.checkpoints[pos] = saved
        return tensors

    # ---- reading ------------------------------------------------------------------------

    @property
    def max_batch(self) -> int:
        """The most sessions one ``read_chunks`` pass takes: the fast path's largest usable batch
        size (its warm-up check may refuse some); on the torch forward, which reads a pass's sessions one
        after the other, what the constructor was given (1 by default)."""
        return self.fast.max_batch if self.fast is not None else self._eager_batch

    def read_chunk(self, book: SessionBook, tensors: SessionTensors) -> float:
        """Commit the next whole chunk; returns its measured cost in seconds (device synchronised)."""
        return self.read_chunks([(book, tensors)])

    @_on_own_stream
    def read_chunks(self, batch: Sequence[tuple[SessionBook, SessionTensors]]) -> float:
        """Commit the next whole chunk of each (book, tensors), each at its own depth; returns the
        measured cost of the whole call in seconds (device synchronised). Each session ends in the
        bits ``read_chunk`` on it alone gives, whatever it is batched with. A number of sessions
        the fast path did not capture is read as ``pass_plan`` says: in the next usable size up
        with an empty slot, or in several passes, the largest usable sizes first. Checkpoints are
        taken as ``read_chunk`` takes them."""
        if not batch:
            return 0.0
        if len({id(tensors) for _, tensors in batch}) != len(batch):
            raise ValueError("a session appears twice in one batch")
        chunks = []
        for book, tensors in batch:
            start = book.committed
            if book.pending < self.grid:
                raise ValueError(f"no whole chunk pending: {book.pending} ids past {start}, grid {self.grid}")
            if tensors.state.length != start:
                raise ValueError(f"state and book disagree on the committed length: {tensors.state.length} != {start}")
            chunks.append((long_ids(book.ids[start:start + self.grid]), tensors.state))
        t0 = self.timer()
        if self.fast is not None:
            at = 0
            for size, real in pass_plan(len(chunks), self.fast.usable):
                self.fast.read_chunks(chunks[at:at + real], size if size > real else None)
                at += real
        else:
            for ids, state in chunks:
                self.model.forward(ids, state)
        self._wait()
        cost = self.timer() - t0
        for book, tensors in batch:
            book.committed_chunk()
            self.checkpoint_if_due(book, tensors)
        return cost

    @property
    def spans(self) -> tuple[int, ...]:
        """Span sizes ``read_span`` takes: the fast path's, less any its warm-up check refused."""
        if self.fast is None:
            return ()
        return self.fast.usable_spans

    @_on_own_stream
    def read_span(self, book: SessionBook, tensors: SessionTensors, chunks: int) -> float:
        """Commit the next ``chunks`` whole chunks of one session in one pass (a size of ``spans``);
        returns its measured cost in seconds (device synchronised). The session ends in the bits of
        ``chunks`` calls of ``read_chunk``. A wanted checkpoint line may end the span, not fall inside it."""
        if chunks not in self.spans or self.fast is None:
            raise ValueError(f"a span is one of {list(self.spans)} chunks, got {chunks}")
        start, end = book.committed, book.committed + chunks * self.grid
        if book.pending < end - start:
            raise ValueError(f"{chunks} chunks are not pending: {book.pending} ids past {start}, grid {self.grid}")
        if tensors.state.length != start:
            raise ValueError(f"state and book disagree on the committed length: {tensors.state.length} != {start}")
        inside = [w for w in book.wanted if start < w < end]
        if inside:
            raise ValueError(f"checkpoint lines {inside} fall inside the span [{start}, {end})")
        t0 = self.timer()
        self.fast.read_chunks([(long_ids(book.ids[start:end]), tensors.state)])
        self._wait()
        cost = self.timer() - t0
        for _ in range(chunks):
            book.committed_chunk()
        self.checkpoint_if_due(book, tensors)
        return cost

    @_on_own_stream
    def checkpoint_if_due(self, book: SessionBook, tensors: SessionTensors) -> None:
        if book.checkpoint_due():
            tensors.checkpoints[book.committed] = tensors.state.save_recurrent()
            dropped = book.took_checkpoint()
            if dropped is not None:
                tensors.checkpoints.pop(dropped, None)

    @_on_own_stream
    def roll_back(self, tensors: SessionTensors, resume_at: int) -> None:
        """Return the state to ``resume_at``: a held checkpoint, or the empty state at 0.
        KV rows below the cut stay as they are: they depend only on the ids below it."""
        state = tensors.state
        state.truncate(resume_at)
        if resume_at == 0:
            for c in state.conv:
                c.zero_()
            for r in state.recurrent:
                r.zero_()
        else:
            state.load_recurrent(tensors.checkpoints[resume_at])
        for pos in [p for p in tensors.checkpoints if p > resume_at]:
            del tensors.checkpoints[pos]

    # ---- forks ---------------------------------------------------------------------------

    def sync(self) -> None:
        """Wait until the reader's own work is done (not the device's: see ``__init__``)."""
        self._wait()

    def _wait(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        elif self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    def _forward_pieces(self, ids: list[int], state: ModelState) -> torch.Tensor:
        """fp32 logits of the last of ``ids`` after a forward in pieces of at most ``grid`` rows, as
        the fast path's fork runs: no attention mask past ``grid`` rows by the session, however
        long the question (the CPU path materialises one)."""
        if not ids:
            raise ValueError("a fork needs at least one id")
        out = None
        for pos in range(0, len(ids), self.grid):
            last = pos + self.grid >= len(ids)
            out = self.model.forward(torch.tensor(ids[pos:pos + self.grid], dtype=torch.long), state,
                                     logits_at=[-1] if last else None)
        assert out is not None
        return out[0]

    @_on_own_stream
    def fork_logits(self, book: SessionBook, tensors: SessionTensors, extra: list[int],
                    upto: int | None = None) -> torch.Tensor:
        """fp32 logits after the pending tail (up to ``upto``) and ``extra``, leaving the committed
        state as it was."""
        state = tensors.state
        committed = state.length
        if self.fast is not None:
            fork = self.fast.fork([*book.ids[committed:upto], *extra], state)
            try:
                assert fork.logits is not None
                return fork.logits.clone()
            finally:
                fork.close()
        saved = state.save_recurrent()
        try:
            return self._forward_pieces([*book.ids[committed:upto], *extra], state)
        finally:
            state.truncate(committed)
            state.load_recurrent(saved)

    @_on_own_stream
    def fork_decode(self, book: SessionBook, tensors: SessionTensors, prompt: list[int], max_new: int,
                    stop: set[int], upto: int | None = None) -> list[int]:
        """Greedy decoding on top of the session, as if it ended at ``upto`` (the narrator's path);
        the committed state is untouched."""
        state = tensors.state
        committed = state.length
        out: list[int] = []
        if self.fast is not None:
            fork = self.fast.fork([*book.ids[committed:upto], *prompt], state)
            try:
                return fork.decode(max_new, stop) if max_new > 0 else out
            finally:
                fork.close()
        saved = state.save_recurrent()
        try:
            logits: torch.Tensor | None = self._forward_pieces([*book.ids[committed:upto], *prompt], state)
            while logits is not None and len(out) < max_new:
                token = int(logits.argmax())
                out.append(token)
                if token in stop or len(out) == max_new:
                    break
                logits = self._forward_pieces([token], state)
            return out
        finally:
            state.truncate(committed)
            state.load_recurrent(saved)

    # ---- comparing states ------------------------------------------------------------------

    @_on_own_stream
    def export(self, tensors: SessionTensors) -> dict[str, torch.Tensor]:
        """CPU copies, one stable name per tensor: committed KV rows, conv and recurrent state."""
        cfg = self.model.config
        state = tensors.state
        out: dict[str, torch.Tensor] = {}
        for j, layer in enumerate(cfg.full_layers):
            out[f"layers.{layer}.k"] = state.k[j][:state.length].cpu().clone()
            out[f"layers.{layer}.v"] = state.v[j][:state.length].cpu().clone()
        for j, layer in enumerate(cfg.linear_layers):
            out[f"layers.{layer}.conv"] = state.conv[j].cpu().clone()
            out[f"layers.{layer}.recurrent"] = state.recurrent[j].cpu().clone()
        return out

    @_on_own_stream
    def fresh(self, ids: list[int]) -> dict[str, torch.Tensor]:
        """``export`` of a fresh prefill of ``ids`` on the grid: every whole chunk, in order."""
        book = SessionBook(grid=self.grid, ids=array("i", ids))
        tensors = self.new_session()
        while book.pending >= self.grid:
            self.read_chunk(book, tensors)
        return self.export(tensors)

    @_on_own_stream
    def probabilities(self, logits: torch.Tensor, token_ids: Sequence[int]) -> list[float]:
        """Softmax over the chosen tokens' logits only, in fp32."""
        picked = logits.float()[torch.tensor(list(token_ids), device=logits.device)]
        return [float(p) for p in torch.softmax(picked, dim=0).cpu()]
