"""Packed layouts onto a node's physical GPUs, and devices onto their slots; the checks every
proposed layout passes (:func:`check_placeable`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from mig_geometry.catalogue import GpuModel
from mig_geometry.layouts import Layout
from mig_geometry.names import canonical_profile
from mig_geometry.placement import place
from rightsizer.analysis.types import GpuInventory
from rightsizer.optimise import packing
from rightsizer.optimise.proposal import GpuPlan, Item, NodeInconsistency


def compute_slices(model: GpuModel, items: Sequence[Item], *, proposed: bool) -> int:
    """Compute slices of ``items``: of the profile each is served by (``proposed``), else of its own."""
    total = 0
    for it in items:
        prof = model.profile(it.klass if proposed else it.profile_now)
        total += prof.compute_slices if prof else 0
    return total


def signature(g: GpuPlan) -> tuple[bool, tuple[tuple[str, int], ...]]:
    """What mig-parted compares: MIG mode and the instance counts (an unchanged GPU is skipped)."""
    return (g.mig_enabled, tuple(sorted((k, v) for k, v in g.counts.items() if v)) if g.mig_enabled else ())


class AssignmentError(Exception):
    """Packed layouts that leave a device without a slot on the node's GPUs."""


def assign(
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
            tuple(sorted(Counter(canon(model, i.profile) for i in g.instances).items()))
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
        q = _serving_profile(want, it.klass, prefer=free.get(it.gpu), current=it.profile_now)
        if q and free.get(it.gpu, Counter())[q] > 0:
            free[it.gpu][q] -= 1
            want[(it.klass, q)] -= 1
            plans[it.gpu].items.append(served(it, q))
            pending.remove(it)
    for it in pending:
        q = _serving_profile(want, it.klass, prefer=None)
        idx = next((i for i, c in free.items() if q and c[q] > 0), None)
        if q is None or idx is None:
            raise AssignmentError(f"packing left {it.klass} on {it.node} without a slot")
        free[idx][q] -= 1
        want[(it.klass, q)] -= 1
        plans[idx].items.append(served(it, q))
    return [plans[g.index] for g in gpus]


def canon(model: GpuModel, name: str) -> str:
    prof = canonical_profile(model, name)
    return prof.name if prof else name


def _serving_profile(
    want: Counter[tuple[str, str]], klass: str, *, prefer: Counter[str] | None, current: str = ""
) -> str | None:
    options = [q for (k, q), n in want.items() if k == klass and n > 0]
    if prefer is not None:
        local = [q for q in options if prefer[q] > 0]
        if current in local:
            return current  # the pod keeps its device: no eviction when its GPU keeps its layout
        if local:
            return local[0]
    return options[0] if options else None


def served(it: Item, profile: str) -> Item:
    return replace(it, klass=profile)


def check_placeable(model: GpuModel, gpus: Sequence[GpuPlan], node: str) -> None:
    """:class:`NodeInconsistency` unless every proposed layout has a placement."""
    for g in gpus:
        if g.mig_enabled and g.counts:
            result = place(model, g.counts)
            if not result.ok:
                raise NodeInconsistency(
                    f"{node} GPU {g.index}: proposed layout has no placement: {result.reason}"
                )
