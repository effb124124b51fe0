"""One node: its devices' demand classes, the packed layouts, and which GPU and slot each gets.

See :mod:`rightsizer.optimise.fleet` for the rules. Mixed-strategy nodes are solved exactly by
:mod:`rightsizer.optimise.repartition` (best-fit packing when HiGHS has no answer in time); every
proposed layout passes :func:`mig_geometry.placement.place` (:func:`rightsizer.optimise.slots.check_placeable`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from mig_geometry.catalogue import GpuModel, Profile
from mig_geometry.names import canonical_profile
from rightsizer.analysis import lookback
from rightsizer.analysis.types import Analysis, DeviceStats, GpuInventory, NodeInventory, PodKey, Workload
from rightsizer.optimise import packing, repartition
from rightsizer.optimise import single as single_strategy
from rightsizer.optimise.proposal import (
    GpuPlan,
    Item,
    NodeInconsistency,
    NodeProposal,
    OptimiserSettings,
    with_changes,
)
from rightsizer.optimise.slots import (
    AssignmentError,
    assign,
    canon,
    check_placeable,
    compute_slices,
    signature,
)

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
            klass, growth, need = prof.name, "", ""
            if known and not settings.keep_profiles and not prof.media_extensions:
                klass, growth, need = _sized(model, prof, dev, workloads.get(dev.pods[0]), settings)
            elif prof.media_extensions:
                # +me instances are not packed: keep them where they are by pinning their class.
                klass = prof.name
            last_busy, weekly = None, False
            shrunk = model.profile(klass)
            if dev.past_need and shrunk is not None and shrunk.compute_slices < prof.compute_slices:
                hours = lookback.busy_beyond(dev.past_need, above=shrunk.compute_slices)
                if hours:
                    last_busy, weekly = max(hours), lookback.recurs_weekly(hours)
                    if weekly and not settings.ignore_history:
                        klass = prof.name  # busy again every week: keep the slice
            out.append(
                Item(
                    node.name,
                    gpu.index,
                    prof.name,
                    inst.gpu_instance_id,
                    dev.pods,
                    klass,
                    busy,
                    last_busy=last_busy,
                    weekly=weekly,
                    growth=growth if klass != prof.name or growth == "kept" else "",
                    peak_need=need,
                )
            )
    return out


def _sized(
    model: GpuModel, prof: Profile, dev: DeviceStats, w: Workload | None, settings: OptimiserSettings
) -> tuple[str, str, str]:
    """(class, growth, the peak in words) of a device now served by ``prof``: the smallest profile
    covering its demand (peak with headroom). A class larger than ``prof`` in compute or memory
    stands only when the peak itself does not fit ``prof``, or when the namespace asked for
    growth for headroom (``growth`` says which); else the device keeps ``prof`` (``kept``)."""
    compute = w.demand_slices if w else (dev.peak or 0) * prof.compute_slices
    memory = w.demand_memory_mib if w else (dev.fb_peak_mib or 0.0)
    klass = packing.class_for(model, compute=compute, memory_mib=memory)
    if packing.dominates(prof, klass):
        return klass.name, "", ""
    peak_c = w.peak_slices if w and w.peak_slices is not None else (dev.peak or 0) * prof.compute_slices
    peak_m = w.peak_memory_mib if w and w.peak_memory_mib is not None else (dev.fb_peak_mib or 0.0)
    need = (
        f"peak {peak_c / prof.compute_slices:.0%} of its {prof.compute_slices} compute slice(s) and "
        f"{peak_m / 1024:.1f} GiB of {prof.memory_mib / 1024:.0f} GiB"
    )
    if peak_c > prof.compute_slices + 1e-9 or peak_m > prof.memory_mib:
        return klass.name, "peak", need
    if settings.grows_for_headroom(dev.pods[0].namespace if dev.pods else ""):
        return klass.name, "headroom", need
    return prof.name, "kept", f"{need}; with the headroom it would need {klass.name}"


def _current(gpu: GpuInventory, items: Sequence[Item]) -> GpuPlan:
    counts: Counter[str] = Counter()
    model = gpu.model
    for inst in gpu.instances:
        prof = canonical_profile(model, inst.profile) if model else None
        counts[prof.name if prof else inst.profile] += 1
    return GpuPlan(gpu.index, gpu.mig_enabled, dict(counts), [i for i in items if i.gpu == gpu.index])


def is_pinned(gpu: GpuInventory, analysis: Analysis, node: str) -> bool:
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
    """The node's best change (or the node as it is, with the reason); :class:`NodeInconsistency`
    when a check on the answer fails (the caller leaves the node alone)."""
    model = next((g.model for g in node.gpus if g.model is not None), None)
    pinned = [g for g in node.gpus if is_pinned(g, analysis, node.name)]
    pinned_idx = {g.index for g in pinned}
    # Devices on pinned GPUs keep their profile: their GPU's layout is not touched.
    items = [
        i if i.gpu not in pinned_idx else replace(i, klass=i.profile_now)
        for i in items_for_node(node, analysis, settings=settings, workloads=workloads)
    ]
    current = tuple(_current(g, items) for g in node.gpus)
    used_now = sum(1 for g in node.gpus if _gpu_used(g, analysis, node.name))
    whole_busy, whole_units = _whole_gpu_use(node, analysis)
    base = NodeProposal(
        node=node,
        model=model,
        current=current,
        proposed=current,
        changed=False,
        method="none",
        status="optimal",
        lower_bound=used_now,
        used_now=used_now,
        used_after=used_now,
        slices_now=0,
        slices_after=0,
        busy_slices=sum(i.busy_slices for i in items if i.busy_slices is not None),
        whole_busy=whole_busy,
        whole_units=whole_units,
    )
    if model is None or not model.mig_capable or len({g.model_key for g in node.gpus}) != 1:
        return with_changes(base, reason="no MIG-capable model, or mixed models on the node")
    pool = [g for g in node.gpus if g.index not in pinned_idx]
    pool_items = [i for i in items if i.gpu not in pinned_idx]
    slices_now = compute_slices(model, pool_items, proposed=False)
    pinned_used = sum(1 for g in pinned if _gpu_used(g, analysis, node.name))
    base = with_changes(base, slices_now=slices_now, slices_after=slices_now)
    single = node.mig_strategy == "single"
    if single and pinned:
        return with_changes(base, reason="single strategy with whole GPUs in use: left alone")
    if not pool:
        return with_changes(base, reason="no GPU free to re-partition")
    demand = Counter(i.klass for i in pool_items)
    exact = settings.keep_profiles and not single  # --keep-profiles: no pod changes its resource name
    res = packing.pack(model, demand, gpus=len(pool), time_limit=time_limit, uniform=single, exact=exact)
    if not res.feasible:
        # Upsized demand does not fit: consolidate with the profiles pods have now instead.
        pool_items = [replace(i, klass=i.profile_now) for i in pool_items]
        demand = Counter(i.klass for i in pool_items)
        res = packing.pack(model, demand, gpus=len(pool), time_limit=time_limit, uniform=single, exact=exact)
    if not res.feasible:
        return with_changes(
            base, reason="demand does not fit the node's GPUs", method=res.method, status=res.status
        )
    # Pinned GPUs count towards the bound only when pods hold them (an idle +me GPU is freeable
    # by nobody, but it is not in use either).
    lower = res.lower_bound + pinned_used
    if single:
        answer = single_strategy.uniform(base, model=model, pool=pool, items=pool_items, res=res, lower=lower)
        if settings.allow_strategy_change:
            return with_changes(
                answer,
                strategy_change=single_strategy.as_mixed(
                    base, model=model, pool=pool, items=pool_items, answer=answer, time_limit=time_limit
                ),
            )
        return answer
    least_slices = compute_slices(model, pool_items, proposed=True)
    if (
        least_slices >= slices_now
        and sum(1 for g in pool if _gpu_used(g, analysis, node.name)) <= res.lower_bound
    ):
        # Nothing to win: every device already has its class and the pool is at its bound.
        return with_changes(
            base,
            method=res.method,
            status=res.status,
            lower_bound=min(lower, used_now),
            reason="already as tight as the demand allows",
        )
    shape = repartition.NodeShape(
        model=model,
        pool=pool,
        items=pool_items,
        pinned_gpus=len(pinned),
        pinned_pods=frozenset(p for g in current if g.index in pinned_idx for i in g.items for p in i.pods)
        | _whole_gpu_pods(node, analysis, pinned),
        exact_profiles=exact,
    )
    return _mixed(
        base,
        shape=shape,
        packed=res,
        pinned_idx=pinned_idx,
        pinned_used=pinned_used,
        lower=lower,
        time_limit=time_limit,
    )


def _mixed(
    base: NodeProposal,
    *,
    shape: repartition.NodeShape,
    packed: packing.PackResult,
    pinned_idx: set[int],
    pinned_used: int,
    lower: int,
    time_limit: float,
) -> NodeProposal:
    """Mixed strategy. When the packing frees a GPU, that GPU goes MIG off, so mig-parted resets every
    GPU of the node and every pod of it is disrupted whatever the layouts: the packing's answer (fewest
    GPUs, then fewest allocated slices) is then lexicographically optimal as it is. Otherwise the
    exact repartition decides who moves (best-fit packing when HiGHS has no answer in time)."""
    model, pool, pool_items = shape.model, shape.pool, shape.items
    node = base.node
    if packed.gpus < len({i.gpu for i in pool_items}):
        try:
            plans = assign(model, pool, pool_items, packed, single=False)
        except AssignmentError as exc:
            raise NodeInconsistency(f"{node.name}: {exc}") from None
        return _decided(
            base,
            plans,
            model=model,
            pinned_idx=pinned_idx,
            pinned_used=pinned_used,
            lower=lower,
            method=packed.method,
            status=packed.status,
        )
    best = _exact(shape, packed, time_limit=time_limit)
    if best is not None:
        plans, method, status = list(best.plans), "milp", best.status
    else:
        greedy = packing.pack_greedy(model, Counter(i.klass for i in pool_items), gpus=len(pool))
        if not greedy.feasible:
            return with_changes(base, reason="no answer within the time limit", status="time-limit")
        try:
            plans = assign(model, pool, pool_items, greedy, single=False)
        except AssignmentError as exc:
            raise NodeInconsistency(f"{node.name}: {exc}") from None
        method, status = "greedy", "heuristic"
    return _decided(
        base,
        plans,
        model=model,
        pinned_idx=pinned_idx,
        pinned_used=pinned_used,
        lower=lower,
        method=method,
        status=status,
    )


def _exact(
    shape: repartition.NodeShape, packed: packing.PackResult, *, time_limit: float
) -> repartition.Repartition | None:
    """The exact repartition, cut by the packing's GPUs and slices; None once the fleet's time budget
    is spent or when HiGHS finds no answer in the time left."""
    if time_limit <= 0:
        return None
    cut = replace(shape, most_gpus=packed.gpus, most_slices=packed.allocated_slices(shape.model))
    try:
        return repartition.solve(cut, time_limit=time_limit)
    except repartition.NoRepartition:
        return None


def _decided(
    base: NodeProposal,
    plans: Sequence[GpuPlan],
    *,
    model: GpuModel,
    pinned_idx: set[int],
    pinned_used: int,
    lower: int,
    method: str,
    status: str,
) -> NodeProposal:
    """The node with ``plans`` on its pool GPUs, if that wins GPUs or slices; else as it is."""
    node, current, used_now, slices_now = base.node, base.current, base.used_now, base.slices_now
    proposed = _with_pinned(plans, current, pinned_idx)
    check_placeable(model, proposed, node.name)
    used_after = sum(1 for g in plans if g.items) + pinned_used
    slices_after = compute_slices(model, [i for g in plans for i in g.items], proposed=True)
    changed = (used_after < used_now or slices_after < slices_now) and any(
        signature(a) != signature(b) or _moves(b) for a, b in zip(current, proposed, strict=True)
    )
    if not changed:
        return with_changes(
            base,
            method=method,
            status=status,
            lower_bound=min(lower, used_now),
            reason="already as tight as the demand allows",
        )
    return with_changes(
        base,
        proposed=proposed,
        changed=True,
        method=method,
        status=status,
        lower_bound=lower,
        used_after=used_after,
        slices_after=slices_after,
    )


def _with_pinned(
    plans: Sequence[GpuPlan], current: Sequence[GpuPlan], pinned_idx: set[int]
) -> tuple[GpuPlan, ...]:
    return tuple(sorted([*plans, *(c for c in current if c.index in pinned_idx)], key=lambda g: g.index))


def _moves(g: GpuPlan) -> bool:
    return any(i.gpu != g.index or i.klass != i.profile_now for i in g.items)


def _whole_gpu_pods(
    node: NodeInventory, analysis: Analysis, pinned: Sequence[GpuInventory]
) -> frozenset[PodKey]:
    out: set[PodKey] = set()
    for g in pinned:
        if not g.mig_enabled and (dev := analysis.device(node.name, g.index, "")) is not None:
            out.update(dev.pods)
    return frozenset(out)


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


def left_alone(node: NodeInventory, analysis: Analysis, *, reason: str) -> NodeProposal:
    """``node`` as it is (no items re-placed), with ``reason`` as its note."""
    used = sum(1 for g in node.gpus if _gpu_used(g, analysis, node.name))
    current = tuple(
        GpuPlan(
            g.index,
            g.mig_enabled,
            dict(Counter(canon(g.model, i.profile) if g.model else i.profile for i in g.instances)),
        )
        for g in node.gpus
    )
    return NodeProposal(
        node=node,
        model=next((g.model for g in node.gpus if g.model is not None), None),
        current=current,
        proposed=current,
        changed=False,
        method="none",
        status="optimal",
        lower_bound=used,
        used_now=used,
        used_after=used,
        slices_now=0,
        slices_after=0,
        busy_slices=0.0,
        reason=reason,
    )


def _gpu_used(gpu: GpuInventory, analysis: Analysis, node: str) -> bool:
    if not gpu.mig_enabled:
        dev = analysis.device(node, gpu.index, "")
        return bool(dev and dev.pods)
    return any((d := analysis.device(node, gpu.index, i.gpu_instance_id)) and d.pods for i in gpu.instances)
