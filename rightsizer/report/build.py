"""The weekly rightsizing report: numbers from :mod:`rightsizer.report.data`, charts from
:mod:`rightsizer.report.charts`, written as a self-contained HTML file (PNGs inlined as data URIs), a
Markdown file and the PNGs themselves."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gpupilot_common import atomicfile
from gpupilot_common.text import plural
from mig_geometry.catalogue import find_model
from mig_geometry.placement import describe
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.plan import clusters, idle
from rightsizer.plan.model import GpuLayout, NodePlan, Plan
from rightsizer.plan.pipeline import make_plan
from rightsizer.plan.settings import PlanSettings
from rightsizer.report import charts, namespaces, sections, weekly
from rightsizer.report import data as report_data
from rightsizer.report import hpas as report_hpas
from rightsizer.report import render as report_render
from rightsizer.report.data import Heatmap, ReportData
from rightsizer.report.hpas import HpaLine
from rightsizer.report.model import Change, ClusterSummary, IdleSlice, Report, Summary, Unallocated

HOURS_PER_WEEK = 168.0
TOP_IDLE = 15
"""The idle-pods table and chart list the pods holding the most idle GPU-hours."""
TOP_SAVINGS = 40
"""The savings chart shows the nodes that free the most GPU-hours; the table lists every change."""


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


def gpu_share(model: str, profile: str) -> float:
    """A device's share of its GPU: ``3g.40gb`` on a 7-slice model is 3/7; a whole GPU is 1."""
    if not profile:
        return 1.0
    found = find_model(model)
    head = profile.split("g.", 1)[0]
    if found is None or not found.compute_slices or not head.isdigit():
        return 1.0
    return min(1.0, int(head) / found.compute_slices)


def _idle_slices(data: ReportData) -> list[IdleSlice]:
    """The devices idle by the plan's burst-aware rule (:mod:`rightsizer.plan.idle`), in plan order."""
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
                allocated=e.allocated,
                gpu_share=gpu_share(n.model, e.profile),
            )
        )
    return out


def _unallocated(found: list[IdleSlice], plan: Plan) -> tuple[Unallocated, ...]:
    """The idle devices no pod holds, one line per node, most GPU equivalents first."""
    models = {(n.cluster, n.name): n.model for n in plan.nodes}
    per: dict[tuple[str, str], list[IdleSlice]] = {}
    for s in found:
        if not s.allocated:
            per.setdefault((s.cluster, s.node), []).append(s)
    lines = [
        Unallocated(
            node=node,
            model=models.get((c, node), ""),
            devices=len(v),
            gpus=sum(s.gpu_share for s in v),
            cluster=c,
        )
        for (c, node), v in per.items()
    ]
    return tuple(sorted(lines, key=lambda u: (-u.gpus, u.cluster, u.node)))


def _device_uses(plan: Plan) -> list[namespaces.DeviceUse]:
    return [
        namespaces.DeviceUse(
            pods=tuple(p.strip() for p in e.pod.split(",") if p.strip()),
            gpu_share=gpu_share(n.model, e.profile),
            hours=e.coverage_hours,
            idle_hours=min(e.idle_hours, e.coverage_hours),
        )
        for n in plan.nodes
        for e in n.evidence
        if e.allocated
    ]


def with_every_node(heatmap: Heatmap, plan: Plan) -> Heatmap:
    """The heatmap with a row (no data: drawn grey) for each plan node it lacks; a heatmap cut to
    its least active nodes stays cut (the lead says how many nodes it leaves out)."""
    if heatmap.nodes_total > len(heatmap.nodes) or not heatmap.hours:
        return heatmap
    labelled = any(" · " in k for k in heatmap.nodes) or plan.multi_cluster
    rows = dict(zip(heatmap.nodes, heatmap.values, strict=True))
    blank = tuple(None for _ in heatmap.hours)
    for n in plan.nodes:
        key = f"{n.cluster or '-'} · {n.name}" if labelled else n.name
        rows.setdefault(key, blank)
    keys = sorted(rows)
    return replace(heatmap, nodes=tuple(keys), values=tuple(rows[k] for k in keys), nodes_total=len(keys))


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


