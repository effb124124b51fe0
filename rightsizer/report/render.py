"""HTML and Markdown renderings of a :class:`rightsizer.report.build.Report` (same sections, same numbers)."""

from __future__ import annotations

import base64
from html import escape
from typing import TYPE_CHECKING

from gpupilot_common.timefmt import format_time as iso
from gpupilot_common.urls import redact

if TYPE_CHECKING:  # report.py imports this module to write files
    from rightsizer.report.build import Report
    from rightsizer.report.data import Heatmap


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


CSS = """
:root { --ink:#1f2933; --muted:#616e7c; --line:#e4e7eb; --bg:#f5f7fa; --accent:#2f9e6e; --warn:#c17d11; --bad:#d64545; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink); font:15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 32px 28px 56px; }
header h1 { font-size: 28px; margin: 0 0 4px; letter-spacing: -0.01em; }
header p { margin: 0; color: var(--muted); }
.cards { display:grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap:14px; margin: 24px 0 8px; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.card .v { font-size: 28px; font-weight: 650; line-height:1.15; }
.card .k { color: var(--muted); font-size: 13px; }
.card.good .v { color: var(--accent); } .card.warn .v { color: var(--warn); } .card.bad .v { color: var(--bad); }
section { background:#fff; border:1px solid var(--line); border-radius:10px; padding: 20px 22px; margin-top: 20px; }
section h2 { font-size: 19px; margin: 0 0 6px; }
section p.lead { margin: 0 0 14px; color: var(--muted); }
img { width: 100%; display:block; margin: 8px 0 4px; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; margin-top: 10px; }
th { text-align:left; font-weight:600; color: var(--muted); border-bottom: 2px solid var(--line); padding: 7px 8px; white-space: nowrap; }
td { border-bottom: 1px solid var(--line); padding: 7px 8px; vertical-align: top; }
td.k { white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
code { background: var(--bg); border:1px solid var(--line); border-radius: 4px; padding: 1px 5px; font-size: 12.5px; }
.sev-critical { color: var(--bad); font-weight:600; } .sev-warning { color: var(--warn); font-weight:600; }
footer { color: var(--muted); font-size: 12.5px; margin-top: 26px; }
ul.notes { margin: 6px 0 0; padding-left: 20px; color: var(--muted); }
"""


def _num(v: float | None, fmt: str = "{:.0f}", none: str = "n/a") -> str:
    return none if v is None else fmt.format(v)


