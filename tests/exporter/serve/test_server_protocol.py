"""HTTP/1.1 at the edges, over raw sockets: what httptools parses and what the server makes of it —
pipelining, HTTP/1.0, upgrades, malformed requests, versions, head-size limits, bodies, timeouts,
and requests held back while bcrypt runs."""

from __future__ import annotations

import base64
import re
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from exporter.collect.collector import Collector
from exporter.serve import server as server_mod
from exporter.serve import webconfig
from exporter.serve.server import MetricsServer


@pytest.fixture
def srv(one_gpu_collector: Collector) -> Iterator[MetricsServer]:
    with MetricsServer(one_gpu_collector, host="127.0.0.1", port=0) as s:
        yield s


def exchange(srv: MetricsServer, *sends: bytes, pause: float = 0.0) -> bytes:
    """Send each piece (``pause`` seconds apart), then read until the server closes."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        for piece in sends:
            s.sendall(piece)
            time.sleep(pause)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def statuses(data: bytes) -> list[bytes]:
    """The status codes of the answers in ``data`` (our bodies never contain a status line)."""
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", data)


def test_pipelined_requests_in_one_packet_answered_in_order(srv: MetricsServer) -> None:
    data = exchange(
        srv,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",  # after the close: never answered
    )
    assert statuses(data) == [b"200", b"200", b"404", b"200"]
    assert data.index(b"ok\n") < data.index(b"not found") < data.index(b"ready: snapshot")
    assert data.count(b"Connection: close") == 1
    assert data.rsplit(b"\r\n\r\n", 1)[1].startswith(b"ready: snapshot")  # the last answer
    head_answer = data.split(b"HTTP/1.1 ")[2]
    assert b"Content-Length: " in head_answer and b"# HELP" not in head_answer  # HEAD: no body


def test_malformed_request_after_good_ones_gets_400_and_close(srv: MetricsServer) -> None:
    data = exchange(
        srv,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert statuses(data) == [b"200", b"200", b"400"]
    assert data.endswith(b"Connection: close\r\n\r\n400 Bad Request\n")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"get /metrics HTTP/1.1\r\nHost: x\r\n\r\n",  # methods are case-sensitive
        b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\nHost: x\n\n",  # bare LF
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded: value\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: \x01\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
    ],
)
def test_bad_requests_get_400_then_close(srv: MetricsServer, request_bytes: bytes) -> None:
    data = exchange(srv, request_bytes)
    assert statuses(data) == [b"400"], data[:200]
    assert b"DCGM" not in data


@pytest.mark.parametrize(
    "request_line", [b"GET / HTTP/2.0", b"GET / HTTP/1.2", b"GET / HTTP/0.9", b"PRI * HTTP/2.0"]
)
def test_other_http_versions_get_505(srv: MetricsServer, request_line: bytes) -> None:
    data = exchange(srv, request_line + b"\r\nHost: x\r\n\r\n")
    assert statuses(data) == [b"505"]


def test_http10_gets_one_answer_then_close_even_with_keep_alive(srv: MetricsServer) -> None:
    for extra in (b"", b"Connection: keep-alive\r\n"):
        data = exchange(srv, b"GET /health HTTP/1.0\r\n" + extra + b"\r\nGET /health HTTP/1.0\r\n\r\n")
        assert statuses(data) == [b"200"] and data.endswith(b"ok\n")
        assert b"Connection: close" in data


def test_upgrade_request_answered_as_plain_http_then_closed(srv: MetricsServer) -> None:
    data = exchange(
        srv,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        b"\x81\x85not http at all",
    )
    assert statuses(data) == [b"200"] and data.endswith(b"ok\n") and b"Connection: close" in data


def test_head_size_limits_across_reads(srv: MetricsServer) -> None:
    # 8 KiB heads are always accepted, even trickled in small pieces (each a separate read) ...
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 8000 + b"\r\nConnection: close\r\n\r\n"
    pieces = [head[i : i + 1000] for i in range(0, len(head), 1000)]
    assert statuses(exchange(srv, *pieces, pause=0.01)) == [b"200"]
    # ... and none above 16 KiB: a long header, a long URL, many headers, all in one send or trickled
    too_long = [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 16500 + b"\r\n\r\n",
        b"GET /health?" + b"q" * 16500 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 2100 + b"\r\n",
    ]
    for big in too_long:
        assert statuses(exchange(srv, big)) == [b"431"]
        chunks = [big[i : i + 3000] for i in range(0, len(big), 3000)]
        assert statuses(exchange(srv, *chunks, pause=0.01)) == [b"431"]


def test_half_closed_client_still_gets_its_answers(srv: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert statuses(data) == [b"200", b"200"]


@pytest.mark.slow
def test_trickled_head_gets_408_and_idle_connection_is_closed(
    srv: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_mod, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(server_mod, "IDLE_TIMEOUT_S", 0.8)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        start = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\n")
        data = b""
        for _ in range(20):  # a byte every 0.1 s keeps the connection active but the head unfinished
            s.sendall(b"X")
            readable, _, _ = select.select([s], [], [], 0.1)
            if readable:
                data = s.recv(4096)
                break
        assert data.startswith(b"HTTP/1.1 408 Request Timeout"), data
        assert 0.4 < time.monotonic() - start < 1.5
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        start = time.monotonic()
        data = b""
        while chunk := s.recv(4096):  # the answer, then nothing until the idle close
            data += chunk
        assert statuses(data) == [b"200"] and 0.6 < time.monotonic() - start < 2.5


def test_pipelined_requests_wait_for_bcrypt_and_keep_their_order(
    tmp_path: Path, one_gpu_collector: Collector
) -> None:
    hashed = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(4)).decode()
    (tmp_path / "web.yml").write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    cfg = webconfig.load(tmp_path / "web.yml")
    good = base64.b64encode(b"prometheus:scrape-me").decode().encode()
    bad = base64.b64encode(b"prometheus:wrong").decode().encode()
    with MetricsServer(one_gpu_collector, host="127.0.0.1", port=0, web_config=cfg) as s:
        data = exchange(
            s,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + good + b"\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + bad + b"\r\n\r\n"
            b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + good + b"\r\n\r\n"
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    assert statuses(data) == [b"200", b"200", b"401", b"200", b"200"]
    assert data.index(b"DCGM_FI_DEV_GPU_TEMP") < data.index(b"ok\n") < data.index(b"unauthorized")
