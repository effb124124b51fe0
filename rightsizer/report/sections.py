"""The report as one model of sections (title, lead, chart, table, notes) that
:mod:`rightsizer.report.render` turns into HTML and Markdown: both show the same sections and numbers.

Text may hold inline code between backticks (`` `plan.json` ``); each renderer writes it its own way.
The sections lead with what to act on: the pods holding idle GPUs first, by idle GPU-hours, then the
capacity no pod holds, the proposed layout changes, GPU use per namespace, and the fleet's charts.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupilot_common.text import plural
from gpupilot_common.timefmt import format_time as iso
from gpupilot_common.urls import redact
from rightsizer.plan import clusters
from rightsizer.report import weekly
from rightsizer.report.data import Heatmap
from rightsizer.report.model import Report


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: frozenset[int] = frozenset()
    """Columns aligned right (numbers)."""


@dataclass(frozen=True)
class Section:
    key: str
    """Anchor in the HTML page."""
    title: str
    lead: str = ""
    image: str = ""
    """A chart's file name (``trend.png``), shown after the lead."""
    table: Table | None = None
    notes: tuple[str, ...] = ()
    after: str = ""
    """A line after the table (where to find the CSV …)."""


@dataclass(frozen=True)
class Card:
    value: str
    label: str
    tone: str = ""
    """``good``, ``warn``, ``bad`` or empty."""


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    cards: tuple[Card, ...]
    sections: tuple[Section, ...]
    footer: str


def _num(v: float | None, fmt: str = "{:.0f}", none: str = "n/a") -> str:
    return none if v is None else fmt.format(v)


