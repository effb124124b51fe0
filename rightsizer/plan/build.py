"""Optimiser proposals + analysis → the :class:`rightsizer.plan.model.Plan` written to ``plan.json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpupilot_common.timefmt import format_time
from rightsizer.analysis.types import Analysis, NodeInventory, PodKey
from rightsizer.migparted import config as migparted
from rightsizer.migparted import resolve, timeslicing
from rightsizer.optimise.fleet import FleetProposal, GpuPlan, Item, NodeProposal
from rightsizer.plan.model import (
    SCHEMA,
    DisruptedPod,
    Evidence,
    GpuLayout,
    HeldDevice,
    NodePlan,
    Plan,
    SolverInfo,
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


def _held(analysis: Analysis, node: NodeInventory, item: Item) -> HeldDevice:
    gpu = next((g for g in node.gpus if g.index == item.gpu), None)
    inst = (
        next((i for i in gpu.instances if i.gpu_instance_id == item.gpu_instance_id), None) if gpu else None
    )
    return HeldDevice(item.gpu, item.profile_now, item.gpu_instance_id, inst.uuid if inst else "")


def _disrupted(analysis: Analysis, p: NodeProposal) -> tuple[DisruptedPod, ...]:
    if not p.changed:
        return ()
    changed_gpus = {
        c.index
        for c, n in zip(p.current, p.proposed, strict=True)
        if (c.mig_enabled, sorted(c.counts.items())) != (n.mig_enabled, sorted(n.counts.items()))
    }
    pods: dict[PodKey, list[HeldDevice]] = {}
    for g in p.current:
        for it in g.items:
            resized = any(
                x.gpu_instance_id == it.gpu_instance_id and x.node == it.node and x.klass != it.profile_now
                for pg in p.proposed
                for x in pg.items
            )
            if g.index in changed_gpus or resized:
                for pod in it.pods:
                    pods.setdefault(pod, []).append(_held(analysis, p.node, it))
    # Whole GPUs handed back or re-partitioned: pods on them are disrupted too.
    for idx in changed_gpus:
        dev = analysis.device(p.node.name, idx, "")
        if dev is not None:
            for pod in dev.pods:
                pods.setdefault(pod, []).append(HeldDevice(idx, "", "", dev.gpu_uuid))
    return tuple(
        DisruptedPod(k.namespace, k.name, tuple(v))
        for k, v in sorted(pods.items(), key=lambda kv: str(kv[0]))
    )


def _evidence(analysis: Analysis, node: NodeInventory) -> tuple[Evidence, ...]:
    out = []
    for d in analysis.devices:
        if d.node != node.name:
            continue
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
            )
        )
    return tuple(sorted(out, key=lambda e: (e.gpu, e.gpu_instance_id)))


def _resize_notes(p: NodeProposal) -> list[str]:
    if not p.changed or p.node.mig_strategy == "single":
        return []
    notes = []
    for g in p.proposed:
        for it in g.items:
            if it.klass != it.profile_now:
                for pod in it.pods:
                    notes.append(
                        f"{p.node.name}: pod {pod} moves from nvidia.com/mig-{it.profile_now} to "
                        f"nvidia.com/mig-{it.klass}; update its workload's resource request"
                    )
    return notes


def build_plan(analysis: Analysis, fleet: FleetProposal, *, context: PlanContext) -> Plan:
    nodes: list[NodePlan] = []
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
                pods_disrupted=_disrupted(analysis, p),
                evidence=_evidence(analysis, p.node),
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
        gpus_freed=sum(n.gpus_freed for n in nodes),
        slices_freed=sum(n.slices_freed for n in nodes),
        pods_disrupted=sum(len(n.pods_disrupted) for n in nodes),
    )
    ts = tuple(
        TimeSlicingRecommendation(
            node=t.node,
            model=t.model,
            gpus=t.gpus,
            replicas=t.replicas,
            reason=t.reason,
            config_document=timeslicing.sharing_document(replicas=t.replicas),
        )
        for t in fleet.time_slicing
    )
    notes = [*analysis.notes, *fleet.notes]
    for p in fleet.nodes:
        notes += _resize_notes(p)
        if p.reason and not p.changed and p.reason.startswith(("deferred", "pods would fit")):
            notes.append(f"{p.node.name}: {p.reason}")
    return Plan(
        schema=SCHEMA,
        plan_id=plan_id_for(nodes=nodes, window=window),
        created_at=format_time(context.created_at or datetime.now(tz=UTC)),
        window=window,
        prometheus_url=analysis.prometheus_url,
        settings=dict(context.settings),
        solver=SolverInfo(fleet.method, fleet.status, fleet.lower_bound, fleet.seconds),
        totals=totals,
        mig_parted_config=merged,
        nodes=tuple(nodes),
        time_slicing=ts,
        notes=tuple(notes),
    )
