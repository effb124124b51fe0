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

Each request is one DEBUG line (method, path, status, bytes, milliseconds), and so is each refused
one; a failing handler is one ERROR line and a 500. No traceback, in the log or to the client.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping

from aiohttp import web

from gpupilot_common.httpbase import TEXT, LoopServer, Reply

__all__ = ["TEXT", "HTTPServer", "Handler", "Limits", "Reply"]

log = logging.getLogger(__name__)

Handler = Callable[[str, Mapping[str, str]], Reply]
"""``(path, query) -> Reply``; runs in a worker thread."""


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
