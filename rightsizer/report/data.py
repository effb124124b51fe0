"""What the weekly report shows, fetched from Prometheus as plain data (no pandas here).

Every statistic is computed on the server, one range query per chart: fleet idle/allocated/total
slices (``gpupilot:node_slices:*``), mean slice activity per node and hour
(``gpupilot:slice_activity:avg5m``) and the ``ALERTS`` series that fired in the window.

Recording rules only have results from the moment they were loaded (unless their history was
backfilled), so where a rule has no point the same quantity is computed from the raw series the rule
is built from (:func:`trend_queries`: the rules' expressions inlined); the charts then cover the whole window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rightsizer.clients.chunks import QueryLimits, fleet_groups, scoped
from rightsizer.clients.prometheus import PrometheusClient, Series
from rightsizer.plan.model import Plan

Groups = list[tuple[str, ...] | None]
ONE_GROUP: Groups = [None]
MAX_POINTS = 10_000
"""Points per series of one range query at most (Prometheus refuses more than 11,000)."""
HEATMAP_ROWS = 60
"""A larger fleet's heatmap shows its least active nodes only (the rightsizing candidates)."""

FIRING = 'ALERTS{alertstate="firing"}'
ZERO_WHERE_SEEN = " or 0 * count(gpupilot_gpu_info)"
"""0 where the exporter reported GPUs, nothing (missing, not zero) before the history begins."""


@dataclass(frozen=True)
class TrendQueries:
    """Each trend line as its recording rule and the raw expression standing in where it has no point."""

    idle: tuple[str, str]
    allocated: tuple[str, str]
    total: tuple[str, str]


def trend_queries(cluster_label: str = "cluster", *, named: bool = False) -> TrendQueries:
    """Devices are counted by cluster too, so the same node and GPU names in two clusters count
    twice. ``named``: the plan's series carry ``cluster_label``; the rules are then read only where
    their series carry it as well (one evaluator over several clusters' series would merge them)."""
    sel = f'{{{cluster_label}!=""}}' if named else ""
    by = f"{cluster_label}, Hostname, UUID, GPU_I_ID"
    raw_idle = (
        f"count(count by ({by}) ("
        f'max by ({by}) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!="", pod!=""}}[4m59s999ms])) < 0.05'
        f' or max by ({by}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[4m59s999ms])) < 5'
        "))" + ZERO_WHERE_SEEN
    )
    return TrendQueries(
        idle=(f"sum(gpupilot:node_slices:idle{sel})", raw_idle),
        allocated=(
            f"sum(gpupilot:node_slices:allocated{sel})",
            f"count(count by ({by}) (gpupilot_device_pod_info))" + ZERO_WHERE_SEEN,
        ),
        total=(
            f"sum(gpupilot:node_slices:total{sel})",
            'count(gpupilot_mig_instance_info or gpupilot_gpu_info{mig_mode="disabled"})',
        ),
    )


ALERT_KEYS = ("Hostname", "namespace", "pod", "horizontalpodautoscaler", "gpu", "GPU_I_PROFILE", "instance")


@dataclass(frozen=True)
class Trend:
    times: tuple[float, ...]
    idle: tuple[float | None, ...]
    allocated: tuple[float | None, ...]
    total: tuple[float | None, ...]


@dataclass(frozen=True)
class Heatmap:
    hours: tuple[float, ...]
    nodes: tuple[str, ...]
    values: tuple[tuple[float | None, ...], ...]
    """``values[node][hour]``: mean activity 0-1 of the node's slices in that hour; None = no data."""
    nodes_total: int = 0
    """Nodes with data; more than ``len(nodes)`` when only the least active are kept."""


@dataclass(frozen=True)
class AlertSeen:
    name: str
    severity: str
    subject: str
    """The labels that say what fired (node, pod, GPU …), ``k=v`` joined."""
    first: float
    last: float
    minutes: float


@dataclass(frozen=True)
class ReportData:
    start: float
    end: float
    trend: Trend
    heatmap: Heatmap
    alerts: tuple[AlertSeen, ...]
    plan: Plan
    price_per_gpu_hour: float | None
    prometheus_url: str


