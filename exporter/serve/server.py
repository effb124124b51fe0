"""The exporter's HTTP(S) endpoint: ``/metrics``, ``/health``, ``/ready``.

HTTP/1.1 requests parsed by httptools (llhttp, Node.js's C parser, as uvicorn uses it) on one asyncio
event loop in its own thread; this module routes, formats answers from cached heads and bounds
memory and time per connection (see :class:`_Connection`). Every response to
``/metrics`` is a lookup in the collector's current :class:`~exporter.expose.render.Page` (pre-rendered in
both formats, plain and gzip) plus the snapshot-age line, so a scrape never touches the backend and
costs tens of microseconds; one thread and no locks means 16 concurrent scrapers do not fight over
the GIL. Keep-alive, HEAD, content negotiation (OpenMetrics when ``Accept`` prefers
``application/openmetrics-text``; gzip when ``Accept-Encoding`` allows it), TLS and basic auth
(``--web-config``; bcrypt verdicts cached, misses verified off the loop). ``/health`` and ``/ready``
are not behind basic auth so that kubelet probes need no secret; they reveal nothing but state.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import httptools

from exporter.errors import ConfigError
from exporter.expose.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Page
from exporter.serve.webconfig import BasicAuth, ServingTls, WebConfig
from gpupilot_common import loops
from gpupilot_common.qvalues import q_values

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""A request line and headers larger than this get 431."""
READ_CHUNK_BYTES = 4 * 1024
"""What one read from a client's socket may bring in (the protocol's receive buffer). The size of an
incomplete head is checked after each read, counting the whole read in which it began, against
``MAX_HEAD_BYTES - READ_CHUNK_BYTES``: so heads up to 8 KiB are always accepted and none above
``MAX_HEAD_BYTES`` ever is (a Prometheus scrape request is about 300 bytes)."""
WRITE_HIGH_WATER = 64 * 1024
"""Send-buffer size above which a connection stops reading requests until its client reads."""
MAX_CONNECTIONS = 128
"""Open connections at most. With the per-connection bounds above this caps what all clients
together can make the exporter hold (a few MiB plus answers in flight; Prometheus needs one
connection per scraping server, kubelet probes one each). A connection beyond it takes the place of
the one that has waited longest for a complete request head (anonymous before one with a verified
client certificate; never one being answered); with none such, the new one is closed at once."""
IDLE_TIMEOUT_S = 120.0
"""A connection on which nothing arrives for this long is closed."""
HEAD_TIMEOUT_S = 10.0
"""A request head not complete this long after its first byte gets 408 and the connection closes
(a client trickling bytes would otherwise hold a connection as long as it likes); a new connection
that sends no complete head this long after it opened is closed (like Go's ``ReadHeaderTimeout``)."""
LINGER_S = 2.0
"""After a last answer, how long what the client still sends is read and dropped before closing."""
CLOSE_TIMEOUT_S = 30.0
"""A closing connection whose client does not read the rest of its answer is aborted after this."""
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_LANDING = (
    b"<html><head><title>gpupilot exporter</title></head><body><h1>gpupilot exporter</h1>"
    b'<p><a href="/metrics">/metrics</a> &middot; <a href="/health">/health</a> &middot; '
    b'<a href="/ready">/ready</a></p></body></html>\n'
)


class PageSource(Protocol):
    """What the server needs from the collector."""

    @property
    def page(self) -> Page: ...

    def readiness(self) -> tuple[bool, str]: ...


@functools.lru_cache(maxsize=64)
def wants_openmetrics(accept: str) -> bool:
    if "openmetrics" not in accept:
        return False
    q = q_values(accept)
    om = q.get("application/openmetrics-text", 0.0)
    text = max(q.get("text/plain", 0.0), q.get("text/*", 0.0), q.get("*/*", 0.0))
    return om > 0 and om >= text


@functools.lru_cache(maxsize=64)
def accepts_gzip(accept_encoding: str) -> bool:
    if "gzip" not in accept_encoding:
        return False
    return q_values(accept_encoding).get("gzip", 0.0) > 0


