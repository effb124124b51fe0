"""The exporter's HTTP(S) endpoint: ``/metrics``, ``/health``, ``/ready``.

A small HTTP/1.1 server on one asyncio event loop in its own thread. Every response to
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
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from exporter.errors import ConfigError
from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Page
from exporter.webconfig import BasicAuth, WebConfig

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
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
    __slots__ = ("headers", "keep_alive", "method", "path")

    def __init__(self, method: str, path: str, headers: dict[str, str], keep_alive: bool) -> None:
        self.method, self.path, self.headers, self.keep_alive = method, path, headers, keep_alive


def parse_head(head: bytes) -> _Request | int:
    """The request line and headers, or an HTTP status for a malformed request.

    Cached: a scraper sends the same request head every time, so parsing is a dict lookup after the
    first scrape (the returned request is never mutated). Heads carrying credentials are parsed
    each time instead, so that no password sits in the cache."""
    if b"uthorization" in head:
        return _parse_head(head)
    return _parse_head_cached(head)


@functools.lru_cache(maxsize=256)
def _parse_head_cached(head: bytes) -> _Request | int:
    return _parse_head(head)


def _parse_head(head: bytes) -> _Request | int:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return 400
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        return 505 if version.startswith("HTTP/") else 400
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return 400
        headers[name.lower()] = value.strip()
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        return 400  # only GET/HEAD are served; a request body would desynchronise keep-alive
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return _Request(method, target.split("?", 1)[0], headers, keep_alive)


class _App:
    """Routing and responses; shared by every connection."""

    def __init__(
        self,
        source: PageSource,
        *,
        auth: BasicAuth | None,
        extra_headers: Mapping[str, str],
        clock: Callable[[], float],
    ) -> None:
        self.source, self.auth, self.clock = source, auth, clock
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in extra_headers.items())
        self.connections: set[_Connection] = set()

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
            om = page.negotiate(wants_openmetrics=wants_openmetrics(req.headers.get("accept", "")))
            gz = accepts_gzip(req.headers.get("accept-encoding", ""))
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


class _Connection(asyncio.Protocol):
    def __init__(self, app: _App) -> None:
        self.app = app
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiting = False  # a bcrypt check or a full send buffer holds back the next request
        self.write_paused = False
        self.closing = False
        self.last_active = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.app.connections.add(self)
        asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S, self._idle_check)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.transport = None
        self.app.connections.discard(self)

    def _idle_check(self) -> None:
        if self.transport is None:
            return
        idle = time.monotonic() - self.last_active
        if idle >= IDLE_TIMEOUT_S:
            self.transport.close()
        else:
            asyncio.get_running_loop().call_later(IDLE_TIMEOUT_S - idle, self._idle_check)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._process()

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self.buf += data
        self._process()

    def _process(self) -> None:
        while not (self.waiting or self.write_paused or self.closing) and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD_BYTES:
                    self._send_error(431)
                return
            if end > MAX_HEAD_BYTES:
                self._send_error(431)
                return
            head = bytes(self.buf[:end])
            del self.buf[: end + 4]
            req = parse_head(head)
            if isinstance(req, int):
                self._send_error(req)
                return
            self._handle(req)

    def _handle(self, req: _Request) -> None:
        auth = self.app.auth
        if auth is None or req.path != "/metrics":
            self._respond(req, authorized=True)
            return
        header = req.headers.get("authorization")
        verdict = auth.cached(header)
        if verdict is not None:
            self._respond(req, authorized=verdict)
            return
        self.waiting = True  # bcrypt costs tens of ms: verify off the loop, keep others served
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, auth.check, header)
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
        self._write(status, ctype, body, headers, keep_alive=req.keep_alive, head_only=req.method == "HEAD")

    def _send_error(self, status: int) -> None:
        self._write(
            status, "text/plain; charset=utf-8", f"{status} {_REASONS.get(status, '')}\n".encode(), ()
        )

    def _write(
        self,
        status: int,
        ctype: str,
        body: bytes,
        headers: tuple[tuple[str, str], ...],
        *,
        keep_alive: bool = False,
        head_only: bool = False,
    ) -> None:
        if self.transport is None:
            return
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        conn = "" if keep_alive else "Connection: close\r\n"
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}{self.app.extra}{conn}\r\n"
        ).encode("latin-1")
        self.transport.writelines((head, b"" if head_only else body))
        if not keep_alive:
            self.closing = True
            self.transport.close()


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
    ) -> None:
        self.host = host
        self.port = port
        self._ssl: ssl.SSLContext | None = web_config.ssl_context() if web_config else None
        self._app = _App(
            source,
            auth=web_config.authenticator() if web_config else None,
            extra_headers=web_config.headers if web_config else {},
            clock=clock,
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
