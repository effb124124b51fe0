"""Optimiser proposals + analysis → the :class:`rightsizer.plan.model.Plan` written to ``plan.json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from gpupilot_common.timefmt import format_time
from rightsizer.analysis.types import Analysis, NodeInventory, PodKey
from rightsizer.migparted import config as migparted
from rightsizer.migparted import resolve, timeslicing
from rightsizer.optimise.fleet import FleetProposal, GpuPlan, NodeProposal
from rightsizer.plan import disruption
from rightsizer.plan.model import (
    SCHEMA,
    AdmittedPod,
    DisruptedPod,
    Evidence,
    GpuLayout,
    HeldDevice,
    NodePlan,
    Plan,
    SolverInfo,
    StrategyChange,
    TargetDevice,
    TimeSlicingRecommendation,
    Totals,
    Window,
    config_name_for,
    plan_id_for,
)


@dataclass(frozen=True)
class PlanContext:
    window: str
    """The ``--window`` text (``7d``)."""
    settings: Mapping[str, Any]
    created_at: datetime | None = None
    cluster_configs: Sequence[migparted.MigPartedConfig] = ()
    """The cluster's mig-parted configs: a proposed layout equal to one of them is named by it."""
    cluster_label: str = ""
    """The label naming the clusters (recorded in the plan when the nodes carry one)."""


def _layouts(gpus: Sequence[GpuPlan]) -> tuple[GpuLayout, ...]:
    return tuple(
        GpuLayout(g.index, g.mig_enabled, dict(sorted(g.counts.items())) if g.mig_enabled else {})
        for g in gpus
    )


def _config(
    node: NodeInventory, gpus: Sequence[GpuPlan], cluster: Sequence[migparted.MigPartedConfig] = ()
) -> tuple[str, dict[str, Any]]:
    device_id = node.gpus[0].pci_device_id if node.gpus and node.gpus[0].pci_device_id else None
    layouts = [(g.index, g.mig_enabled, g.counts) for g in gpus]
    existing = resolve.matching_config(cluster, device_id=device_id, layouts=layouts) if cluster else None
    if existing is not None:
        name, raw = existing
        return name, {"version": "v1", "mig-configs": {name: raw}}
    entries = migparted.entries_for_layouts(layouts, device_id=device_id)
    dicts = [e.to_dict() for e in entries]
    name = config_name_for(dicts)
    return name, migparted.document({name: entries})


Slot = tuple[str, int, str]
"""(node, GPU index, GPU instance id) of a device now."""


def _targets(fleet: FleetProposal) -> dict[Slot, TargetDevice]:
    """Every MIG device of a changing node, and every device moving to a node that keeps its layouts
    (``--allow-moves``), → the device the plan gives it (fleet-wide)."""
    out: dict[Slot, TargetDevice] = {}
    for p in fleet.nodes:
        for g in p.proposed:
            for it in g.items:
                if p.changed or it.node != p.node.name:
                    out[(it.node, it.gpu, it.gpu_instance_id)] = TargetDevice(p.node.name, g.index, it.klass)
    return out


def _placements(
    analysis: Analysis, node: NodeInventory, targets: dict[Slot, TargetDevice]
) -> list[disruption.PodPlacement]:
    """The GPU pods on ``node`` now (from the exporter's pod attribution), matched by GPU index."""
    held: dict[PodKey, list[HeldDevice]] = {}
    for d in analysis.devices_on(node.name):
        gpu = next((g for g in node.gpus if g.index == d.gpu), None)
        inst = (
            next((i for i in gpu.instances if i.gpu_instance_id == d.gpu_instance_id), None) if gpu else None
        )
        device = HeldDevice(d.gpu, d.profile, d.gpu_instance_id, inst.uuid if inst else d.gpu_uuid)
        for pod in d.pods:
            held.setdefault(pod, []).append(device)
    out = []
    for pod, devices in sorted(held.items(), key=lambda kv: str(kv[0])):
        moves = tuple(
            disruption.Target(dev, t.node, t.gpu, t.profile)
            for dev in devices
            if dev.profile and (t := targets.get((node.name, dev.gpu, dev.gpu_instance_id))) is not None
        )
        out.append(disruption.PodPlacement(DisruptedPod(pod.namespace, pod.name, tuple(devices)), moves))
    return out


@dataclass(frozen=True)
class _NodePods:
    disrupted: tuple[DisruptedPod, ...]
    kept: tuple[DisruptedPod, ...]
    arriving: tuple[disruption.Target, ...]
    notes: tuple[str, ...] = ()


