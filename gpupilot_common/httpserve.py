"""A small read-only HTTP server for a service's own endpoints (``/metrics``, ``/health``) on aiohttp's
low-level web server — the choice the adapter made — instead of ``http.server``, which Python's
documentation says is not for production.

One event loop in one thread holds every connection (a slow or idle client costs a few kilobytes, not
a thread); the answers are computed by a plain function ``(path, query) -> Reply`` in a small pool of
worker threads, so the function may block (a registry's ``generate_latest``, a render of a few
milliseconds). Bounds, each a field of :class:`Limits`:

* connections: the loop accepts only while fewer than ``max_connections`` are open; the rest wait in
  the kernel's listen backlog, costing this process nothing;
* a connection that sends no complete request head within ``idle_timeout`` (slowloris), or stays
  idle that long between requests, is closed;
* a request line over ``max_url_bytes`` → 414, a header field over ``max_header_bytes`` or more than
  ``max_headers`` fields → 431, any other malformed request → 400, each closing the connection; a
  request body → 413 (nothing here takes one); a method other than GET/HEAD → 405;
* writing an answer to a client that does not read it: ``write_timeout``, then the connection is cut.

Each request is one DEBUG line (method, path, status, bytes, milliseconds), and so is each refused
one; a failing handler is one ERROR line and a 500. No traceback, in the log or to the client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Self

from aiohttp import http_exceptions, web, web_protocol

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = TEXT


Handler = Callable[[str, Mapping[str, str]], Reply]
"""``(path, query) -> Reply``; runs in a worker thread."""


@dataclasses.dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    """Open connections at once; Prometheus and a kubelet probe need a handful."""
    idle_timeout: float = 15.0
    """Seconds a connection may take to send a complete request head, or stay idle between requests
    (a scrape's interval is longer, so Prometheus reconnects; a connection costs microseconds)."""
    max_url_bytes: int = 8192
    """Request line; ``/metrics?name[]=...`` never needs more."""
    max_header_bytes: int = 8192
    """One header field (name and value)."""
    max_headers: int = 64
    """Header fields per request."""
    write_timeout: float = 30.0
    """Seconds a client may take to read its answer."""
    backlog: int = 128
    """Connections the kernel holds while ``max_connections`` are open."""
    workers: int = 4
    """Threads running the handler."""


class _Protocol(web_protocol.RequestHandler):
    """aiohttp's connection handler with a deadline for writing an answer, and malformed or oversized
    requests answered 400/414/431 with one DEBUG line (aiohttp's own handler logs a traceback)."""

    write_timeout = 30.0
    max_url_bytes = 8192

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        code, text = status, message or "internal error"
        if isinstance(exc, http_exceptions.LineTooLong):
            limit = exc.args[1] if len(exc.args) > 1 else None
            if limit == self.max_url_bytes:
                code, text = 414, f"the request line is longer than {limit} bytes"
            else:
                code, text = 431, f"a request header is longer than {limit} bytes"
        elif isinstance(exc, http_exceptions.BadHttpMessage) and "Too many headers" in str(exc):
            code, text = 431, "too many request headers"
        elif code == 400:
            text = f"malformed HTTP request: {type(exc).__name__ if exc else message}"
        elif code == 500:
            log.error("error serving %s: %s: %s", request.path, type(exc).__name__, exc)
        log.debug("refused a request from %s: %d %s", request.remote, code, text)
        resp = web.Response(status=code, text=text[:300] + "\n")
        resp.force_close()
        return resp

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            async with asyncio.timeout(self.write_timeout):
                return await super().finish_response(request, resp, start_time)
        except TimeoutError:
            log.debug(
                "client %s did not take its answer within %gs; closing", request.remote, self.write_timeout
            )
            self.force_close()
            return resp, True


class _Server(web.Server):
    def __init__(self, handler: Any, *, on_closed: Callable[[], None], limits: Limits, **kw: Any) -> None:
        super().__init__(handler, **kw)
        self._on_closed = on_closed
        self._limits = limits

    def __call__(self) -> web_protocol.RequestHandler:
        proto = _Protocol(
            self,
            loop=self._loop,
            keepalive_timeout=self._limits.idle_timeout,
            access_log=None,  # type: ignore[arg-type]  # one line of our own per request instead
            max_line_size=self._limits.max_url_bytes,
            max_field_size=self._limits.max_header_bytes,
            max_headers=self._limits.max_headers,
            lingering_time=0,
        )
        proto.write_timeout = self._limits.write_timeout
        proto.max_url_bytes = self._limits.max_url_bytes
        return proto

    def connection_lost(self, handler: web_protocol.RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._on_closed()


class HTTPServer:
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
        self.handler = handler
        self.limits = limits or Limits()
        self.name = name
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(self.limits.backlog)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.limits.workers, thread_name_prefix=name)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._server: _Server | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._stopped = threading.Event()
        self.open_connections = 0

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return self.address[1]

    # -- lifecycle -------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`close` (from another thread or a signal handler)."""
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._setup())
        self._loop.run_forever()
        self._stopped.set()

    def start(self) -> Self:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        async def stop() -> None:
            if self._accepting is not None:
                self._accepting.cancel()
            if self._server is not None:
                await self._server.shutdown(1.0)

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._stopped.wait(5)
        elif not self._loop.is_closed() and self._server is not None:  # interrupted serve_forever
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(stop())
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    async def _setup(self) -> None:
        self._slots = asyncio.Semaphore(self.limits.max_connections)
        self._server = _Server(self._handle, on_closed=self._release, limits=self.limits, loop=self._loop)
        self._accepting = self._loop.create_task(self._accept_loop())

    # -- connections -----------------------------------------------------------------------------
    def _release(self) -> None:
        self.open_connections -= 1
        assert self._slots is not None
        self._slots.release()

    async def _accept_loop(self) -> None:
        assert self._slots is not None and self._server is not None
        while True:
            await self._slots.acquire()  # at the limit, new clients wait in the kernel's backlog
            try:
                conn, _peer = await self._loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and friends: wait, do not spin
                self._slots.release()
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            self.open_connections += 1
            try:
                await self._loop.connect_accepted_socket(self._server, conn)
            except OSError as exc:  # reset before we got to it
                log.debug("%s: connection dropped at accept: %s", self.name, exc)
                conn.close()
                self._release()

    # -- requests --------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        path = request.path or "/"
        reply = await self._reply(request, path)
        resp = web.Response(
            status=reply.status, body=reply.body, headers={"Content-Type": reply.content_type}
        )
        if reply.status in (405, 413):
            resp.force_close()  # an unread body must not be parsed as the next request
        log.debug(
            "%s %s %s %d %dB %.1fms",
            request.remote,
            request.method,
            path,
            reply.status,
            len(reply.body),
            (time.perf_counter() - start) * 1000,
        )
        return resp

    async def _reply(self, request: web.BaseRequest, path: str) -> Reply:
        if request.method not in ("GET", "HEAD"):
            return Reply(405, f"{request.method} is not supported here; use GET\n".encode())
        if request.body_exists:
            return Reply(413, b"request bodies are not accepted here\n")
        query = dict(request.query.items())
        call = functools.partial(self._call, path, query)
        return await self._loop.run_in_executor(self._pool, call)

    def _call(self, path: str, query: Mapping[str, str]) -> Reply:
        try:
            return self.handler(path, query)
        except Exception as exc:  # a bug must not leave the client without an answer
            log.error("%s: error serving %s: %s: %s", self.name, path, type(exc).__name__, exc)
            return Reply(500, f"internal error serving {path}; see the log\n".encode())
