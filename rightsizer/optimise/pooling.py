"""``--allow-moves``: pack the changing nodes of one GPU model as one pool, so pods may change node."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence

from mig_geometry.catalogue import GpuModel
from rightsizer.analysis.types import Analysis, GpuInventory
from rightsizer.optimise import packing
from rightsizer.optimise.node import is_pinned
from rightsizer.optimise.proposal import GpuPlan, Item, NodeInconsistency, NodeProposal, with_changes
from rightsizer.optimise.slots import AssignmentError, assign, check_placeable, served


def pool_moves(
    proposals: list[NodeProposal], analysis: Analysis, *, deadline: float
) -> tuple[list[NodeProposal], str]:
    """Pack the changing mixed-strategy nodes of each model together; keep it if it frees more GPUs."""
    by_model: dict[str, list[NodeProposal]] = {}
    for p in proposals:
        if p.changed and p.model is not None and p.node.mig_strategy != "single":
            by_model.setdefault(p.model.key, []).append(p)
    notes = []
    out = {p.node.name: p for p in proposals}
    for group in by_model.values():
        if len(group) < 2:
            continue
        model = group[0].model
        if model is None:
            continue
        pools = {
            p.node.name: [g for g in p.node.gpus if not is_pinned(g, analysis, p.node.name)] for p in group
        }
        pool_idx = {name: {g.index for g in gpus} for name, gpus in pools.items()}
        items = [it for p in group for g in p.proposed if g.index in pool_idx[p.node.name] for it in g.items]
        res = packing.pack(
            model,
            Counter(i.klass for i in items),
            gpus=sum(len(v) for v in pools.values()),
            time_limit=max(0.05, deadline - time.perf_counter()),
        )
        separate = sum(p.used_after for p in group)
        pinned_used = {
            p.node.name: p.used_after
            - sum(1 for g in p.proposed if g.items and g.index in pool_idx[p.node.name])
            for p in group
        }
        if not res.feasible or res.gpus + sum(pinned_used.values()) >= separate:
            continue
        try:
            updated = _distribute(group, model, pools, items, res, pinned_used)
        except (AssignmentError, NodeInconsistency):
            continue  # the nodes keep their own answers
        out.update(updated)
        after = sum(u.used_after for u in updated.values())
        notes.append(f"--allow-moves: {model.key} nodes pooled, {separate - after} more GPU(s) freed")
    return [out[p.node.name] for p in proposals], "; ".join(notes)


def _distribute(  # noqa: PLR0917
    group: Sequence[NodeProposal],
    model: GpuModel,
    pools: Mapping[str, Sequence[GpuInventory]],
    items: list[Item],
    res: packing.PackResult,
    pinned_used: Mapping[str, int],
) -> dict[str, NodeProposal]:
    """Hand the pooled layouts to the busiest nodes first, then put every device on a slot of the
    profile the pooled answer serves it with, on its own node (its own GPU) when there is one."""
    order = sorted(group, key=lambda p: -sum(len(g.items) for g in p.proposed))
    layouts = list(res.layouts)
    plans: dict[str, list[GpuPlan]] = {}
    for p in order:
        n = min(len(layouts), len(pools[p.node.name]))
        mine, layouts = layouts[:n], layouts[n:]
        empty = packing.PackResult(tuple(mine), {}, res.method, res.status, 0)
        plans[p.node.name] = assign(model, pools[p.node.name], [], empty, single=False)
    if layouts:
        raise AssignmentError("more pooled layouts than GPUs")
    free = {(node, g.index): Counter(g.counts) for node, gs in plans.items() for g in gs}
    by_slot = {(node, g.index): g for node, gs in plans.items() for g in gs}
    # Indexes of GPUs with a free slot of each profile, fleet-wide and per node (sets, kept exact).
    anywhere: dict[str, set[tuple[str, int]]] = {}
    on_node: dict[tuple[str, str], set[int]] = {}
    for key, c in free.items():
        for q, n in c.items():
            if n > 0:
                anywhere.setdefault(q, set()).add(key)
                on_node.setdefault((q, key[0]), set()).add(key[1])
    want: Counter[tuple[str, str]] = Counter(res.serve)
    for it in sorted(items, key=lambda i: (-packing.size(model, i.klass), i.node, i.gpu)):
        options = [q for (k, q), n in want.items() if k == it.klass and n > 0]
        spot: tuple[tuple[str, int], str] | None = None
        for q in options:  # own GPU, then own node, then anywhere
            local = on_node.get((q, it.node), set())
            if it.gpu in local:
                spot = ((it.node, it.gpu), q)
                break
            if local and spot is None:
                spot = ((it.node, min(local)), q)
        if spot is None:
            spot = next(((min(anywhere[q]), q) for q in options if anywhere.get(q)), None)
        if spot is None:
            raise AssignmentError(f"pooled packing left {it.klass} without a slot")
        key, q = spot
        free[key][q] -= 1
        if free[key][q] == 0:
            anywhere[q].discard(key)
            on_node[(q, key[0])].discard(key[1])
        want[(it.klass, q)] -= 1
        by_slot[key].items.append(served(it, q))
    updated: dict[str, NodeProposal] = {}
    # The pooled LP bound belongs to the group: it is shared out over the nodes (none above what it
    # uses), so the fleet's bound (a sum over nodes) stays a bound.
    left = res.lower_bound + sum(pinned_used.values())
    for p in order:
        pool_idx = {g.index for g in pools[p.node.name]}
        mine_plans = plans[p.node.name]
        proposed = tuple(
            sorted([*mine_plans, *(c for c in p.current if c.index not in pool_idx)], key=lambda g: g.index)
        )
        check_placeable(model, proposed, p.node.name)
        node_items = [i for g in mine_plans for i in g.items]
        used_after = sum(1 for g in mine_plans if g.items) + pinned_used[p.node.name]
        share = min(left, used_after)
        left -= share
        updated[p.node.name] = with_changes(
            p,
            proposed=proposed,
            changed=True,
            moved_in=tuple(i for i in node_items if i.node != p.node.name),
            used_after=used_after,
            slices_after=sum(packing.size(model, i.klass) for i in node_items),
            method=res.method,
            status=res.status,
            lower_bound=share,
        )
    return updated
