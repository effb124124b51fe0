"""The HTTP(S) endpoint: routes, content negotiation, gzip, keep-alive, /ready, TLS, client certs, basic auth."""

from __future__ import annotations

import base64
import gzip
import http.client
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import requests
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exporter.collect.collector import Collector
from exporter.contract import counters
from exporter.contract.layout import SeriesLayout
from exporter.errors import ConfigError
from exporter.serve import webconfig
from exporter.serve.server import MetricsServer, accepts_gzip, wants_openmetrics
from exporter.settings import CollectorSettings
from tests.support.clocks import ManualClock
from tests.support.exporter import fakes
from tests.support.exporter import pki as pki_mod

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PASSWORD_HASH = bcrypt.hashpw(b"scrape-me", bcrypt.gensalt(4)).decode()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(500.0)


@pytest.fixture
def collector(clock: ManualClock) -> Collector:
    backend = fakes.FakeBackend(fakes.node(fakes.mig_gpu(0), fakes.whole_gpu(1)))
    return Collector(
        backend, hostname="node-a", settings=CollectorSettings(interval=10, collect_timeout=1), clock=clock
    )


@pytest.fixture
def metrics_server(collector: Collector, clock: ManualClock) -> Iterator[MetricsServer]:
    with MetricsServer(collector, host="127.0.0.1", port=0, clock=clock) as srv:
        yield srv


def test_metrics_text_by_default_and_ready_after_first_collection(
    metrics_server: MetricsServer, collector: Collector, clock: ManualClock
) -> None:
    r = requests.get(metrics_server.url + "/ready", timeout=5)
    assert r.status_code == 503
    assert "no successful collection" in r.text
    assert requests.get(metrics_server.url + "/health", timeout=5).status_code == 200
    collector.collect_once()
    clock.now += 3
    r = requests.get(metrics_server.url + "/metrics", headers={"Accept": "*/*"}, timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert 'DCGM_FI_DEV_GPU_TEMP{gpu="1"' in r.text
    assert 'gpupilot_exporter_snapshot_age_seconds{backend="fake"} 3.000' in r.text
    assert requests.get(metrics_server.url + "/ready", timeout=5).status_code == 200
    clock.now += 31  # older than 3 intervals
    r = requests.get(metrics_server.url + "/ready", timeout=5)
    assert r.status_code == 503
    assert "34.0s old" in r.text
    assert requests.get(metrics_server.url + "/health", timeout=5).status_code == 200


def test_text_even_when_openmetrics_is_preferred_while_dcgm_counters_lack_total(
    metrics_server: MetricsServer, collector: Collector
) -> None:
    collector.collect_once()
    r = requests.get(metrics_server.url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5)
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in r.text
    assert not r.text.endswith("# EOF\n")


def test_openmetrics_when_asked_and_every_counter_ends_in_total(clock: ManualClock) -> None:
    only_gauges = counters.select(counters.parse("DCGM_FI_DEV_GPU_TEMP, gauge, t\n", source="x"))
    collector = Collector(
        fakes.FakeBackend(fakes.node(fakes.whole_gpu(0))),
        hostname="node-a",
        settings=CollectorSettings(interval=10, collect_timeout=1),
        layout=SeriesLayout(selection=only_gauges),
        clock=clock,
    )
    collector.collect_once()
    with MetricsServer(collector, host="127.0.0.1", port=0, clock=clock) as srv:
        r = requests.get(srv.url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}, timeout=5)
    assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.text.endswith("# EOF\n")
    fams = {f.name: f for f in parse_openmetrics(r.text)}
    assert fams["DCGM_FI_DEV_GPU_TEMP"].type == "gauge"
    assert fams["gpupilot_exporter_collection_errors"].type == "counter"


def raw_get(srv: MetricsServer, path: str, headers: dict[str, str]) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", path, headers=headers)
    return conn.getresponse()


def test_gzip_only_when_accepted(metrics_server: MetricsServer, collector: Collector) -> None:
    collector.collect_once()
    r = raw_get(metrics_server, "/metrics", {"Accept-Encoding": "gzip, deflate"})
    body = r.read()
    assert r.getheader("Content-Encoding") == "gzip"
    assert int(r.getheader("Content-Length") or 0) == len(body)
    assert b"DCGM_FI_PROF_GR_ENGINE_ACTIVE" in gzip.decompress(body)
    r = raw_get(metrics_server, "/metrics", {"Accept-Encoding": "identity"})
    assert r.getheader("Content-Encoding") is None
    assert b"DCGM_FI_PROF_GR_ENGINE_ACTIVE" in r.read()
    r = raw_get(metrics_server, "/metrics", {"Accept-Encoding": "gzip;q=0"})
    assert r.getheader("Content-Encoding") is None


