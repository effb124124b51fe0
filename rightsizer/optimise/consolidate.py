"""``--allow-moves`` over the whole fleet: every node's options (:mod:`rightsizer.optimise.selection`
chooses), then the choice made real, GPU by GPU and device by device.

A node's options come from the per-node pass: as it is now, its own answer (when it changes
anything), and, for mixed-strategy nodes of one MIG-capable model whose every device belongs to a pod
holding nothing else, being repacked. The chosen layouts go to the repacked nodes busiest first
(a GPU whose layout is one of them keeps it); devices go to a slot of the profile the choice serves
them with: their own GPU, their own node, another repacked node, then free slots on the nodes that
stay. A repacked GPU left without devices that held some goes MIG off (handed back whole); one that
was empty keeps its layout. The plan's bound is :func:`fleet_bound`: the LP relaxation of the same
packing over every pool, so the gap it prints is to the fleet's optimum, not to the nodes changed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mig_geometry.catalogue import GpuModel
from mig_geometry.layouts import Layout, as_layout
from rightsizer.analysis.types import Analysis, PodKey
from rightsizer.optimise import packing, selection
from rightsizer.optimise.node import is_pinned
from rightsizer.optimise.proposal import GpuPlan, Item, NodeProposal, OptimiserSettings, with_changes
from rightsizer.optimise.selection import Candidate, Ending, Repack
from rightsizer.optimise.slots import check_placeable, served, signature


def in_pool(p: NodeProposal) -> bool:
    """Mixed-strategy nodes of one MIG-capable model: their pods may move among them."""
    model = p.model
    return (
        model is not None
        and model.mig_capable
        and p.node.mig_strategy != "single"
        and len({g.model_key for g in p.node.gpus}) == 1
    )


def pool_gpus(p: NodeProposal, analysis: Analysis) -> list[int]:
    return [g.index for g in p.node.gpus if not is_pinned(g, analysis, p.node.name)]


@dataclass(frozen=True)
class FleetBound:
    """LP lower bounds on the GPUs holding pods after any plan."""

    gpus: int
    """Pods free to move among the mixed-strategy nodes of their GPU model (``--allow-moves``)."""
    per_model: Mapping[str, int] = field(default_factory=dict)
    """The pools' LP bounds alone (GPUs pinned by whole-GPU pods and other nodes not included)."""


def pool_items(p: NodeProposal, analysis: Analysis) -> list[Item]:
    """The node's devices on its pool GPUs, each with its demand class (not the profile serving it)."""
    pool = set(pool_gpus(p, analysis))
    return [it for g in p.current if g.index in pool for it in g.items]


def fleet_bound(
    proposals: Sequence[NodeProposal], analysis: Analysis, *, settings: OptimiserSettings
) -> FleetBound:
    """Every pool's LP bound, plus the GPUs pods hold on pinned GPUs, plus each other node's own bound.

    A relaxation of every plan the optimiser may make: devices served by any slot covering what
    they need at least, on any GPU of their model's pool, layouts fractional."""
    demand: dict[str, Counter[str]] = {}
    models: dict[str, GpuModel] = {}
    total = 0
    for p in proposals:
        if not in_pool(p) or p.model is None:
            total += p.lower_bound
            continue
        models[p.model.key] = p.model
        # A device staying where it is keeps its slice, one that moves gets its class: it needs
        # at least what both cover (the two differ only where a slice grows).
        demand.setdefault(p.model.key, Counter()).update(
            packing.meet(p.model, it.klass, it.profile_now) for it in pool_items(p, analysis)
        )
        pool = set(pool_gpus(p, analysis))
        total += sum(1 for g in p.node.gpus if g.index not in pool and _holds_pods(p, analysis, g.index))
    per_model = {
        key: packing.lp_lower_bound(models[key], dict(d), exact=settings.keep_profiles)
        for key, d in sorted(demand.items())
    }
    return FleetBound(total + sum(per_model.values()), per_model)


