"""A small stdlib HTTP server for the cluster series: ``/metrics`` (text 0.0.4) and ``/health``.

Each scrape evaluates :func:`exporter.sim.cluster.families` at the current time (a few hundred series,
well under a millisecond per series), so values follow the clock exactly like the backfill's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exporter import render
from exporter.sim import cluster
from exporter.sim.model import Scenario


class ClusterServer:
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

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def render(self) -> str:
        return render.render_text(cluster.families(self.scenario, self.clock(), all_series=self.series))

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> ClusterServer:
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
