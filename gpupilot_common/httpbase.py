"""What every HTTP server of the project built on aiohttp's low-level web server shares: the
listening socket, one event loop in one thread holding every connection (a slow or idle client costs
a few kilobytes, not a thread), a pool of worker threads, and the bounds.

* connections: at most ``max_connections`` are open. When all are taken and another client waits in
  the kernel's listen backlog (``backlog``), the connection that has waited longest for a complete
  request head (a silent or slow client, an idle keep-alive one) is cut to make room: anonymous
  ones first, those of a trusted client (:attr:`BoundedProtocol.trusted`: a verified client
  certificate) only when no anonymous one is left. Connections with a request being answered are
  never cut for room, so probes and trusted callers get in however many slow clients hold the rest;
* a request head must be complete within ``header_timeout`` seconds (like Go's
  ``ReadHeaderTimeout``): counted from the accept (after the TLS handshake where there is one), and
  on a kept-alive connection from the first byte of the next head; a connection idle between
  requests is closed after ``idle_timeout``;
* a request line over ``max_url_bytes`` → 414, a header field over ``max_header_bytes`` or more than
  ``max_headers`` fields → 431, any other malformed request → 400, each one DEBUG line, an answer
  the server renders (:meth:`BoundedProtocol.refusal_response`) and a closed connection; a handler
  that raises → 500 and one ERROR line; no traceback, in the log or to the client;
* writing an answer to a client that does not read it: ``write_timeout``, then the connection is cut.

:class:`LoopServer` is the base: :mod:`gpupilot_common.httpserve` (the rightsizer's and the
simulator's ``/metrics`` and ``/health``) and the adapter's HTTPS server each add their request
handler, and the adapter its TLS handshakes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import re
import socket
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, Self, TypeVar

from aiohttp import http_exceptions, web, web_protocol

from gpupilot_common import logs

log = logging.getLogger(__name__)

TEXT = "text/plain; charset=utf-8"


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """One answer: status, body and its content type."""

    status: int
    body: bytes
    content_type: str = TEXT


class ConnectionLimits(Protocol):
    """The bounds :class:`LoopServer` enforces (``gpupilot_common.httpserve.Limits``, the adapter's
    ``ServerLimits``)."""

    @property
    def max_connections(self) -> int: ...
    @property
    def idle_timeout(self) -> float: ...
    @property
    def header_timeout(self) -> float: ...
    @property
    def write_timeout(self) -> float: ...
    @property
    def max_url_bytes(self) -> int: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def max_headers(self) -> int: ...
    @property
    def backlog(self) -> int: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    reason: str
    """``metav1.Status`` reason (``RequestURITooLong``, ``BadRequest`` …)."""
    message: str


_REQUEST_LINE = re.compile(rb"(/|\*|https?://|[A-Z]+ )")
"""How what aiohttp quotes of a line too long starts when it is the request line or its URL (a header
is quoted as its name, its value or both)."""


def refusal(
    status: int,
    exc: BaseException | None,
    message: str | None,
    *,
    max_url_bytes: int,
    max_header_bytes: int | None = None,
) -> Refusal:
    """What aiohttp's call to ``handle_error`` means: the one status → answer mapping of both servers.
    A line over the limit is the request line (414) when the limit is the URL's and, where both limits
    are equal, what was quoted of it looks like a request line or URL; any other is a header (431)."""
    if isinstance(exc, http_exceptions.LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else None
        quoted = bytes(exc.args[0]) if exc.args and isinstance(exc.args[0], bytes | bytearray) else b""
        ambiguous = max_header_bytes is None or max_header_bytes == max_url_bytes
        if limit == max_url_bytes and (not ambiguous or _REQUEST_LINE.match(quoted)):
            return Refusal(414, "RequestURITooLong", f"the request line is longer than {limit} bytes")
        return Refusal(431, "RequestHeaderFieldsTooLarge", f"a request header is longer than {limit} bytes")
    if isinstance(exc, http_exceptions.BadHttpMessage) and "Too many headers" in str(exc):
        return Refusal(431, "RequestHeaderFieldsTooLarge", "too many request headers")
    if status == 400:
        detail = getattr(exc, "message", None) or exc or message
        text = " ".join(str(detail).split())  # aiohttp's messages span lines; a log line must not
        return Refusal(400, "BadRequest", f"malformed HTTP request: {text}"[:300])
    return Refusal(status, "InternalError", message or "internal error")


class BoundedProtocol(web_protocol.RequestHandler):
    """aiohttp's connection handler with a deadline for a request head and one for writing an answer,
    malformed or oversized requests answered through :func:`refusal` in one DEBUG line (aiohttp's own
    logs a traceback), and what the server needs to choose a connection to cut (:meth:`awaiting_head`,
    :attr:`waiting_since`, :attr:`trusted`, :meth:`shed`)."""

    write_timeout = 30.0
    max_url_bytes = 8192
    max_header_bytes = 8190
    header_timeout = 10.0
    waiting_since = 0.0
    """Loop time since which this connection waits for a request head: its accept, or the end of its
    last answer."""
    _head_done = False
    _head_timer: asyncio.TimerHandle | None = None

    @property
    def trusted(self) -> bool:
        """Whether the client proved who it is (a verified client certificate); never cut for room
        while an anonymous connection can be."""
        return False

    def awaiting_head(self) -> bool:
        """No complete request head yet (a new connection, a slow one, one idle between requests)."""
        return not self._head_done and not self._force_close

    def shed(self) -> None:
        """Cut the connection at once (no TLS close_notify wait): its slot is wanted."""
        transport = self.transport
        self.force_close()
        if transport is not None:
            transport.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.waiting_since = self._loop.time()
        self._start_head_clock()
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_clock()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._head_done and self._head_timer is None:  # the first byte of a kept-alive head
            self._start_head_clock()
        super().data_received(data)
        if self._messages:
            self._head_done = True
            self._stop_head_clock()

    def _start_head_clock(self) -> None:
        self._head_timer = self._loop.call_later(self.header_timeout, self._head_overdue)

    def _stop_head_clock(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.awaiting_head():
            peer = self.transport.get_extra_info("peername") if self.transport is not None else None
            log.debug(
                "no complete request head from %s within %gs; closing", logs.peer(peer), self.header_timeout
            )
            self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        refused = refusal(
            status, exc, message, max_url_bytes=self.max_url_bytes, max_header_bytes=self.max_header_bytes
        )
        if refused.status == 500:
            log.error("error serving %s: %s: %s", request.path, type(exc).__name__, exc)
        log.debug("refused a request from %s: %d %s", request.remote, refused.status, refused.message)
        resp = self.refusal_response(refused)
        resp.force_close()
        return resp

    def refusal_response(self, refused: Refusal) -> web.Response:
        """The answer to a refused request (plain text here)."""
        return web.Response(status=refused.status, text=refused.message + "\n")

    async def _drain_helper(self) -> None:
        """Wait for the client to take what was written, up to ``write_timeout``. Only a client that
        leaves the transport's buffer above its high-water mark makes a response wait here, so the
        deadline costs nothing on the way of an answer the socket takes at once."""
        async with asyncio.timeout(self.write_timeout):
            await super()._drain_helper()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        except TimeoutError:
            log.debug(
                "client %s did not take its answer within %gs; closing", request.remote, self.write_timeout
            )
            self.force_close()
            return resp, True
        finally:  # answered: what comes next is a new head (unless one is queued already)
            self._head_done = bool(self._messages)
            self.waiting_since = self._loop.time()


class _Server(web.Server):
    """Makes each connection's protocol with the limits, and reports each closed connection (its
    TLS handshake included) so the accept loop can stop at the limit."""

    def __init__(
        self,
        handler: Any,
        *,
        protocol: type[BoundedProtocol],
        on_closed: Callable[[], None],
        limits: ConnectionLimits,
        **kw: Any,
    ) -> None:
        super().__init__(handler, **kw)
        self._protocol = protocol
        self._on_closed = on_closed
        self._limits = limits
        self.open: dict[BoundedProtocol, None] = {}
        """Connections past their TLS handshake, oldest first."""

    def __call__(self) -> web_protocol.RequestHandler:
        proto = self._protocol(
            self,
            loop=self._loop,
            keepalive_timeout=self._limits.idle_timeout,
            access_log=None,  # type: ignore[arg-type]  # each server logs or counts requests itself
            max_line_size=self._limits.max_url_bytes,
            max_field_size=self._limits.max_header_bytes,
            max_headers=self._limits.max_headers,
            lingering_time=0,
        )
        proto.write_timeout = self._limits.write_timeout
        proto.max_url_bytes = self._limits.max_url_bytes
        proto.max_header_bytes = self._limits.max_header_bytes
        proto.header_timeout = self._limits.header_timeout
        return proto

    def connection_made(self, handler: web_protocol.RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if isinstance(handler, BoundedProtocol):
            self.open[handler] = None

    def connection_lost(self, handler: web_protocol.RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self.open.pop(handler, None)  # type: ignore[call-overload]
        self._on_closed()


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A non-blocking listening socket on ``host:port`` (0: a free port); OSError when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


L = TypeVar("L", bound=ConnectionLimits)


class LoopServer(Generic[L]):
    """Listens on ``host:port`` when constructed; :meth:`start` serves in a background thread,
    :meth:`serve_forever` in the calling one; :meth:`close` stops and frees the port. A subclass
    answers requests in :meth:`_handle` (on the loop; blocking work goes to ``self._pool``)."""

    protocol: type[BoundedProtocol] = BoundedProtocol
    stop_wait_s: float = 5.0
    """How long :meth:`close` waits for the orderly stop (connections' last answers) before it stops
    the loop anyway; what is left then is cancelled and unwound on the loop."""

    def __init__(self, host: str, port: int, *, limits: L, workers: int, name: str, pool_name: str) -> None:
        self.name = name
        self.limits = limits
        self._sock = listen(host, port, limits.backlog)
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=pool_name)
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._freed: asyncio.Event | None = None
        self._server: _Server | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self.open_connections = 0
        self.shed_connections = 0
        """Connections cut to make room for a client waiting in the backlog."""

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
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._finish_tasks()
            self._stopped.set()

    def _finish_tasks(self) -> None:
        """Cancel what is left on the stopped loop and let it unwind (as ``asyncio.run`` does): a
        task left pending is destroyed with the loop, which asyncio logs as an error."""
        left = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in left:
            task.cancel()
        if left:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))

    def start(self) -> Self:
        """Serve in a background thread (returns once the loop accepts)."""
        self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def close(self) -> None:
        """Stop accepting, close every connection (one second for answers being written), free the
        port, the workers and the loop. Safe to call twice."""
        if self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(self.stop_wait_s)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._stopped.wait(5)
        elif not self._loop.is_closed() and self._server is not None:  # interrupted serve_forever
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._stop())
            self._finish_tasks()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()

    async def _setup(self) -> None:
        self._freed = asyncio.Event()
        self._server = _Server(
            self._handle, protocol=self.protocol, on_closed=self._release, limits=self.limits, loop=self._loop
        )
        self._accepting = self._loop.create_task(self._accept_loop())

    async def _stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        await self._cancel_connecting()
        if self._server is not None:
            await self._server.shutdown(1.0)

    async def _cancel_connecting(self) -> None:
        """Close connections accepted but not yet handed to aiohttp (none here)."""

    # -- connections -----------------------------------------------------------------------------
    def _release(self) -> None:
        self.open_connections -= 1
        assert self._freed is not None
        self._freed.set()

    AT_LIMIT_TICK = 0.25
    """Seconds between calls of :meth:`_at_limit` while every connection is taken."""

    async def _wait_for_slot(self) -> None:
        """Until fewer than ``max_connections`` are open. Meanwhile, whenever a client waits in the
        backlog, the connection that has waited longest for a request head is cut for it (an
        anonymous one before a trusted one); with none to cut, the client waits for a slot."""
        assert self._freed is not None
        watch_backlog = True  # False while every connection is being answered (nothing to cut)
        while self.open_connections >= self.limits.max_connections:
            self._freed.clear()
            waiting = self._loop.create_future()
            fd = self._sock.fileno()

            def backlog(fut: asyncio.Future[None] = waiting) -> None:
                if not fut.done():
                    fut.set_result(None)

            if watch_backlog:
                self._loop.add_reader(fd, backlog)
            freed = self._loop.create_task(self._freed.wait())
            try:
                await asyncio.wait(
                    (waiting, freed), timeout=self.AT_LIMIT_TICK, return_when="FIRST_COMPLETED"
                )
            finally:
                if watch_backlog:
                    self._loop.remove_reader(fd)
                freed.cancel()
                waiting.cancel()
            if self.open_connections < self.limits.max_connections:
                return
            watch_backlog = True  # after a tick or a close without a cut, look at the backlog again
            self._at_limit()
            if not (waiting.done() and not waiting.cancelled()):
                continue
            if not self._shed_one():
                watch_backlog = False  # the listening socket stays readable: do not spin on it
                continue
            if self.open_connections >= self.limits.max_connections:
                # the slot is freed when the loop runs the cut connection's connection_lost
                self._freed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._freed.wait(), 1.0)

    def _at_limit(self) -> None:
        """Called every :attr:`AT_LIMIT_TICK` seconds, and whenever a client waits, while every
        connection is taken (nothing to do here)."""

    def _incomplete(self) -> list[tuple[float, bool, Callable[[], None]]]:
        """(waiting since, trusted, cut) of each connection without a complete request head."""
        assert self._server is not None
        return [(p.waiting_since, p.trusted, p.shed) for p in self._server.open if p.awaiting_head()]

    def _shed_one(self) -> bool:
        """Cut the connection that has waited longest for a request head, anonymous ones first."""
        candidates = self._incomplete()
        if not candidates:
            return False
        _since, trusted, cut = min(candidates, key=lambda c: (c[1], c[0]))
        self.shed_connections += 1
        log.debug(
            "%s: at %d connections: cut the longest %s one without a request head for a waiting client",
            self.name,
            self.open_connections,
            "trusted" if trusted else "anonymous",
        )
        cut()
        return True

    async def _accept_loop(self) -> None:
        while True:
            await self._wait_for_slot()
            try:
                conn, peer = await self._loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and friends: wait, do not spin
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            self.open_connections += 1
            await self._accepted(conn, peer)

    async def _accepted(self, conn: socket.socket, peer: Any) -> None:
        """Hand an accepted socket (counted already) to aiohttp."""
        assert self._server is not None
        try:
            await self._loop.connect_accepted_socket(self._server, conn)
        except OSError as exc:  # reset before we got to it
            log.debug("%s: connection dropped at accept: %s", self.name, exc)
            conn.close()
            self._release()

    # -- requests --------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raise NotImplementedError