def _node_pods(
    analysis: Analysis, p: NodeProposal, targets: dict[Slot, TargetDevice]
) -> tuple[_NodePods, list[disruption.PodPlacement]]:
    placements = _placements(analysis, p.node, targets)
    if not p.changed:
        kept = tuple(pl.pod for pl in placements)
        return _NodePods((), kept, ()), placements
    current, proposed = _layouts(p.current), _layouts(p.proposed)
    disrupted, kept = disruption.split_pods(placements, node=p.node.name, current=current, proposed=proposed)
    by_key = {(pl.pod.namespace, pl.pod.name): pl for pl in placements}
    with_targets = tuple(
        DisruptedPod(
            d.namespace,
            d.name,
            d.devices,
            tuple(TargetDevice(t.node, t.gpu, t.profile) for t in by_key[(d.namespace, d.name)].targets),
        )
        for d in disrupted
    )
    arriving = tuple(t for d in disrupted for t in by_key[(d.namespace, d.name)].targets)
    notes = _resize_notes(p.node, placements, {PodKey(d.namespace, d.name) for d in disrupted})
    return _NodePods(with_targets, kept, arriving, tuple(notes)), placements


def _evidence(analysis: Analysis, node: NodeInventory) -> tuple[Evidence, ...]:
    out = []
    for d in analysis.devices_on(node.name):
        out.append(
            Evidence(
                gpu=d.gpu,
                profile=d.profile,
                gpu_instance_id=d.gpu_instance_id,
                allocated=d.allocated,
                pod=", ".join(str(p) for p in d.pods),
                idle_hours=d.idle_hours,
                p95_activity=d.p95,
                coverage_hours=d.coverage_hours,
                window_hours=d.window_hours,
                peak_activity=d.peak,
                peak_at=format_time(d.peak_at) if d.peak_at is not None else "",
                busy_minutes=d.busy_minutes,
            )
        )
    return tuple(sorted(out, key=lambda e: (e.gpu, e.gpu_instance_id)))


def _resize_notes(
    node: NodeInventory, placements: list[disruption.PodPlacement], moving: set[PodKey]
) -> list[str]:
    """One note per evicted pod whose device changes profile or node: what to change in its workload."""
    notes = []
    for pl in placements:
        pod = PodKey(pl.pod.namespace, pl.pod.name)
        if pod not in moving:
            continue
        for t in pl.targets:
            where = f" on node {t.node}" if t.node != node.name else ""
            if node.mig_strategy != "single" and t.profile != t.held.profile:
                notes.append(
                    f"{node.name}: pod {pod} moves from nvidia.com/mig-{t.held.profile} (GPU {t.held.gpu}) to "
                    f"nvidia.com/mig-{t.profile} (GPU {t.gpu}{where}); update its workload's resource request"
                )
            elif where:
                notes.append(f"{node.name}: pod {pod} moves to GPU {t.gpu}{where}")
    return notes


def _node_pods_all(analysis: Analysis, fleet: FleetProposal) -> dict[str, _NodePods]:
    targets = _targets(fleet)
    return {p.node.name: _node_pods(analysis, p, targets)[0] for p in fleet.nodes}


def _mismatches(fleet: FleetProposal, pods: Mapping[str, _NodePods]) -> dict[str, str]:
    """Changing nodes, and nodes pods move to, whose proposed layouts would not hold the pods that stay
    plus those arriving."""
    arriving: dict[str, list[disruption.Target]] = {}  # by the node the device lands on
    for np_ in pods.values():
        for t in np_.arriving:
            arriving.setdefault(t.node, []).append(t)
    bad = {}
    for p in fleet.nodes:
        if not p.changed and p.node.name not in arriving:
            continue
        try:
            disruption.check_requests_fit(
                p.node.name,
                _layouts(p.proposed),
                staying=pods[p.node.name].kept,
                arriving=arriving.get(p.node.name, ()),
            )
        except disruption.LayoutMismatchError as exc:
            bad[p.node.name] = str(exc)
    return bad


def _linked(fleet: FleetProposal, names: set[str]) -> set[str]:
    """``names`` and every node that exchanges pods with them (``--allow-moves``), transitively."""
    edges = [(it.node, p.node.name) for p in fleet.nodes for it in p.moved_in]
    out = set(names)
    grew = True
    while grew:
        grew = False
        for a, b in edges:
            if (a in out) != (b in out):
                out |= {a, b}
                grew = True
    return out


def consistent(analysis: Analysis, fleet: FleetProposal) -> tuple[FleetProposal, dict[str, _NodePods]]:
    """The fleet with every node whose change fails the pods-fit check (and the nodes it exchanges pods
    with) left as it is, the check's finding as its note: one node never stops the plan."""
    while True:
        pods = _node_pods_all(analysis, fleet)
        bad = _mismatches(fleet, pods)
        if not bad:
            return fleet, pods
        revert = _linked(fleet, set(bad))
        nodes = []
        for proposal in fleet.nodes:
            p = proposal
            if p.node.name in revert:
                why = bad.get(p.node.name) or "exchanges pods with a node left unchanged"
                p = replace(
                    p,
                    proposed=p.current,
                    changed=False,
                    moved_in=(),
                    used_after=p.used_now,
                    slices_after=p.slices_now,
                    lower_bound=min(p.lower_bound, p.used_now),
                    reason=f"left unchanged: the plan's check failed ({why})",
                )
            nodes.append(p)
        fleet = replace(fleet, nodes=tuple(nodes))


