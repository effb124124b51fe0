"""Plans over several clusters: one plan per cluster, merged into the fleet's plan, and a fleet plan
cut back to one cluster (what ``apply --cluster`` and ``plan --cluster`` act on).

A cluster's part of a merged plan is exactly the plan of that cluster alone: nodes never move between
clusters and names are unique only within one, so each cluster is optimised and built on its own
(:func:`rightsizer.plan.pipeline.make_plan`) and the fleet's plan only sums them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rightsizer.plan.model import ClusterTotals, NodePlan, Plan, PlanError, SolverInfo, Totals, plan_id_for

STATUS_RANK = {"optimal": 0, "heuristic": 1, "time-limit": 2, "infeasible": 3}
"""Worst first when ranked high: the fleet's solver status is its worst cluster's."""


def shown(cluster: str) -> str:
    """A cluster's name as tables show it (the unnamed cluster of series without the label: ``-``)."""
    return cluster or "-"


def totals_of(nodes: Sequence[NodePlan], *, gpus_needed: int) -> Totals:
    return Totals(
        nodes=len(nodes),
        nodes_changed=sum(1 for n in nodes if n.changed),
        gpus=sum(len(n.current) for n in nodes),
        gpus_needed=gpus_needed,
        gpus_freed=sum(n.gpus_freed for n in nodes),
        slices_freed=sum(n.slices_freed for n in nodes),
        pods_disrupted=sum(len(n.pods_disrupted) for n in nodes),
        pods_admitted=sum(len(n.pods_admitted) for n in nodes),
    )


def _sum(totals: Sequence[Totals]) -> Totals:
    return Totals(**{f: sum(getattr(t, f) for t in totals) for f in Totals.__dataclass_fields__})


def merge(parts: Sequence[Plan]) -> Plan:
    """The fleet's plan from per-cluster plans of the same window and settings (cluster order kept)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    nodes = tuple(n for p in parts for n in p.nodes)
    configs: dict[str, Any] = {}
    for p in parts:
        configs.update(p.mig_parted_config.get("mig-configs", {}))
    methods: list[str] = []
    for p in parts:
        methods += [m for m in p.solver.method.split("+") if m not in methods and m != "none"]
    notes = [f"{shown(p.cluster_names[0])}: {n}" for p in parts for n in p.notes]
    window = first.window
    return replace(
        first,
        plan_id=plan_id_for(nodes=nodes, window=window),
        solver=SolverInfo(
            method="+".join(methods) or "none",
            status=max((p.solver.status for p in parts), key=lambda s: STATUS_RANK.get(s, 4)),
            lower_bound_gpus=sum(p.solver.lower_bound_gpus for p in parts),
            seconds=sum(p.solver.seconds for p in parts),
            bound_scope=first.solver.bound_scope,
            fleet_lower_bound_gpus=sum(p.solver.fleet_lower_bound_gpus for p in parts),
        ),
        totals=_sum([p.totals for p in parts]),
        mig_parted_config={"version": "v1", "mig-configs": dict(sorted(configs.items()))},
        nodes=nodes,
        time_slicing=tuple(t for p in parts for t in p.time_slicing),
        strategy_changes=tuple(c for p in parts for c in p.strategy_changes),
        notes=tuple(notes),
        cluster_label=next((p.cluster_label for p in parts if p.cluster_label), ""),
        clusters=tuple(ClusterTotals(p.cluster_names[0], p.totals) for p in parts),
    )


def for_apply(plan: Plan, cluster: str | None, *, source: str = "plan") -> Plan:
    """The part of ``plan`` one API server (one cluster) may apply: ``cluster``'s nodes. A plan over
    several clusters without ``cluster``, or a ``cluster`` the plan does not have, is one
    :class:`PlanError` line; a single-cluster plan needs no ``cluster`` (and is checked against it)."""
    names = plan.cluster_names
    listed = ", ".join(shown(c) for c in names)
    if cluster is None:
        if len(names) > 1:
            raise PlanError(
                f"{source}: the plan covers {len(names)} clusters ({listed}); apply acts on the cluster its "
                "kubeconfig points at: pass --cluster NAME to apply that cluster's changes only"
            )
        return plan
    if cluster not in names:
        raise PlanError(f"{source}: --cluster {cluster!r} is not in the plan (clusters: {listed})")
    return select(plan, cluster)


def select(plan: Plan, cluster: str) -> Plan:
    """``plan`` cut to ``cluster``'s nodes, with that cluster's totals (the plan itself when it has
    only that cluster); its id is that of the cluster's own nodes, the id ``plan --cluster`` gives, so
    ``apply``'s checks and node annotations hold for the part that is applied."""
    if plan.cluster_names == (cluster,):
        return plan
    nodes = tuple(n for n in plan.nodes if n.cluster == cluster)
    mine = next((c.totals for c in plan.clusters if c.name == cluster), None)
    totals = mine or totals_of(nodes, gpus_needed=0)
    names = {n.config_name for n in nodes if n.changed}
    configs = {k: v for k, v in plan.mig_parted_config.get("mig-configs", {}).items() if k in names}
    prefix = f"{shown(cluster)}: "
    return replace(
        plan,
        plan_id=plan_id_for(nodes=nodes, window=plan.window),
        totals=totals,
        nodes=nodes,
        mig_parted_config={"version": "v1", "mig-configs": configs},
        time_slicing=tuple(t for t in plan.time_slicing if t.cluster == cluster),
        notes=tuple(n.removeprefix(prefix) for n in plan.notes if n.startswith(prefix)),
        clusters=(),
    )
