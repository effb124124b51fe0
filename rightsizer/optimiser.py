"""Analysis → proposed MIG layouts per node, under the plan's constraints. Pure: no I/O.

Per node: every allocated device becomes a demand of one *class* (the smallest profile covering its
workload's p95 compute and peak memory with headroom, on that node's GPU model; devices without data
keep their current profile). Whole GPUs held by pods stay as they are (their pods ask for
``nvidia.com/gpu``); everything else on the node is a pool of GPUs that :func:`packing.pack` fills
with the fewest GPUs, then the least allocated-but-idle compute. GPUs left empty are handed back
whole (``mig-enabled: false``); under ``nvidia.com/mig.strategy=single`` every GPU carries the same
uniform layout instead. A node changes only if that frees a GPU or allocated slices; the
``max_nodes`` most valuable changes are kept. With ``allow_moves`` the changing nodes of one model
are packed as one pool, so pods may land on another node. Every proposed layout is checked with
:func:`mig_geometry.placement.place` before it leaves this module.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mig_geometry.catalogue import GpuModel
from mig_geometry.layouts import Layout
from mig_geometry.names import canonical_profile
from mig_geometry.placement import place
from rightsizer import packing
from rightsizer.model import Analysis, DeviceStats, GpuInventory, NodeInventory, PodKey, Workload


@dataclass(frozen=True)
class OptimiserSettings:
    max_nodes: int | None = None
    """At most this many nodes change per plan (None: no limit)."""
    allow_moves: bool = False
    """Let pods move across nodes (pool the changing nodes of one model)."""
    time_limit_s: float = 30.0
    """Wall-clock budget for all MILPs together; nodes beyond it get the greedy packing."""
    keep_profiles: bool = False
    """Consolidate only: every pod keeps its current profile (no resource-name change for pods)."""
    min_coverage: float = 0.5
    """A device's data must cover this share of the window before its demand is trusted."""
    time_slicing_below: float = 0.3
    """Whole GPUs whose pod's p95 activity is below this get a time-slicing recommendation."""


@dataclass(frozen=True)
class Item:
    """One device demand: who holds it, what it is now, what class it needs."""

    node: str
    gpu: int
    profile_now: str
    gpu_instance_id: str
    pods: tuple[PodKey, ...]
    klass: str
    busy_slices: float | None
    """p95 activity × compute slices of the current device (no headroom); None when unknown."""


@dataclass
class GpuPlan:
    index: int
    mig_enabled: bool
    counts: dict[str, int]
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True)
class NodeProposal:
    node: NodeInventory
    model: GpuModel | None
    current: tuple[GpuPlan, ...]
    proposed: tuple[GpuPlan, ...]
    changed: bool
    method: str
    status: str
    lower_bound: int
    used_now: int
    used_after: int
    slices_now: int
    slices_after: int
    busy_slices: float
    moved_in: tuple[Item, ...] = ()
    reason: str = ""
    whole_busy: float = 0.0
    """p95 activity × compute units of whole GPUs held by pods (1 unit per GPU without MIG)."""
    whole_units: int = 0

    @property
    def gpus_freed(self) -> int:
        return max(0, self.used_now - self.used_after) if self.changed else 0

    @property
    def slices_freed(self) -> int:
        return max(0, self.slices_now - self.slices_after) if self.changed else 0

    def utilisation(self, *, after: bool) -> float:
        """Busy share of what pods hold: p95 activity × size over allocated compute, 0-1."""
        slices = (self.slices_after if after and self.changed else self.slices_now) + self.whole_units
        busy = self.busy_slices + self.whole_busy
        return min(1.0, busy / slices) if slices else 0.0


@dataclass(frozen=True)
class TimeSlicing:
    node: str
    model: str
    gpus: tuple[int, ...]
    replicas: int
    reason: str


