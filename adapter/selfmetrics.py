"""The adapter's own metrics (``/metrics``), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from adapter.prometheus import PrometheusMetrics


class SelfMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gpupilot_adapter_requests_total",
            "API requests answered, by kind (custom, external, discovery, other) and HTTP code.",
            ["kind", "code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "gpupilot_adapter_request_duration_seconds",
            "Time from request parsed to answer written, by kind.",
            ["kind"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
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
        self.serving_cert_expiry = Gauge(
            "gpupilot_adapter_serving_certificate_expiry_timestamp_seconds",
            "Unix time the serving certificate in use expires.",
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
