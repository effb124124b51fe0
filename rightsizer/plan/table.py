"""The plan as text: a head line with the totals, then one table (:mod:`gpupilot_common.table`) of
the changed nodes that fits the terminal (evidence and disrupted pods are left out first; ``wide``
keeps them)."""

from __future__ import annotations

from collections.abc import Sequence

from gpupilot_common.table import Column, render
from gpupilot_common.text import plural
from rightsizer.plan import clusters, dra
from rightsizer.plan.idle import activity_known
from rightsizer.plan.model import Evidence, GpuLayout, NodePlan, Plan, Totals

COLUMNS = (
    Column("node", wrap=True, breaks=" "),
    Column("model", drop=2),
    Column("current", wrap=True),
    Column("proposed", wrap=True),
    Column("freed"),
    Column("util"),
    # one namespace/pod per line: never split, so the column is as wide as the longest name, or left
    # out (with -o wide showing it) when that does not fit
    Column("disrupted", wrap=True, drop=1, breaks=" "),
    Column("evidence", wrap=True, drop=3, breaks=" "),
)


def layout_text(g: GpuLayout) -> str:
    if not g.mig_enabled:
        return f"{g.index}: MIG off"
    if not g.mig_devices:
        return f"{g.index}: MIG on, empty"
    parts = sorted(g.mig_devices.items(), key=lambda kv: (-int(kv[0].split("g.")[0]), kv[0]))
    return f"{g.index}: " + " + ".join(f"{n}×{c}" for n, c in parts)


def activity_text(e: Evidence) -> str:
    """``peak 15-min mean 85 % on 11-29 03:00``: the statistic sizing used, and when it happened."""
    if e.peak_activity is None:
        return "activity unknown"
    # A device that never ran has no peak worth dating.
    when = f" on {e.peak_at[5:10]} {e.peak_at[11:16]}" if len(e.peak_at) >= 16 and e.peak_activity > 0 else ""
    return f"peak {e.busy_minutes:.0f}-min mean {e.peak_activity:.0%}{when}"


def _evidence(node: NodePlan) -> str:
    alloc = [e for e in node.evidence if e.allocated]
    idle_free = [e for e in node.evidence if not e.allocated and e.peak_activity is not None]
    unknown = [e for e in node.evidence if e.peak_activity is None]
    lines = []
    for e in alloc[:6]:
        lines.append(
            f"{e.gpu}/{e.profile or 'gpu'} {e.pod}: {activity_text(e)}, "
            f"idle {e.idle_hours:.0f}/{e.coverage_hours:.0f} h"
        )
    if len(alloc) > 6:
        lines.append(f"… {len(alloc) - 6} more allocated")
    if idle_free:
        lines.append(f"{plural(len(idle_free), 'unallocated device')}")
    if unknown:
        lines.append(f"{plural(len(unknown), 'device')} with activity unknown (no data)")
    return "\n".join(lines) or "-"


def _rows(nodes: Sequence[NodePlan], *, all_nodes: bool) -> list[list[str]]:
    rows = []
    for n in nodes:
        if not n.changed and not all_nodes:
            continue
        rows.append(
            [
                n.name + ("" if n.changed else " (no change)") + f"\n{n.mig_strategy}",
                n.model,
                "\n".join(layout_text(g) for g in n.current)
                + (f"\n[{n.current_config_name}]" if n.current_config_name else ""),
                "\n".join(layout_text(g) for g in n.proposed)
                + (f"\n[{n.config_name}]" if n.changed else "")
                + "".join(f"\nadmits {a.namespace}/{a.name}" for a in n.pods_admitted),
                f"{plural(n.gpus_freed, 'GPU')}\n{plural(n.slices_freed, 'slice')}",
                "unknown"
                if not activity_known(n)
                else f"{n.current_utilisation:.0%} → {n.expected_utilisation:.0%}"
                if n.changed
                else f"{n.current_utilisation:.0%}",
                "\n".join(f"{p.namespace}/{p.name}" for p in n.pods_disrupted) or "-",
                _evidence(n),
            ]
        )
    return rows


def totals_text(t: Totals) -> str:
    return (
        f"{t.nodes_changed}/{plural(t.nodes, 'node')} change; GPUs in use {t.gpus_needed + t.gpus_freed} → {t.gpus_needed} "
        f"of {t.gpus}"
    )