def _holds_pods(p: NodeProposal, analysis: Analysis, gpu: int) -> bool:
    inv = next(g for g in p.node.gpus if g.index == gpu)
    if not inv.mig_enabled:
        dev = analysis.device(p.node.name, gpu, "")
        return bool(dev and dev.pods)
    return any(
        (d := analysis.device(p.node.name, gpu, i.gpu_instance_id)) is not None and d.pods
        for i in inv.instances
    )


# ---------------------------------------------------------------------------------------------- options


def _free(model: GpuModel, plans: Sequence[GpuPlan], pool: set[int], *, after: bool) -> Counter[str]:
    """Free slots on the pool GPUs that hold devices (``after``: devices on the profile serving them)."""
    out: Counter[str] = Counter()
    for g in plans:
        if g.index not in pool or not g.mig_enabled or not g.items:
            continue
        have = Counter(g.counts)
        have.subtract(it.klass if after else it.profile_now for it in g.items)
        out.update({q: n for q, n in have.items() if n > 0 and model.profile(q) is not None})
    return out


def disrupted_pods(p: NodeProposal, analysis: Analysis) -> set[PodKey]:
    """The pods the node's proposal restarts (the rules of :mod:`rightsizer.plan.disruption`)."""
    if not p.changed:
        return set()
    now = {g.index: g for g in p.current}
    changed = {g.index for g in p.proposed if signature(g) != signature(now[g.index])}
    if any(g.mig_enabled != now[g.index].mig_enabled for g in p.proposed):
        changed = set(now)
    out: set[PodKey] = set()
    for g in p.proposed:
        for it in g.items:
            if it.node == p.node.name and (it.gpu != g.index or it.klass != it.profile_now):
                out.update(it.pods)
    for d in analysis.devices_on(p.node.name):
        if d.gpu in changed:
            out.update(d.pods)
    return out


def _ending(p: NodeProposal, analysis: Analysis, pool: set[int], *, own: bool) -> Ending:
    model = p.model
    assert model is not None
    plans = p.proposed if own else p.current
    items = [it for g in plans if g.index in pool for it in g.items]
    return Ending(
        used=sum(1 for g in plans if g.index in pool and g.items),
        slices=sum(packing.size(model, it.klass if own else it.profile_now) for it in items),
        disrupted=len(disrupted_pods(p, analysis)) if own else 0,
        free=tuple(sorted(_free(model, plans, pool, after=own).items())),
    )


def _repackable(p: NodeProposal, analysis: Analysis, items: Sequence[Item]) -> bool:
    """No pod of a device on the pool GPUs holds another device of the node (a device several pods
    hold moves with all of them)."""
    holders: Counter[PodKey] = Counter(pod for d in analysis.devices_on(p.node.name) for pod in d.pods)
    return all(holders[pod] == 1 for it in items for pod in it.pods)


def candidate(p: NodeProposal, analysis: Analysis) -> Candidate:
    if not in_pool(p) or p.model is None:
        # Outside every pool: the node's own answer or nothing; its GPUs count as they are.
        used, slices = p.used_now, p.slices_now
        now = Ending(used, slices, 0, ())
        own = (
            Ending(p.used_after, p.slices_after, len(disrupted_pods(p, analysis)), ()) if p.changed else None
        )
        return Candidate("", now, own, None)
    pool = set(pool_gpus(p, analysis))
    items = pool_items(p, analysis)
    now = _ending(p, analysis, pool, own=False)
    own_end = _ending(p, analysis, pool, own=True) if p.changed else None
    repack = None
    if pool and _repackable(p, analysis, items):
        pods = {pod for d in analysis.devices_on(p.node.name) for pod in d.pods}
        repack = Repack(tuple(sorted(Counter(it.klass for it in items).items())), len(pool), len(pods))
    return Candidate(p.model.key, now, own_end, repack)


# ---------------------------------------------------------------------------------------------- the answer