def build_report(data: ReportData, *, hpas: tuple[HpaLine, ...] = ()) -> Report:
    price = data.price_per_gpu_hour
    data = replace(data, heatmap=with_every_node(data.heatmap, data.plan))
    changes = tuple(_change(n, price) for n in data.plan.changed_nodes)
    found = _idle_slices(data)
    pods = sorted(
        (s for s in found if s.allocated), key=lambda s: (-s.idle_gpu_hours, -s.idle_hours, s.label)
    )
    idle = tuple(pods[:TOP_IDLE])
    per_namespace = namespaces.frame(_device_uses(data.plan), price=price)
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
        "trend.png": charts.trend_chart(data.trend, title="Allocated but idle slices across the fleet"),
        "heatmap.png": charts.heatmap_chart(data.heatmap, title="Mean slice activity per node and hour"),
    }
    if idle:
        images["top-idle.png"] = charts.barh_chart(
            [charts.Bar(s.label, s.idle_gpu_hours, f"{s.idle_share:.0%} idle") for s in idle],
            xlabel=f"idle GPU-hours in the {summary.window} window",
            color=charts.IDLE,
            limit=max(s.idle_gpu_hours for s in idle) * 1.3,
            title="Pods holding idle GPUs (idle GPU-hours)",
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
                    plural(c.gpus_freed, "GPU"),
                )
                for c in top
            ],
            xlabel="GPU-hours freed per week",
            color=charts.FREED,
            title="GPU-hours freed per week by the plan, per node",
        )
    if data.alerts:
        images["alerts.png"] = charts.alerts_chart(data.alerts, title="Hours each alert fired")
    return Report(
        data,
        summary,
        changes,
        idle,
        images,
        unallocated=_unallocated(found, data.plan),
        idle_pods_total=len(pods),
        namespaces=namespaces.lines(per_namespace),
        namespaces_csv=namespaces.csv_text(per_namespace),
        hpas=hpas,
    )


@dataclass(frozen=True)
class Written:
    html: Path
    markdown: Path
    images: tuple[Path, ...]
    csv: Path | None = None
    figures: Path | None = None
    """The key figures (``figures.json``) the next report's week-over-week section reads."""


def _report_file(name: str) -> bool:
    """A name a report directory holds (what :func:`write_report` writes)."""
    return name in ("report.html", "report.md", weekly.FILE) or name.endswith((".png", ".csv"))


def write_report(report: Report, out_dir: Path) -> Written:
    """Write the report's files into ``out_dir``, replacing the directory as a whole: they are built
    in a directory beside it and swapped in, so a failed write (full disk) leaves the previous
    report as it was, never a new chart beside old pages (:class:`atomicfile.WriteFailed`)."""
    doc = sections.document(report)
    html_text = report_render.html(doc, report.charts)
    md_text = report_render.markdown(doc)

    def build(staging: Path) -> None:
        for name, png in report.charts.items():
            (staging / name).write_bytes(png)
        (staging / "namespaces.csv").write_text(report.namespaces_csv, encoding="utf-8")
        (staging / "report.html").write_text(html_text, encoding="utf-8")
        (staging / "report.md").write_text(md_text, encoding="utf-8")
        (staging / weekly.FILE).write_text(weekly.to_json(weekly.of(report)), encoding="utf-8")

    atomicfile.replace_dir(out_dir, build, owned=_report_file)
    images = tuple(out_dir / name for name in report.charts)
    return Written(
        out_dir / "report.html",
        out_dir / "report.md",
        images,
        out_dir / "namespaces.csv",
        out_dir / weekly.FILE,
    )


def generate(
    client: PrometheusClient,
    *,
    out: Path,
    end: float,
    settings: PlanSettings,
    price: float | None,
    plan: Plan | None,
    progress: Callable[[str], None] = lambda _m: None,
    previous: Path | None = None,
    hpa_recommendations: Sequence[Path] = (),
) -> Written:
    """Collect, build and write one report (``report`` runs it once, ``serve`` every week); without
    ``plan`` it plans through the same pipeline and ``settings`` as ``plan``. ``previous``: an
    earlier report's folder, whose figures the week-over-week section compares with (default: the
    newest dated folder before ``out`` beside it, as ``serve`` writes them). ``hpa_recommendations``:
    recommend-hpa's JSON answers (files or folders of them), one line each in the autoscaling section."""
    hpas = report_hpas.load(hpa_recommendations)  # read first: a bad file stops the run before any query
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
    if previous is not None:
        found = weekly.load(previous)
        before = (previous.name, found) if found is not None else None
    else:
        before = weekly.previous(out.parent, out)
    return write_report(replace(build_report(data, hpas=hpas), previous=before), out)