def _money(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def _cards(r: Report) -> list[tuple[str, str, str]]:
    s = r.summary
    cards = [
        (
            "good" if s.gpus_freed else "",
            str(s.gpus_freed),
            f"GPUs freed by the plan ({s.nodes_changed} node(s) change)",
        ),
        ("good" if s.gpu_hours_per_week else "", f"{s.gpu_hours_per_week:,.0f}", "GPU-hours freed per week"),
    ]
    if s.cost_per_week is not None:
        cards.append(
            (
                "good" if s.cost_per_week else "",
                _money(s.cost_per_week),
                f"saved per week at {r.data.price_per_gpu_hour:g} per GPU-hour",
            )
        )
    cards += [
        (
            "warn" if s.idle_mean else "",
            _num(s.idle_mean, "{:.1f}"),
            f"idle allocated slices on average (of {_num(s.slices_total)})",
        ),
        ("bad" if s.alerts else "", str(s.alerts), "alerts fired in the window"),
    ]
    return cards


def _cluster_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    """The per-cluster table (a plan over several clusters): each cluster's totals, then the fleet's."""
    price = r.summary.cost_per_week is not None
    headers = ["cluster", "nodes", "nodes changed", "GPUs", "GPUs freed", "GPU-h / week"]
    headers += ["cost / week"] if price else []
    headers.append("pods moved")
    rows = [
        [
            c.name,
            str(c.nodes),
            str(c.nodes_changed),
            str(c.gpus),
            str(c.gpus_freed),
            f"{c.gpu_hours_per_week:,.0f}",
            *([_money(c.cost_per_week)] if price else []),
            str(c.pods_disrupted),
        ]
        for c in r.summary.clusters
    ]
    return headers, rows


def html(r: Report) -> str:
    d, s, plan = r.data, r.summary, r.data.plan
    img = {name: f'<img alt="{escape(name)}" src="{data_uri(png)}">' for name, png in r.charts.items()}
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>GPU rightsizing report {escape(iso(d.start))} → {escape(iso(d.end))}</title>",
        f"<style>{CSS}</style></head><body><main>",
        "<header><h1>GPU rightsizing report</h1>",
        f"<p>{escape(iso(d.start))} → {escape(iso(d.end))} ({escape(s.window)}) · plan <code>{escape(plan.plan_id)}</code>"
        f" · data from <code>{escape(redact(d.prometheus_url))}</code></p></header>",
        "<div class='cards'>",
        *(
            f"<div class='card {cls}'><div class='v'>{escape(v)}</div><div class='k'>{escape(k)}</div></div>"
            for cls, v, k in _cards(r)
        ),
        "</div>",
        *_html_clusters(r),
        "<section><h2>Fleet: allocated but idle slices</h2>",
        "<p class='lead'>MIG slices and whole GPUs handed to pods whose activity stayed under the idle threshold, "
        f"next to everything allocated and the fleet total. Now: {_num(s.idle_now)} idle of {_num(s.slices_total)}; "
        f"mean over the window: {_num(s.idle_mean, '{:.1f}')}.</p>",
        img["trend.png"],
        "</section>",
        "<section><h2>Proposed layout changes</h2>",
    ]
    if r.changes:
        out.append(
            f"<p class='lead'>{len(r.changes)} node(s) change and free {s.gpus_freed} GPU(s): "
            f"{s.gpu_hours_per_week:,.0f} GPU-hours a week"
            + (
                f", worth {_money(s.cost_per_week)} a week and {_money(s.cost_per_year)} a year at "
                f"{d.price_per_gpu_hour:g} per GPU-hour"
                if s.cost_per_week is not None
                else ""
            )
            + ". Preview with <code>gpupilot-rightsizer apply --plan plan.json --dry-run</code>.</p>"
        )
        out.append(img["savings.png"])
        cost_head = "<th class='n'>cost / week</th>" if s.cost_per_week is not None else ""
        many = bool(s.clusters)
        out.append(
            "<table><tr>"
            + ("<th>cluster</th>" if many else "")
            + "<th>node</th><th>model</th><th>current</th><th>proposed</th><th class='n'>GPUs freed</th>"
            f"<th class='n'>GPU-h / week</th>{cost_head}<th class='n'>utilisation</th><th class='n'>pods moved</th></tr>"
        )
        for c in r.changes:
            cost = f"<td class='n'>{_money(c.cost_per_week)}</td>" if s.cost_per_week is not None else ""
            out.append(
                "<tr>"
                + (f"<td class='k'>{escape(c.cluster or '-')}</td>" if many else "")
                + f"<td class='k'>{escape(c.node)}</td><td class='k'>{escape(c.model)}</td><td>{escape(c.current)}</td>"
                f"<td>{escape(c.proposed)}</td><td class='n'>{c.gpus_freed}</td><td class='n'>{c.gpu_hours_per_week:,.0f}</td>"
                f"{cost}<td class='n'>{escape(c.utilisation)}</td><td class='n'>{c.pods_disrupted}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p class='lead'>No node needs a change: every layout already fits its demand.</p>")
    out.append("</section>")
    out.append("<section><h2>Top idle slices</h2>")
    if r.idle:
        out += [
            "<p class='lead'>Devices whose busiest rolling mean (15 min unless the plan says otherwise) stayed "
            "below the idle threshold all window, most idle hours first: a slice with a daily burst is not "
            "idle. An hour with no samples is unknown, not idle.</p>",
            img["top-idle.png"],
            "<table><tr><th>node</th><th>device</th><th>pod</th><th class='n'>idle hours</th><th class='n'>idle share</th>"
            "<th class='n'>peak activity</th></tr>",
            *(
                f"<tr><td class='k'>{escape(i.node)}</td><td class='k'>{escape(i.device)}</td><td>{escape(i.pod or '-')}</td>"
                f"<td class='n'>{i.idle_hours:.0f}</td><td class='n'>{i.idle_share:.0%}</td>"
                f"<td class='n'>{_num(i.peak_activity, '{:.0%}', 'unknown')}</td></tr>"
                for i in r.idle
            ),
            "</table>",
        ]
    else:
        out.append("<p class='lead'>No device was idle for a whole hour in the window.</p>")
    out += [
        "</section><section><h2>Slice activity per node</h2>",
        f"<p class='lead'>{escape(_heatmap_lead(d.heatmap))}</p>",
        img["heatmap.png"],
        "</section><section><h2>Alerts seen</h2>",
    ]
    if d.alerts:
        out += [
            f"<p class='lead'>{len(d.alerts)} alert(s) fired in the window (from the <code>ALERTS</code> series).</p>",
            img["alerts.png"],
            "<table><tr><th>alert</th><th>severity</th><th>what</th><th>first seen</th><th>last seen</th><th class='n'>firing</th></tr>",
            *(
                f"<tr><td>{escape(a.name)}</td><td class='sev-{escape(a.severity)}'>{escape(a.severity or '-')}</td>"
                f"<td>{escape(a.subject or '-')}</td><td>{escape(iso(a.first))}</td><td>{escape(iso(a.last))}</td>"
                f"<td class='n'>{a.minutes / 60:.1f} h</td></tr>"
                for a in d.alerts
            ),
            "</table>",
        ]
    else:
        out.append("<p class='lead'>No alert fired in the window.</p>")
    out.append("</section>")
    if plan.notes or plan.time_slicing:
        out.append("<section><h2>Notes</h2><ul class='notes'>")
        out += [f"<li>{escape(n)}</li>" for n in plan.notes]
        out += [
            f"<li>{escape(t.node)} ({escape(t.model)}): time-slice GPUs {', '.join(map(str, t.gpus))} ×{t.replicas}: {escape(t.reason)}</li>"
            for t in plan.time_slicing
        ]
        out.append("</ul></section>")
    out.append(
        f"<footer>Generated by gpupilot-rightsizer from Prometheus recording rules "
        f"(gpupilot:node_slices:*, gpupilot:slice_activity:avg5m) and ALERTS. GPU-hours per week = GPUs freed × 168. "
        f"Plan solver: {escape(plan.solver.method)} ({escape(plan.solver.status)}).</footer>"
    )
    out.append("</main></body></html>")
    return "\n".join(out) + "\n"


