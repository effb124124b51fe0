"""The weekly rightsizing report: numbers from :mod:`rightsizer.report.data`, charts from
:mod:`rightsizer.report.charts`, written as a self-contained HTML file (PNGs inlined as data URIs), a
Markdown file and the PNGs themselves."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpupilot_common import atomicfile
from mig_geometry.placement import describe
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.plan import clusters, idle
from rightsizer.plan.model import GpuLayout, NodePlan, Plan
from rightsizer.plan.pipeline import PlanSettings, make_plan
from rightsizer.report import charts
from rightsizer.report import data as report_data
from rightsizer.report import render as report_render
from rightsizer.report.data import ReportData

HOURS_PER_WEEK = 168.0
TOP_IDLE = 15
TOP_SAVINGS = 40
"""The savings chart shows the nodes that free the most GPU-hours; the table lists every change."""


@dataclass(frozen=True)
class Change:
    node: str
    model: str
    current: str
    proposed: str
    gpus_freed: int
    slices_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    pods_disrupted: int
    utilisation: str
    cluster: str = ""


@dataclass(frozen=True)
class IdleSlice:
    label: str
    node: str
    device: str
    pod: str
    idle_hours: float
    idle_share: float
    peak_activity: float | None
    """Busiest rolling mean in the window (below the idle threshold, or the device would not be idle)."""
    cluster: str = ""


@dataclass(frozen=True)
class ClusterSummary:
    """One cluster's line of a report over several clusters (the last line, ``fleet``, sums them)."""

    name: str
    nodes: int
    nodes_changed: int
    gpus: int
    gpus_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    pods_disrupted: int


@dataclass(frozen=True)
class Summary:
    window: str
    window_hours: float
    slices_total: float | None
    idle_now: float | None
    idle_mean: float | None
    gpus_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    cost_per_year: float | None
    nodes_changed: int
    alerts: int
    clusters: tuple[ClusterSummary, ...] = ()
    """Per cluster, then the fleet, when the plan covers several clusters; empty otherwise."""


@dataclass(frozen=True)
class Report:
    data: ReportData
    summary: Summary
    changes: tuple[Change, ...]
    idle: tuple[IdleSlice, ...]
    charts: Mapping[str, bytes]
    """File name (``trend.png``) → PNG bytes."""


def _layout(layouts: tuple[GpuLayout, ...]) -> str:
    """``8 × (3g.40gb×1 + 1g.10gb×4)``: identical GPUs grouped."""
    groups: dict[str, int] = {}
    for g in layouts:
        key = describe(dict(g.mig_devices)) if g.mig_enabled else "MIG off (whole GPU)"
        groups[key] = groups.get(key, 0) + 1
    return "; ".join(f"{n} × ({k})" if n > 1 else k for k, n in groups.items()) or "-"