def consolidate(
    proposals: Sequence[NodeProposal],
    analysis: Analysis,
    *,
    settings: OptimiserSettings,
    deadline: float,
) -> tuple[list[NodeProposal], list[str], FleetBound]:
    """The fleet with pods free to move among the nodes of their model: the proposals, notes, bound."""
    bound = fleet_bound(proposals, analysis, settings=settings)
    cands = [candidate(p, analysis) for p in proposals]
    members: dict[Candidate, list[int]] = {}
    for i, c in enumerate(cands):
        members.setdefault(c, []).append(i)
    groups = [(c, len(idx)) for c, idx in members.items()]
    models = {p.model.key: p.model for p in proposals if p.model is not None and in_pool(p)}
    choice = selection.choose(
        groups,
        models,
        budget=settings.max_nodes,
        exact=settings.keep_profiles,
        # What the nodes left of --time-limit, and at least a third of it: on a busy machine the
        # per-node pass may spend it all, and the fleet's choice is the point of --allow-moves.
        time_limit=max(deadline - time.perf_counter(), settings.time_limit_s / 3),
    )
    fate: dict[int, str] = {}
    for g, (_c, idx) in enumerate(members.items()):
        order = sorted(idx, key=lambda i: proposals[i].node.name)
        for i in order[: choice.own[g]]:
            fate[i] = "own"
        for i in order[choice.own[g] : choice.own[g] + choice.repacked[g]]:
            fate[i] = "repack"
    out = [
        p if fate.get(i) == "own" else (p if not p.changed else _as_now(p)) for i, p in enumerate(proposals)
    ]
    notes: list[str] = []
    for key, model in sorted(models.items()):
        repacked = [i for i, p in enumerate(proposals) if fate.get(i) == "repack" and p.model is model]
        if not repacked:
            continue
        _realise(out, repacked, model=model, choice=choice, analysis=analysis)
        notes.append(
            f"--allow-moves: {len(repacked)} {key} node(s) repacked together, their pods placed across the "
            f"{key} nodes"
        )
    if choice.status != "optimal":
        notes.append("--allow-moves: the fleet MILP stopped at --time-limit; its best answer is used")
    before = sum(p.used_after for p in proposals)
    after = sum(p.used_after for p in out)
    if before > after:
        notes.append(f"--allow-moves: {before - after} more GPU(s) freed than with pods kept on their nodes")
    return out, notes, bound


def _as_now(p: NodeProposal) -> NodeProposal:
    """The node as it is (the selection left it out: budget, or moves do better without it)."""
    return with_changes(
        p,
        proposed=p.current,
        changed=False,
        used_after=p.used_now,
        slices_after=p.slices_now,
        moved_in=(),
        admits=(),
        strategy_change=p.strategy_change,
        reason=p.reason or "left as it is by the fleet's plan",
    )


@dataclass
class _Slots:
    """Free slots by profile: (node position, GPU index) → count."""

    free: dict[str, Counter[tuple[int, int]]] = field(default_factory=dict)

    def add(self, q: str, where: tuple[int, int], n: int = 1) -> None:
        if n > 0:
            self.free.setdefault(q, Counter())[where] += n

    def take(self, q: str, where: tuple[int, int]) -> None:
        c = self.free[q]
        c[where] -= 1
        if c[where] <= 0:
            del c[where]