PROMETHEUS_3_ACCEPT = (  # 3.13's default scrape_protocols, UTF-8 names allowed (seen by tests/exporter/test_prometheus3_scrape.py)
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def test_negotiation_helpers() -> None:
    assert wants_openmetrics(PROMETHEUS_ACCEPT)
    assert wants_openmetrics(PROMETHEUS_3_ACCEPT)
    assert wants_openmetrics(PROMETHEUS_3_ACCEPT.replace("allow-utf-8", "underscores"))
    # scrape_protocols: [PrometheusText0.0.4] alone
    assert not wants_openmetrics("text/plain;version=0.0.4;q=1.0,*/*;q=0.1")
    assert not wants_openmetrics("text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5")
    assert not wants_openmetrics("text/html,application/xhtml+xml,*/*;q=0.8")
    assert not wants_openmetrics("application/openmetrics-text;q=0")
    assert accepts_gzip("gzip")
    assert not accepts_gzip("br, gzip;q=0")


def test_keep_alive_head_404_405_and_bad_requests(
    metrics_server: MetricsServer, collector: Collector
) -> None:
    collector.collect_once()
    backend = collector.backend
    assert isinstance(backend, fakes.FakeBackend)
    reads = backend.read_calls
    conn = http.client.HTTPConnection("127.0.0.1", metrics_server.port, timeout=5)
    for _ in range(3):  # one connection, several requests
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read()
    assert backend.read_calls == reads  # a scrape is a lookup: the backend is never read for it
    conn.request("HEAD", "/metrics")
    r = conn.getresponse()
    assert r.status == 200 and int(r.getheader("Content-Length") or 0) > 1000 and r.read() == b""
    conn.request("GET", "/nope")
    r = conn.getresponse()
    assert r.status == 404
    r.read()
    conn.request("POST", "/metrics", body=b"")
    r = conn.getresponse()
    assert r.status == 405 and r.getheader("Allow") == "GET, HEAD"
    r.read()
    conn.close()
    with socket.create_connection(("127.0.0.1", metrics_server.port), timeout=5) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", metrics_server.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 431")


@pytest.mark.slow
def test_concurrent_scrapes_while_collections_swap_pages(
    metrics_server: MetricsServer, collector: Collector
) -> None:
    collector.collect_once()
    failures: list[str] = []

    def scraper() -> None:
        with requests.Session() as sess:
            for _ in range(15):
                r = sess.get(metrics_server.url + "/metrics", timeout=10)
                if r.status_code != 200 or "gpupilot_exporter_backend_up" not in r.text:
                    failures.append(f"{r.status_code}")

    threads = [threading.Thread(target=scraper) for _ in range(16)]
    for t in threads:
        t.start()
    for _ in range(20):
        collector.collect_once()
    for t in threads:
        t.join()
    assert failures == []


def test_port_in_use_is_one_clear_line(collector: Collector) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(
            ConfigError, match=rf"^--listen 127.0.0.1:{port}: cannot listen \(.*\); choose a free"
        ):
            MetricsServer(collector, host="127.0.0.1", port=port).start()


def web_config(tmp_path: Path, text: str) -> webconfig.WebConfig:
    p = tmp_path / "web.yml"
    p.write_text(text)
    return webconfig.load(p)


def test_tls_and_basic_auth(tmp_path: Path, exporter_pki: pki_mod.Pki, collector: Collector) -> None:
    cfg = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n"
        f"basic_auth_users:\n  prometheus: {PASSWORD_HASH}\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
    )
    collector.collect_once()
    with MetricsServer(collector, host="127.0.0.1", port=0, web_config=cfg) as srv:
        assert srv.url.startswith("https://")
        ca = str(exporter_pki.ca_cert)
        r = requests.get(srv.url + "/metrics", verify=ca, timeout=5)
        assert r.status_code == 401
        assert r.headers["WWW-Authenticate"] == 'Basic realm="gpupilot-exporter"'
        assert "DCGM" not in r.text
        r = requests.get(srv.url + "/metrics", verify=ca, auth=("prometheus", "wrong"), timeout=5)
        assert r.status_code == 401
        r = requests.get(srv.url + "/metrics", verify=ca, auth=("prometheus", "scrape-me"), timeout=5)
        assert r.status_code == 200 and "DCGM_FI_DEV_GPU_TEMP" in r.text
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        # probes need no credentials
        assert requests.get(srv.url + "/health", verify=ca, timeout=5).status_code == 200
        # plain HTTP to the TLS port gets nothing useful
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(srv.url.replace("https", "http") + "/metrics", timeout=5)
        # an untrusting client refuses our self-made CA
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(srv.url + "/health", timeout=5)