def _html_clusters(r: Report) -> list[str]:
    if not r.summary.clusters:
        return []
    headers, rows = _cluster_rows(r)
    out = [
        "<section><h2>Per cluster</h2>",
        "<p class='lead'>Each cluster is planned on its own (nodes never move between clusters); the last "
        "line is the fleet.</p><table><tr>",
        *(f"<th class='{'k' if i == 0 else 'n'}'>{escape(h)}</th>" for i, h in enumerate(headers)),
        "</tr>",
    ]
    for row in rows:
        cells = "".join(f"<td class='{'k' if i == 0 else 'n'}'>{escape(v)}</td>" for i, v in enumerate(row))
        out.append(f"<tr>{cells}</tr>")
    out.append("</table></section>")
    return out


def _heatmap_lead(h: Heatmap) -> str:
    if h.nodes_total > len(h.nodes):
        return (
            f"The {len(h.nodes)} least active of {h.nodes_total:,} nodes: mean activity of each node's "
            "slices, hour by hour (blank: no data)."
        )
    return "Mean activity of each node's slices, hour by hour (blank: no data)."


def _md_table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    def cell(t: str) -> str:
        return t.replace("|", "\\|")

    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def _md_clusters(r: Report) -> list[str]:
    if not r.summary.clusters:
        return []
    headers, rows = _cluster_rows(r)
    return [
        "## Per cluster",
        "",
        "Each cluster is planned on its own (nodes never move between clusters); the last line is the fleet.",
        "",
        *_md_table(headers, rows, right=set(range(1, len(headers)))),
        "",
    ]


