"""The adapter's own metrics (``/metrics``), in a registry of its own."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from adapter.clients.prometheus import PrometheusMetrics


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = RequestStats(r)
        self.scaler_requests = RequestStats(
            r,
            name="gpupilot_adapter_external_scaler_requests",
            duration_name="gpupilot_adapter_external_scaler_request_duration_seconds",
            label="method",
            what="KEDA external scaler (gRPC) calls answered, by method and gRPC status code; "
            "StreamIsActive counted when the stream ends.",
            duration_what="Time from a KEDA external scaler call received to its answer, by method "
            "(unary calls only).",
        )
        self.prometheus = PrometheusMetrics(r)
        self.discovery_age = Gauge(
            "gpupilot_adapter_discovery_age_seconds",
            "Seconds since the metric listing (cached; refreshed in the background) was refreshed; -1 = never.",
            registry=r,
        )
        self.pod_cache_age = Gauge(
            "gpupilot_adapter_pod_source_age_seconds",
            "Age of the cached pod index: seconds since the last watch event (kubernetes) or the oldest "
            "cached namespace listing (prometheus); -1 = empty.",
            registry=r,
        )
        self.config_reloads = Counter(
            "gpupilot_adapter_config_reloads_total",
            "Config reload attempts, by result (success, failure; a failure keeps the previous config).",
            ["result"],
            registry=r,
        )
        self.config_loaded = Gauge(
            "gpupilot_adapter_config_last_reload_success_timestamp_seconds",
            "Unix time the config now in use was loaded.",
            registry=r,
        )
        self.auth_failures = Counter(
            "gpupilot_adapter_auth_failures_total",
            "Requests refused, by code (401 unauthenticated, 403 forbidden).",
            ["code"],
            registry=r,
        )

        self.refreshed_queries = Gauge(
            "gpupilot_adapter_refreshed_queries",
            "Queries kept fresh in memory (one per metric, resource, namespace and metricLabelSelector "
            "asked for recently); each is evaluated once per refresh interval.",
            registry=r,
        )
        self.values_age = Gauge(
            "gpupilot_adapter_values_age_seconds",
            "Age of the oldest value held in memory (cached; refreshed in the background); -1 = none.",
            registry=r,
        )
        self.refresh_interval = Gauge(
            "gpupilot_adapter_refresh_interval_seconds",
            "Seconds between re-evaluations of each query held in memory.",
            registry=r,
        )
        self.tls_reloads = Counter(
            "gpupilot_adapter_tls_reloads_total",
            "Reloads of the serving certificate and client CAs after their files changed, by result.",
            ["result"],
            registry=r,
        )
        self.scaler_tls_reloads = Counter(
            "gpupilot_adapter_external_scaler_tls_reloads_total",
            "Reloads of the KEDA scaler's serving certificate and client CA after their files changed, "
            "by result; on failure the previous ones stay in use.",
            ["result"],
            registry=r,
        )
        self.loop_failures = Counter(
            "gpupilot_adapter_loop_failures_total",
            "Failures a long-lived loop survived since start, by loop (discovery, refresher, pod-watch, "
            "config-watch, tls-watch, scaler-tls): each logged in one line, the last good state kept, "
            "retried after a growing pause.",
            ["loop"],
            registry=r,
        )
        for loop in LOOPS:
            self.loop_failures.labels(loop)
        self.serving_cert_expiry = Gauge(
            "gpupilot_adapter_serving_certificate_expiry_timestamp_seconds",
            "Unix time the serving certificate in use expires.",
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def loop_failure(self, loop: str) -> Callable[[BaseException], None]:
        """An ``on_failure`` counting under ``loop`` (see :mod:`gpupilot_common.loops`)."""
        counter = self.loop_failures.labels(loop)
        return lambda _exc: counter.inc()


LOOPS = ("discovery", "refresher", "pod-watch", "config-watch", "tls-watch", "scaler-tls")


REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_LE = (*(repr(b) for b in REQUEST_BUCKETS), "+Inf")
"""The buckets' ``le`` labels as prometheus_client writes them (``0.001`` … ``2.5``, ``+Inf``)."""


class RequestStats(Collector):
    """``gpupilot_adapter_requests_total{kind,code}`` and
    ``gpupilot_adapter_request_duration_seconds{kind}``, recorded by the server's event loop thread
    (the only writer) with plain integer adds, and read by the registry at scrape time.

    prometheus_client's children take a lock and make a handful of calls per update: 35 µs a
    request when the CPU's caches are cold, as they are between an HPA's requests; this is one
    dict update and one list update."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        name: str = "gpupilot_adapter_requests",
        duration_name: str = "gpupilot_adapter_request_duration_seconds",
        label: str = "kind",
        what: str = "API requests answered, by kind (custom, external, discovery, other) and HTTP code.",
        duration_what: str = "Time from request parsed to answer written, by kind.",
    ) -> None:
        self._names = (name, duration_name, label, what, duration_what)
        self._counts: dict[tuple[str, int | str], int] = {}
        self._latency: dict[str, tuple[list[int], list[float]]] = {}
        """kind → (observations per bucket, the last one +Inf; [sum of seconds])."""
        registry.register(self)

    def record(self, kind: str, code: int | str, seconds: float) -> None:
        key = (kind, code)
        self._counts[key] = self._counts.get(key, 0) + 1
        found = self._latency.get(kind)
        if found is None:
            found = self._latency[kind] = ([0] * (len(REQUEST_BUCKETS) + 1), [0.0])
        found[0][bisect.bisect_left(REQUEST_BUCKETS, seconds)] += 1
        found[1][0] += seconds

    def count(self, kind: str, code: int | str) -> None:
        """Count without a duration (a stream, whose length says nothing about the server)."""
        key = (kind, code)
        self._counts[key] = self._counts.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        name, duration_name, label, what, duration_what = self._names
        counts = CounterMetricFamily(name, what, labels=[label, "code"])
        for (kind, code), n in sorted(list(self._counts.items()), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            counts.add_metric([kind, str(code)], n)  # list() above: one atomic copy
        latency = HistogramMetricFamily(duration_name, duration_what, labels=[label])
        for kind, (per_bucket, total) in sorted(list(self._latency.items())):
            snapshot, cumulative, buckets = list(per_bucket), 0, []
            for le, n in zip(_LE, snapshot, strict=True):
                cumulative += n
                buckets.append((le, cumulative))
            latency.add_metric([kind], buckets, sum_value=total[0])
        yield counts
        yield latency