@dataclass(frozen=True)
class FleetProposal:
    nodes: tuple[NodeProposal, ...]
    time_slicing: tuple[TimeSlicing, ...]
    seconds: float
    notes: tuple[str, ...] = ()

    @property
    def lower_bound(self) -> int:
        return sum(n.lower_bound for n in self.nodes)

    @property
    def method(self) -> str:
        methods = {n.method for n in self.nodes if n.method not in ("none", "")}
        return "+".join(sorted(methods)) or "none"

    @property
    def status(self) -> str:
        """Worst solver status among the nodes that change (nodes left alone do not count)."""
        statuses = {n.status for n in self.nodes if n.changed}
        for s in ("time-limit", "heuristic"):
            if s in statuses:
                return s
        return "optimal"


# ---------------------------------------------------------------------------------------------- items


def items_for_node(
    node: NodeInventory,
    analysis: Analysis,
    *,
    settings: OptimiserSettings,
    workloads: Mapping[PodKey, Workload],
) -> list[Item]:
    out = []
    window = max(analysis.window_hours, 1e-9)
    for gpu in node.gpus:
        model = gpu.model
        if model is None or not model.mig_capable or not gpu.mig_enabled:
            continue
        for inst in gpu.instances:
            dev = analysis.device(node.name, gpu.index, inst.gpu_instance_id)
            if dev is None or not dev.pods:
                continue
            prof = canonical_profile(model, inst.profile)
            if prof is None:
                continue
            known = not dev.unknown and dev.coverage_hours / window >= settings.min_coverage
            busy = dev.p95 * prof.compute_slices if known and dev.p95 is not None else None
            klass = prof.name
            if known and not settings.keep_profiles and not prof.media_extensions:
                w = workloads.get(dev.pods[0])
                compute = w.demand_slices if w else (dev.p95 or 0) * prof.compute_slices
                memory = w.demand_memory_mib if w else (dev.fb_peak_mib or 0.0)
                klass = packing.class_for(model, compute=compute, memory_mib=memory).name
            elif prof.media_extensions:
                # +me instances are not packed: keep them where they are by pinning their class.
                klass = prof.name
            out.append(Item(node.name, gpu.index, prof.name, inst.gpu_instance_id, dev.pods, klass, busy))
    return out


def _current(gpu: GpuInventory, items: Sequence[Item]) -> GpuPlan:
    counts: Counter[str] = Counter()
    model = gpu.model
    for inst in gpu.instances:
        prof = canonical_profile(model, inst.profile) if model else None
        counts[prof.name if prof else inst.profile] += 1
    return GpuPlan(gpu.index, gpu.mig_enabled, dict(counts), [i for i in items if i.gpu == gpu.index])


def _slices(model: GpuModel, items: Sequence[Item], *, proposed: bool) -> int:
    total = 0
    for it in items:
        prof = model.profile(it.klass if proposed else it.profile_now)
        total += prof.compute_slices if prof else 0
    return total


def _is_pinned(gpu: GpuInventory, analysis: Analysis, node: str) -> bool:
    """A whole GPU held by a pod, a GPU of an unknown model, or one carrying +me instances."""
    if gpu.model is None or not gpu.model.mig_capable:
        return True
    if not gpu.mig_enabled:
        dev = analysis.device(node, gpu.index, "")
        return bool(dev and dev.pods)
    return any(i.profile.endswith("+me") for i in gpu.instances)


# ---------------------------------------------------------------------------------------------- per node


