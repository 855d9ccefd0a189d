"""The engine's response passed on to the client, and read along the way for the turn.

The bytes go to the client as the engine sent them (``Response.chunks``: not even a ``Content-Encoding``
is undone), each chunk before the proxy reads it. Only what the proxy itself asked the engine for
(its token id fields, ``engines.py``) is taken out again: those events, or that whole body, are
re-serialised without it. Reading never stops the bytes: an event or body the proxy cannot parse,
or anything the turn raises, ends the following of the turn (``ProxyTurn.stop``), and the relay goes on.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectSendStream

from .turn import ProxyTurn, Unparseable
from .upstream import Response, UpstreamError

log = logging.getLogger("shadow.proxy")

HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
              b"trailer", b"upgrade"}
READ_CAP = 64 << 20  # an event or whole body larger than this is passed on unread

Receive = Any
Send = Any


def take_events(buffer: bytearray) -> list[bytes]:
    """Whole SSE events taken off the front of ``buffer`` (what is left waits for more bytes)."""
    text = bytes(buffer).replace(b"\r\n", b"\n")
    *done, rest = text.split(b"\n\n")
    buffer[:] = rest
    return done


def parse_event(event: bytes) -> Any:
    """An event's JSON data; None for a comment, a keep-alive or ``[DONE]``; ``Unparseable`` else."""
    data = b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise Unparseable(f"an event that is not JSON: {type(err).__name__}") from None


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


class Stop:
    """In the turn's queue: following ends here, for ``reason`` (in order with the events before it)."""

    def __init__(self, reason: str, err: BaseException | None = None) -> None:
        self.reason, self.err = reason, err


async def _follow(turn: ProxyTurn | None, obj: Any, key: str) -> None:
    if turn is None or turn.stopped or obj is None:
        return
    if isinstance(obj, Stop):
        turn.stop(obj.reason, obj.err)
        return
    try:
        await turn.event(obj, key)
    except Unparseable as err:
        turn.stop("unparseable_event", err)
    except Exception as err:  # never the client's problem
        turn.stop("shadow_error", err)


def _parsed(read: Any) -> Any:
    """What ``read`` returns, or a ``Stop`` saying why it could not."""
    try:
        return read()
    except Unparseable as err:
        return Stop("unparseable_event", err)


async def relay(response: Response, receive: Receive, send: Send, turn: ProxyTurn | None) -> bool:
    """Pass the response on; True when the upstream finished it and the client got all of it.

    The turn follows in a task of its own, from a queue of what was parsed: the bytes never wait for
    the shadow (its barrier, its ration's reads), and the render (CPU work that would compete with
    the relay for the interpreter) starts once the first bytes went out. The relay returns once the
    turn has caught up (then ``ProxyTurn.finish``)."""
    queue_in, queue_out = anyio.create_memory_object_stream[tuple[Any, str]](max_buffer_size=math.inf)
    first = anyio.Event()  # the first bytes went to the client: the render may start

    async def follow() -> None:
        assert turn is not None
        await first.wait()
        await turn.prepare()
        await turn.accepted()
        async with queue_out:
            async for obj, key in queue_out:
                await _follow(turn, obj, key)

    async with anyio.create_task_group() as tg:
        if turn is not None:
            tg.start_soon(follow)
        with queue_in:
            try:
                complete = await _pass(response, receive, send, turn, queue_in, first)
            finally:
                first.set()
    return complete


async def _pass(response: Response, receive: Receive, send: Send, turn: ProxyTurn | None,
                queue: MemoryObjectSendStream[tuple[Any, str]], first: anyio.Event) -> bool:
    headers = [(k, v) for k, v in response.raw_headers if k.lower() not in HOP_BY_HOP]
    streaming = response.header("content-type").startswith("text/event-stream")
    encoded = bool(response.header("content-encoding"))
    strip = turn.strip if turn is not None and not encoded else None
    hold_whole = strip is not None and not streaming  # the body changes length: its headers wait
    if strip is not None and streaming:  # the events change length
        headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    if not hold_whole:
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    if turn is not None and streaming and encoded:
        queue.send_nowait((Stop("undecodable_body"), "stop"))
    buffer, whole = bytearray(), bytearray()
    gone = anyio.Event()

    async def watch(scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        scope.cancel()  # the client went away: stop reading the upstream (it is closed after)

    async def body(chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        first.set()

    done = False
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        try:
            async for raw in response.chunks():
                reading = turn is not None and not turn.stopped
                if not streaming:
                    if not hold_whole:
                        await body(raw)
                    if reading or hold_whole:
                        whole.extend(raw)
                    if len(whole) > READ_CAP and not hold_whole and turn is not None:
                        queue.send_nowait((Stop("undecodable_body"), "stop"))
                        whole.clear()
                    continue
                if strip is None:
                    await body(raw)
                    if not reading:
                        continue
                buffer.extend(raw)
                if len(buffer) > READ_CAP:
                    if turn is not None:
                        queue.send_nowait((Stop("undecodable_body"), "stop"))
                    if strip is not None:
                        await body(bytes(buffer))
                    buffer.clear()
                    strip = None
                    continue
                for event in take_events(buffer):
                    obj = _parsed(lambda e=event: parse_event(e))
                    if strip is not None:
                        await body(event + b"\n\n" if not isinstance(obj, dict) else
                                   b"data: " + _dumps(strip(obj)) + b"\n\n")
                    if turn is not None and obj is not None:
                        queue.send_nowait((obj, "delta"))
            done = True
        except UpstreamError as err:
            log.warning("the upstream broke mid-response: %s: %s", type(err).__name__, err)
        except OSError:  # uvicorn's ClientDisconnected: the client went away while we sent
            gone.set()
        finally:
            tg.cancel_scope.cancel()
    if not done or gone.is_set():
        return False  # the client's response stays unfinished, as the upstream's did
    if streaming and strip is not None and buffer:
        await body(bytes(buffer))
    obj = None
    if whole and (hold_whole or (turn is not None and not turn.stopped)):
        obj = _parsed(lambda: _whole(bytes(whole), response))
    if hold_whole:
        out = _dumps(strip(obj)) if isinstance(obj, dict) and strip is not None else bytes(whole)
        headers = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"transfer-encoding")]
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": [*headers, (b"content-length", str(len(out)).encode())]})
        await body(out)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    if turn is not None and obj is not None:
        queue.send_nowait((obj, "message"))
    return True


def _whole(raw: bytes, response: Response) -> Any:
    if len(raw) > READ_CAP:
        raise Unparseable("a body larger than the proxy reads")
    try:
        text = raw if not response.header("content-encoding") else httpx.Response(
            200, headers={"content-encoding": response.header("content-encoding")}, content=raw).read()
        return json.loads(text)
    except (ValueError, RecursionError, httpx.HTTPError) as err:
        raise Unparseable(f"a body that is not JSON: {type(err).__name__}") from None
