"""Which configured metrics have data: a background refresh of Prometheus' metric names.

Only ``/api/v1/label/__name__/values`` is read (a list of names, small even for large servers), every
``interval`` seconds (30 s default; the anchor relists every 10 min). Until the first refresh
succeeds, every configured metric is listed. Serving never waits on discovery: a configured metric
is answered even before it is listed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Gauge

from adapter.clients.prometheus import PrometheusClient
from adapter.config.mapping import AdapterConfig
from adapter.config.resources import Resource
from adapter.errors import PrometheusUnavailable
from gpupilot_common import loops

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listing:
    custom: tuple[tuple[Resource, str], ...]
    """(resource, metric) pairs for custom.metrics.k8s.io discovery."""
    external: tuple[str, ...]
    refreshed: float
    """Unix time of the refresh this listing comes from (0 = never; everything configured is listed)."""


def listing_for(config: AdapterConfig, names: set[str] | None, *, refreshed: float) -> Listing:
    custom = tuple(
        (resource, rule.name)
        for rule in config.metrics
        if names is None or rule.series in names
        for resource in rule.labels
    )
    external = tuple(r.name for r in config.external if names is None or r.series in names)
    return Listing(custom, external, refreshed)


class Discovery:
    def __init__(
        self,
        *,
        prometheus: PrometheusClient,
        config: Callable[[], AdapterConfig],
        interval: float,
        age_gauge: Gauge | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._on_failure = on_failure
        self._prometheus = prometheus
        self._config = config
        self._interval = interval
        self._names: set[str] | None = None
        self._refreshed = 0.0
        self._listing = listing_for(config(), None, refreshed=0.0)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if age_gauge is not None:
            age_gauge.set_function(lambda: time.time() - self._refreshed if self._refreshed else -1)

    @property
    def listing(self) -> Listing:
        return self._listing

    def refresh(self) -> bool:
        """One refresh now; False (and the previous listing kept) when Prometheus failed."""
        try:
            names = self._prometheus.metric_names()
        except PrometheusUnavailable as exc:
            log.warning("discovery: %s; keeping the previous listing", exc)
            self._listing = listing_for(self._config(), self._names, refreshed=self._refreshed)
            return False
        self._names, self._refreshed = names, time.time()
        self._listing = listing_for(self._config(), names, refreshed=self._refreshed)
        return True

    def poke(self) -> None:
        """Refresh soon (after a config reload)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="discovery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = loops.Backoff(initial_s=min(self._interval, 5.0), max_s=self._interval)
        while not self._stop.is_set():
            # anything unforeseen: one line, counted, the previous listing kept, tried again sooner
            ok = loops.guarded("discovery refresh", self.refresh, logger=log, on_failure=self._on_failure)
            self._wake.wait(self._interval if ok else pause.next_delay())
            if ok:
                pause.reset()
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