def _aligned(series: list[Series], times: tuple[float, ...]) -> tuple[float | None, ...]:
    """The series' values on the grid ``times``, matched by slot (never by float equality): a point
    belongs to the grid time nearest to it, within half a step; a slot without one is missing."""
    out: list[float | None] = [None] * len(times)
    if not series or not times:
        return tuple(out)
    step = times[1] - times[0] if len(times) > 1 else 1.0
    for t, v in series[0].points:
        i = round((t - times[0]) / step)
        if 0 <= i < len(times) and abs(t - times[i]) <= step / 2 and math.isfinite(v):
            out[i] = v
    return tuple(out)


def _summed(
    client: PrometheusClient, query: str, times: tuple[float, ...], step: float, groups: Groups
) -> tuple[float | None, ...]:
    """A fleet-wide count or sum, queried per node group and added up slot by slot (missing where
    every group's answer is missing)."""
    out: list[float | None] = [None] * len(times)
    for nodes in groups:
        got = _aligned(client.range(scoped(query, nodes), times[0], times[-1], step), times)
        out = [a if b is None else b if a is None else a + b for a, b in zip(out, got, strict=True)]
    return tuple(out)


def _filled(
    client: PrometheusClient,
    rule: str,
    raw: str,
    times: tuple[float, ...],
    step: float,
    *,
    groups: Groups = ONE_GROUP,
) -> tuple[float | None, ...]:
    """The rule's values (one series per node: whole-fleet queries), with the raw expression's
    (over every device: per node group) where the rule has none."""
    got = _aligned(client.range(rule, times[0], times[-1], step), times)
    if all(v is not None for v in got):
        return got
    fallback = _summed(client, raw, times, step, groups)
    return tuple(v if v is not None else f for v, f in zip(got, fallback, strict=True))


def grid_step(seconds: float) -> float:
    """A range-query step the server gets exactly: whole seconds (``514.2857`` would be sent rounded)."""
    return float(max(1, math.ceil(seconds)))