def propose_node(
    node: NodeInventory,
    analysis: Analysis,
    *,
    settings: OptimiserSettings,
    workloads: Mapping[PodKey, Workload],
    time_limit: float,
) -> NodeProposal:
    items = items_for_node(node, analysis, settings=settings, workloads=workloads)
    current = tuple(_current(g, items) for g in node.gpus)
    model = next((g.model for g in node.gpus if g.model is not None), None)
    used_now = sum(1 for g in node.gpus if _gpu_used(g, analysis, node.name))
    busy = sum(i.busy_slices for i in items if i.busy_slices is not None)
    whole_busy, whole_units = _whole_gpu_use(node, analysis)
    unchanged = NodeProposal(
        node,
        model,
        current,
        current,
        False,
        "none",
        "optimal",
        used_now,
        used_now,
        used_now,
        0,
        0,
        busy,
        whole_busy=whole_busy,
        whole_units=whole_units,
    )
    if model is None or not model.mig_capable or len({g.model_key for g in node.gpus}) != 1:
        return _with(unchanged, reason="no MIG-capable model, or mixed models on the node")
    pinned = [g for g in node.gpus if _is_pinned(g, analysis, node.name)]
    pool = [g for g in node.gpus if g not in pinned]
    pool_items = [i for i in items if i.gpu in {g.index for g in pool}]
    slices_now = _slices(model, pool_items, proposed=False)
    used_pool_now = sum(1 for g in pool if any(i.gpu == g.index for i in pool_items))
    base = _with(unchanged, slices_now=slices_now, slices_after=slices_now)
    single = node.mig_strategy == "single"
    if single and pinned:
        return _with(base, reason="single strategy with whole GPUs in use: left alone")
    if not pool:
        return _with(base, reason="no GPU free to re-partition")
    demand = Counter(i.klass for i in pool_items)
    res = packing.pack(model, demand, gpus=len(pool), time_limit=time_limit, uniform=single)
    if not res.feasible:
        # Upsized demand does not fit: consolidate with the profiles pods have now instead.
        pool_items = [replace(i, klass=i.profile_now) for i in pool_items]
        demand = Counter(i.klass for i in pool_items)
        res = packing.pack(model, demand, gpus=len(pool), time_limit=time_limit, uniform=single)
    if not res.feasible:
        return _with(base, reason="demand does not fit the node's GPUs", method=res.method, status=res.status)
    lower = res.lower_bound + len(pinned)
    slices_after = res.allocated_slices(model)
    try:
        proposed = _assign(model, pool, pool_items, res, single=single)
    except AssertionError:
        # A time-limited answer that does not assign cleanly: use the greedy packing instead.
        res = packing.pack_greedy(model, demand, gpus=len(pool)) if not single else res
        if not res.feasible:
            return _with(base, reason="no clean assignment within the time limit", status="time-limit")
        proposed = _assign(model, pool, pool_items, res, single=single)
    proposed_all = tuple(
        sorted(
            [*proposed, *(c for c in current if c.index in {g.index for g in pinned})], key=lambda g: g.index
        )
    )
    _assert_placeable(model, proposed_all, node.name)
    used_after = res.gpus + (used_now - used_pool_now)
    gain = used_after < used_now or slices_after < slices_now
    layout_changed = any(_signature(a) != _signature(b) for a, b in zip(current, proposed_all, strict=True))
    reason = "" if gain else "already as tight as the demand allows"
    if gain and not layout_changed and used_after < used_now:
        # The layout is already right; only moving pods between its GPUs would free some. A MIG
        # plan does not reschedule pods, so the node counts at its current use (bound included).
        lower = used_now
        reason = (
            f"pods would fit on {used_now - used_after} fewer GPU(s) with the current layout; "
            "drain and reschedule them to free those GPUs (no MIG change needed)"
        )
    return NodeProposal(
        node,
        model,
        current,
        proposed_all if gain and layout_changed else current,
        gain and layout_changed,
        res.method,
        res.status,
        # When the node stays as it is, its current count is achievable: the bound cannot exceed it.
        lower if gain and layout_changed else min(lower, used_now),
        used_now,
        used_after if gain and layout_changed else used_now,
        slices_now,
        slices_after if gain and layout_changed else slices_now,
        busy,
        reason=reason,
        whole_busy=whole_busy,
        whole_units=whole_units,
    )


def _whole_gpu_use(node: NodeInventory, analysis: Analysis) -> tuple[float, int]:
    busy, units = 0.0, 0
    for g in node.gpus:
        if g.mig_enabled:
            continue
        dev = analysis.device(node.name, g.index, "")
        if dev is None or not dev.pods or dev.unknown or dev.p95 is None:
            continue
        size = g.model.compute_slices if g.model is not None and g.model.mig_capable else 1
        busy += dev.p95 * size
        units += size
    return busy, units


def _with(p: NodeProposal, **changes: object) -> NodeProposal:
    return replace(p, **changes)  # type: ignore[arg-type]


