"""Analysis → proposed MIG layouts per node, under the plan's constraints. Pure: no I/O.

Per node: every allocated device becomes a demand of one *class* (the smallest profile covering its
workload's peak rolling-mean compute and peak memory with headroom, on that node's GPU model; devices without data
keep their current profile). Whole GPUs held by pods stay as they are (their pods ask for
``nvidia.com/gpu``); everything else on the node is a pool of GPUs that :func:`packing.pack` fills
with the fewest GPUs, then the least allocated-but-idle compute. GPUs left empty are handed back
whole (``mig-enabled: false``); under ``nvidia.com/mig.strategy=single`` every GPU carries the same
uniform layout instead. A node changes only if that frees a GPU or allocated slices; the
``max_nodes`` most valuable changes are kept. With ``allow_moves`` the whole fleet is one problem
(:mod:`rightsizer.optimise.consolidate`): each node stays, takes its own answer or is repacked with
the others of its model, so pods may land on another node, and ``max_nodes`` bounds the nodes that
change. The fleet's LP bound with pods free to move is computed either way. Every proposed layout is
checked with :func:`mig_geometry.placement.place` before it leaves this module.
"""

from __future__ import annotations

import math
import time

from rightsizer.analysis.types import Analysis, DeviceStats, NodeInventory
from rightsizer.optimise import consolidate, pending
from rightsizer.optimise.node import items_for_node, left_alone, propose_node
from rightsizer.optimise.proposal import (
    FleetProposal,
    GpuPlan,
    Item,
    NodeInconsistency,
    NodeProposal,
    OptimiserSettings,
    TimeSlicing,
    with_changes,
)

__all__ = [
    "FleetProposal",
    "GpuPlan",
    "Item",
    "NodeProposal",
    "OptimiserSettings",
    "TimeSlicing",
    "items_for_node",
    "optimise",
    "propose_node",
    "time_slicing_for",
]


# ---------------------------------------------------------------------------------------------- fleet


def time_slicing_for(
    node: NodeInventory, analysis: Analysis, *, settings: OptimiserSettings
) -> TimeSlicing | None:
    """Whole GPUs held by pods that stay mostly idle: share them with time-slicing replicas."""
    low: list[tuple[int, DeviceStats]] = []
    window = max(analysis.window_hours, 1e-9)
    for gpu in node.gpus:
        if gpu.mig_enabled:
            continue
        dev = analysis.device(node.name, gpu.index, "")
        if dev is None or not dev.pods or dev.unknown or dev.peak is None:
            continue
        if dev.coverage_hours / window >= settings.min_coverage and dev.peak < settings.time_slicing_below:
            low.append((gpu.index, dev))
    if not low:
        return None
    worst = max(d.peak or 0.0 for _, d in low)
    replicas = max(2, min(8, math.floor(0.8 / max(worst, 0.1))))
    model = node.model_key
    kind = "no MIG" if node.gpus[0].model is None or not node.gpus[0].model.mig_capable else "MIG off"
    return TimeSlicing(
        node.name,
        model,
        tuple(i for i, _ in low),
        replicas,
        f"whole GPU(s) ({kind}) whose busiest {low[0][1].busy_minutes:.0f}-min mean was {worst:.0%} in {window:.0f} h: "
        f"{replicas} replicas keep the busiest below 80 %",
    )


def optimise(analysis: Analysis, *, settings: OptimiserSettings) -> FleetProposal:
    started = time.perf_counter()
    deadline = started + settings.time_limit_s
    workloads = {p: w for w in analysis.workloads for p in w.pods}
    proposals = []
    notes: list[str] = []
    for node in analysis.nodes:
        # Past the budget a node gets no MILP at all (0), not a minimum slice of one per node.
        remaining = max(0.0, deadline - time.perf_counter())
        try:
            proposal = propose_node(
                node, analysis, settings=settings, workloads=workloads, time_limit=min(remaining, 10.0)
            )
        except NodeInconsistency as exc:
            proposal = left_alone(
                node, analysis, reason=f"left unchanged: the optimiser's check failed ({exc})"
            )
        proposals.append(proposal)
    bound = consolidate.fleet_bound(proposals, analysis, settings=settings)
    if settings.allow_moves:
        proposals, moved_notes, bound = consolidate.consolidate(
            proposals, analysis, settings=settings, deadline=deadline
        )
        notes += moved_notes
        changed = sum(1 for p in proposals if p.changed)
        if settings.max_nodes is not None and changed >= settings.max_nodes:
            notes.append(
                f"--max-nodes {settings.max_nodes}: the fleet's best plan within that many node changes"
            )
    else:
        ranked = sorted(
            (p for p in proposals if p.changed),
            key=lambda p: (-p.gpus_freed, -p.slices_freed, p.node.name),
        )
        if settings.max_nodes is not None and len(ranked) > settings.max_nodes:
            keep = {p.node.name for p in ranked[: settings.max_nodes]}
            dropped = len(ranked) - len(keep)
            notes.append(
                f"--max-nodes {settings.max_nodes}: {dropped} further node change(s) left for a later plan"
            )
            proposals = [p if (not p.changed or p.node.name in keep) else _unchanged(p) for p in proposals]
    if analysis.pending:
        proposals, pending_notes = pending.serve(proposals, analysis)
        notes += pending_notes
    ts = [t for n in analysis.nodes if (t := time_slicing_for(n, analysis, settings=settings)) is not None]
    return FleetProposal(
        tuple(proposals),
        tuple(ts),
        time.perf_counter() - started,
        tuple(notes),
        moves=settings.allow_moves,
        moves_bound=bound.gpus,
    )


def _unchanged(p: NodeProposal) -> NodeProposal:
    return with_changes(
        p,
        proposed=p.current,
        changed=False,
        used_after=p.used_now,
        slices_after=p.slices_now,
        reason="deferred by --max-nodes",
    )
