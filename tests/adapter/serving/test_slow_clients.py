"""The HTTPS server under a flood of slow clients, over real TLS: 1,500 anonymous connections that
each send half a request head leave ``/healthz`` answering within a second and the aggregation
layer's verified connection in place (the connections waiting longest for a head are cut for new
clients, anonymous ones first); a head not complete within ``header_timeout`` is cut."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable

import pytest

from adapter.config.settings import ServerLimits, ServeSettings
from adapter.serving.app import Adapter
from tests.adapter.conftest import PromEnv, base_settings
from tests.adapter.serving.test_server import V2, hpa_head, tls_context, wait_for
from tests.support.adapter.pki import Pki

HALF_HEAD = b"GET /apis/custom.metrics.k8s.io/v1beta2 HTTP/1.1\r\nHost: adapter\r\nX-Slow: "
FLOOD = 1500
FLOOD_DEADLINE_S = 90.0


def anonymous_context(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.serving_ca.path))


async def _flood(port: int, ctx: ssl.SSLContext, n: int) -> tuple[list[asyncio.StreamWriter], int]:
    """``n`` TLS connections, each sending half a request head and then nothing; the writers of
    those that got that far, and how many were cut or refused before."""

    async def one() -> asyncio.StreamWriter | None:
        try:
            _reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
            )
            writer.write(HALF_HEAD)
            await writer.drain()
            return writer
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError):
            return None

    async with asyncio.timeout(FLOOD_DEADLINE_S):
        done = await asyncio.gather(*(one() for _ in range(n)))
    held = [w for w in done if w is not None]
    return held, n - len(held)


def _read_answer(tls: ssl.SSLSocket) -> int:
    """One HTTP answer with a Content-Length body from a kept-alive connection; its status."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = tls.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = tls.recv(65536)
        assert chunk, "the server closed the connection mid-answer"
        body += chunk
    return int(head.split()[1])


def _healthz_seconds(port: int, pki: Pki) -> tuple[int, float]:
    """A kubelet-like probe: a new anonymous TLS connection, GET /healthz; (status, seconds)."""
    started = time.monotonic()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        anonymous_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: adapter\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := tls.recv(4096):
            data += chunk
    return int(data.split()[1]), time.monotonic() - started


@pytest.mark.slow
def test_a_flood_of_half_heads_starves_neither_probes_nor_the_aggregation_layer(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    # head and idle deadlines far beyond the test: only cutting for room can let anyone in
    limits = ServerLimits(header_timeout=120.0, idle_timeout=120.0, handshake_timeout=120.0)
    adapter = start_adapter(base_settings(prom.url, pki, limits=limits))
    port = adapter.port
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as proxy,
    ):
        # the aggregation layer's kept-alive connection (verified front-proxy certificate)
        head = hpa_head(V2).replace(b"Connection: close\r\n", b"")
        proxy.sendall(head)
        assert _read_answer(proxy) == 200
        loop = asyncio.new_event_loop()
        try:
            flood_started = time.monotonic()
            held, cut_early = loop.run_until_complete(_flood(port, anonymous_context(pki), FLOOD))
            flood_s = time.monotonic() - flood_started
            status, took = _healthz_seconds(port, pki)
            assert status == 200 and took < 1.0, f"/healthz took {took:.2f}s behind {len(held)} slow clients"
            assert adapter.server.open_connections <= limits.max_connections
            assert (
                adapter.server.shed_connections + adapter.server.shed_handshakes
                >= FLOOD - limits.max_connections
            )
            proxy.sendall(head)  # the same connection: never cut while anonymous ones could be
            assert _read_answer(proxy) == 200
        finally:
            for writer in held if "held" in locals() else []:
                writer.transport.abort()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()
    print(
        f"flood of {FLOOD} in {flood_s:.1f}s: {len(held)} reached the half head, {cut_early} cut before; "
        f"/healthz {took * 1000:.0f} ms"
    )
    assert wait_for(lambda: adapter.server.open_connections == 0, timeout=20)


@pytest.mark.slow
def test_a_request_head_not_complete_within_the_header_timeout_is_cut(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    limits = ServerLimits(header_timeout=0.5, idle_timeout=60.0)
    adapter = start_adapter(base_settings(prom.url, pki, limits=limits))
    with (
        socket.create_connection(("127.0.0.1", adapter.port), timeout=10) as raw,
        tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        started = time.monotonic()
        tls.sendall(HALF_HEAD)
        assert tls.recv(1) == b""  # closed without an answer
        took = time.monotonic() - started
    assert 0.4 < took < 3, took  # the head deadline, not the 60 s idle timeout
    # a kept-alive connection: the deadline counts from the next head's first byte, not the last answer
    with (
        socket.create_connection(("127.0.0.1", adapter.port), timeout=10) as raw,
        tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        head = hpa_head(V2).replace(b"Connection: close\r\n", b"")
        tls.sendall(head)
        assert _read_answer(tls) == 200
        time.sleep(1.0)  # idle between requests: within idle_timeout, past header_timeout
        tls.sendall(head)
        assert _read_answer(tls) == 200
