"""gpupilot_common.httpserve: answers, bounds (connections, slow and oversized clients, bodies,
methods) and one log line for a failing handler."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import pytest

from gpupilot_common.httpserve import HTTPServer, Limits, Reply
from tests.support.common.httpclients import get, oversized_header_status, slow_client_is_closed


def _answer(path: str, query: Mapping[str, str]) -> Reply:
    if path == "/boom":
        raise ValueError("the handler broke")
    return Reply(200, f"{path} {dict(query)}".encode())


@pytest.fixture
def held() -> Iterator[tuple[HTTPServer, threading.Event]]:
    """A server whose ``/hold`` answers only once the event is set."""
    release = threading.Event()

    def answer(path: str, query: Mapping[str, str]) -> Reply:
        if path == "/hold":
            release.wait(10)
        return Reply(200, b"ok")

    srv = HTTPServer(answer, limits=Limits(max_connections=4, workers=4)).start()
    yield srv, release
    release.set()
    srv.close()


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    srv = HTTPServer(
        _answer, limits=Limits(idle_timeout=0.5, max_header_bytes=1024, max_connections=4)
    ).start()
    yield srv
    srv.close()


def test_answers_path_and_query(server: HTTPServer) -> None:
    assert get(server.port, "/metrics?a=1") == (200, b"/metrics {'a': '1'}")


@pytest.mark.slow
def test_slow_client_is_closed_after_idle_timeout(server: HTTPServer) -> None:
    took = slow_client_is_closed(server.port, within=0.5)
    assert 0.4 < took < 3
    assert get(server.port, "/ok")[0] == 200


def test_oversized_header_is_refused_and_the_server_goes_on(server: HTTPServer) -> None:
    assert oversized_header_status(server.port, size=4096) == 431
    assert oversized_header_status(server.port, size=512) == 200
    assert get(server.port, "/ok")[0] == 200


def _status_line(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        return s.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"414"),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n", b"431"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not HTTP\r\n\r\n", b"400"),
    ],
)
def test_malformed_requests_are_refused_in_one_debug_line(
    server: HTTPServer, caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: bytes
) -> None:
    with caplog.at_level(logging.DEBUG):
        line = _status_line(server.port, request_bytes)
        time.sleep(0.1)
    assert line.split(b" ")[1] == status
    assert get(server.port, "/ok")[0] == 200
    assert not [r for r in caplog.records if r.exc_info or r.levelno > logging.DEBUG]
    assert any(r.getMessage().startswith("refused a request from") for r in caplog.records)


def test_connections_without_a_request_head_are_cut_oldest_first_for_a_waiting_client(
    server: HTTPServer,
) -> None:
    idle = []
    for _ in range(4):
        idle.append(socket.create_connection(("127.0.0.1", server.port)))
        time.sleep(0.02)  # accepted in this order
    try:
        assert _wait(lambda: server.open_connections == 4)
        assert get(server.port, "/late") == (200, b"/late {}")  # the oldest silent one made room
        assert server.shed_connections == 1
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # ... this one
        for s in idle[1:]:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)  # the younger ones are still open
    finally:
        for s in idle:
            s.close()


def test_connections_being_answered_are_never_cut(held: tuple[HTTPServer, threading.Event]) -> None:
    server, release = held
    busy = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(4)]
    try:
        for s in busy:
            s.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _wait(lambda: server.open_connections == 4)
        late = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        late.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        late.settimeout(0.5)
        cpu = time.process_time()
        with pytest.raises(TimeoutError):
            late.recv(100)  # not accepted while four are being answered
        assert time.process_time() - cpu < 0.25  # the waiting client does not make the loop spin
        assert server.shed_connections == 0
        release.set()
        late.settimeout(5)
        assert late.recv(100).startswith(b"HTTP/1.1 200")
        late.close()
        for s in busy:
            assert s.recv(100).startswith(b"HTTP/1.1 200")
    finally:
        release.set()
        for s in busy:
            s.close()


@pytest.mark.slow
def test_half_sent_requests_beyond_the_limit_do_not_starve_health() -> None:
    srv = HTTPServer(_answer, limits=Limits(header_timeout=60.0, idle_timeout=60.0)).start()
    half = []
    try:
        for _ in range(Limits().max_connections + 64):  # bounded: 128 sockets
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            half.append(s)
        started = time.monotonic()
        status, _body = get(srv.port, "/health")
        took = time.monotonic() - started
        assert status == 200 and took < 1.0, took
        assert srv.open_connections <= Limits().max_connections
    finally:
        for s in half:
            s.close()
        srv.close()


def test_a_request_head_must_be_complete_within_the_header_timeout() -> None:
    srv = HTTPServer(_answer, limits=Limits(header_timeout=0.3, idle_timeout=60.0)).start()
    try:
        took = slow_client_is_closed(srv.port, within=0.3)
        assert 0.2 < took < 3, took
        assert get(srv.port, "/ok")[0] == 200
    finally:
        srv.close()


def _wait(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_post_and_bodies_are_refused(server: HTTPServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert s.recv(100).startswith(b"HTTP/1.1 405")
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        assert s.recv(100).startswith(b"HTTP/1.1 413")


def test_failing_handler_is_a_500_and_one_log_line(
    server: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="gpupilot_common.httpserve"):
        status, body = get(server.port, "/boom")
    assert status == 500 and b"internal error serving /boom" in body
    [record] = caplog.records
    assert record.getMessage() == "http: error serving /boom: ValueError: the handler broke"
    assert record.exc_info is None


def test_port_in_use_is_an_oserror_at_construction(server: HTTPServer) -> None:
    with pytest.raises(OSError):
        HTTPServer(_answer, port=server.port)