def _realise(
    out: list[NodeProposal],
    repacked: Sequence[int],
    *,
    model: GpuModel,
    choice: selection.Choice,
    analysis: Analysis,
) -> None:
    """The choice for ``model``'s pool made real in ``out``: the repacked nodes' new layouts, every
    device of theirs on a slot, the nodes they land on with the devices that arrive."""
    key = model.key
    nodes = sorted(repacked, key=lambda i: (-len(pool_items(out[i], analysis)), out[i].node.name))
    pools = {i: pool_gpus(out[i], analysis) for i in nodes}
    given = _hand_out(out, nodes, pools, choice.layouts.get(key, ()), model=model, analysis=analysis)
    slots = _Slots()
    plans: dict[int, dict[int, GpuPlan]] = {}
    for i in nodes:
        plans[i], carrying = _place_layouts(out[i], pools[i], given[i])
        for idx in carrying:
            for q, n in plans[i][idx].counts.items():
                slots.add(q, (i, idx), n)
    kept = _offer_kept(out, set(plans), slots, model=model, analysis=analysis)
    want: Counter[tuple[str, str]] = Counter(choice.serve.get(key, {}))
    position = {out[i].node.name: i for i in nodes}
    items = [it for i in nodes for it in pool_items(out[i], analysis)]
    for it in sorted(
        items, key=lambda it: (-packing.size(model, it.klass), it.node, it.gpu, it.gpu_instance_id)
    ):
        spot = _spot(slots, want, it, home=position[it.node], repacked=set(plans), model=model)
        if spot is None:
            raise AssertionError(f"no slot for {it.klass}")  # the MILP's rows hold every device
        (i, idx), q = spot
        slots.take(q, (i, idx))
        want[(it.klass, q)] -= 1
        (plans[i] if i in plans else kept[i])[idx].items.append(served(it, q))
    for i in nodes:
        out[i] = _repacked(out[i], plans[i], model)
    for i, gpus in kept.items():
        arrived = tuple(it for g in gpus.values() for it in g.items if it.node != out[i].node.name)
        if arrived:
            proposed = tuple(gpus[g.index] for g in out[i].proposed)
            out[i] = with_changes(out[i], proposed=proposed, moved_in=arrived)


def _hand_out(
    out: Sequence[NodeProposal],
    nodes: Sequence[int],
    pools: Mapping[int, Sequence[int]],
    layouts: Sequence[Layout],
    *,
    model: GpuModel,
    analysis: Analysis,
) -> dict[int, list[Layout]]:
    """Layouts to the repacked nodes (busiest first): each first takes those that serve most of its
    own devices, then the rest fill the busiest nodes' remaining GPUs."""
    todo = sorted(layouts, key=lambda lay: (-sum(n for _, n in lay), lay))
    given: dict[int, list[Layout]] = {i: [] for i in nodes}
    for i in nodes:
        need = Counter(it.klass for it in pool_items(out[i], analysis))
        while need and todo and len(given[i]) < len(pools[i]):
            best = max(range(len(todo)), key=lambda j: (_covers(model, todo[j], need), -j))
            if _covers(model, todo[best], need) == 0:
                break
            lay = todo.pop(best)
            given[i].append(lay)
            for q, n in lay:
                for _ in range(n):
                    k = next((k for k in need if model.profile(q) in packing.serving(model, k)), None)
                    if k is not None:
                        need[k] -= 1
                        if need[k] <= 0:
                            del need[k]
    for i in nodes:
        while todo and len(given[i]) < len(pools[i]):
            given[i].append(todo.pop(0))
    if todo:
        raise AssertionError("more layouts than the repacked nodes' GPUs")  # the MILP's row forbids it
    return given


def _offer_kept(
    out: Sequence[NodeProposal], repacked: set[int], slots: _Slots, *, model: GpuModel, analysis: Analysis
) -> dict[int, dict[int, GpuPlan]]:
    """The GPUs of the model's other pool nodes (copies, to receive devices), their free slots on GPUs
    holding devices added to ``slots``."""
    kept: dict[int, dict[int, GpuPlan]] = {}
    for i, p in enumerate(out):
        if i in repacked or p.model is not model or not in_pool(p):
            continue
        pool = set(pool_gpus(p, analysis))
        kept[i] = {
            g.index: GpuPlan(g.index, g.mig_enabled, dict(g.counts), list(g.items)) for g in p.proposed
        }
        for g in kept[i].values():
            if g.index in pool and g.mig_enabled and g.items:
                have = Counter(g.counts)
                have.subtract(it.klass if p.changed else it.profile_now for it in g.items)
                for q, n in have.items():
                    slots.add(q, (i, g.index), n)
    return kept


