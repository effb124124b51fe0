"""The simulator's HTTP endpoint for the cluster series: ``/metrics`` (text 0.0.4) and ``/health``, on
:mod:`gpupilot_common.httpserve` (aiohttp, bounded connections and header sizes).

Each scrape evaluates :func:`simulator.cluster.families` at the current time (a few hundred series,
a few milliseconds), so values follow the clock exactly like the backfill's. :class:`SeriesServer`
serves any render function the same way (tests and the devkit use it for simulated nodes too).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Self

from exporter.expose import render
from gpupilot_common.httpserve import TEXT, HTTPServer, Limits, Reply
from simulator import cluster, service, service_series
from simulator.model import Scenario

HEALTH_PATHS = frozenset({"/health", "/ready", "/-/healthy"})


class SeriesServer:
    """``/metrics`` answers ``render()`` in text format 0.0.4; ``/health`` answers ok."""

    def __init__(
        self,
        render_body: Callable[[], str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
    ) -> None:
        self._render_body = render_body
        self._http = HTTPServer(self._answer, host=host, port=port, limits=limits, name="sim-cluster")

    @property
    def port(self) -> int:
        return self._http.port

    def render(self) -> str:
        return self._render_body()

    def _answer(self, path: str, _query: Mapping[str, str]) -> Reply:
        if path == "/metrics":
            return Reply(200, self.render().encode(), render.TEXT_CONTENT_TYPE)
        if path in HEALTH_PATHS:
            return Reply(200, b"ok\n", TEXT)
        return Reply(404, b"not found: try /metrics\n", TEXT)

    def serve_forever(self) -> None:
        self._http.serve_forever()

    def start(self) -> Self:
        """Serve in a background thread (tests, the demo)."""
        self._http.start()
        return self

    def close(self) -> None:
        self._http.close()


class ClusterServer(SeriesServer):
    """The cluster series of a scenario at ``clock()``."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        limits: Limits | None = None,
    ) -> None:
        self.scenario = scenario
        self.clock = clock
        self.series = cluster.series(scenario)
        # an autoscaled service's week is a few seconds of the controller's decisions: run it before
        # serving, and the next week's in the background as this one ends, never on a scrape
        service_series.warm(scenario, clock())
        self._warming: threading.Thread | None = None
        super().__init__(self._families_text, host=host, port=port, limits=limits)

    def _warm_ahead(self, now: float) -> None:
        if not self.scenario.services or (self._warming is not None and self._warming.is_alive()):
            return
        if service.week_start(now + 3600.0) == service.week_start(now):
            return
        self._warming = threading.Thread(
            target=service_series.warm, args=(self.scenario, now), name="sim-week-ahead", daemon=True
        )
        self._warming.start()

    def _families_text(self) -> str:
        now = self.clock()
        self._warm_ahead(now)
        pods = service_series.window_series(self.scenario, now, now)  # autoscaled services' pods come and go
        return render.render_text(cluster.families(self.scenario, now, all_series=self.series + pods))