def _gpu_used(gpu: GpuInventory, analysis: Analysis, node: str) -> bool:
    if not gpu.mig_enabled:
        dev = analysis.device(node, gpu.index, "")
        return bool(dev and dev.pods)
    return any((d := analysis.device(node, gpu.index, i.gpu_instance_id)) and d.pods for i in gpu.instances)


def _signature(g: GpuPlan) -> tuple[bool, tuple[tuple[str, int], ...]]:
    return (g.mig_enabled, tuple(sorted((k, v) for k, v in g.counts.items() if v)) if g.mig_enabled else ())


def _assign(
    model: GpuModel,
    pool: Sequence[GpuInventory],
    items: Sequence[Item],
    res: packing.PackResult,
    *,
    single: bool,
) -> list[GpuPlan]:
    """Put the packed layouts on physical GPUs (keeping GPUs whose layout is unchanged) and items on slots."""
    layouts: list[Layout] = list(res.layouts)
    gpus = list(pool)
    plans: dict[int, GpuPlan] = {}
    # 1. GPUs that already carry one of the layouts keep it (prefer the busiest of them).
    busy_order = sorted(gpus, key=lambda g: -sum(1 for i in items if i.gpu == g.index))
    for g in busy_order:
        sig = (
            tuple(sorted(Counter(_canon(model, i.profile) for i in g.instances).items()))
            if g.mig_enabled
            else None
        )
        if sig is not None and sig in layouts:
            layouts.remove(sig)
            plans[g.index] = GpuPlan(g.index, True, dict(sig))
    # 2. The rest go to the busiest remaining GPUs, so fewer pods move.
    for g in busy_order:
        if g.index in plans:
            continue
        if layouts:
            plans[g.index] = GpuPlan(g.index, True, dict(layouts.pop(0)))
        elif single:
            # Under the single strategy every GPU carries the node's one uniform layout.
            uniform = res.layouts[0] if res.layouts else ()
            plans[g.index] = GpuPlan(g.index, bool(uniform), dict(uniform))
        else:
            plans[g.index] = GpuPlan(g.index, False, {})
    # 3. Items onto slots: an item stays on its GPU when that GPU has a slot of its class.
    free = {idx: Counter(p.counts) for idx, p in plans.items()}
    want: Counter[tuple[str, str]] = Counter(res.serve)
    pending = sorted(items, key=lambda i: -(packing.size(model, i.klass)))
    for it in list(pending):
        q = _serving_profile(want, it.klass, prefer=free.get(it.gpu))
        if q and free.get(it.gpu, Counter())[q] > 0:
            free[it.gpu][q] -= 1
            want[(it.klass, q)] -= 1
            plans[it.gpu].items.append(_served(it, q))
            pending.remove(it)
    for it in pending:
        q = _serving_profile(want, it.klass, prefer=None)
        idx = next((i for i, c in free.items() if q and c[q] > 0), None)
        if q is None or idx is None:
            raise AssertionError(f"packing left {it.klass} on {it.node} without a slot")
        free[idx][q] -= 1
        want[(it.klass, q)] -= 1
        plans[idx].items.append(_served(it, q))
    return [plans[g.index] for g in gpus]


def _canon(model: GpuModel, name: str) -> str:
    prof = canonical_profile(model, name)
    return prof.name if prof else name


def _serving_profile(
    want: Counter[tuple[str, str]], klass: str, *, prefer: Counter[str] | None
) -> str | None:
    options = [q for (k, q), n in want.items() if k == klass and n > 0]
    if prefer is not None:
        local = [q for q in options if prefer[q] > 0]
        if local:
            return local[0]
    return options[0] if options else None


def _served(it: Item, profile: str) -> Item:
    return Item(it.node, it.gpu, it.profile_now, it.gpu_instance_id, it.pods, profile, it.busy_slices)