def markdown(r: Report) -> str:
    d, s, plan = r.data, r.summary, r.data.plan
    out = [
        "# GPU rightsizing report",
        "",
        f"{iso(d.start)} → {iso(d.end)} ({s.window}) · plan `{plan.plan_id}` · data from `{redact(d.prometheus_url)}`",
        "",
        *(f"- **{v}** {k}" for _, v, k in _cards(r)),
        "",
        *_md_clusters(r),
        "## Fleet: allocated but idle slices",
        "",
        f"Now {_num(s.idle_now)} idle of {_num(s.slices_total)}; mean over the window {_num(s.idle_mean, '{:.1f}')}.",
        "",
        "![fleet idle slices](trend.png)",
        "",
        "## Proposed layout changes",
        "",
    ]
    if r.changes:
        price = s.cost_per_week is not None
        out.append(
            f"{len(r.changes)} node(s) change and free {s.gpus_freed} GPU(s): {s.gpu_hours_per_week:,.0f} GPU-hours a week"
            + (
                f", worth {_money(s.cost_per_week)} a week and {_money(s.cost_per_year)} a year at "
                f"{d.price_per_gpu_hour:g} per GPU-hour"
                if price
                else ""
            )
            + ". Preview with `gpupilot-rightsizer apply --plan plan.json --dry-run`."
        )
        out += ["", "![GPU-hours freed per node](savings.png)", ""]
        many = bool(s.clusters)
        headers = [
            *(["cluster"] if many else []),
            "node",
            "model",
            "current",
            "proposed",
            "GPUs freed",
            "GPU-h / week",
            *(["cost / week"] if price else []),
            "utilisation",
            "pods moved",
        ]
        rows = [
            [
                *([c.cluster or "-"] if many else []),
                c.node,
                c.model,
                c.current,
                c.proposed,
                str(c.gpus_freed),
                f"{c.gpu_hours_per_week:,.0f}",
                *([_money(c.cost_per_week)] if price else []),
                c.utilisation,
                str(c.pods_disrupted),
            ]
            for c in r.changes
        ]
        shift = int(many)
        right = {4, 5, 6, 7, 8} if price else {4, 5, 6, 7}
        out += _md_table(headers, rows, right={i + shift for i in right})
    else:
        out.append("No node needs a change: every layout already fits its demand.")
    out += ["", "## Top idle slices", ""]
    if r.idle:
        out += ["![top idle slices](top-idle.png)", ""]
        out += _md_table(
            ["node", "device", "pod", "idle hours", "idle share", "peak activity"],
            [
                [
                    i.node,
                    i.device,
                    i.pod or "-",
                    f"{i.idle_hours:.0f}",
                    f"{i.idle_share:.0%}",
                    _num(i.peak_activity, "{:.0%}", "unknown"),
                ]
                for i in r.idle
            ],
            right={3, 4, 5},
        )
    else:
        out.append("No device was idle for a whole hour in the window.")
    out += [
        "",
        "## Slice activity per node",
        "",
        *([_heatmap_lead(d.heatmap), ""] if d.heatmap.nodes_total > len(d.heatmap.nodes) else []),
        "![slice activity per node](heatmap.png)",
        "",
        "## Alerts seen",
        "",
    ]
    if d.alerts:
        out += ["![alerts](alerts.png)", ""]
        out += _md_table(
            ["alert", "severity", "what", "first seen", "last seen", "firing"],
            [
                [
                    a.name,
                    a.severity or "-",
                    a.subject or "-",
                    iso(a.first),
                    iso(a.last),
                    f"{a.minutes / 60:.1f} h",
                ]
                for a in d.alerts
            ],
            right={5},
        )
    else:
        out.append("No alert fired in the window.")
    if plan.notes:
        out += ["", "## Notes", "", *(f"- {n}" for n in plan.notes)]
    return "\n".join(out) + "\n"