class _Refused(Exception):
    """Raised from a parser callback: answer ``status`` and close the connection."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Request(NamedTuple):
    """What the routes read from one request (collected by the parser callbacks)."""

    method: str
    path: str
    accept: str
    accept_encoding: str
    authorization: str | None
    keep_alive: bool


@functools.lru_cache(maxsize=256)
def _response_head(
    status: int,
    ctype: str,
    length: int,
    headers: tuple[tuple[str, str], ...],
    close: bool,  # positional: an lru_cache key is cheaper without keywords
) -> bytes:
    """Status line and headers, cached: a scraper gets the same few heads over and over (the page
    length changes once per collection). Formatting only; every value here is ours or web-config's
    (checked at load: header names are tokens, values one-line ASCII)."""
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        f"Content-Type: {ctype}",
        f"Content-Length: {length}",
        *(f"{name}: {value}" for name, value in headers),
    ]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _App:
    """Routing and responses; shared by every connection."""

    def __init__(
        self,
        source: PageSource,
        *,
        auth: BasicAuth | None,
        extra_headers: Mapping[str, str],
        clock: Callable[[], float],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.source, self.auth, self.clock = source, auth, clock
        self.max_connections = max_connections
        self.extra = tuple(extra_headers.items())
        self.connections: set[_Connection] = set()
        self.shed = 0
        """Connections closed to make room for a new one."""
        self._refused_logged_at = -math.inf

    def make_room(self) -> bool:
        """At the limit: close the connection that has waited longest for a request head, anonymous
        ones first (closing ones before all); False when every connection is being answered."""
        candidates = [c for c in self.connections if c.awaiting_head()]
        if not candidates:
            return False
        oldest = min(candidates, key=lambda c: (c.trusted, c.waiting_since))
        oldest.shed()
        self.shed += 1
        log.debug("at %d connections: closed the longest waiting for a request head", len(self.connections))
        return True

    def refused_connection(self) -> None:
        now = time.monotonic()
        if now - self._refused_logged_at >= 60:  # at most one line a minute
            self._refused_logged_at = now
            log.warning(
                "refusing connections: %d are open, the most this exporter holds", self.max_connections
            )

    def response(
        self, req: _Request, *, authorized: bool
    ) -> tuple[int, str, tuple[bytes, ...], tuple[tuple[str, str], ...]]:
        """(status, content type, body in pieces, extra headers) for one request."""
        if req.method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", (b"only GET and HEAD\n",), (("Allow", "GET, HEAD"),)
        if req.path == "/metrics":
            if not authorized:
                challenge = (("WWW-Authenticate", 'Basic realm="gpupilot-exporter"'),)
                return 401, "text/plain; charset=utf-8", (b"unauthorized\n",), challenge
            page = self.source.page
            om = page.negotiate(wants_openmetrics=wants_openmetrics(req.accept))
            gz = accepts_gzip(req.accept_encoding)
            body = page.parts(openmetrics=om, gzip=gz, now=self.clock())
            ctype = OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE
            enc = (("Content-Encoding", "gzip"),) if gz else ()
            return 200, ctype, body, (*enc, ("Vary", "Accept, Accept-Encoding"))
        if req.path == "/health":
            return 200, "text/plain; charset=utf-8", (b"ok\n",), ()
        if req.path == "/ready":
            ok, why = self.source.readiness()
            return (200 if ok else 503), "text/plain; charset=utf-8", (why.encode() + b"\n",), ()
        if req.path == "/":
            return 200, "text/html; charset=utf-8", (_LANDING,), ()
        return 404, "text/plain; charset=utf-8", (b"not found; try /metrics\n",), ()


class _Connection(asyncio.BufferedProtocol):
    """One client connection: httptools parses, this class routes and bounds what is held in memory.

    httptools parses whatever it is fed in one call, pipelined requests included, calling back for
    each part of each request. A request whose answer cannot be written now — a bcrypt check for an
    earlier one is running, or the transport's send buffer is above its high-water mark because the
    client does not read — waits in ``pending`` and reading stops until it is answered. So a
    connection holds at most one receive chunk, the requests parsed from it, one incomplete request
    head (under ``MAX_HEAD_BYTES``; more is a 431) and one send buffer (``WRITE_HIGH_WATER`` plus
    the answer being written)."""

    def __init__(self, app: _App) -> None:
        self.app = app
        self.parser = httptools.HttpRequestParser(self)
        self.recv = bytearray(READ_CHUNK_BYTES)
        self.view = memoryview(self.recv)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Request] = deque()
        self.waiting = False  # a bcrypt check holds back the next answer
        self.write_paused = False
        self.reading = True
        self.eof = False  # the client has half-closed; close once everything it sent is answered
        self.stopped = False  # nothing more is parsed: an error answer or a close is due
        self.error: int | None = None  # the error answer due after the pending ones
        self.last_active = time.monotonic()
        self.connected_at = self.last_active
        self.first_head = True  # no request head complete yet on this connection
        self.waiting_since = self.last_active
        """Since when this connection waits for a request head: its start, or its last answer."""
        self.closing: asyncio.Transport | None = None  # lingering after a last answer
        self._trusted: bool | None = None
        self.lost = False  # the transport has reported the connection closed
        # the request being parsed
        self.chunk = 0
        self.in_head = False
        self.head_bytes = 0
        self.head_started = 0.0
        self.url = b""
        self.accept = self.accept_encoding = ""
        self.authorization: str | None = None
        self.has_body = self.has_host = False
        self.keep_alive = True
        self.method = ""

    # -- transport callbacks ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self.app.connections) >= self.app.max_connections and not self.app.make_room():
            self.app.refused_connection()
            transport.abort()
            return
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.app.connections.add(self)
        asyncio.get_running_loop().call_later(min(IDLE_TIMEOUT_S, HEAD_TIMEOUT_S), self._timeout_check)

    # -- making room ------------------------------------------------------------------------
    @property
    def trusted(self) -> bool:
        """The client's certificate was verified in the TLS handshake (``client_ca_file``)."""
        if self._trusted is None:
            transport = self.transport
            self._trusted = bool(transport is not None and transport.get_extra_info("peercert"))
        return self._trusted

    def awaiting_head(self) -> bool:
        """Nothing being answered: a new, idle or trickling connection, or one lingering after its
        last answer (those first: their ``waiting_since`` is -inf)."""
        if self.closing is not None:
            return True
        transport = self.transport
        return (
            transport is not None
            and not self.pending
            and not self.waiting
            and not self.stopped
            and transport.get_write_buffer_size() == 0
        )

    def shed(self) -> None:
        transport = self.transport or self.closing
        self.transport = self.closing = None
        self.stopped = True
        if transport is not None:
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = self.closing = None
        self.lost = True
        self.pending.clear()
        self.app.connections.discard(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        if self.transport is None or self.stopped:
            return  # closing: whatever else arrives is dropped
        self.last_active = time.monotonic()
        self.chunk = nbytes
        if self.in_head:
            self.head_bytes += nbytes
        try:
            self.parser.feed_data(self.view[:nbytes])
        except httptools.HttpParserUpgrade:
            self.stopped = True  # the upgrade request is answered as plain HTTP, then we close
        except httptools.HttpParserError as exc:
            self._refuse(self._error_status(exc))
        else:
            # An over-estimate by less than one chunk (the part of the chunk before the head
            # began), checked after each chunk: no head above MAX_HEAD_BYTES is ever accepted.
            if self.in_head and self.head_bytes > MAX_HEAD_BYTES - READ_CHUNK_BYTES:
                self._refuse(431)
        self._drain()

    def eof_received(self) -> bool:
        transport = self.transport
        if transport is None or not (self.pending or self.waiting) or not transport.can_write_eof():
            return False  # close our side too (TLS cannot stay half-open)
        self.eof = True  # answer what was asked first
        self.stopped = True
        return True

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._drain()

    def _timeout_check(self) -> None:
        """Close a connection idle for ``IDLE_TIMEOUT_S``; answer 408 to a request head that has
        not arrived ``HEAD_TIMEOUT_S`` after its first byte (a client trickling bytes)."""
        if self.transport is None:
            return
        now = time.monotonic()
        if self.in_head and now - self.head_started >= HEAD_TIMEOUT_S:
            self._refuse(408)
            self._drain()
            return
        if self.first_head and not self.in_head and now - self.connected_at >= HEAD_TIMEOUT_S:
            self._close()  # not a byte of a request since it opened
            return
        idle = now - self.last_active
        if idle >= IDLE_TIMEOUT_S:
            self._close()
            return
        due = IDLE_TIMEOUT_S - idle
        if self.in_head:
            due = min(due, HEAD_TIMEOUT_S - (now - self.head_started))
        elif self.first_head:
            due = min(due, HEAD_TIMEOUT_S - (now - self.connected_at))
        asyncio.get_running_loop().call_later(due, self._timeout_check)

    # -- parser callbacks (httptools) -------------------------------------------------------
    def on_message_begin(self) -> None:
        self.in_head = True
        self.head_bytes = self.chunk  # this whole chunk: where in it the head began is not known
        self.head_started = self.last_active
        self.url = b""
        self.accept = self.accept_encoding = ""
        self.authorization = None
        self.has_body = self.has_host = False

    def on_url(self, url: bytes) -> None:
        self.url += url  # in pieces when the request line spans reads; bounded by the head limit

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"accept":
            self.accept = value.decode("latin-1")
        elif name == b"accept-encoding":
            self.accept_encoding = value.decode("latin-1")
        elif name == b"authorization":
            self.authorization = value.decode("latin-1")
        elif name == b"host":
            self.has_host = True
        elif name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            self.has_body = True

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.first_head = False
        parser = self.parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _Refused(505)
        if self.has_body:
            raise _Refused(400)  # only GET and HEAD are served: a body is refused, not read
        if version == "1.1" and not self.has_host:
            raise _Refused(400)  # RFC 9112 section 3.2: a server MUST answer 400
        # HTTP/1.0 clients get one answer per connection; an upgrade is answered as plain HTTP
        self.keep_alive = version == "1.1" and parser.should_keep_alive() and not parser.should_upgrade()
        self.method = parser.get_method().decode("ascii", "replace")

    def on_message_complete(self) -> None:
        if self.stopped:
            return  # pipelined after a request that closes the connection: not answered
        req = _Request(
            self.method,
            self.url.partition(b"?")[0].decode("ascii", "replace"),
            self.accept,
            self.accept_encoding,
            self.authorization,
            self.keep_alive,
        )
        if not self.keep_alive:
            self.stopped = True  # this is the last request read from this connection
        if self.pending or self.waiting or self.write_paused:
            self.pending.append(req)  # bounded by what one chunk holds: reading stops below
        else:
            self._handle(req)

    def _error_status(self, exc: httptools.HttpParserError) -> int:
        if isinstance(exc.__context__, _Refused):
            return exc.__context__.status
        # llhttp refuses versions other than 0.9, 1.x, 2.0 and 3.0 (and HTTP/2's preface) itself
        return 400 if self.parser.get_http_version() in ("0.0", "1.0", "1.1") else 505

    # -- answers ----------------------------------------------------------------------------
    def _set_reading(self, on: bool) -> None:
        if self.transport is not None and on != self.reading:
            self.reading = on
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _refuse(self, status: int) -> None:
        """Answer ``status`` after the requests already parsed, then close: the stream cannot be
        trusted past a malformed or refused request."""
        self.stopped = True
        self.in_head = False
        self.error = status

    def _drain(self) -> None:
        """Answer pending requests while answers can be written; then the due error, or the close
        the client asked for; else read on."""
        while self.transport is not None:
            if self.waiting or self.write_paused:
                self._set_reading(False)  # the client's further requests wait in its own buffers
                return
            if not self.pending:
                break
            self._handle(self.pending.popleft())
        if self.transport is None:
            return
        if self.error is not None:
            status, self.error = self.error, None
            body = (f"{status} {_REASONS.get(status, 'Error')}\n".encode(),)
            self._write(status, "text/plain; charset=utf-8", body, (), close=True)
        elif self.eof:
            self._close()
        else:
            self._set_reading(not self.stopped)

    def _handle(self, req: _Request) -> None:
        auth = self.app.auth
        if auth is None or req.path != "/metrics":
            self._respond(req, authorized=True)
            return
        verdict = auth.cached(req.authorization)
        if verdict is not None:
            self._respond(req, authorized=verdict)
            return
        self.waiting = True  # bcrypt costs tens of ms: verify off the loop, keep others served
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, auth.check, req.authorization)
        future.add_done_callback(lambda f: self._verified(req, f))

    def _verified(self, req: _Request, future: asyncio.Future[bool]) -> None:
        self.waiting = False
        ok = not future.cancelled() and future.exception() is None and future.result()
        if self.transport is not None:
            self._respond(req, authorized=ok)
            self._drain()

    def _respond(self, req: _Request, *, authorized: bool) -> None:
        try:
            status, ctype, body, headers = self.app.response(req, authorized=authorized)
        except Exception:  # never a traceback to the client; the server keeps running
            log.exception("error answering %s %s", req.method, req.path)
            status, ctype, body, headers = 500, "text/plain; charset=utf-8", (b"internal error\n",), ()
        self._write(status, ctype, body, headers, close=not req.keep_alive, head_only=req.method == "HEAD")

    def _write(
        self,
        status: int,
        ctype: str,
        body: tuple[bytes, ...],
        headers: tuple[tuple[str, str], ...],
        *,
        close: bool,
        head_only: bool = False,
    ) -> None:
        if self.transport is None:
            return
        length = sum(map(len, body))
        head = _response_head(status, ctype, length, headers + self.app.extra, close)
        self.transport.write(head if head_only else b"".join((head, *body)))  # one copy of the body
        self.waiting_since = time.monotonic()
        if close:
            self._close(linger=True)

    def _close(self, *, linger: bool = False) -> None:
        """Write nothing more and close once what is buffered is sent. ``linger``, after a last
        answer the client may still be sending behind (pipelined requests, the rest of a refused
        head): half-close and read and drop what arrives for ``LINGER_S``, so that unread input does
        not make the kernel reset the connection and destroy the answer in flight (RFC 9112
        section 9.6). The connection counts against ``max_connections`` until it is gone."""
        transport = self.transport
        if transport is None:
            return
        self.transport = None
        self.closing = transport
        self.waiting_since = -math.inf
        self.stopped = True
        self.pending.clear()
        if linger and transport.can_write_eof():  # not TLS: a TLS close_notify is a close
            transport.write_eof()  # FIN after the buffered answer
            transport.resume_reading()
        else:
            transport.close()
        loop = asyncio.get_running_loop()
        loop.call_later(LINGER_S, self._reap, transport, loop.time() + CLOSE_TIMEOUT_S)

    def _reap(self, transport: asyncio.Transport, give_up_at: float) -> None:
        """Close a lingering connection whose answers are sent; abort one whose client has not
        read them by ``give_up_at`` (its buffered answer would be held for as long as it likes)."""
        if self.lost:
            return
        loop = asyncio.get_running_loop()
        if transport.get_write_buffer_size() == 0:
            transport.close()
        elif loop.time() >= give_up_at:
            transport.abort()
        else:
            loop.call_later(LINGER_S, self._reap, transport, give_up_at)


