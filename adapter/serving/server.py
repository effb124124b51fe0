"""HTTPS front on aiohttp's low-level web server, built on :mod:`gpupilot_common.httpbase` (shared
with the rightsizer's and the simulator's endpoints): one event loop in one thread holds every
connection (a slow or idle client costs a few kilobytes, not a thread), and a small pool of worker
threads runs authentication, authorisation and :class:`adapter.serving.api.MetricsApi` (pure, from memory).

Bounds, each with a setting in :class:`adapter.config.settings.ServerLimits`:

* connections: at most ``max_connections``; when all are taken and another client waits in the
  kernel's listen backlog, the connection waiting longest for a request head is cut for it (TLS
  handshakes and anonymous connections first, those with a verified client certificate — the
  aggregation layer's — only when no anonymous one is left; see :mod:`gpupilot_common.httpbase`);
* TLS 1.2+ handshakes must finish within ``handshake_timeout`` — within ``busy_handshake_timeout``
  while the server is at ``max_connections``; a request head must be complete within
  ``header_timeout`` after the handshake (slowloris); a connection idle for ``idle_timeout`` between
  requests is closed;
* request line (URL) ``max_url_bytes`` → 414, header fields ``max_header_bytes`` and ``max_headers``
  → 431, bodies (this API is read-only) over ``max_body_bytes`` → 413;
* metric requests in flight: ``max_inflight``; more wait up to ``inflight_wait`` seconds, then 429;
* writing an answer to a client that does not read it: ``write_timeout``, then the connection is cut.

Every error is a ``metav1.Status`` JSON object. A client that goes away before its answer is one
debug line. Health endpoints answer without credentials (kubelet probes carry none).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import functools
import logging
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import orjson
from aiohttp import web
from cryptography import x509

from adapter.config.settings import ServerLimits
from adapter.errors import AdapterError
from adapter.provider import nowait
from adapter.provider.nowait import WouldBlock
from adapter.serving.api import CUSTOM, EXTERNAL, MetricsApi, request_info, status
from adapter.serving.auth import Authenticator, Authorizer, Headers
from adapter.serving.compress import GZIP_ABOVE, GzipCache, accepts_gzip, gzip_bytes
from adapter.serving.selfmetrics import SelfMetrics
from gpupilot_common import logs
from gpupilot_common.httpbase import BoundedProtocol, LoopServer, Refusal, Reply

log = logging.getLogger(__name__)
JSON = "application/json"


class App:
    """What a request needs; the synchronous part of answering (runs in a worker thread).
    ``authenticator`` may be swapped at any time (the request-header CA was reloaded)."""

    def __init__(
        self,
        *,
        api: MetricsApi,
        authenticator: Authenticator,
        authorizer: Authorizer,
        metrics: SelfMetrics,
        always_allow_paths: frozenset[str],
    ) -> None:
        self.api = api
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.metrics = metrics
        self.always_allow_paths = always_allow_paths

    def handle(self, path: str, query: Mapping[str, str], headers: Headers, peer_der: bytes | None) -> Reply:
        info = request_info(path)
        try:
            if path.rstrip("/") not in self.always_allow_paths:
                peer = _certificate(peer_der)
                user = self.authenticator.authenticate(peer_cert=peer, headers=headers)
                self.authorizer.authorize(user, info)
            if path == "/metrics":
                return Reply(200, self.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8")
            code, body = self.api.answer(path, query)
        except WouldBlock:
            raise
        except AdapterError as exc:
            if exc.status in (401, 403):
                self.metrics.auth_failures.labels(str(exc.status)).inc()
            return error_reply(exc.status, exc.reason, str(exc))
        except Exception:  # a bug must not leave the client without an answer
            log.exception("unhandled error serving %s", path)
            return error_reply(500, "InternalError", f"internal error serving {path}; see the adapter log")
        if isinstance(body, str):
            return Reply(code, body.encode(), "text/plain; charset=utf-8")
        if isinstance(body, bytes):  # encoded already (items from the per-evaluation memo)
            return Reply(code, body, JSON)
        # orjson: large MetricValueLists encode an order of magnitude faster than with json.dumps
        return Reply(code, orjson.dumps(body), JSON)

    def handle_inline(
        self, path: str, query: Mapping[str, str], headers: Headers, peer_der: bytes | None
    ) -> Reply | None:
        """:meth:`handle` on the event loop when nothing on the way waits or encodes (credentials
        and authorisation cached, values in memory, answer encoded); None when it would."""
        token = nowait.enter()
        try:
            return self.handle(path, query, headers, peer_der)
        except WouldBlock:
            return None
        finally:
            nowait.leave(token)


def error_reply(code: int, reason: str, message: str) -> Reply:
    return Reply(code, orjson.dumps(status(code, reason, message)), JSON)


def _certificate(der: bytes | None) -> x509.Certificate | None:
    return _parse_der(der) if der else None


_der_cache: dict[bytes, x509.Certificate] = {}


def _parse_der(der: bytes) -> x509.Certificate:
    """Parse a peer certificate once: the aggregation layer reuses one proxy certificate."""
    cert = _der_cache.get(der)
    if cert is None:
        if len(_der_cache) > 256:
            _der_cache.clear()
        cert = _der_cache[der] = x509.load_der_x509_certificate(der)
    return cert


QUERY_MEMO_BYTES = 2048
"""Query strings up to this long have their parsed form memoised (1,024 of them at most)."""


def _parse_query(raw: str) -> dict[str, str]:
    """A raw query string's parameters (the last of repeated ones, as aiohttp's mapping gives)."""
    return dict(urllib.parse.parse_qsl(raw, keep_blank_values=True))


@functools.lru_cache(maxsize=1024)
def _query(raw: str) -> Mapping[str, str]:
    """(memoised, read-only: an HPA sends the same query string every sync)"""
    return MappingProxyType(_parse_query(raw))


@functools.lru_cache(maxsize=1024)
def _kind(path: str) -> tuple[str, bool]:
    """(memoised: the metrics' label for a path, on every request)"""
    info = request_info(path)
    if info.is_resource:
        return ("external" if info.group == EXTERNAL else "custom"), True
    if path.startswith((f"/apis/{CUSTOM}", f"/apis/{EXTERNAL}")):
        return "discovery", False
    return "other", False


class _Protocol(BoundedProtocol):
    """The shared connection handler (:mod:`gpupilot_common.httpbase`: 400/413/414/431, the write
    deadline) answering refusals as ``metav1.Status`` objects, and the client's certificate."""

    def refusal_response(self, refused: Refusal) -> web.Response:
        reply = error_reply(refused.status, refused.reason, refused.message)
        return web.Response(status=reply.status, body=reply.body, headers={"Content-Type": JSON})

    @property
    def trusted(self) -> bool:
        """A client certificate was verified in the handshake (the aggregation layer's front proxy,
        or any client of the client CA): such connections are cut for room only when no anonymous
        one is left."""
        return self.transport is not None and self.peer_certificate() is not None

    def peer_certificate(self) -> bytes | None:
        """The client certificate (DER), read once per connection: renegotiation is refused
        (``tlsutil.server_context``), so it cannot change under a connection."""
        if not self._peer_read:
            ssl_object = self.transport.get_extra_info("ssl_object") if self.transport else None
            self._peer_der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            self._peer_read = True
        return self._peer_der

    _peer_read = False
    _peer_der: bytes | None = None


TLS_SHUTDOWN_TIMEOUT = 2.0
"""Seconds a closed connection waits for the client's TLS close_notify before the socket is dropped
(the loop's default, 30 s, would let a client that was cut off for being slow hold its socket on)."""

TLS_READ_BUFFER = 16 * 1024 + 256
"""Bytes of plaintext per TLS read. asyncio allocates (and zero-fills) ``SSLProtocol.max_size``
for every connection from its first byte — 256 KiB by default, so 2,000 silent clients held
500 MiB. A TLS record carries at most 16 KiB of plaintext, so reading one record per call costs
nothing measurable."""


STREAM_ABOVE = 256 * 1024
STREAM_CHUNK = 64 * 1024


class AdapterHTTPServer(LoopServer[ServerLimits]):
    """The shared loop server (:mod:`gpupilot_common.httpbase`: the listening socket, the event loop
    thread, the worker pool, the connection count) with TLS handshakes, shed when stalled at the
    connection limit, and :class:`App` answering requests."""

    protocol = _Protocol

    def __init__(
        self,
        address: tuple[str, int],
        *,
        app: App,
        ssl_context: Callable[[], ssl.SSLContext] | ssl.SSLContext,
        limits: ServerLimits | None = None,
    ) -> None:
        limits = limits or ServerLimits()
        super().__init__(
            *address, limits=limits, workers=limits.max_inflight + 2, name="http-server", pool_name="request"
        )
        self.app = app
        # a class attribute read in SSLProtocol.__init__; there is no per-server way to pass it
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
        if isinstance(ssl_context, ssl.SSLContext):
            fixed = ssl_context
            self._ssl: Callable[[], ssl.SSLContext] = lambda: fixed
        else:
            self._ssl = ssl_context
        self._inflight: asyncio.Semaphore | None = None
        self._handshakes: dict[asyncio.Task[None], tuple[float, socket.socket]] = {}
        """Connections not yet past their TLS handshake: start time and socket (oldest first)."""
        self.shed_handshakes = 0
        self._gzip = GzipCache()

    async def _setup(self) -> None:
        self._inflight = asyncio.Semaphore(self.limits.max_inflight)
        await super()._setup()

    async def _cancel_connecting(self) -> None:
        pending = list(self._handshakes)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # -- connections -----------------------------------------------------------------------------
    def _at_limit(self) -> None:
        """At the limit, every quarter second: handshakes stalled for longer than a healthy client
        needs are shed to make room."""
        self._shed_stalled_handshakes()

    def _incomplete(self) -> list[tuple[float, bool, Callable[[], None]]]:
        """TLS handshakes in progress are connections without a request head too (anonymous: no
        certificate is verified yet)."""
        handshakes = [
            (started, False, functools.partial(self._shed_handshake, task))
            for task, (started, _conn) in self._handshakes.items()
        ]
        return handshakes + super()._incomplete()

    def _shed_handshake(self, task: asyncio.Task[None]) -> None:
        """Cut a connection in its handshake by shutting its socket down, not by cancelling its task:
        a handshake that has just finished has handed the socket to a transport, which would keep
        polling a descriptor closed under it (and a new connection could be given that number).
        The handshake fails at once on the closed socket and its task frees the slot."""
        _started, conn = self._handshakes.pop(task)
        self.shed_handshakes += 1
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    async def _accepted(self, conn: socket.socket, peer: Any) -> None:
        task = self._loop.create_task(self._connect(conn, peer))
        self._handshakes[task] = (self._loop.time(), conn)
        task.add_done_callback(self._handshake_done)

    def _handshake_done(self, task: asyncio.Task[None]) -> None:
        self._handshakes.pop(task, None)

    def _shed_stalled_handshakes(self) -> None:
        """At the connection limit: close connections whose handshake has taken longer than
        ``busy_handshake_timeout`` (a client on the cluster network needs milliseconds)."""
        cutoff = self._loop.time() - self.limits.busy_handshake_timeout
        shed = [task for task, (started, _conn) in self._handshakes.items() if started <= cutoff]
        for task in shed:
            self._shed_handshake(task)
        if shed:
            log.debug("at %d connections: shed %d stalled TLS handshakes", self.open_connections, len(shed))

    async def _connect(self, conn: socket.socket, peer: Any) -> None:
        """TLS for one accepted socket. The TLS machinery (about 50 KB per connection with OpenSSL 3)
        is set up only once the client has sent its first bytes: a silent client costs a socket
        and a task until the handshake deadline closes it."""
        assert self._server is not None
        deadline = self._loop.time() + self.limits.handshake_timeout
        readable: asyncio.Future[None] = self._loop.create_future()
        fd = conn.fileno()

        def wake() -> None:
            if not readable.done():
                readable.set_result(None)

        self._loop.add_reader(fd, wake)
        try:
            try:
                await asyncio.wait_for(readable, self.limits.handshake_timeout)
            finally:  # before the transport registers its own reader on this socket
                self._loop.remove_reader(fd)
            context = self._ssl()
            if not context.options & ssl.OP_NO_RENEGOTIATION:  # see _Protocol.peer_certificate
                context.options |= ssl.OP_NO_RENEGOTIATION
            await self._loop.connect_accepted_socket(
                self._server,
                conn,
                ssl=context,
                ssl_handshake_timeout=max(0.1, deadline - self._loop.time()),
                ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
            )
        except (Exception, asyncio.CancelledError) as exc:  # too slow, shed, refused or reset
            log.debug("TLS handshake with %s failed: %s", logs.peer(peer), exc or type(exc).__name__)
            with contextlib.suppress(OSError):
                conn.close()
            self._release()

    # -- requests --------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = time.perf_counter()
        path, _, raw_query = request.raw_path.partition("?")
        path = path or "/"
        kind, is_metric = _kind(path)
        reply = await self._reply(request, path, raw_query, is_metric=is_metric)
        transport = request.transport
        if transport is None or transport.is_closing():
            log.debug("client %s went away before its answer to %s", request.remote, path)
        headers = {"Content-Type": reply.content_type, "Cache-Control": "no-cache, private"}
        if len(reply.body) >= GZIP_ABOVE:
            headers["Vary"] = "Accept-Encoding"
            if reply.status == 200 and accepts_gzip(request.headers.getall("Accept-Encoding", ())):
                # an answer from memory is one object until it changes: compressed once, in a worker
                gz = self._gzip.get(reply.body)
                if gz is None:
                    gz = await self._loop.run_in_executor(self._pool, gzip_bytes, reply.body)
                    self._gzip.put(reply.body, gz)
                reply = Reply(reply.status, gz, reply.content_type)
                headers["Content-Encoding"] = "gzip"
        self.app.metrics.requests.record(kind, reply.status, time.perf_counter() - start)
        if len(reply.body) > STREAM_ABOVE and request.method == "GET":
            return await self._stream(request, reply, headers, path)
        resp = web.Response(status=reply.status, body=reply.body, headers=headers)
        if reply.status in (413, 405):
            resp.force_close()
        return resp

    async def _stream(
        self, request: web.BaseRequest, reply: Reply, headers: dict[str, str], path: str
    ) -> web.StreamResponse:
        """A large answer (5,000 items is 1.3 MB) in 64 KiB writes that wait for the client, so a
        slow reader holds one body, not the body plus its encrypted copy in the transport buffer."""
        resp = web.StreamResponse(status=reply.status, headers=headers)
        resp.content_length = len(reply.body)
        view = memoryview(reply.body)
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await resp.prepare(request)
                for offset in range(0, len(view), STREAM_CHUNK):
                    await resp.write(view[offset : offset + STREAM_CHUNK])
                await resp.write_eof()
        except (ConnectionError, TimeoutError) as exc:
            log.debug("client %s did not take its answer to %s: %s", request.remote, path, exc or "timed out")
            if request.transport is not None:
                request.transport.abort()
        return resp

    async def _reply(self, request: web.BaseRequest, path: str, raw_query: str, *, is_metric: bool) -> Reply:
        if request.method not in ("GET", "HEAD"):
            return error_reply(
                405, "MethodNotAllowed", f"{request.method} is not supported; this API is read-only"
            )
        length = request.content_length
        if (length or 0) > self.limits.max_body_bytes or (length is None and request.body_exists):
            return error_reply(
                413,
                "RequestEntityTooLarge",
                f"request bodies are limited to {self.limits.max_body_bytes} bytes",
            )
        query = _query(raw_query) if len(raw_query) <= QUERY_MEMO_BYTES else _parse_query(raw_query)
        headers = request.headers  # a header line's value each: see adapter.serving.auth.Headers
        der = request.protocol.peer_certificate() if isinstance(request.protocol, _Protocol) else None
        # answered on the loop when everything it needs is in memory: no thread hop, no slot
        inline = self.app.handle_inline(path, query, headers, der)
        if inline is not None:
            return inline
        call = functools.partial(self.app.handle, path, query, headers, der)
        if not is_metric:
            return await self._loop.run_in_executor(self._pool, call)
        assert self._inflight is not None
        try:
            await asyncio.wait_for(self._inflight.acquire(), self.limits.inflight_wait)
        except TimeoutError:
            return error_reply(
                429,
                "TooManyRequests",
                f"more than {self.limits.max_inflight} metric requests in flight for "
                f"{self.limits.inflight_wait:g}s; retry",
            )
        try:
            return await self._loop.run_in_executor(self._pool, call)
        finally:
            self._inflight.release()
