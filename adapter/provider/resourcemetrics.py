"""Resource metrics (CPU, memory) for Resource/ContainerResource targets, from Prometheus.

What metrics-server would report, rebuilt from the series most clusters already scrape: cAdvisor's
``container_cpu_usage_seconds_total`` (a rate over ``CPU_WINDOW``) and
``container_memory_working_set_bytes`` summed over a pod's containers (the ``POD`` sandbox and
pod-level rows without a ``container`` label left out), and kube-state-metrics'
``kube_pod_container_resource_requests``. The simulator's cluster series publish all three.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from adapter.clients.prometheus import PrometheusClient
from adapter.errors import BadRequest
from adapter.provider.selectors import promql_escape
from adapter.quantity import to_milli

CPU_WINDOW = "1m"
"""Rate window for CPU usage (metrics-server reports over its kubelet scrape, ~15-60 s)."""


def usage_query(resource: str, namespace: str, container: str = "") -> str:
    extra = f', container="{promql_escape(container)}"' if container else ""
    matchers = f'namespace="{promql_escape(namespace)}", container!="", container!="POD"{extra}'
    if resource == "cpu":
        return f"sum by (pod) (rate(container_cpu_usage_seconds_total{{{matchers}}}[{CPU_WINDOW}]))"
    if resource == "memory":
        return f"sum by (pod) (container_memory_working_set_bytes{{{matchers}}})"
    raise BadRequest(f"resource {resource!r}: only cpu and memory are known")


def requests_query(resource: str, namespace: str, container: str = "") -> str:
    extra = f', container="{promql_escape(container)}"' if container else ""
    return (
        f'sum by (pod) (kube_pod_container_resource_requests{{namespace="{promql_escape(namespace)}", '
        f'resource="{promql_escape(resource)}"{extra}}})'
    )


def fetch(
    prometheus: PrometheusClient,
    *,
    namespace: str,
    resource: str,
    container: str = "",
    at: float | None = None,
) -> tuple[dict[str, float], dict[str, int]]:
    """(usage per pod in cores / bytes, requests per pod in milli-units)."""
    usage = {
        s.labels["pod"]: s.value
        for s in prometheus.query(usage_query(resource, namespace, container), at=at, purpose="resource")
        if "pod" in s.labels and math.isfinite(s.value)
    }
    requests = {
        s.labels["pod"]: to_milli(s.value)
        for s in prometheus.query(requests_query(resource, namespace, container), at=at, purpose="resource")
        if "pod" in s.labels and math.isfinite(s.value)
    }
    return usage, requests


def request_key(resource: str, container: str) -> str:
    return f"{container}/{resource}" if container else resource


def merge_requests(
    requests: Mapping[str, Mapping[str, int]], extra: Mapping[str, int], key: str
) -> dict[str, dict[str, int]]:
    out = {pod: dict(r) for pod, r in requests.items()}
    for pod, value in extra.items():
        out.setdefault(pod, {})[key] = value
    return out
