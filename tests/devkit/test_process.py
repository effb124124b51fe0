"""A server started for the tests, the demo or the benchmarks is the one that answers on its port:
another process answering 200 on the same port (a free port is free only until someone binds it, and
parallel test workers start servers all the time) is never taken for it; the server moves to a fresh
port."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.process import listens_on
from devkit.prometheus import PrometheusServer

pytestmark = pytest.mark.prometheus


class _Yes(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def squatter() -> Iterator[int]:
    """A server on 127.0.0.1 answering 200 to every path (``/-/ready`` included): its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Yes)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_port_taken_by_another_server_is_not_mistaken_for_ours(squatter: int, tmp_path: Path) -> None:
    with PrometheusServer(tmp_path / "data", port=squatter, log_file=tmp_path / "prometheus.log") as prom:
        assert prom.port != squatter
        assert listens_on(prom.pid, prom.port)
        with urllib.request.urlopen(f"{prom.url}/api/v1/status/flags", timeout=10) as r:
            flags = json.load(r)["data"]
        assert flags["storage.tsdb.path"] == str(tmp_path / "data")  # ours, not the squatter
    assert "address already in use" in (tmp_path / "prometheus.log").read_text()


def test_listens_on_names_the_process_holding_the_port(squatter: int) -> None:
    import os  # noqa: PLC0415

    assert listens_on(os.getpid(), squatter)  # the squatter is a thread of this process
    assert not listens_on(os.getpid(), squatter + 1 if squatter < 65535 else squatter - 1)