def steps(start: float, end: float, step: float) -> tuple[float, ...]:
    """Grid times in ``(start, end]``, on multiples of ``step`` (whole seconds)."""
    step = grid_step(step)
    first = start - start % step + step
    n = int((end - first) // step) + 1
    return tuple(first + i * step for i in range(max(0, n)))


def fetch_trend(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float,
    queries: TrendQueries | None = None,
    groups: Groups = ONE_GROUP,
) -> Trend:
    step = grid_step(step)
    times = steps(start, end, step)
    if not times:
        return Trend((), (), (), ())
    q = queries or trend_queries()
    return Trend(
        times,
        _filled(client, *q.idle, times, step, groups=groups),
        _filled(client, *q.allocated, times, step, groups=groups),
        _filled(client, *q.total, times, step, groups=groups),
    )


def fetch_heatmap(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float = 3600.0,
    cluster_label: str = "cluster",
    named: bool = False,
    groups: Groups = ONE_GROUP,
    rows: int = HEATMAP_ROWS,
) -> Heatmap:
    """Per node and hour, the mean activity of its slices; past ``rows`` nodes, the least active
    ``rows`` (mean over the hours with data). Rows ``cluster · node``, grouped by cluster, when the
    series carry ``cluster_label`` (the same node name in two clusters stays two rows, also when one
    node group's ``Hostname`` matcher selects both); ``named``: as for :func:`trend_queries`."""
    parts = [
        _heatmap(client, start=start, end=end, step=step, nodes=g, cluster_label=cluster_label, named=named)
        for g in groups
    ]
    hours = parts[0][0]
    by_node = {k: row for _, part in parts for k, row in part.items()}
    total = len(by_node)
    if total > rows:

        def mean(row: tuple[float | None, ...]) -> float:
            seen = [v for v in row if v is not None]
            return sum(seen) / len(seen) if seen else math.inf

        keep = sorted(by_node, key=lambda k: (mean(by_node[k]), k))[:rows]
        by_node = {k: by_node[k] for k in keep}
    keys = sorted(by_node)
    labelled = any(c for c, _ in keys)
    nodes = tuple(f"{c or '-'} · {n}" if labelled else n for c, n in keys)
    return Heatmap(hours, nodes, tuple(by_node[k] for k in keys), total)


def _heatmap(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float,
    nodes: tuple[str, ...] | None,
    cluster_label: str,
    named: bool,
) -> tuple[tuple[float, ...], dict[tuple[str, str], tuple[float | None, ...]]]:
    """One node group's rows, keyed by (cluster, node)."""
    hours = steps(start, end, step)
    if not hours:
        return (), {}
    # Each cell: the mean over the hour ending at that step (a subquery-free avg_over_time), the
    # window a millisecond short so that Prometheus 2 (closed windows) and 3 (left-open) both leave
    # out the sample on the hour before: (t - 1 h, t].
    rng = f"[{int(step) * 1000 - 1}ms]"
    by = f"{cluster_label}, Hostname"
    sel = f'{{{cluster_label}!=""}}' if named else ""
    rule = f"avg by ({by}) (avg_over_time(gpupilot:slice_activity:avg5m{sel}{rng}))"
    raw = (
        f'avg by ({by}) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!=""}}{rng})'
        f" or avg_over_time(DCGM_FI_DEV_GPU_UTIL{rng}) / 100)"
    )

    def row(s: Series) -> tuple[str, str]:
        return s.labels.get(cluster_label, ""), s.labels.get("Hostname", "?")

    by_node: dict[tuple[str, str], tuple[float | None, ...]] = {
        row(s): _aligned([s], hours) for s in client.range(scoped(rule, nodes), hours[0], hours[-1], step)
    }
    if not by_node or any(v is None for values in by_node.values() for v in values):
        for s in client.range(scoped(raw, nodes), hours[0], hours[-1], step):
            node = row(s)
            fallback = _aligned([s], hours)
            have = by_node.get(node, tuple(None for _ in hours))
            by_node[node] = tuple(v if v is not None else f for v, f in zip(have, fallback, strict=True))
    return hours, by_node


def fetch_alerts(
    client: PrometheusClient, *, start: float, end: float, step: float = 300.0
) -> tuple[AlertSeen, ...]:
    """Alerts that fired in the window, with first/last time seen and minutes firing (at ``step`` resolution)."""
    out = []
    for s in client.range(FIRING, start, end, step):
        if not s.points:
            continue
        labels = s.labels
        subject = ", ".join(f"{k}={labels[k]}" for k in ALERT_KEYS if labels.get(k))
        ts = [t for t, v in s.points if v > 0]
        if not ts:
            continue
        out.append(
            AlertSeen(
                name=labels.get("alertname", "?"),
                severity=labels.get("severity", ""),
                subject=subject,
                first=min(ts),
                last=max(ts),
                minutes=len(ts) * step / 60.0,
            )
        )
    rank = {"critical": 0, "warning": 1, "info": 2}
    return tuple(sorted(out, key=lambda a: (rank.get(a.severity, 3), -a.minutes, a.name, a.subject)))


def collect(
    client: PrometheusClient,
    *,
    end: float,
    window_s: float,
    plan: Plan,
    price_per_gpu_hour: float | None,
    progress: Callable[[str], None] = lambda _m: None,
    cluster_label: str = "cluster",
    limits: QueryLimits | None = None,
) -> ReportData:
    """Everything the report shows. Queries over every device are cut into node groups under
    ``limits`` (the plan's nodes and devices say how many series each node has)."""
    start = end - window_s
    trend_step = max(60.0, window_s / 336)  # 7 days → 30-minute points
    named = any(n.cluster for n in plan.nodes)
    # node groups by name: a name's cost counts its devices in every cluster (its Hostname matcher
    # selects them all); the queries group by the cluster label, so clusters stay apart
    devices: dict[str, int] = {}
    for n in plan.nodes:
        devices[n.name] = devices.get(n.name, 0) + sum(
            sum(g.mig_devices.values()) if g.mig_enabled else 1 for g in n.current
        )
    groups = fleet_groups(
        client, devices, limits=limits or QueryLimits(), span_s=window_s, at=end, selectors=2
    )
    cut = f" in {len(groups)} node groups" if len(groups) > 1 else ""
    progress(f"fleet slice trend{cut}")
    trend = fetch_trend(
        client,
        start=start,
        end=end,
        step=trend_step,
        queries=trend_queries(cluster_label, named=named),
        groups=groups,
    )
    progress(f"per-node activity{cut}")
    heatmap = fetch_heatmap(
        client,
        start=start,
        end=end,
        step=3600.0 if window_s >= 86400 else 300.0,
        cluster_label=cluster_label,
        named=named,
        groups=groups,
    )
    progress("alerts")
    # 5-minute resolution up to 34 days; longer windows stay under Prometheus' 11,000 points per series
    alerts = fetch_alerts(client, start=start, end=end, step=max(300.0, grid_step(window_s / MAX_POINTS)))
    return ReportData(start, end, trend, heatmap, alerts, plan, price_per_gpu_hour, client.url)