class MetricsServer:
    """Serves a :class:`PageSource` over HTTP(S) from a background thread."""

    def __init__(
        self,
        source: PageSource,
        *,
        host: str = "",
        port: int = 9400,
        web_config: WebConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_connections: int = MAX_CONNECTIONS,
        failures: loops.LoopFailures | None = None,
    ) -> None:
        """``failures``: where a TLS reload that failed is counted (see :class:`ServingTls`)."""
        self.host = host
        self.port = port
        self.tls = (
            ServingTls(web_config, failures=failures) if web_config is not None and web_config.tls else None
        )
        self._ssl: ssl.SSLContext | None = self.tls.context if self.tls is not None else None
        self._app = _App(
            source,
            auth=web_config.authenticator() if web_config else None,
            extra_headers=web_config.headers if web_config else {},
            clock=clock,
            max_connections=max_connections,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self._ssl else "http"
        host = self.host or "127.0.0.1"
        return f"{scheme}://{host}:{self.port}"

    def start(self) -> MetricsServer:
        """Bind and serve; raises ConfigError (one line) when the address cannot be bound."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(
                        lambda: _Connection(self._app),
                        host=self.host or None,
                        port=self.port,
                        ssl=self._ssl,
                        ssl_handshake_timeout=10.0 if self._ssl else None,
                        reuse_address=True,
                        backlog=256,
                    )
                )
            except OSError as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            sock = self._server.sockets[0]
            self.port = int(sock.getsockname()[1])
            ready.set()
            try:
                loop.run_forever()
            finally:
                self._server.close()
                for conn in list(self._app.connections):
                    if conn.transport is not None:
                        conn.transport.abort()
                loop.run_until_complete(self._server.wait_closed())
                loop.close()

        self._thread = threading.Thread(target=run, name="http", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            exc = failure[0]
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(
                f"--listen {self.host}:{self.port}: cannot listen ({reason}); choose a free HOST:PORT"
            )
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    def __enter__(self) -> MetricsServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
