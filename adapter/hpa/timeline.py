"""An HPA's inputs over a past time range, from Prometheus range queries of the same PromQL the
adapter serves (so the history is what the HPA would have read), aligned on one step grid.

Per step: an :class:`hpa_controller.decide.Observation` per metric and the replica count the cluster recorded
(kube-state-metrics ``kube_deployment_spec_replicas`` / ``kube_statefulset_replicas``, else the
HPA's ``status_current_replicas``, else the number of pods with a value). The pods are those whose
labels match the target's selector at any time in the range (``kube_pod_labels``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adapter.clients.prometheus import PrometheusClient, RangeSeries
from adapter.config import resources
from adapter.errors import AdapterError
from adapter.hpa.spec import HpaSpec, MetricSource
from adapter.provider import resourcemetrics
from adapter.provider.selectors import Selector, promql_escape
from adapter.provider.values import MetricValues
from hpa_controller import decide as hpa

MAX_STEPS = 200_000
"""A replay longer than this many steps is refused (7 d at 15 s is 40,320)."""


@dataclass
class Timeline:
    times: list[float]
    observations: list[list[hpa.Observation]]
    """``observations[i][m]``: metric ``m`` at ``times[i]``."""
    recorded: list[int | None]
    recorded_from: str
    pods: list[str]


def _index(times: Sequence[float], step: float, start: float) -> dict[int, int]:
    return {round((t - start) / step): i for i, t in enumerate(times)}


def _slot(ts: float, start: float, step: float) -> int:
    return round((ts - start) / step)


def _grid(
    series: Sequence[RangeSeries], start: float, step: float
) -> list[tuple[Mapping[str, str], dict[int, float]]]:
    return [(s.labels, {_slot(ts, start, step): v for ts, v in s.points}) for s in series]


def selected_pods(
    prometheus: PrometheusClient, *, namespace: str, selector: Selector, start: float, end: float
) -> list[str]:
    """Pods of ``namespace`` whose kube-state-metrics labels matched ``selector`` at any time in range."""
    span = max(1, int(end - start) + 1)
    rows = prometheus.query(
        f'last_over_time(kube_pod_labels{{namespace="{promql_escape(namespace)}"}}[{span}s])',
        at=end,
        purpose="pods",
    )
    out = set()
    for row in rows:
        labels = {k[len("label_") :]: v for k, v in row.labels.items() if k.startswith("label_")}
        if row.labels.get("pod") and selector.matches(labels):
            out.add(row.labels["pod"])
    return sorted(out)


def fetch(
    spec: HpaSpec,
    *,
    values: MetricValues,
    prometheus: PrometheusClient,
    selector: Selector,
    start: float,
    end: float,
    step: float,
    non_finite: list[tuple[Mapping[str, str], float, float]] | None = None,
) -> Timeline:
    """The HPA's metrics and recorded replicas at every step; ``non_finite`` collects NaN/Inf
    samples the answers held (dropped from the timeline)."""
    if step <= 0 or end <= start:
        raise AdapterError("the replay range must be positive (--since, --step)")
    count = int((end - start) // step) + 1
    if count > MAX_STEPS:
        raise AdapterError(
            f"{count} steps is too many (at most {MAX_STEPS}); use a larger --step or a shorter --since"
        )
    times = [start + i * step for i in range(count)]
    pods = selected_pods(prometheus, namespace=spec.namespace, selector=selector, start=start, end=end)
    wanted = set(pods)
    per_metric: list[list[hpa.Observation]] = []
    counted: list[int] = [0] * count
    for source in spec.sources:
        try:
            obs = _metric_history(
                source,
                spec=spec,
                values=values,
                prometheus=prometheus,
                wanted=wanted,
                start=start,
                end=end,
                step=step,
                count=count,
                non_finite=non_finite,
            )
        except AdapterError as exc:
            obs = [hpa.Observation(error=str(exc))] * count
        per_metric.append(obs)
        for i, o in enumerate(obs):
            if o.per_pod is not None:
                counted[i] = max(counted[i], len(o.per_pod))
    recorded, origin = _recorded(spec, prometheus=prometheus, start=start, end=end, step=step, count=count)
    if origin == "":
        recorded = [c or None for c in counted]
        origin = "pods with a value"
    observations = [[per_metric[m][i] for m in range(len(spec.sources))] for i in range(count)]
    return Timeline(times, observations, recorded, origin, pods)


def _metric_history(
    source: MetricSource,
    *,
    spec: HpaSpec,
    values: MetricValues,
    prometheus: PrometheusClient,
    wanted: set[str],
    start: float,
    end: float,
    step: float,
    count: int,
    non_finite: list[tuple[Mapping[str, str], float, float]] | None = None,
) -> list[hpa.Observation]:
    m = source.spec
    if m.kind == "Pods":
        _, label, query = values.object_query(
            metric=m.name,
            resource=resources.PODS,
            namespace=spec.namespace,
            name="*",
            metric_selector=source.metric_selector,
        )
        grid = _grid(
            prometheus.query_range(query, start=start, end=end, step=step, non_finite=non_finite), start, step
        )
        by_pod = {labels.get(label, ""): points for labels, points in grid if labels.get(label, "") in wanted}
        return [
            hpa.Observation(per_pod={p: pts[i] for p, pts in by_pod.items() if i in pts})
            for i in range(count)
        ]
    if m.kind == "Object":
        assert source.object_resource is not None
        res = source.object_resource
        _, _, query = values.object_query(
            metric=m.name,
            resource=res,
            namespace=spec.namespace if res.namespaced else "",
            name=source.object_name,
            metric_selector=source.metric_selector,
        )
        grid = _grid(
            prometheus.query_range(query, start=start, end=end, step=step, non_finite=non_finite), start, step
        )
        points = grid[0][1] if grid else {}
        return [
            hpa.Observation(values=(points[i],)) if i in points else hpa.Observation(error="no value")
            for i in range(count)
        ]
    if m.kind == "External":
        _, query = values.external_query(
            metric=m.name, namespace=spec.namespace, selector=source.metric_selector
        )
        grid = _grid(
            prometheus.query_range(query, start=start, end=end, step=step, non_finite=non_finite), start, step
        )
        out = []
        for i in range(count):
            vals = tuple(pts[i] for _, pts in grid if i in pts)
            out.append(hpa.Observation(values=vals) if vals else hpa.Observation(error="no series matched"))
        return out
    usage = _grid(
        prometheus.query_range(
            resourcemetrics.usage_query(m.name, spec.namespace, m.container),
            start=start,
            end=end,
            step=step,
            non_finite=non_finite,
        ),
        start,
        step,
    )
    by_pod = {labels.get("pod", ""): pts for labels, pts in usage if labels.get("pod", "") in wanted}
    return [
        hpa.Observation(per_pod={p: pts[i] for p, pts in by_pod.items() if i in pts}) for i in range(count)
    ]


def resource_requests(spec: HpaSpec, *, prometheus: PrometheusClient, at: float) -> dict[str, dict[str, int]]:
    """Requests per pod (milli-units) for every Resource metric of ``spec``, at one time."""
    out: dict[str, dict[str, int]] = {}
    for source in spec.sources:
        m = source.spec
        if m.kind not in ("Resource", "ContainerResource"):
            continue
        _, requests = resourcemetrics.fetch(
            prometheus, namespace=spec.namespace, resource=m.name, container=m.container, at=at
        )
        out = resourcemetrics.merge_requests(out, requests, resourcemetrics.request_key(m.name, m.container))
    return out


def _recorded(
    spec: HpaSpec, *, prometheus: PrometheusClient, start: float, end: float, step: float, count: int
) -> tuple[list[int | None], str]:
    ns = promql_escape(spec.namespace)
    candidates = []
    if spec.target_kind == "Deployment":
        candidates.append(
            f'kube_deployment_spec_replicas{{namespace="{ns}", deployment="{promql_escape(spec.target_name)}"}}'
        )
    if spec.target_kind == "StatefulSet":
        candidates.append(
            f'kube_statefulset_replicas{{namespace="{ns}", statefulset="{promql_escape(spec.target_name)}"}}'
        )
    candidates.append(
        f'kube_horizontalpodautoscaler_status_current_replicas{{namespace="{ns}", horizontalpodautoscaler="{promql_escape(spec.name)}"}}'
    )
    for query in candidates:
        grid = _grid(prometheus.query_range(f"max({query})", start=start, end=end, step=step), start, step)
        if grid and grid[0][1]:
            points = grid[0][1]
            return [int(points[i]) if i in points else None for i in range(count)], query.split("{")[0]
    return [None] * count, ""


def scale_events(
    times: Sequence[float], recorded: Sequence[int | None]
) -> tuple[list[hpa.ScaleEvent], list[hpa.ScaleEvent]]:
    """Scale-up and scale-down events from changes of the recorded replica count."""
    up: list[hpa.ScaleEvent] = []
    down: list[hpa.ScaleEvent] = []
    last: int | None = None
    for t, r in zip(times, recorded, strict=False):
        if r is None:
            continue
        if last is not None and r != last:
            (up if r > last else down).append(hpa.ScaleEvent(t, abs(r - last)))
        last = r
    return up, down
