"""What the weekly report shows, fetched from Prometheus as plain data (no pandas here).

Every statistic is computed on the server, one range query per chart: fleet idle/allocated/total
slices (``gpupilot:node_slices:*``), mean slice activity per node and hour
(``gpupilot:slice_activity:avg5m``) and the ``ALERTS`` series that fired in the window.

Recording rules only have results from the moment they were loaded (unless their history was
backfilled), so where a rule has no point the same quantity is computed from the raw series the rule
is built from (``RAW_*`` below, the rules' expressions inlined); the charts then cover the whole window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from rightsizer.clients.prometheus import PrometheusClient, Series
from rightsizer.plan.model import Plan

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
        f'max by ({by}) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!="", pod!=""}}[5m])) < 0.05'
        f' or max by ({by}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL{{pod!=""}}[5m])) < 5'
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


def _filled(
    client: PrometheusClient, rule: str, raw: str, times: tuple[float, ...], step: float
) -> tuple[float | None, ...]:
    """The rule's values, with the raw expression's where the rule has none."""
    got = _aligned(client.range(rule, times[0], times[-1], step), times)
    if all(v is not None for v in got):
        return got
    fallback = _aligned(client.range(raw, times[0], times[-1], step), times)
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
) -> Trend:
    step = grid_step(step)
    times = steps(start, end, step)
    if not times:
        return Trend((), (), (), ())
    q = queries or trend_queries()
    return Trend(
        times,
        _filled(client, *q.idle, times, step),
        _filled(client, *q.allocated, times, step),
        _filled(client, *q.total, times, step),
    )


def fetch_heatmap(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float = 3600.0,
    cluster_label: str = "cluster",
    named: bool = False,
) -> Heatmap:
    """Mean slice activity per node and hour; rows ``cluster · node``, grouped by cluster, when the
    series carry ``cluster_label`` (the same node name in two clusters stays two rows); ``named``: as
    for :func:`trend_queries`."""
    hours = steps(start, end, step)
    if not hours:
        return Heatmap((), (), ())
    # Each cell: the mean over the hour ending at that step (a subquery-free avg_over_time).
    rng = f"[{int(step)}s]"
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
        row(s): _aligned([s], hours) for s in client.range(rule, hours[0], hours[-1], step)
    }
    if not by_node or any(v is None for values in by_node.values() for v in values):
        for s in client.range(raw, hours[0], hours[-1], step):
            node = row(s)
            fallback = _aligned([s], hours)
            have = by_node.get(node, tuple(None for _ in hours))
            by_node[node] = tuple(v if v is not None else f for v, f in zip(have, fallback, strict=True))
    keys = sorted(by_node)
    named = any(c for c, _ in keys)
    nodes = tuple(f"{c or '-'} · {n}" if named else n for c, n in keys)
    return Heatmap(hours, nodes, tuple(by_node[k] for k in keys))


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
) -> ReportData:
    start = end - window_s
    trend_step = max(60.0, window_s / 336)  # 7 days → 30-minute points
    progress("fleet slice trend")
    named = any(n.cluster for n in plan.nodes)
    trend = fetch_trend(
        client, start=start, end=end, step=trend_step, queries=trend_queries(cluster_label, named=named)
    )
    progress("per-node activity")
    heatmap = fetch_heatmap(
        client,
        start=start,
        end=end,
        step=3600.0 if window_s >= 86400 else 300.0,
        cluster_label=cluster_label,
        named=named,
    )
    progress("alerts")
    alerts = fetch_alerts(client, start=start, end=end)
    return ReportData(start, end, trend, heatmap, alerts, plan, price_per_gpu_hour, client.url)
