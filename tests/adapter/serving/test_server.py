"""The HTTPS server under hostile load, over real TLS sockets: slow and idle connections (held by one
event loop, bounded, timed out), request-line/header/body limits answered as metav1.Status, a client
that leaves before its answer (one debug line, no traceback), and TLS 1.2 as the floor."""

from __future__ import annotations

import gzip
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from adapter.config.settings import ServerLimits, ServeSettings
from adapter.provider import nowait
from adapter.serving import server
from adapter.serving.app import Adapter
from adapter.serving.compress import GzipCache, accepts_gzip, gzip_bytes
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki

V2 = "/apis/custom.metrics.k8s.io/v1beta2"
PODS = f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL?labelSelector=app%3Dllm-inference"


def tls_context(pki: Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.serving_ca.path))
    ctx.load_cert_chain(str(pki.front_proxy.cert), str(pki.front_proxy.key))
    return ctx


def raw_request(port: int, pki: Pki, head: bytes, *, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """Send ``head`` as is over TLS; (status code, JSON body)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw,
        tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(head)
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head_part, _, body = data.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), orjson.loads(body)


def hpa_head(path: str, extra: str = "") -> bytes:
    return (
        f"GET {path} HTTP/1.1\r\nHost: adapter\r\nX-Remote-User: hpa\r\nConnection: close\r\n{extra}\r\n"
    ).encode()


@pytest.fixture
def limited(prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]) -> Iterator[Adapter]:
    limits = ServerLimits(max_connections=20, handshake_timeout=1.0, idle_timeout=1.0, write_timeout=2.0)
    yield start_adapter(base_settings(prom.url, pki, limits=limits))


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_slow_tls_clients_cost_no_threads_are_bounded_and_timed_out(limited: Adapter, pki: Pki) -> None:
    client = Client(f"https://127.0.0.1:{limited.port}", pki)
    assert client.as_hpa(V2).status_code == 200
    threads_before = set(threading.enumerate())  # threads of earlier tests may end meanwhile
    silent = [socket.create_connection(("127.0.0.1", limited.port)) for _ in range(60)]  # no ClientHello
    try:
        assert wait_for(lambda: limited.server.open_connections == 20)
        time.sleep(0.3)
        assert limited.server.open_connections == 20  # the other 40 wait in the kernel's backlog
        assert len(set(threading.enumerate()) - threads_before) <= 1
        # the handshake deadline frees the slots: a real client gets through behind the silent ones
        started = time.monotonic()
        assert client.as_hpa(V2).status_code == 200
        assert time.monotonic() - started < 8
    finally:
        for s in silent:
            s.close()
    assert wait_for(lambda: limited.server.open_connections == 0)


@pytest.mark.slow
def test_slowloris_request_head_is_cut_at_the_idle_timeout(limited: Adapter, pki: Pki) -> None:
    with (
        socket.create_connection(("127.0.0.1", limited.port), timeout=10) as raw,
        tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        started = time.monotonic()
        closed_after = None
        for byte in hpa_head(V2)[:40]:
            try:
                tls.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - started
                break
            time.sleep(0.2)
        if closed_after is None:
            assert tls.recv(1) == b""  # the server closed without answering a head it never got
            closed_after = time.monotonic() - started
    assert closed_after < 5


@pytest.mark.parametrize(
    ("head", "code", "reason"),
    [
        (hpa_head(V2 + "/" + "x" * 20_000), 414, "RequestURITooLong"),
        (hpa_head(V2, "X-Big: " + "y" * 9000 + "\r\n"), 431, "RequestHeaderFieldsTooLarge"),
        (hpa_head(V2, "".join(f"X-H{i}: v\r\n" for i in range(150))), 431, "RequestHeaderFieldsTooLarge"),
        (hpa_head(V2, "Content-Length: 5\r\n") + b"hello", 413, "RequestEntityTooLarge"),
        (hpa_head(V2).replace(b"GET", b"POST", 1), 405, "MethodNotAllowed"),
        (b"GET /\x00 HTTP/1.1\r\n\r\n", 400, "BadRequest"),
    ],
)
def test_limits_and_malformed_requests_are_status_objects(
    limited: Adapter, pki: Pki, head: bytes, code: int, reason: str
) -> None:
    got, body = raw_request(limited.port, pki, head)
    assert got == code
    assert (body["kind"], body["apiVersion"], body["status"], body["code"], body["reason"]) == (
        "Status",
        "v1",
        "Failure",
        code,
        reason,
    )
    assert body["message"]


@pytest.mark.slow
def test_a_client_leaving_before_its_answer_is_one_debug_line(
    limited: Adapter, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    answered = threading.Event()
    real = limited.app.api.answer

    def slow(path: str, query: Mapping[str, str]) -> Any:
        nowait.check()  # a slow answer is a worker thread's (the loop answers only from memory)
        time.sleep(0.5)
        try:
            return real(path, query)
        finally:
            answered.set()

    limited.app.api.answer = slow  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG)
    for _ in range(3):
        answered.clear()
        with (
            socket.create_connection(("127.0.0.1", limited.port), timeout=10) as raw,
            tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(hpa_head(PODS))
            time.sleep(0.1)
        assert answered.wait(5)
    time.sleep(0.3)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "adapter.serving.app"]
    assert loud == []
    assert not any(r.exc_info for r in caplog.records)
    gone = [r for r in caplog.records if "went away" in r.getMessage()]
    assert len(gone) == 3 and all(r.levelno == logging.DEBUG for r in gone)


def test_tls_1_2_is_the_floor_and_is_served(limited: Adapter, pki: Pki) -> None:
    assert limited._ssl.minimum_version == ssl.TLSVersion.TLSv1_2
    ctx = tls_context(pki)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with (
        socket.create_connection(("127.0.0.1", limited.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() == "TLSv1.2"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_silent_connection_costs_kilobytes_not_a_thread(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    adapter = start_adapter(base_settings(prom.url, pki, limits=ServerLimits(max_connections=600)))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    assert client.as_hpa(V2).status_code == 200
    threads, before = set(threading.enumerate()), rss_mib()
    silent = [socket.create_connection(("127.0.0.1", adapter.port)) for _ in range(500)]
    try:
        assert wait_for(lambda: adapter.server.open_connections == 500)
        grown = rss_mib() - before
        # TLS is set up at the first byte: OpenSSL's ~50 KB per connection would be 25 MiB here, and
        # asyncio's default 256 KiB read buffer another 125 MiB
        assert grown < 10, f"{grown:.1f} MiB for 500 silent connections"
        assert len(set(threading.enumerate()) - threads) <= 1
        assert client.as_hpa(V2).status_code == 200
    finally:
        for s in silent:
            s.close()


@pytest.mark.slow
def test_at_the_limit_stalled_handshakes_are_shed_for_real_clients(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    limits = ServerLimits(max_connections=20, handshake_timeout=60.0, busy_handshake_timeout=0.5)
    adapter = start_adapter(base_settings(prom.url, pki, limits=limits))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    stalled = []
    for _ in range(100):  # a TLS record header, then nothing: each one taken holds OpenSSL state
        s = socket.create_connection(("127.0.0.1", adapter.port))
        s.sendall(b"\x16\x03\x01\x02\x00")
        stalled.append(s)
    try:
        started = time.monotonic()
        assert client.as_hpa(V2).status_code == 200
        assert time.monotonic() - started < 8  # not the 60 s handshake deadline, several times over
        assert adapter.server.shed_handshakes >= 20
        assert adapter.server.open_connections <= 20
    finally:
        for s in stalled:
            s.close()


def test_large_answers_are_streamed_whole(
    limited: Adapter, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "STREAM_ABOVE", 100)
    monkeypatch.setattr(server, "STREAM_CHUNK", 64)  # many small writes, each waiting for the client
    client = Client(f"https://127.0.0.1:{limited.port}", pki)
    r = client.as_hpa(PODS.split("?", maxsplit=1)[0], {"labelSelector": "app=llm-inference"})
    assert r.status_code == 200 and int(r.headers["Content-Length"]) == len(r.content) > 100
    assert sorted(i["describedObject"]["name"] for i in r.json()["items"]) == [
        "llm-inference-7d9f-a",
        "llm-inference-7d9f-b",
        "llm-inference-7d9f-c",
    ]


def test_large_answers_are_gzipped_for_clients_that_accept_it(
    limited: Adapter, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "GZIP_ABOVE", 100)  # the test data's answers are small
    url = f"https://127.0.0.1:{limited.port}{PODS}"

    def raw(encoding: str | None) -> requests.Response:
        session = requests.Session()
        session.headers.pop("Accept-Encoding")  # requests asks for gzip by default
        headers = {"X-Remote-User": "hpa"} | ({"Accept-Encoding": encoding} if encoding is not None else {})
        cert = (str(pki.front_proxy.cert), str(pki.front_proxy.key))
        verify = str(pki.serving_ca.path)
        return session.get(url, headers=headers, cert=cert, verify=verify, stream=True, timeout=10)

    plain = raw(None)
    assert "Content-Encoding" not in plain.headers and plain.headers["Vary"] == "Accept-Encoding"
    body = plain.raw.read()
    for encoding in ("gzip", "br, gzip;q=0.5", "*"):
        r = raw(encoding)
        assert r.headers["Content-Encoding"] == "gzip", encoding
        packed = r.raw.read(decode_content=False)
        assert int(r.headers["Content-Length"]) == len(packed) < len(body)
        assert gzip.decompress(packed) == body  # byte for byte the identity answer
    for refused in ("gzip;q=0", "identity", "br"):
        r = raw(refused)
        assert "Content-Encoding" not in r.headers and r.raw.read() == body, refused
    assert limited.server._gzip.get(body) is None  # kept by the answer object, not by equal bytes
    assert len(limited.server._gzip) == 1  # the answer from memory was compressed once


def test_accept_encoding_parsing_and_the_gzip_store_bound() -> None:
    assert accepts_gzip(["gzip, deflate"]) and accepts_gzip(["deflate", "x-gzip;q=0.1"])
    assert not accepts_gzip(["gzip;q=0"]) and not accepts_gzip(["gzip;q=zero"]) and not accepts_gzip([])
    assert not accepts_gzip(["gzipped"])
    store = GzipCache(max_entries=2, max_bytes=10_000)
    bodies = [bytes([i]) * 1000 for i in range(3)]
    for b in bodies:
        store.put(b, gzip_bytes(b))
    assert len(store) == 2 and store.get(bodies[0]) is None
    assert gzip.decompress(store.get(bodies[2]) or b"") == bodies[2]
    store.put(b"x" * 9000, b"y" * 1001)  # over the byte budget on its own: not kept
    assert store.get(b"x" * 9000) is None and store.bytes <= 10_000


@pytest.mark.slow
def test_idle_tls_client_that_ignores_close_notify_is_dropped(limited: Adapter, pki: Pki) -> None:
    """An idle connection is cut at ``idle_timeout`` with a TLS close_notify; a client that never
    answers it (nor closes) loses its socket after ``TLS_SHUTDOWN_TIMEOUT``, not the loop's 30 s."""
    with (
        socket.create_connection(("127.0.0.1", limited.port), timeout=10) as raw,
        tls_context(pki).wrap_socket(raw, server_hostname="127.0.0.1"),
    ):
        assert wait_for(lambda: limited.server.open_connections == 1)
        started = time.monotonic()
        assert wait_for(lambda: limited.server.open_connections == 0, timeout=15)
        # idle_timeout 1 s + TLS_SHUTDOWN_TIMEOUT 2 s, with room for a slow machine
        assert time.monotonic() - started < 8
