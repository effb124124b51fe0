"""A small stdlib HTTP server for the cluster series: ``/metrics`` (text 0.0.4) and ``/health``.

Each scrape evaluates :func:`exporter.sim.cluster.families` at the current time (a few hundred series,
a few milliseconds), so values follow the clock exactly like the backfill's. :class:`SeriesServer`
serves any render function the same way (tests and the devkit use it for simulated nodes too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from exporter import render
from exporter.sim import cluster
from exporter.sim.model import Scenario


class SeriesServer:
    """``/metrics`` answers ``render()`` in text format 0.0.4; ``/health`` answers ok."""

    def __init__(self, render_body: Callable[[], str], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._render_body = render_body
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body = owner.render().encode()
                    self._reply(200, render.TEXT_CONTENT_TYPE, body)
                elif path in ("/health", "/ready", "/-/healthy"):
                    self._reply(200, "text/plain; charset=utf-8", b"ok\n")
                else:
                    self._reply(404, "text/plain; charset=utf-8", b"not found: try /metrics\n")

            def _reply(self, status: int, ctype: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def render(self) -> str:
        return self._render_body()

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> Self:
        """Serve in a background thread (tests, the demo)."""
        self._thread = threading.Thread(target=self.serve_forever, name="sim-cluster", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()


class ClusterServer(SeriesServer):
    """The cluster series of a scenario at ``clock()``."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.scenario = scenario
        self.clock = clock
        self.series = cluster.series(scenario)
        super().__init__(self._families_text, host=host, port=port)

    def _families_text(self) -> str:
        return render.render_text(cluster.families(self.scenario, self.clock(), all_series=self.series))