def bound_text(plan: Plan) -> str:
    """``LP lower bound 5566 over the fleet, pods moving: gap 1 (0.02 %)``, and without moves the
    bound moving pods would have."""
    s, t = plan.solver, plan.totals
    gap = max(0, t.gpus_needed - s.lower_bound_gpus)
    share = f" ({gap / s.lower_bound_gpus:.2%})" if gap and s.lower_bound_gpus else ""
    text = f"LP lower bound {s.lower_bound_gpus} {s.gap_text}: gap {gap}{share}"
    if (
        s.bound_scope != "fleet"
        and s.fleet_lower_bound_gpus
        and s.fleet_lower_bound_gpus < s.lower_bound_gpus
    ):
        text += f"; {s.fleet_lower_bound_gpus} over the fleet with --allow-moves"
    return text


def _freed_text(t: Totals) -> str:
    admitted = f"; {plural(t.pods_admitted, 'pending pod')} admitted" if t.pods_admitted else ""
    return (
        f"{plural(t.gpus_freed, 'GPU')} and {plural(t.slices_freed, 'allocated slice')} freed; "
        f"{plural(t.pods_disrupted, 'pod')} disrupted" + admitted
    )


def _hidden(block: str) -> str:
    """The columns a rendered table left out (its last line names them), "" when none."""
    last = block.rsplit("\n", 1)[-1]
    return last.split(" left out to fit ", 1)[0] if " left out to fit " in last else ""


def plan_table(plan: Plan, *, all_nodes: bool = False, width: int | None = None, wide: bool = False) -> str:
    """The plan as text: a head line with the totals, the changed nodes (all with ``all_nodes``), then
    time-slicing advice and notes. A plan over several clusters has one table per cluster, each under
    a line with that cluster's totals, after the fleet's."""
    t = plan.totals
    head = (
        f"plan {plan.plan_id}  window {plan.window.start} → {plan.window.end} ({plan.window.duration})\n"
        + ("fleet: " if plan.clusters else "")
        + f"{totals_text(t)} ({bound_text(plan)})\n{_freed_text(t)}\n"
        f"solver {plan.solver.method} ({plan.solver.status}, {plan.solver.seconds:.2f} s)"
    )
    if not plan.clusters:
        rows = _rows(plan.nodes, all_nodes=all_nodes)
        blocks = [render(COLUMNS, rows, width=width, wide=wide) if rows else "No node needs a change."]
    else:
        blocks = []
        for c in plan.clusters:
            rows = _rows([n for n in plan.nodes if n.cluster == c.name], all_nodes=all_nodes)
            blocks.append(
                f"cluster {clusters.shown(c.name)}: {totals_text(c.totals)}; {_freed_text(c.totals)}\n"
                + (render(COLUMNS, rows, width=width, wide=wide) if rows else "No node needs a change.")
            )
    extra = []
    for ts in plan.time_slicing:
        where = f"{clusters.shown(ts.cluster)}/" if plan.clusters else ""
        extra.append(
            f"time-slicing: {where}{ts.node} ({ts.model}) GPU(s) {', '.join(map(str, ts.gpus))}: "
            f"{ts.replicas} replicas — {ts.reason}"
        )
    for sc in plan.strategy_changes:
        where = f"{clusters.shown(sc.cluster)}/" if plan.clusters else ""
        extra.append(
            f"strategy change: {where}{sc.node} ({sc.model}) to the {sc.strategy} strategy frees "
            f"{sc.gpus_freed} GPU(s) and {sc.slices_freed} slice(s) (its best uniform layout: "
            f"{sc.single_gpus_freed} GPU(s)); all {sc.pods_disrupted} GPU pod(s) restart — {sc.reason}"
        )
    for n in plan.nodes:
        if n.gap:
            where = f"{clusters.shown(n.cluster)}/" if plan.clusters else ""
            why = f": {n.reason}" if n.reason else ""
            extra.append(
                f"gap: {where}{n.name} uses {n.gpus_in_use} GPU(s) after the plan, lower bound "
                f"{n.lower_bound_gpus} ({n.gap} above){why}"
            )
    extra += dra.table_lines(plan.dra)
    if any("disrupted" in _hidden(b) for b in blocks):
        # names are never split (a name copied from here is one kubectl finds): one per line instead
        extra += [
            f"disrupted: {clusters.shown(n.cluster) + '/' if plan.clusters else ''}{n.name}: {p.namespace}/{p.name}"
            for n in plan.nodes
            if n.changed or all_nodes
            for p in n.pods_disrupted
        ]
    extra += [f"note: {n}" for n in plan.notes]
    return "\n\n".join([head, *blocks, *(["\n".join(extra)] if extra else [])])