def _assert_placeable(model: GpuModel, gpus: Sequence[GpuPlan], node: str) -> None:
    for g in gpus:
        if g.mig_enabled and g.counts:
            result = place(model, g.counts)
            assert result.ok, f"{node} GPU {g.index}: proposed layout has no placement: {result.reason}"


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
        if dev is None or not dev.pods or dev.unknown or dev.p95 is None:
            continue
        if dev.coverage_hours / window >= settings.min_coverage and dev.p95 < settings.time_slicing_below:
            low.append((gpu.index, dev))
    if not low:
        return None
    worst = max(d.p95 or 0.0 for _, d in low)
    replicas = max(2, min(8, math.floor(0.8 / max(worst, 0.1))))
    model = node.model_key
    kind = "no MIG" if node.gpus[0].model is None or not node.gpus[0].model.mig_capable else "MIG off"
    return TimeSlicing(
        node.name,
        model,
        tuple(i for i, _ in low),
        replicas,
        f"whole GPU(s) ({kind}) with p95 activity ≤ {worst:.0%} over {window:.0f} h: "
        f"{replicas} replicas keep the busiest below 80 %",
    )


def optimise(analysis: Analysis, *, settings: OptimiserSettings) -> FleetProposal:
    started = time.perf_counter()
    deadline = started + settings.time_limit_s
    workloads = {p: w for w in analysis.workloads for p in w.pods}
    proposals = []
    notes: list[str] = []
    for node in analysis.nodes:
        remaining = max(0.05, deadline - time.perf_counter())
        proposals.append(
            propose_node(
                node, analysis, settings=settings, workloads=workloads, time_limit=min(remaining, 10.0)
            )
        )
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
    if settings.allow_moves:
        proposals, moved_note = _pool_moves(proposals, analysis, settings=settings, deadline=deadline)
        if moved_note:
            notes.append(moved_note)
    ts = [t for n in analysis.nodes if (t := time_slicing_for(n, analysis, settings=settings)) is not None]
    return FleetProposal(tuple(proposals), tuple(ts), time.perf_counter() - started, tuple(notes))


def _unchanged(p: NodeProposal) -> NodeProposal:
    return _with(
        p,
        proposed=p.current,
        changed=False,
        used_after=p.used_now,
        slices_after=p.slices_now,
        reason="deferred by --max-nodes",
    )


def _pool_moves(
    proposals: list[NodeProposal], analysis: Analysis, *, settings: OptimiserSettings, deadline: float
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
        assert model is not None
        pools = {
            p.node.name: [g for g in p.node.gpus if not _is_pinned(g, analysis, p.node.name)] for p in group
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
        pinned_used = {p.node.name: p.used_after - sum(1 for g in p.proposed if g.items) for p in group}
        if not res.feasible or res.gpus + sum(pinned_used.values()) >= separate:
            continue
        try:
            updated = _distribute(group, model, pools, items, res, pinned_used)
        except AssertionError:
            continue
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
        plans[p.node.name] = _assign(model, pools[p.node.name], [], empty, single=False)
    assert not layouts, "more pooled layouts than GPUs"
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
        assert spot is not None, f"pooled packing left {it.klass} without a slot"
        key, q = spot
        free[key][q] -= 1
        if free[key][q] == 0:
            anywhere[q].discard(key)
            on_node[(q, key[0])].discard(key[1])
        want[(it.klass, q)] -= 1
        by_slot[key].items.append(_served(it, q))
    updated: dict[str, NodeProposal] = {}
    # The pooled LP bound belongs to the group; it is booked on the first node so that the
    # fleet's bound (a sum over nodes) stays a bound.
    group_bound = res.lower_bound + sum(pinned_used.values())
    for n, p in enumerate(order):
        pool_idx = {g.index for g in pools[p.node.name]}
        mine_plans = plans[p.node.name]
        proposed = tuple(
            sorted([*mine_plans, *(c for c in p.current if c.index not in pool_idx)], key=lambda g: g.index)
        )
        _assert_placeable(model, proposed, p.node.name)
        node_items = [i for g in mine_plans for i in g.items]
        updated[p.node.name] = _with(
            p,
            proposed=proposed,
            changed=True,
            moved_in=tuple(i for i in node_items if i.node != p.node.name),
            used_after=sum(1 for g in mine_plans if g.items) + pinned_used[p.node.name],
            slices_after=sum(packing.size(model, i.klass) for i in node_items),
            method=res.method,
            status=res.status,
            lower_bound=group_bound if n == 0 else 0,
        )
    return updated
