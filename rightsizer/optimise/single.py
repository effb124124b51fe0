"""Single-strategy nodes: one uniform layout on every GPU, and (``--allow-strategy-change``) the same
node answered as if it moved to the mixed strategy."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mig_geometry.catalogue import GpuModel
from rightsizer.analysis.types import GpuInventory
from rightsizer.optimise import packing
from rightsizer.optimise.proposal import Item, NodeInconsistency, NodeProposal, with_changes
from rightsizer.optimise.slots import AssignmentError, assign, check_placeable, compute_slices, signature


def uniform(
    base: NodeProposal,
    *,
    model: GpuModel,
    pool: Sequence[GpuInventory],
    items: Sequence[Item],
    res: packing.PackResult,
    lower: int,
) -> NodeProposal:
    """Single strategy: every GPU carries the same uniform layout (the best one for the pods)."""
    try:
        proposed = tuple(assign(model, pool, items, res, single=True))
    except AssignmentError as exc:
        raise NodeInconsistency(f"{base.node.name}: {exc}") from None
    check_placeable(model, proposed, base.node.name)
    slices_after = res.allocated_slices(model)
    gain = res.gpus < base.used_now or slices_after < base.slices_now
    layout_changed = any(signature(a) != signature(b) for a, b in zip(base.current, proposed, strict=True))
    if gain and layout_changed:
        return with_changes(
            base,
            proposed=proposed,
            changed=True,
            method=res.method,
            status=res.status,
            lower_bound=min(lower, res.gpus),
            used_after=res.gpus,
            slices_after=slices_after,
        )
    reason = "already as tight as the demand allows"
    if gain:
        uniform = " + ".join(f"{n}×{name}" for name, n in res.layouts[0]) if res.layouts else "its layout"
        reason = (
            f"a repack would free {base.used_now - res.gpus} GPU(s): the pods fit on {res.gpus} GPU(s) "
            f"of {uniform}, the layout they have now; relabelling cannot do it, because under the single "
            "strategy pods request nvidia.com/gpu and the device plugin, not the rightsizer, chooses which "
            "slice each pod gets: drain the node's GPU pods and let them reschedule to free those GPUs"
        )
    # The bound stays the true one for the pods: the gap shows what only a repack can win.
    return with_changes(
        base, method=res.method, status=res.status, lower_bound=min(lower, base.used_now), reason=reason
    )


def as_mixed(
    base: NodeProposal,
    *,
    model: GpuModel,
    pool: Sequence[GpuInventory],
    items: Sequence[Item],
    answer: NodeProposal,
    time_limit: float,
) -> NodeProposal | None:
    """``--allow-strategy-change``: the single-strategy node's best layouts under the mixed strategy,
    when they free more GPUs (or as many and more slices) than its uniform answer. Every pod's request
    changes from ``nvidia.com/gpu`` to ``nvidia.com/mig-<profile>``, so every GPU pod of the node goes:
    the fewest GPUs, then the fewest allocated slices, decide (the packing)."""
    demand = Counter(i.klass for i in items)
    res = packing.pack(model, demand, gpus=len(pool), time_limit=max(time_limit, 0.0))
    if not res.feasible:
        return None
    try:
        plans = assign(model, pool, items, res, single=False)
    except AssignmentError:
        return None
    proposed = tuple(plans)
    check_placeable(model, proposed, base.node.name)
    used_after = sum(1 for g in plans if g.items)
    slices_after = compute_slices(model, [i for g in plans for i in g.items], proposed=True)
    if (used_after, slices_after) >= (answer.used_after, answer.slices_after):
        return None
    return with_changes(
        base,
        proposed=proposed,
        changed=True,
        method=res.method,
        status=res.status,
        lower_bound=min(res.lower_bound, used_after),
        used_after=used_after,
        slices_after=slices_after,
        reason="moves to the mixed strategy",
    )
