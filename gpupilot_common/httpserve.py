"""A small read-only HTTP server for a service's own endpoints (``/metrics``, ``/health``) on aiohttp's
low-level web server (:mod:`gpupilot_common.httpbase`, shared with the adapter's HTTPS server) instead
of ``http.server``, which Python's documentation says is not for production.

One event loop in one thread holds every connection (a slow or idle client costs a few kilobytes, not
a thread); the answers are computed by a plain function ``(path, query) -> Reply`` in a small pool of
worker threads, so the function may block (a registry's ``generate_latest``, a render of a few
milliseconds). Bounds, each a field of :class:`Limits`:

* connections: at most ``max_connections`` open; when all are taken and another client waits, the
  one that has waited longest for a complete request head is cut for it (see
  :mod:`gpupilot_common.httpbase`), so ``/health`` is answered whatever slow clients hold;
* a request head must be complete within ``header_timeout`` (slowloris); a connection idle between
  requests is closed after ``idle_timeout``;
* a request line over ``max_url_bytes`` → 414, a header field over ``max_header_bytes`` or more than
  ``max_headers`` fields → 431, any other malformed request → 400, each closing the connection; a
  request body → 413 (nothing here takes one); a method other than GET/HEAD → 405;
* writing an answer to a client that does not read it: ``write_timeout``, then the connection is cut.

A handler may answer with a :class:`FileReply` (an open file) instead of bytes: the file is sent in
``stream_chunk`` pieces as the client takes them, with at most ``stream_budget_bytes`` read from
files and not yet handed to the kernel, across all connections (a client that reads nothing holds one
chunk and the transport's buffer, never the file).

Each request is one DEBUG line (method, path, status, bytes, milliseconds), and so is each refused
one; a failing handler is one ERROR line and a 500. No traceback, in the log or to the client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO

from aiohttp import web

from gpupilot_common.httpbase import TEXT, LoopServer, Reply

__all__ = ["TEXT", "FileReply", "HTTPServer", "Handler", "Limits", "Reply"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class FileReply:
    """An answer read from an open file as the client takes it; the server closes the file."""

    file: BinaryIO
    size: int
    """Bytes to send (the file's size when it was opened)."""
    content_type: str
    status: int = 200


Handler = Callable[[str, Mapping[str, str]], Reply | FileReply]
"""``(path, query) -> Reply | FileReply``; runs in a worker thread."""


@dataclasses.dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    """Open connections at once; Prometheus and a kubelet probe need a handful."""
    idle_timeout: float = 15.0
    """Seconds a connection may stay idle between requests (a scrape's interval is longer, so
    Prometheus reconnects; a connection costs microseconds)."""
    header_timeout: float = 10.0
    """Seconds a connection may take to send a complete request head (from its accept, or on a kept-alive
    connection from the head's first byte), like Go's ``ReadHeaderTimeout``."""
    max_url_bytes: int = 8192
    """Request line; ``/metrics?name[]=...`` never needs more."""
    max_header_bytes: int = 8190
    """One header field (name and value). Kept apart from ``max_url_bytes``: aiohttp reports both as
    the same error, told apart by its limit."""
    max_headers: int = 64
    """Header fields per request."""
    write_timeout: float = 30.0
    """Seconds a client may take to read its answer."""
    backlog: int = 128
    """Connections the kernel holds while ``max_connections`` are open."""
    workers: int = 4
    """Threads running the handler."""
    stream_chunk: int = 64 * 1024
    """Bytes of a :class:`FileReply` read and written at a time."""
    stream_budget_bytes: int = 8 << 20
    """Bytes read from files and not yet handed to the kernel, all connections together; a chunk
    waits (up to ``write_timeout``) for room."""


class HTTPServer(LoopServer[Limits]):
    """Listens on ``host:port`` (0: a free port) when constructed; :meth:`start` serves in a background
    thread, :meth:`serve_forever` in the calling one; :meth:`close` stops and frees the port."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        name: str = "http",
    ) -> None:
        limits = limits or Limits()
        super().__init__(host, port, limits=limits, workers=limits.workers, name=name, pool_name=name)
        self.handler = handler
        self._chunks: asyncio.Semaphore | None = None

    async def _setup(self) -> None:
        self._chunks = asyncio.Semaphore(max(1, self.limits.stream_budget_bytes // self.limits.stream_chunk))
        await super()._setup()

    # -- requests --------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        path = request.path or "/"
        reply = await self._reply(request, path)
        if isinstance(reply, FileReply):
            return await self._stream(request, path, reply, start)
        resp = web.Response(
            status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type}
        )
        if reply.status in (405, 413):
            resp.force_close()  # an unread body must not be parsed as the next request
        _access_log(request, path, reply.status, len(reply.body), start)
        return resp

    async def _stream(
        self, request: web.BaseRequest, path: str, reply: FileReply, start: float
    ) -> web.StreamResponse:
        """Send the file in chunks, each read only once there is room in the budget and the client
        took the one before (the transport's buffer is below its high-water mark); a client that
        takes nothing for ``write_timeout`` is cut."""
        assert self._chunks is not None
        limits = self.limits
        resp = web.StreamResponse(status=reply.status, headers={"Content-Type": reply.content_type})
        resp.content_length = reply.size
        sent = 0
        try:
            async with asyncio.timeout(limits.write_timeout):
                await resp.prepare(request)
            if request.method == "GET":
                while sent < reply.size:
                    async with asyncio.timeout(limits.write_timeout):
                        async with self._chunks:
                            want = min(limits.stream_chunk, reply.size - sent)
                            chunk = await self._loop.run_in_executor(self._pool, reply.file.read, want)
                            if not chunk:
                                raise OSError(f"{path} shrank while it was sent")
                            await resp.write(chunk)
                            sent += len(chunk)
                            del chunk
                await resp.write_eof()
        except (ConnectionError, TimeoutError, OSError) as exc:
            log.debug(
                "%s %s: stopped after %d of %d bytes: %s",
                request.remote,
                path,
                sent,
                reply.size,
                exc or "timed out",
            )
            if request.transport is not None:
                request.transport.abort()
        finally:
            reply.file.close()
        _access_log(request, path, reply.status, sent, start)
        return resp

    async def _reply(self, request: web.BaseRequest, path: str) -> Reply | FileReply:
        if request.method not in ("GET", "HEAD"):
            return Reply(405, f"{request.method} is not supported here; use GET\n".encode())
        if request.body_exists:
            return Reply(413, b"request bodies are not accepted here\n")
        query = dict(request.query.items())
        call = functools.partial(self._call, path, query)
        return await self._loop.run_in_executor(self._pool, call)

    def _call(self, path: str, query: Mapping[str, str]) -> Reply | FileReply:
        try:
            return self.handler(path, query)
        except Exception as exc:  # a bug must not leave the client without an answer
            log.error("%s: error serving %s: %s: %s", self.name, path, type(exc).__name__, exc)
            return Reply(500, f"internal error serving {path}; see the log\n".encode())


def _access_log(request: web.BaseRequest, path: str, status: int, size: int, start: float) -> None:
    """One debug line per answer: client, method, path, status, bytes sent, milliseconds."""
    log.debug(
        "%s %s %s %d %dB %.1fms",
        request.remote,
        request.method,
        path,
        status,
        size,
        (time.perf_counter() - start) * 1000,
    )