def _history_notes(fleet: FleetProposal, *, window: str) -> list[str]:
    """What the history before the window says about each slice the plan would shrink."""
    out = []
    for p in fleet.nodes:
        for g in p.proposed:
            for it in g.items:
                if it.last_busy is None:
                    continue
                who = f"{p.node.name} GPU {it.gpu} {it.profile_now} ({', '.join(str(x) for x in it.pods)})"
                when = f"last busy beyond the {window} window in the hour from {format_time(it.last_busy)}"
                if it.weekly and it.klass == it.profile_now:
                    out.append(
                        f"{who}: kept; {when}, at the same hour every week (--ignore-history shrinks it)"
                    )
                elif it.weekly and p.changed:
                    out.append(f"{who}: shrinks to {it.klass} though {when}, weekly (--ignore-history)")
                elif p.changed and it.klass != it.profile_now:
                    out.append(f"{who}: shrinks to {it.klass}; {when}, not a weekly pattern")
    return out


def _growth_notes(fleet: FleetProposal, *, headroom: float | None) -> list[str]:
    """Why a slice grows (its peak does not fit it, or its namespace asked to grow for headroom),
    and which slices keep their size though the headroom alone would grow them."""
    out = []
    room = f"{headroom:.0%} headroom" if headroom is not None else "the headroom"
    for p in fleet.nodes:
        for g in p.proposed:
            for it in g.items:
                if not it.growth:
                    continue
                placed = p.changed or it.node != p.node.name  # the plan gives it this slot
                who = f"{it.node} GPU {it.gpu} {it.profile_now} ({', '.join(str(x) for x in it.pods)})"
                if it.growth == "kept":
                    out.append(
                        f"{who}: keeps its slice: {it.peak_need} with {room} (--grow-for-headroom grows it)"
                    )
                elif placed and it.growth == "peak":
                    out.append(
                        f"{who}: grows to {it.klass}: its {it.peak_need} does not fit {it.profile_now}"
                    )
                elif placed and it.growth == "headroom":
                    out.append(f"{who}: grows to {it.klass} for {room} (--grow-for-headroom): {it.peak_need}")
                elif it.growth == "peak":
                    out.append(
                        f"{who}: its {it.peak_need} does not fit {it.profile_now}, but its node frees nothing "
                        f"to change for: the plan leaves it (a {it.klass} needs a new layout on that node)"
                    )
    return out


def _strategy_change(
    analysis: Analysis, p: NodeProposal, mixed: NodeProposal, context: PlanContext
) -> StrategyChange:
    """The recommendation for a single-strategy node ``p`` that frees more under the mixed strategy."""
    name, doc = _config(p.node, mixed.proposed, context.cluster_configs)
    pods = {pod for d in analysis.devices_on(p.node.name) for pod in d.pods}
    return StrategyChange(
        cluster=p.node.cluster,
        node=p.node.name,
        model=p.node.model_key,
        proposed=_layouts(mixed.proposed),
        config_name=name,
        config_document=doc,
        gpus_freed=mixed.gpus_freed,
        slices_freed=mixed.slices_freed,
        single_gpus_freed=p.gpus_freed,
        pods_disrupted=len(pods),
        reason=(
            "not applied by 'apply': switch the node's device plugin to the mixed MIG strategy "
            "(a per-node device-plugin config with migStrategy: mixed), give every GPU pod of the node a "
            f"nvidia.com/mig-<profile> request, then label it nvidia.com/mig.config={name}"
        ),
    )


def _bound(fleet: FleetProposal, nodes: Sequence[NodePlan]) -> int:
    """The bound of the problem solved; with pods on their nodes, the sum of the nodes' bounds as
    the plan records them (a node left unchanged by the check counts its GPUs in use at most)."""
    if fleet.moves:
        return fleet.lower_bound
    return sum(n.lower_bound_gpus for n in nodes)


