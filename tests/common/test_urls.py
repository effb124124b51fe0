"""Credentials in a --prometheus-url: sent as HTTP basic auth, never shown (messages, logs, 503
bodies, explain-hpa, plan, report)."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from adapter import cli as adapter_cli
from adapter.clients.prometheus import PrometheusClient as AdapterPrometheus
from adapter.errors import PrometheusUnavailable
from gpupilot_common.urls import redact, split_userinfo
from rightsizer import cli as rightsizer_cli
from rightsizer.clients.prometheus import PrometheusClient as RightsizerPrometheus

ROOT = Path(__file__).resolve().parents[2]
SEED_HPA = ROOT / "examples" / "hpa-llm-inference.yaml"
SECRET = "s3cret"
CLOSED = "http://admin:s3cret@127.0.0.1:9"  # nothing listens on the discard port here


def test_split_and_redact() -> None:
    assert split_userinfo("https://admin:s%40cret@prom.example:9090/prefix") == (
        "https://prom.example:9090/prefix",
        ("admin", "s@cret"),
    )
    assert split_userinfo("http://prom:9090") == ("http://prom:9090", None)
    assert split_userinfo("http://[::1") == ("http://[::1", None)
    assert redact("at http://admin:s3cret@prom:9090/api?x=1 now") == "at http://***@prom:9090/api?x=1 now"
    assert redact("http://prom:9090/a@b") == "http://prom:9090/a@b"
    assert redact("no url here") == "no url here"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[str | None]]]:
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://admin:{SECRET}@127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_both_clients_send_the_credentials_as_basic_auth(recorder: tuple[str, list[str | None]]) -> None:
    url, seen = recorder
    expected = "Basic " + base64.b64encode(f"admin:{SECRET}".encode()).decode()
    adapter_client = AdapterPrometheus(url)
    assert adapter_client.query("up") == []
    assert SECRET not in adapter_client.url
    with RightsizerPrometheus(url) as rightsizer_client:
        assert rightsizer_client.instant("up") == []
        assert SECRET not in rightsizer_client.url
    adapter_client.close()
    assert seen == [expected, expected]


def test_adapter_error_and_its_log_never_show_the_password(caplog: pytest.LogCaptureFixture) -> None:
    client = AdapterPrometheus(CLOSED, timeout=2)
    with caplog.at_level(logging.DEBUG), pytest.raises(PrometheusUnavailable) as info:
        client.query("up")
    client.close()
    message = str(info.value)  # this text is the API's 503 body
    assert "127.0.0.1:9" in message
    assert SECRET not in message and "admin" not in message
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (adapter_cli.main, ["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", CLOSED]),
        (rightsizer_cli.main, ["plan", "--prometheus-url", CLOSED, "--timeout", "2"]),
        (rightsizer_cli.main, ["report", "--prometheus-url", CLOSED, "--out", "{tmp}", "--timeout", "2"]),
    ],
    ids=["explain-hpa", "plan", "report"],
)
def test_commands_name_the_server_without_the_password(
    main: object, argv: list[str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path / "out")) for a in argv]
    assert callable(main)
    rc = main(argv)
    out, err = capfd.readouterr()
    assert rc != 0
    assert "127.0.0.1:9" in out + err
    assert SECRET not in out + err
