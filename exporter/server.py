"""The exporter's HTTP(S) endpoint: ``/metrics``, ``/health``, ``/ready``.

HTTP/1.1 by h11 (the protocol: parsing, keep-alive, pipelining, framing) on one asyncio event loop
in its own thread; this module routes and bounds memory (see :class:`_Connection`). Every response to
``/metrics`` is a lookup in the collector's current :class:`~exporter.render.Page` (pre-rendered in
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
from collections.abc import Callable, Mapping
from typing import Protocol

import h11

from exporter.errors import ConfigError
from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Page
from exporter.webconfig import BasicAuth, WebConfig

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
"""A request line and headers larger than this get 431."""
READ_CHUNK_BYTES = 4 * 1024
"""What one read from a client's socket may bring in (the protocol's receive buffer). h11 answers
431 when an incomplete head exceeds its limit, which it checks once per read; so that limit is
``MAX_HEAD_BYTES - READ_CHUNK_BYTES`` and no head above ``MAX_HEAD_BYTES`` is ever accepted."""
WRITE_HIGH_WATER = 64 * 1024
"""Send-buffer size above which a connection stops reading requests until its client reads."""
MAX_CONNECTIONS = 128
"""Open connections at most; more are closed at once. With the per-connection bounds above this
caps what all clients together can make the exporter hold (a few MiB plus answers in flight;
Prometheus needs one connection per scraping server, kubelet probes one each)."""
IDLE_TIMEOUT_S = 120.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
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


def _q_values(header: str) -> dict[str, float]:
    """``Accept``-style header → lower-cased token → highest q."""
    out: dict[str, float] = {}
    for part in header.split(","):
        token, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        token = token.lower()
        if token:
            out[token] = max(q, out.get(token, 0.0))
    return out


@functools.lru_cache(maxsize=64)
def wants_openmetrics(accept: str) -> bool:
    if "openmetrics" not in accept:
        return False
    q = _q_values(accept)
    om = q.get("application/openmetrics-text", 0.0)
    text = max(q.get("text/plain", 0.0), q.get("text/*", 0.0), q.get("*/*", 0.0))
    return om > 0 and om >= text


@functools.lru_cache(maxsize=64)
def accepts_gzip(accept_encoding: str) -> bool:
    if "gzip" not in accept_encoding:
        return False
    return _q_values(accept_encoding).get("gzip", 0.0) > 0


class _Request:
    """The parts of an ``h11.Request`` the routes read (header names lower-cased by h11)."""

    __slots__ = ("accept", "accept_encoding", "authorization", "method", "path")

    def __init__(self, event: h11.Request) -> None:
        self.method = event.method.decode("ascii", "replace")
        self.path = event.target.decode("ascii", "replace").split("?", 1)[0]
        self.accept = self.accept_encoding = ""
        self.authorization: str | None = None
        for name, value in event.headers:
            if name == b"accept":
                self.accept = value.decode("latin-1")
            elif name == b"accept-encoding":
                self.accept_encoding = value.decode("latin-1")
            elif name == b"authorization":
                self.authorization = value.decode("latin-1")


_END = h11.EndOfMessage()


@functools.lru_cache(maxsize=256)
def _response_head(
    status: int, ctype: str, length: int, headers: tuple[tuple[str, str], ...]
) -> h11.Response:
    """The response event, cached: h11 validates every header when an event is built, and a
    scraper gets the same few heads over and over (the page length changes once per collection)."""
    return h11.Response(
        status_code=status,
        headers=[("Content-Type", ctype), ("Content-Length", str(length)), *headers],
        reason=_REASONS.get(status, "Error"),
    )


def _has_body(event: h11.Request) -> bool:
    """Only GET and HEAD are served: a request body is refused rather than read and buffered."""
    for name, value in event.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


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
        self._refused_logged_at = -math.inf

    def refused_connection(self) -> None:
        now = time.monotonic()
        if now - self._refused_logged_at >= 60:  # at most one line a minute
            self._refused_logged_at = now
            log.warning(
                "refusing connections: %d are open, the most this exporter holds", self.max_connections
            )

    def response(
        self, req: _Request, *, authorized: bool
    ) -> tuple[int, str, bytes, tuple[tuple[str, str], ...]]:
        """(status, content type, body, extra headers) for one request."""
        if req.method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"only GET and HEAD\n", (("Allow", "GET, HEAD"),)
        if req.path == "/metrics":
            if not authorized:
                challenge = (("WWW-Authenticate", 'Basic realm="gpupilot-exporter"'),)
                return 401, "text/plain; charset=utf-8", b"unauthorized\n", challenge
            page = self.source.page
            om = page.negotiate(wants_openmetrics=wants_openmetrics(req.accept))
            gz = accepts_gzip(req.accept_encoding)
            body = page.body(openmetrics=om, gzip=gz, now=self.clock())
            ctype = OPENMETRICS_CONTENT_TYPE if om else TEXT_CONTENT_TYPE
            enc = (("Content-Encoding", "gzip"),) if gz else ()
            return 200, ctype, body, (*enc, ("Vary", "Accept, Accept-Encoding"))
        if req.path == "/health":
            return 200, "text/plain; charset=utf-8", b"ok\n", ()
        if req.path == "/ready":
            ok, why = self.source.readiness()
            return (200 if ok else 503), "text/plain; charset=utf-8", why.encode() + b"\n", ()
        if req.path == "/":
            return 200, "text/html; charset=utf-8", _LANDING, ()
        return 404, "text/plain; charset=utf-8", b"not found; try /metrics\n", ()


class _Connection(asyncio.BufferedProtocol):
    """One client connection: h11 parses, this class routes and bounds what is held in memory.

    Reading stops whenever the connection cannot make progress — a bcrypt check is running, or
    the transport's send buffer is above its high-water mark because the client does not read
    its answers — and resumes when it can. So a connection holds at most one receive chunk, one
    incomplete request head (``MAX_HEAD_BYTES``; more is a 431) and one send buffer
    (``WRITE_HIGH_WATER`` plus the answer being written)."""

    def __init__(self, app: _App) -> None:
        self.app = app
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES - READ_CHUNK_BYTES)
        self.recv = bytearray(READ_CHUNK_BYTES)
        self.transport: asyncio.Transport | None = None
        self.request: _Request | None = None
        self.waiting = False  # a bcrypt check holds back the next request
        self.write_paused = False
        self.reading = True
        self.last_active = time.monotonic()

    # -- transport callbacks ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self.app.connections) >= self.app.max_connections:
            self.app.refused_connection()
            transport.abort()
            return
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.app.connections.add(self)
        asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self._idle_check)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.app.connections.discard(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.recv)

    def buffer_updated(self, nbytes: int) -> None:
        if self.transport is None:
            return  # closing: whatever else arrives is dropped
        self.last_active = time.monotonic()
        self.h11.receive_data(bytes(self.recv[:nbytes]))
        self._process()

    def eof_received(self) -> bool:
        if self.transport is not None:
            self.h11.receive_data(b"")
            self._process()
        return False  # close our side too

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._process()

    def _idle_check(self) -> None:
        if self.transport is None:
            return
        idle = time.monotonic() - self.last_active
        if idle >= IDLE_TIMEOUT_S:
            self.transport.close()
        else:
            asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S - idle, self._idle_check)

    # -- request loop -----------------------------------------------------------------------
    def _set_reading(self, on: bool) -> None:
        if self.transport is not None and on != self.reading:
            self.reading = on
            if on:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _process(self) -> None:
        while self.transport is not None:
            if self.waiting or self.write_paused:
                self._set_reading(False)  # the client's further requests wait in its own buffers
                return
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._send_error(exc.error_status_hint)
                return
            if event is h11.NEED_DATA:
                self._set_reading(True)
                return
            if isinstance(event, h11.Request):
                if _has_body(event):
                    self._send_error(400)
                    return
                self.request = _Request(event)
            elif isinstance(event, h11.EndOfMessage) and self.request is not None:
                req, self.request = self.request, None
                self._handle(req)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                self._close()
                return

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
            self._process()

    def _respond(self, req: _Request, *, authorized: bool) -> None:
        try:
            status, ctype, body, headers = self.app.response(req, authorized=authorized)
        except Exception:  # never a traceback to the client; the server keeps running
            log.exception("error answering %s %s", req.method, req.path)
            status, ctype, body, headers = 500, "text/plain; charset=utf-8", b"internal error\n", ()
        self._write(status, ctype, body, headers, head_only=req.method == "HEAD")

    def _send_error(self, status: int) -> None:
        """Answer a request h11 or we refused, then close: the stream cannot be trusted past it."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self._close()
            return
        body = f"{status} {_REASONS.get(status, 'Error')}\n".encode()
        self._write(status, "text/plain; charset=utf-8", body, (("Connection", "close"),))
        self._close()

    def _write(
        self,
        status: int,
        ctype: str,
        body: bytes,
        headers: tuple[tuple[str, str], ...],
        *,
        head_only: bool = False,
    ) -> None:
        if self.transport is None:
            return
        try:
            response = _response_head(status, ctype, len(body), (*headers, *self.app.extra))
            pieces = [self.h11.send(response)]
            if body and not head_only:  # passthrough: the page is written as is, not copied by h11
                pieces += self.h11.send_with_data_passthrough(h11.Data(data=body)) or ()
            pieces.append(self.h11.send(_END))
        except h11.LocalProtocolError:  # e.g. an error answer to a request h11 could not parse
            log.debug("cannot answer on this connection; closing it", exc_info=True)
            self._close()
            return
        self.transport.writelines([p for p in pieces if p])
        if self.h11.our_state is h11.MUST_CLOSE:
            self._close()
        elif self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # flushes what is buffered, then closes
            self.transport = None
            self.app.connections.discard(self)


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
    ) -> None:
        self.host = host
        self.port = port
        self._ssl: ssl.SSLContext | None = web_config.ssl_context() if web_config else None
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