def _covers(model: GpuModel, lay: Layout, need: Counter[str]) -> int:
    """How many of ``need``'s devices the layout's slots serve (each slot once)."""
    left = Counter(need)
    n = 0
    for q, count in sorted(lay, key=lambda qn: packing.size(model, qn[0])):
        prof = model.profile(q)
        for _ in range(count):
            k = next(
                (
                    k
                    for k in sorted(left, key=lambda k: -packing.size(model, k))
                    if left[k] > 0 and prof in packing.serving(model, k)
                ),
                None,
            )
            if k is not None:
                left[k] -= 1
                n += 1
    return n


def _place_layouts(
    p: NodeProposal, pool: Sequence[int], given: Sequence[Layout]
) -> tuple[dict[int, GpuPlan], set[int]]:
    """The node's pool GPUs with their new layouts, and which GPUs carry one of ``given``: a GPU
    already carrying one keeps it, the rest go to the GPUs holding most devices; pool GPUs left over
    go MIG off if they held devices, else stay as they are (nothing lands there)."""
    todo = list(given)
    now = {g.index: g for g in p.current}
    out: dict[int, GpuPlan] = {}
    carrying: set[int] = set()
    by_load = sorted(pool, key=lambda idx: (-len(now[idx].items), idx))
    for idx in by_load:
        g = now[idx]
        lay = as_layout(g.counts) if g.mig_enabled else None
        if lay is not None and lay in todo:
            todo.remove(lay)
            out[idx] = GpuPlan(idx, True, dict(lay))
            carrying.add(idx)
    for idx in by_load:
        if idx in out:
            continue
        if todo:
            out[idx] = GpuPlan(idx, True, dict(todo.pop(0)))
            carrying.add(idx)
        elif now[idx].items or not now[idx].mig_enabled:
            out[idx] = GpuPlan(idx, False, {})
        else:
            out[idx] = GpuPlan(idx, True, dict(now[idx].counts))  # empty before and after: as it is
    return out, carrying


def _spot(
    slots: _Slots,
    want: Counter[tuple[str, str]],
    it: Item,
    *,
    home: int,
    repacked: set[int],
    model: GpuModel,
) -> tuple[tuple[int, int], str] | None:
    """Where a device of a repacked node goes: its own GPU with its own profile, its own GPU, its own
    node, another repacked node, then a node that stays."""
    options = [q for (k, q), n in want.items() if k == it.klass and n > 0]
    options.sort(key=lambda q: (q != it.profile_now, packing.size(model, q), q))
    ranked: list[tuple[tuple[int, ...], tuple[int, int], str]] = []
    for q in options:
        for where in slots.free.get(q, {}):
            i, idx = where
            rank = (
                0
                if (i, idx) == (home, it.gpu) and q == it.profile_now
                else 1
                if (i, idx) == (home, it.gpu)
                else 2
                if i == home
                else 3
                if i in repacked
                else 4,
            )
            ranked.append((rank, where, q))
            if rank == (0,):
                return where, q
    if not ranked:
        return None
    _, where, q = min(ranked)
    return where, q


def _repacked(p: NodeProposal, plans: Mapping[int, GpuPlan], model: GpuModel) -> NodeProposal:
    pool = set(plans)
    proposed = tuple(plans[g.index] if g.index in pool else g for g in p.current)
    check_placeable(model, proposed, p.node.name)
    mine = [it for g in proposed if g.index in pool for it in g.items]
    pinned_used = p.used_now - sum(1 for g in p.current if g.index in pool and g.items)
    used_after = sum(1 for g in proposed if g.index in pool and g.items) + pinned_used
    same = all(
        signature(a) == signature(b)
        and not any(
            it.gpu != b.index or it.klass != it.profile_now or it.node != p.node.name for it in b.items
        )
        for a, b in zip(p.current, proposed, strict=True)
    )
    return with_changes(
        p,
        proposed=proposed,
        changed=not same,
        moved_in=tuple(it for it in mine if it.node != p.node.name),
        used_after=used_after,
        slices_after=sum(packing.size(model, it.klass) for it in mine),
        method="milp",
        status="optimal",
        lower_bound=used_after,
        reason="" if not same else p.reason,
        admits=(),
    )
