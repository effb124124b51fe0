"""What a hostile or stuck client can make the exporter hold: pipelining without reading, too many
connections. Measured on a real exporter process (its RSS), not on the server's own bookkeeping."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from exporter.collect.collector import Collector
from exporter.serve.server import MetricsServer

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "tests" / "data" / "fleet-small.yaml"
PIPELINED = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2048  # 68 KiB of requests per send


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def exporter_process() -> Iterator[tuple[subprocess.Popen[str], str]]:
    port = free_port()
    argv = ["--backend", "sim", "--scenario", str(SCENARIO), "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", *argv, "--interval", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("the exporter did not become ready")
        yield proc, url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


@pytest.mark.slow
def test_pipelining_client_that_never_reads_is_bounded(
    exporter_process: tuple[subprocess.Popen[str], str],
) -> None:
    proc, url = exporter_process
    for _ in range(20):  # warm up: the first scrapes allocate what every later one reuses
        requests.get(url + "/metrics", timeout=5)
    before = rss_mib(proc.pid)
    port = int(url.rsplit(":", 1)[1])
    sent = 0
    with socket.socket() as hostile:
        # Small socket buffers on our side, so the exporter's answers back up after a few KiB
        # instead of after the megabytes loopback autotuning allows (which only makes this slow).
        hostile.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hostile.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        hostile.connect(("127.0.0.1", port))
        hostile.settimeout(1.0)
        give_up = time.monotonic() + 3.0  # the old server took 96 MiB in well under a second
        try:
            while sent < 96 * 2**20 and time.monotonic() < give_up:  # the attack grew it ~195 MiB
                offset = sent % len(PIPELINED)  # a partial send continues mid-request
                sent += hostile.send(PIPELINED[offset:])
        except TimeoutError:
            pass  # the exporter stopped reading: the socket buffers are full
        grown = rss_mib(proc.pid) - before
        # Others are still served while the hostile connection is stuck.
        r = requests.get(url + "/metrics", timeout=5)
        assert r.status_code == 200 and "DCGM_FI_DEV_GPU_TEMP" in r.text
    assert sent < 48 * 2**20, f"the exporter kept reading ({sent / 2**20:.0f} MiB accepted)"
    assert grown < 12, f"RSS grew {grown:.1f} MiB"
    assert requests.get(url + "/health", timeout=5).status_code == 200


@pytest.fixture
def small_server(one_gpu_collector: Collector) -> Iterator[MetricsServer]:
    with MetricsServer(one_gpu_collector, host="127.0.0.1", port=0, max_connections=2) as srv:
        yield srv


def _health(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock.recv(4096)


def test_a_connection_beyond_the_limit_takes_the_place_of_the_longest_idle_one(
    small_server: MetricsServer,
) -> None:
    addr = ("127.0.0.1", small_server.port)
    with socket.create_connection(addr, timeout=5) as a, socket.create_connection(addr, timeout=5) as b:
        assert _health(a).startswith(b"HTTP/1.1 200")
        time.sleep(0.05)
        assert _health(b).startswith(b"HTTP/1.1 200")  # both idle now; a for longer
        with socket.create_connection(addr, timeout=5) as c:
            assert _health(c).startswith(b"HTTP/1.1 200")
            assert a.recv(1) == b""  # closed for c
            assert _health(b).startswith(b"HTTP/1.1 200")
    assert small_server._app.shed == 1


@pytest.mark.slow
def test_connections_being_answered_are_never_closed_for_room(small_server: MetricsServer) -> None:
    """Two clients pipeline requests and read nothing: their answers back up, both are being
    answered; a third connection is closed at once, not one of theirs."""
    addr = ("127.0.0.1", small_server.port)
    busy = []
    try:
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(addr)
            s.settimeout(0.5)
            try:
                for _ in range(200):  # bounded: the server stops reading long before
                    s.sendall(PIPELINED)
            except TimeoutError:
                pass
            busy.append(s)
        with socket.create_connection(addr, timeout=5) as c:
            try:
                answer = _health(c)
            except ConnectionResetError:
                answer = b""
            assert answer == b""
        assert small_server._app.shed == 0
    finally:
        for s in busy:
            s.close()
    time.sleep(0.2)  # the server sees the two closes
    with socket.create_connection(addr, timeout=5) as d:
        assert _health(d).startswith(b"HTTP/1.1 200")


@pytest.mark.slow
def test_1500_half_sent_heads_do_not_starve_health(
    one_gpu_collector: Collector,
) -> None:
    with MetricsServer(one_gpu_collector, host="127.0.0.1", port=0) as srv:
        addr = ("127.0.0.1", srv.port)
        kept = socket.create_connection(addr, timeout=5)  # a scraper's kept-alive connection
        assert _health(kept).startswith(b"HTTP/1.1 200")
        half = []
        try:
            for _ in range(1500):  # bounded in count; each connect is immediate on loopback
                s = socket.create_connection(addr, timeout=5)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                half.append(s)
            started = time.monotonic()
            with socket.create_connection(addr, timeout=5) as probe:
                answer = _health(probe)
            took = time.monotonic() - started
            assert answer.startswith(b"HTTP/1.1 200") and took < 1.0, took
            assert srv._app.shed >= 1500 - 128
        finally:
            for s in half:
                s.close()
            kept.close()


@pytest.mark.slow
def test_a_connection_that_sends_no_head_is_closed_at_the_head_timeout(
    small_server: MetricsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exporter.serve import server as server_mod  # noqa: PLC0415

    monkeypatch.setattr(server_mod, "HEAD_TIMEOUT_S", 0.5)
    with socket.create_connection(("127.0.0.1", small_server.port), timeout=5) as s:
        started = time.monotonic()
        assert s.recv(1) == b""
        took = time.monotonic() - started
    assert 0.4 < took < 2.0, took  # not the 120 s idle timeout


def test_request_body_refused_and_connection_closed(small_server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", small_server.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400 Bad Request")
    assert data.count(b"HTTP/1.1") == 1