def _mean(values: tuple[float | None, ...]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _last(values: tuple[float | None, ...]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _change(n: NodePlan, price: float | None) -> Change:
    hours = n.gpus_freed * HOURS_PER_WEEK
    return Change(
        node=n.name,
        model=n.model,
        current=_layout(n.current) + (f" [{n.current_config_name}]" if n.current_config_name else ""),
        proposed=_layout(n.proposed) + f" [{n.config_name}]",
        gpus_freed=n.gpus_freed,
        slices_freed=n.slices_freed,
        gpu_hours_per_week=hours,
        cost_per_week=hours * price if price is not None else None,
        pods_disrupted=len(n.pods_disrupted),
        cluster=n.cluster,
        utilisation=f"{n.current_utilisation:.0%} → {n.expected_utilisation:.0%}"
        if idle.activity_known(n)
        else "unknown",
    )


def _idle_slices(data: ReportData) -> tuple[IdleSlice, ...]:
    """The devices idle by the plan's burst-aware rule (:mod:`rightsizer.plan.idle`), most idle hours first."""
    out = []
    many = data.plan.multi_cluster
    for n, e in idle.idle_devices(data.plan):
        device = f"GPU {e.gpu} " + (f"{e.profile} (GI {e.gpu_instance_id})" if e.profile else "whole GPU")
        pod = e.pod or ("unallocated" if not e.allocated else "")
        out.append(
            IdleSlice(
                label=(f"{clusters.shown(n.cluster)} · " if many else "")
                + f"{n.name} · {device}"
                + (f" · {pod}" if pod else ""),
                node=n.name,
                device=device,
                pod=pod,
                idle_hours=e.idle_hours,
                idle_share=e.idle_hours / e.window_hours if e.window_hours else 0.0,
                peak_activity=e.peak_activity,
                cluster=n.cluster,
            )
        )
    out.sort(key=lambda s: (-s.idle_hours, s.label))
    return tuple(out[:TOP_IDLE])


def _cluster_lines(plan: Plan, price: float | None) -> tuple[ClusterSummary, ...]:
    """Each cluster's totals, then the fleet's (``fleet``), for a plan over several clusters."""
    if not plan.multi_cluster:
        return ()
    named = [*((clusters.shown(c.name), c.totals) for c in plan.clusters), ("fleet", plan.totals)]
    return tuple(
        ClusterSummary(
            name=name,
            nodes=t.nodes,
            nodes_changed=t.nodes_changed,
            gpus=t.gpus,
            gpus_freed=t.gpus_freed,
            gpu_hours_per_week=t.gpus_freed * HOURS_PER_WEEK,
            cost_per_week=t.gpus_freed * HOURS_PER_WEEK * price if price is not None else None,
            pods_disrupted=t.pods_disrupted,
        )
        for name, t in named
    )


def build_report(data: ReportData) -> Report:
    price = data.price_per_gpu_hour
    changes = tuple(_change(n, price) for n in data.plan.changed_nodes)
    idle = _idle_slices(data)
    freed = sum(c.gpus_freed for c in changes)
    hours = freed * HOURS_PER_WEEK
    summary = Summary(
        window=data.plan.window.duration,
        window_hours=(data.end - data.start) / 3600.0,
        slices_total=_last(data.trend.total),
        idle_now=_last(data.trend.idle),
        idle_mean=_mean(data.trend.idle),
        gpus_freed=freed,
        gpu_hours_per_week=hours,
        cost_per_week=hours * price if price is not None else None,
        cost_per_year=hours * price * 52 if price is not None else None,
        nodes_changed=len(changes),
        alerts=len(data.alerts),
        clusters=_cluster_lines(data.plan, price),
    )
    images: dict[str, bytes] = {
        "trend.png": charts.trend_chart(data.trend),
        "heatmap.png": charts.heatmap_chart(data.heatmap),
    }
    if idle:
        images["top-idle.png"] = charts.barh_chart(
            [charts.Bar(s.label, s.idle_hours, f"{s.idle_share:.0%} idle") for s in idle],
            xlabel=f"idle hours in the {summary.window} window",
            color=charts.IDLE,
            limit=max(s.idle_hours for s in idle) * 1.15,
        )
    if changes:
        top = (
            changes
            if len(changes) <= TOP_SAVINGS
            else sorted(changes, key=lambda c: (-c.gpu_hours_per_week, c.cluster, c.node))[:TOP_SAVINGS]
        )
        images["savings.png"] = charts.barh_chart(
            [
                charts.Bar(
                    f"{clusters.shown(c.cluster)} · {c.node}" if summary.clusters else c.node,
                    c.gpu_hours_per_week,
                    f"{c.gpus_freed} GPU(s)",
                )
                for c in top
            ],
            xlabel="GPU-hours freed per week",
            color=charts.FREED,
        )
    if data.alerts:
        images["alerts.png"] = charts.alerts_chart(data.alerts)
    return Report(data, summary, changes, idle, images)


@dataclass(frozen=True)
class Written:
    html: Path
    markdown: Path
    images: tuple[Path, ...]


def _report_file(name: str) -> bool:
    """A name a report directory holds (what :func:`write_report` writes)."""
    return name in ("report.html", "report.md") or name.endswith((".png", ".csv"))


def write_report(report: Report, out_dir: Path) -> Written:
    """Write the report's files into ``out_dir``, replacing the directory as a whole: they are built
    in a directory beside it and swapped in, so a failed write (full disk) leaves the previous
    report as it was, never a new chart beside old pages (:class:`atomicfile.WriteFailed`)."""
    html_text = report_render.html(report)
    md_text = report_render.markdown(report)

    def build(staging: Path) -> None:
        for name, png in report.charts.items():
            (staging / name).write_bytes(png)
        (staging / "report.html").write_text(html_text, encoding="utf-8")
        (staging / "report.md").write_text(md_text, encoding="utf-8")

    atomicfile.replace_dir(out_dir, build, owned=_report_file)
    images = tuple(out_dir / name for name in report.charts)
    return Written(out_dir / "report.html", out_dir / "report.md", images)


def generate(
    client: PrometheusClient,
    *,
    out: Path,
    end: float,
    settings: PlanSettings,
    price: float | None,
    plan: Plan | None,
    progress: Callable[[str], None] = lambda _m: None,
) -> Written:
    """Collect, build and write one report (``report`` runs it once, ``serve`` every week); without
    ``plan`` it plans through the same pipeline and ``settings`` as ``plan``."""
    if plan is None:
        plan = make_plan(client, end=end, settings=settings, progress=progress)
    elif settings.cluster is not None:
        plan = clusters.for_apply(plan, settings.cluster)
    data = report_data.collect(
        client,
        end=end,
        window_s=settings.window_s,
        plan=plan,
        price_per_gpu_hour=price,
        cluster_label=settings.cluster_label,
        progress=progress,
        limits=settings.query_limits,
    )
    progress("drawing the charts and writing the report")
    return write_report(build_report(data), out)
