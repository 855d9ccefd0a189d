"""The proxy's HTTP client to the engine (and to a ``--shadow URL`` service): one aiohttp session,
its connections kept alive for the proxy's life.

aiohttp rather than httpx on this path: its C parser and leaner request path take about 1.3 ms
off every request's first byte through the proxy on the 2-core machine (benchmarks/README.md,
"Through the proxy"). It sends what the client sent: no header of its own but ``Host`` and
``Content-Length`` (no ``User-Agent``, ``Accept``, ``Accept-Encoding`` or ``Content-Type`` added),
the path as it came (not re-quoted). It follows no redirect, decompresses no body and keeps no
cookie. An HTTP proxy named in the environment (``HTTP_PROXY``, ``NO_PROXY``, ...) is used as httpx
used it, read once per upstream: aiohttp's own ``trust_env`` looks it and ``.netrc`` up again on
every request, in worker threads, which cost more than the whole relay. Its errors
become the two the proxy tells apart: ``UpstreamTimeout`` (the client gets 504) and
``UpstreamError`` (502, or a stream broken mid-way).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

Headers = Sequence[tuple[bytes, bytes]]
NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


class UpstreamError(Exception):
    """The upstream could not be reached, or broke its answer."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not connect or answer in time."""


def _error(err: BaseException) -> UpstreamError:
    if isinstance(err, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return UpstreamTimeout(f"{type(err).__name__}: {err}")
    return UpstreamError(f"{type(err).__name__}: {err}")


class Response:
    """The upstream's status line and headers; its body is read with ``chunks``."""

    def __init__(self, raw: aiohttp.ClientResponse) -> None:
        self._raw = raw
        self.status_code = raw.status
        self.raw_headers: list[tuple[bytes, bytes]] = list(raw.raw_headers)

    def header(self, name: str) -> str:
        return self._raw.headers.get(name, "")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (chunked framing undone, content encoding kept)."""
        try:
            async for chunk in self._raw.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as err:
            raise _error(err) from err

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def aclose(self) -> None:
        """Back to the pool when the body was read to its end; closed otherwise."""
        if self._raw.content.at_eof():
            self._raw.release()
        else:
            self._raw.close()


class Upstream:
    def __init__(self, timeout_s: float) -> None:
        # per operation, as httpx's was: a stream may run long while each read comes in time
        self.timeout = aiohttp.ClientTimeout(total=None, connect=min(10.0, timeout_s), sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[URL, tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    def _proxy(self, url: URL) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        origin = url.origin()
        if origin not in self._proxies:
            try:
                self._proxies[origin] = get_env_proxy_for_url(origin)
            except LookupError:  # none, or NO_PROXY names the host
                self._proxies[origin] = None, None
        return self._proxies[origin]

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # in the server's event loop, on the first request
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, auto_decompress=False, skip_auto_headers=NOT_ADDED,
                cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    async def send(self, method: str, url: str, headers: Headers, body: bytes) -> Response:
        """The upstream's answer to the request, its body still to read (``Response.aclose`` after)."""
        fields = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        try:
            target = URL(url, encoded=True)
            proxy, proxy_auth = self._proxy(target)
            raw = await self._client().request(method, target, headers=fields, data=body or None,
                                               allow_redirects=False, proxy=proxy, proxy_auth=proxy_auth)
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:  # ValueError: a URL aiohttp refuses
            raise _error(err) from err
        return Response(raw)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