def build_plan(analysis: Analysis, fleet: FleetProposal, *, context: PlanContext) -> Plan:
    """The plan for ``fleet``: nodes whose change would not hold their pods are left as they are
    (pods that stay keep their devices, pods that move take the slots named for them; anything else
    would leave a pod unschedulable)."""
    nodes: list[NodePlan] = []
    fleet, pods = consistent(analysis, fleet)
    for p in fleet.nodes:
        name, doc = _config(p.node, p.proposed, context.cluster_configs)
        device_id = p.node.gpus[0].pci_device_id if p.node.gpus else 0
        nodes.append(
            NodePlan(
                name=p.node.name,
                model=p.node.model_key,
                pci_device_id=f"0x{device_id:04x}",
                mig_strategy=p.node.mig_strategy,
                changed=p.changed,
                current_config_name=p.node.mig_config,
                current=_layouts(p.current),
                proposed=_layouts(p.proposed),
                config_name=name,
                config_document=doc,
                slices_freed=p.slices_freed,
                gpus_freed=p.gpus_freed,
                expected_utilisation=p.utilisation(after=True),
                current_utilisation=p.utilisation(after=False),
                pods_disrupted=pods[p.node.name].disrupted,
                pods_kept=pods[p.node.name].kept,
                evidence=_evidence(analysis, p.node),
                cluster=p.node.cluster,
                gpus_in_use=p.used_after,
                lower_bound_gpus=p.lower_bound,
                reason="" if p.changed or p.reason.startswith("already") else p.reason,
                pods_admitted=tuple(
                    AdmittedPod(
                        namespace=a.pod.namespace,
                        name=a.pod.name,
                        resource=a.pod.resource,
                        count=a.pod.count,
                        gpus=a.gpus,
                    )
                    for a in p.admits
                ),
            )
        )
    window = Window(format_time(analysis.start), format_time(analysis.end), context.window)
    merged: dict[str, Any] = {"version": "v1", "mig-configs": {}}
    for n in nodes:
        if n.changed:
            merged["mig-configs"].update(n.config_document["mig-configs"])
    merged["mig-configs"] = dict(sorted(merged["mig-configs"].items()))
    gpus_total = sum(len(p.node.gpus) for p in fleet.nodes)
    totals = Totals(
        nodes=len(nodes),
        nodes_changed=sum(1 for n in nodes if n.changed),
        gpus=gpus_total,
        gpus_needed=sum(p.used_after for p in fleet.nodes),
        # net over the fleet: with --allow-moves a node may hold more GPUs than before
        gpus_freed=sum(p.used_now - p.used_after for p in fleet.nodes),
        slices_freed=sum(n.slices_freed for n in nodes),
        pods_disrupted=sum(len(n.pods_disrupted) for n in nodes),
        pods_admitted=sum(len(n.pods_admitted) for n in nodes),
    )
    cluster_of = {n.name: n.cluster for n in analysis.nodes}
    ts = tuple(
        TimeSlicingRecommendation(
            node=t.node,
            model=t.model,
            gpus=t.gpus,
            replicas=t.replicas,
            reason=t.reason,
            config_document=timeslicing.sharing_document(replicas=t.replicas),
            cluster=cluster_of.get(t.node, ""),
        )
        for t in fleet.time_slicing
    )
    strategy_changes = tuple(
        _strategy_change(analysis, p, mixed, context)
        for p in fleet.nodes
        if (mixed := p.strategy_change) is not None
    )
    notes = [*analysis.notes, *fleet.notes]
    for n in nodes:
        if n.changed:
            notes.append(disruption.disruption_summary(n))
            notes += pods[n.name].notes
    notes += _history_notes(fleet, window=context.window)
    headroom = context.settings.get("headroom")
    notes += _growth_notes(fleet, headroom=float(headroom) if isinstance(headroom, int | float) else None)
    for n in nodes:
        for a in n.pods_admitted:
            gpus = ", ".join(map(str, a.gpus))
            notes.append(
                f"{n.name}: admits pending pod {a.namespace}/{a.name} ({a.count}× {a.resource}) on GPU(s) {gpus}"
            )
    for p in fleet.nodes:
        if p.reason and not p.changed and p.reason.startswith(("deferred", "left unchanged")):
            notes.append(f"{p.node.name}: {p.reason}")
    return Plan(
        schema=SCHEMA,
        plan_id=plan_id_for(nodes=nodes, window=window),
        created_at=format_time(context.created_at or datetime.now(tz=UTC)),
        window=window,
        prometheus_url=analysis.prometheus_url,
        settings=dict(context.settings),
        solver=SolverInfo(
            fleet.method,
            fleet.status,
            _bound(fleet, nodes),
            fleet.seconds,
            bound_scope="fleet" if fleet.moves else "nodes",
            fleet_lower_bound_gpus=fleet.moves_bound if fleet.moves_bound is not None else fleet.node_bound,
        ),
        totals=totals,
        mig_parted_config=merged,
        nodes=tuple(nodes),
        time_slicing=ts,
        strategy_changes=strategy_changes,
        notes=tuple(notes),
        cluster_label=context.cluster_label if any(n.cluster for n in nodes) else "",
    )