def money(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _cards(r: Report) -> tuple[Card, ...]:
    s = r.summary
    idle_gpu_hours = sum(i.idle_gpu_hours for i in r.idle)
    cards = [
        Card(
            str(r.idle_pods_total),
            "allocated devices idle all window (pods to talk to)",
            "warn" if r.idle_pods_total else "",
        ),
        Card(
            str(s.gpus_freed),
            f"GPUs freed by the plan ({plural(s.nodes_changed, 'node')} {'changes' if s.nodes_changed == 1 else 'change'})",
            "good" if s.gpus_freed else "",
        ),
        Card(
            f"{s.gpu_hours_per_week:,.0f}", "GPU-hours freed per week", "good" if s.gpu_hours_per_week else ""
        ),
        Card(
            _num(s.idle_now),
            f"allocated slices idle at the end of the window (5-minute mean, of {_num(s.slices_total)})",
            "warn" if s.idle_now else "",
        ),
    ]
    if s.cost_per_week is not None:
        cards.append(
            Card(
                money(s.cost_per_week),
                f"saved per week at {r.data.price_per_gpu_hour:g} per GPU-hour",
                "good" if s.cost_per_week else "",
            )
        )
    if r.idle:
        cards.append(Card(f"{idle_gpu_hours:,.0f}", "idle GPU-hours held by the pods listed below", "warn"))
    cards.append(Card(str(s.alerts), "alerts fired in the window", "bad" if s.alerts else ""))
    return tuple(cards)


def _idle_pods(r: Report) -> Section:
    if not r.idle:
        return Section(
            "idle-pods", "Pods holding idle GPUs", "No pod held a device that stayed idle all window."
        )
    more = r.idle_pods_total - len(r.idle)
    lead = (
        f"{plural(r.idle_pods_total, 'allocated device')} stayed under the idle threshold all window: the "
        f"busiest rolling mean (15 min unless the plan says otherwise) never reached it, so a daily burst is "
        f"not idle and an hour without samples is unknown, not idle. Most idle GPU-hours first"
        + (
            f"; the {len(r.idle)} largest shown, {more} more in `namespaces.csv` by namespace."
            if more
            else "."
        )
    )
    many = r.data.plan.multi_cluster
    return Section(
        "idle-pods",
        "Pods holding idle GPUs",
        lead,
        image="top-idle.png",
        table=Table(
            (
                *(("cluster",) if many else ()),
                "pod",
                "node",
                "device",
                "idle GPU-hours",
                "idle share",
                "peak activity",
            ),
            tuple(
                (
                    *((clusters.shown(i.cluster),) if many else ()),
                    i.pod or "-",
                    i.node,
                    i.device,
                    f"{i.idle_gpu_hours:,.1f}",
                    f"{i.idle_share:.0%}",
                    _num(i.peak_activity, "{:.0%}", "unknown"),
                )
                for i in r.idle
            ),
            numeric=frozenset(k + int(many) for k in (3, 4, 5)),
        ),
    )


def _unallocated(r: Report) -> Section:
    if not r.unallocated:
        return Section("unallocated", "Unallocated capacity", "Every idle device is held by a pod.")
    devices = sum(u.devices for u in r.unallocated)
    gpus = sum(u.gpus for u in r.unallocated)
    many = r.data.plan.multi_cluster
    return Section(
        "unallocated",
        "Unallocated capacity",
        f"{plural(devices, 'device')} that no pod holds stayed idle all window ({gpus:,.1f} GPU equivalents): "
        "capacity to hand out or to reshape, not a pod to talk to.",
        table=Table(
            (*(("cluster",) if many else ()), "node", "model", "idle devices", "GPU equivalent"),
            tuple(
                (
                    *((clusters.shown(u.cluster),) if many else ()),
                    u.node,
                    u.model or "-",
                    str(u.devices),
                    f"{u.gpus:.2f}",
                )
                for u in r.unallocated
            ),
            numeric=frozenset(k + int(many) for k in (2, 3)),
        ),
    )


def _clusters(r: Report) -> list[Section]:
    if not r.summary.clusters:
        return []
    price = r.summary.cost_per_week is not None
    headers: tuple[str, ...] = ("cluster", "nodes", "nodes changed", "GPUs", "GPUs freed", "GPU-h / week")
    headers += (("cost / week",) if price else ()) + ("pods disrupted",)
    rows = tuple(
        (
            c.name,
            str(c.nodes),
            str(c.nodes_changed),
            str(c.gpus),
            str(c.gpus_freed),
            f"{c.gpu_hours_per_week:,.0f}",
            *((money(c.cost_per_week),) if price else ()),
            str(c.pods_disrupted),
        )
        for c in r.summary.clusters
    )
    return [
        Section(
            "clusters",
            "Per cluster",
            "Each cluster is planned on its own (nodes never move between clusters); the last line is the fleet.",
            table=Table(headers, rows, numeric=frozenset(range(1, len(headers)))),
        )
    ]


def _changes(r: Report) -> Section:
    s, d = r.summary, r.data
    if not r.changes:
        return Section(
            "changes",
            "Proposed layout changes",
            "No node needs a change: every layout already fits its demand.",
        )
    price = s.cost_per_week is not None
    lead = (
        f"{plural(len(r.changes), 'node')} {'changes and frees' if len(r.changes) == 1 else 'change and free'} "
        f"{plural(s.gpus_freed, 'GPU')}: "
        f"{s.gpu_hours_per_week:,.0f} GPU-hours a week"
        + (
            f", worth {money(s.cost_per_week)} a week and {money(s.cost_per_year)} a year at "
            f"{d.price_per_gpu_hour:g} per GPU-hour"
            if price
            else ""
        )
        + ". Utilisation is the busy share of the GPUs pods use, before → after. "
        "Preview with `gpupilot-rightsizer apply --plan plan.json --dry-run`."
    )
    many = bool(s.clusters)
    headers = (
        *(("cluster",) if many else ()),
        "node",
        "model",
        "current",
        "proposed",
        "GPUs freed",
        "GPU-h / week",
        *(("cost / week",) if price else ()),
        "utilisation",
        "pods disrupted",
    )
    rows = tuple(
        (
            *((c.cluster or "-",) if many else ()),
            c.node,
            c.model,
            c.current,
            c.proposed,
            str(c.gpus_freed),
            f"{c.gpu_hours_per_week:,.0f}",
            *((money(c.cost_per_week),) if price else ()),
            c.utilisation,
            str(c.pods_disrupted),
        )
        for c in r.changes
    )
    right = {4, 5, 6, 7, 8} if price else {4, 5, 6, 7}
    return Section(
        "changes",
        "Proposed layout changes",
        lead,
        image="savings.png",
        table=Table(headers, rows, numeric=frozenset(k + int(many) for k in right)),
    )


def _namespaces(r: Report) -> Section:
    if not r.namespaces:
        return Section("namespaces", "GPU use per namespace", "No pod held a device with data in the window.")
    price = r.data.price_per_gpu_hour is not None
    headers: tuple[str, ...] = ("namespace", "devices", "GPU-hours allocated", "GPU-hours idle", "idle share")
    headers += ("cost", "idle cost") if price else ()
    rows = tuple(
        (
            n.namespace,
            f"{n.devices:g}",
            f"{n.gpu_hours_allocated:,.1f}",
            f"{n.gpu_hours_idle:,.1f}",
            f"{n.idle_share:.0%}",
            *((money(n.cost), money(n.idle_cost)) if price else ()),
        )
        for n in r.namespaces
    )
    return Section(
        "namespaces",
        "GPU use per namespace",
        "What each namespace's pods held over the window, in GPU-hours (a slice counts as its share of a GPU), "
        "and how much of it stayed under the idle threshold, most idle first"
        + (f"; cost at {r.data.price_per_gpu_hour:g} per GPU-hour." if price else "."),
        table=Table(headers, rows, numeric=frozenset(range(1, len(headers)))),
        after="The same table for spreadsheets: `namespaces.csv` beside this report.",
    )


def _heatmap_lead(h: Heatmap) -> str:
    if h.nodes_total > len(h.nodes):
        return (
            f"The {len(h.nodes)} least active of {h.nodes_total:,} nodes: mean activity of each node's "
            "slices, hour by hour (grey: no data)."
        )
    return (
        "Mean activity of each node's slices, hour by hour; every node of the plan has a row (grey: no data)."
    )


def _alerts(r: Report) -> Section:
    alerts = r.data.alerts
    if not alerts:
        return Section("alerts", "Alerts seen", "No alert fired in the window.")
    return Section(
        "alerts",
        "Alerts seen",
        f"{plural(len(alerts), 'alert')} fired in the window (from the `ALERTS` series).",
        image="alerts.png",
        table=Table(
            ("alert", "severity", "what", "first seen", "last seen", "firing"),
            tuple(
                (
                    a.name,
                    a.severity or "-",
                    a.subject or "-",
                    iso(a.first),
                    iso(a.last),
                    f"{a.minutes / 60:.1f} h",
                )
                for a in alerts
            ),
            numeric=frozenset({5}),
        ),
    )


def _week_over_week(r: Report) -> Section:
    if r.previous is None:
        return Section(
            "week-over-week",
            "Week over week",
            "No earlier report with its figures (`figures.json`) to compare with: the next report will be.",
        )
    name, before = r.previous
    now = weekly.of(r)
    return Section(
        "week-over-week",
        "Week over week",
        f"This report's figures beside the report of {name} (window ending {before.end}).",
        table=Table(
            ("figure", f"report of {name}", "this report", "change"),
            tuple(weekly.rows(now, before)),
            numeric=frozenset({1, 2, 3}),
        ),
    )


def _hpas(r: Report) -> list[Section]:
    """recommend-hpa's answers, one row per HPA (only when the report was given some)."""
    if not r.hpas:
        return []
    rows = []
    for h in r.hpas:
        minutes = ", ".join(
            f"{day} {m:g} min" for day, m in zip(h.held_out_days, h.bound_minutes, strict=False)
        )
        if h.recommended_gpu_hours is None:
            hours = f"{h.current_gpu_hours:.1f} → none met the bound"
        else:
            hours = f"{h.current_gpu_hours:.1f} → {h.recommended_gpu_hours:.1f} ({-(h.saving_percent or 0.0):+.1f} %)"
        trust = f"{h.model_error_percent:+.1f} %" + ("" if h.trusted else " (too large: not to be trusted)")
        rows.append((h.hpa, h.bound, hours, h.changes, minutes, trust))
    best = max(
        (h for h in r.hpas if h.saving_percent is not None and h.trusted),
        key=lambda h: h.saving_percent or 0.0,
        default=None,
    )
    lead = (
        "What `gpupilot-adapter recommend-hpa` found for each HPA it was run on: the targets and behaviour that "
        "spend the fewest GPU-hours while the HPA's service bound holds, searched on the first days of its window "
        "and checked on the last ones (held out), replaying the HPA controller's decisions on the demand "
        "recovered from history."
    )
    if best is not None and (best.saving_percent or 0.0) > 0:
        days = len(best.held_out_days)
        lead += (
            f" `{best.hpa}` could spend {best.saving_percent:.0f} % fewer GPU-hours ({best.changes}); its bound "
            f"({best.bound}) held on {'both' if days == 2 else f'all {days}'} held-out days."
        )
    return [
        Section(
            "autoscaling",
            "Autoscaling: HPA recommendations",
            lead,
            table=Table(
                (
                    "HPA",
                    "bound",
                    "GPU-hours on the held-out days: now → recommended",
                    "what changes",
                    "bound broken (recommended)",
                    "model error (training days)",
                ),
                tuple(rows),
            ),
            notes=("Each line is what recommend-hpa wrote with `-o json`; re-run it to refresh a line.",),
        )
    ]


def document(r: Report) -> Document:
    d, s, plan = r.data, r.summary, r.data.plan
    notes = (
        *plan.notes,
        *(
            f"{t.node} ({t.model}): time-slice GPUs {', '.join(map(str, t.gpus))} ×{t.replicas}: {t.reason}"
            for t in plan.time_slicing
        ),
    )
    sections = [
        _idle_pods(r),
        _unallocated(r),
        *_clusters(r),
        _changes(r),
        _week_over_week(r),
        *_hpas(r),
        _namespaces(r),
        Section(
            "trend",
            "Fleet: allocated but idle slices",
            "MIG slices and whole GPUs handed to pods whose 5-minute activity was under the idle threshold, "
            f"next to everything allocated and the fleet total. At the end of the window: {_num(s.idle_now)} of "
            f"{_num(s.slices_total)}; mean over the window: {_num(s.idle_mean, '{:.1f}')}. A pod that is idle "
            "now may still burst later: the pods to talk to are the ones idle all window, listed first.",
            image="trend.png",
        ),
        Section("heatmap", "Slice activity per node", _heatmap_lead(d.heatmap), image="heatmap.png"),
        _alerts(r),
        *([Section("notes", "Notes", notes=notes)] if notes else []),
    ]
    return Document(
        title="GPU rightsizing report",
        subtitle=f"{iso(d.start)} → {iso(d.end)} ({s.window}) · plan `{plan.plan_id}` · "
        f"data from `{redact(d.prometheus_url)}`",
        cards=_cards(r),
        sections=tuple(sections),
        footer="Generated by gpupilot-rightsizer from Prometheus recording rules "
        "(gpupilot:node_slices:*, gpupilot:slice_activity:avg5m) and ALERTS. GPU-hours per week = GPUs freed × 168. "
        f"Plan solver: {plan.solver.method} ({plan.solver.status}).",
    )
