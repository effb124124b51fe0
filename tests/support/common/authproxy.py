"""A small tenant- and auth-checking reverse proxy in front of a real Prometheus, as a Mimir or Cortex
gateway (or nginx with auth) stands in front of a querier: on 127.0.0.1, under a path prefix, it
requires a tenant header, basic auth or a bearer token, and optionally a TLS client certificate,
then forwards the request (method, query string, body) to Prometheus without those headers.

Answers as those gateways do: no tenant → 401 ``no org id``; no or wrong credentials → 401; a tenant
the credentials may not read → 403; a path outside the prefix → 404. Every request's tenant and
Authorization header are recorded, so tests can check what the clients sent.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web


@dataclass
class Seen:
    method: str
    path: str
    tenant: str | None
    authorization: str | None
    client_cn: str | None


@dataclass
class AuthProxy:
    upstream: str
    prefix: str = "/prometheus"
    tenant_header: str = "X-Scope-OrgID"
    tenants: frozenset[str] = frozenset({"team-gpu"})
    """Tenants the credentials may read; others get 403."""
    basic: tuple[str, str] | None = None
    tokens: Callable[[], set[str]] | None = None
    """The bearer tokens accepted now (a test rotates them)."""
    ssl_context: ssl.SSLContext | None = None
    """Serve https; with ``verify_mode = CERT_REQUIRED`` a client certificate is required."""
    on_request: Callable[[int], None] | None = None
    """Called with the number of requests so far before each is checked (a test rotates a token)."""
    seen: list[Seen] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="auth-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}{self.prefix}"

    def _denied(self, request: web.Request) -> web.Response | None:
        tenant = request.headers.get(self.tenant_header)
        if not tenant:
            return web.Response(status=401, text="no org id\n")
        auth = request.headers.get("Authorization", "")
        if self.basic is not None:
            pair = base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
            if auth != f"Basic {pair}":
                return web.Response(status=401, text="invalid username or password\n")
        if self.tokens is not None and (not auth.startswith("Bearer ") or auth[7:] not in self.tokens()):
            return web.Response(status=401, text="invalid or expired bearer token\n")
        if any(t not in self.tenants for t in tenant.split("|")):
            return web.Response(status=403, text=f"tenant {tenant} is not allowed for these credentials\n")
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        cn = None
        if peer:
            cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), None)
        self.seen.append(
            Seen(
                request.method,
                request.path,
                request.headers.get(self.tenant_header),
                request.headers.get("Authorization"),
                cn,
            )
        )
        if self.on_request is not None:
            self.on_request(len(self.seen))
        if not request.path.startswith(self.prefix + "/"):
            return web.Response(status=404, text="404 page not found\n")
        denied = self._denied(request)
        if denied is not None:
            return denied
        assert self._session is not None
        body = await request.read()
        headers = (
            {"Content-Type": request.headers["Content-Type"]} if "Content-Type" in request.headers else {}
        )
        target = self.upstream + request.path_qs[len(self.prefix) :]
        async with self._session.request(request.method, target, data=body or None, headers=headers) as up:
            payload = await up.read()
            return web.Response(status=up.status, body=payload, content_type=up.content_type)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def __enter__(self) -> AuthProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def client_cert_context(*, server_cert: str, server_key: str, client_ca: str) -> ssl.SSLContext:
    """An https server context that requires a client certificate issued by ``client_ca``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(server_cert, server_key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