def test_client_certificates_required_and_verified(
    tmp_path: Path, exporter_pki: pki_mod.Pki, collector: Collector
) -> None:
    cfg = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {exporter_pki.ca_cert}\n",
    )
    collector.collect_once()
    with MetricsServer(collector, host="127.0.0.1", port=0, web_config=cfg) as srv:
        ca = str(exporter_pki.ca_cert)
        good = (str(exporter_pki.client_cert), str(exporter_pki.client_key))
        r = requests.get(srv.url + "/metrics", verify=ca, cert=good, timeout=5)
        assert r.status_code == 200 and "DCGM_FI_DEV_GPU_TEMP" in r.text
        for cert in (None, (str(exporter_pki.stranger_cert), str(exporter_pki.stranger_key))):
            with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
                requests.get(srv.url + "/metrics", verify=ca, cert=cert, timeout=5)


def test_tls13_minimum_refuses_tls12_clients(
    tmp_path: Path, exporter_pki: pki_mod.Pki, collector: Collector
) -> None:
    cfg = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n  min_version: TLS13\n",
    )
    with MetricsServer(collector, host="127.0.0.1", port=0, web_config=cfg) as srv:
        ctx = ssl.create_default_context(cafile=str(exporter_pki.ca_cert))
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as raw, pytest.raises(ssl.SSLError):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        ctx13 = ssl.create_default_context(cafile=str(exporter_pki.ca_cert))
        with (
            socket.create_connection(("127.0.0.1", srv.port), timeout=5) as raw,
            ctx13.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.version() == "TLSv1.3"


def test_bcrypt_paid_once_per_credential(
    tmp_path: Path, collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = web_config(tmp_path, f"basic_auth_users:\n  prometheus: {PASSWORD_HASH}\n")
    calls: list[bytes] = []
    real = bcrypt.checkpw  # the module exporter.serve.webconfig checks passwords with

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return bool(real(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    collector.collect_once()
    with MetricsServer(collector, host="127.0.0.1", port=0, web_config=cfg) as srv:
        good = base64.b64encode(b"prometheus:scrape-me").decode()
        bad = base64.b64encode(b"prometheus:nope").decode()
        for _ in range(5):
            r = raw_get(srv, "/metrics", {"Authorization": f"Basic {good}"})
            assert r.status == 200
            r.read()
            r = raw_get(srv, "/metrics", {"Authorization": f"Basic {bad}"})
            assert r.status == 401
            r.read()
    assert calls == [b"scrape-me", b"nope"]


def test_pipelined_requests_and_http10_close(metrics_server: MetricsServer, collector: Collector) -> None:
    collector.collect_once()
    with socket.create_connection(("127.0.0.1", metrics_server.port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /ready HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):  # the server closes after the HTTP/1.0 answer
            data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 2
    assert data.index(b"ok\n") < data.index(b"ready: snapshot")
    assert b"Connection: close" in data


def _tls_health(tls: ssl.SSLSocket) -> bytes:
    tls.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return tls.recv(4096)


@pytest.mark.slow
def test_at_the_limit_anonymous_half_heads_make_room_before_a_verified_client(
    tmp_path: Path, exporter_pki: pki_mod.Pki, collector: Collector
) -> None:
    cfg = web_config(
        tmp_path,
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n"
        f"  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {exporter_pki.ca_cert}\n",
    )
    collector.collect_once()
    anonymous = ssl.create_default_context(cafile=str(exporter_pki.ca_cert))
    verified = ssl.create_default_context(cafile=str(exporter_pki.ca_cert))
    verified.load_cert_chain(str(exporter_pki.client_cert), str(exporter_pki.client_key))
    with MetricsServer(collector, host="127.0.0.1", port=0, web_config=cfg, max_connections=20) as srv:
        addr = ("127.0.0.1", srv.port)
        scraper = verified.wrap_socket(socket.create_connection(addr, timeout=5), server_hostname="localhost")
        slow = []
        try:
            assert _tls_health(scraper).startswith(b"HTTP/1.1 200")  # kept alive, idle: the oldest
            for _ in range(60):  # bounded: three times the limit
                tls = anonymous.wrap_socket(
                    socket.create_connection(addr, timeout=5), server_hostname="localhost"
                )
                tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                slow.append(tls)
            probe = anonymous.wrap_socket(
                socket.create_connection(addr, timeout=5), server_hostname="localhost"
            )
            with probe:
                assert _tls_health(probe).startswith(b"HTTP/1.1 200")
            assert _tls_health(scraper).startswith(b"HTTP/1.1 200")  # never closed for an anonymous one
            assert srv._app.shed >= 60 + 1 - 20
        finally:
            scraper.close()
            for tls in slow:
                tls.close()
