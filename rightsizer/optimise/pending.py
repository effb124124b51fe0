"""Pending demand: Pending pods that request ``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` are
served with what the plan frees, and each change says which of them it admits.

A pod requesting ``n`` devices needs ``n`` of them on one node. In order, for each pod:

1. a device of its kind that is free *now* (a MIG slot no pod holds, a whole GPU with MIG off that no
   pod holds): nothing to change; the plan notes that something else keeps the pod pending
   (affinity, taints, quota);
2. slots of its profile that a changing node's new layouts add (free after the plan, not before), or
   GPUs a change hands back whole (for ``nvidia.com/gpu``): admitted by that change;
3. GPUs a change hands back whole, re-partitioned for the MIG pods still waiting on that node's model
   (best-fit packing, each pod served by exactly the profile it requests): admitted.

GPUs freed stay counted as freed (from the pods the node has now); what pending pods take of them is
in the admissions.

Only mixed-strategy nodes serve MIG requests (under the single strategy every slot is
``nvidia.com/gpu``). Pods no capacity serves are named in the notes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from rightsizer.analysis.types import Analysis, PendingPod
from rightsizer.optimise import packing
from rightsizer.optimise.proposal import Admission, GpuPlan, NodeProposal


@dataclass
class _Room:
    """What one node offers pending pods now and after its change."""

    p: NodeProposal
    free_now: Counter[str] = field(default_factory=Counter)
    """Profile → slots no pod holds now ('' = whole GPUs with MIG off that no pod holds)."""
    new: dict[str, list[int]] = field(default_factory=dict)
    """Profile → GPU indices, one per slot (or whole GPU) the change adds."""
    freed: list[int] = field(default_factory=list)
    """GPUs the change hands back whole (MIG off, no pod), not yet given to a pending pod."""
    admits: list[Admission] = field(default_factory=list)
    layouts: dict[int, GpuPlan] = field(default_factory=dict)
    """GPUs re-partitioned for pending pods."""


def _room(p: NodeProposal, analysis: Analysis) -> _Room:
    held = {
        g.index
        for g in p.node.gpus
        if not g.mig_enabled and (d := analysis.device(p.node.name, g.index, "")) is not None and d.pods
    }
    room = _Room(p)

    def free(plans: Sequence[GpuPlan], *, after: bool) -> Counter[tuple[int, str]]:
        out: Counter[tuple[int, str]] = Counter()
        for g in plans:
            if not g.mig_enabled:
                if g.index not in held:
                    out[(g.index, "")] += 1
                continue
            out.update({(g.index, q): n for q, n in g.counts.items()})
            for it in g.items:
                out[(g.index, it.klass if after else it.profile_now)] -= 1
        return out

    now = free(p.current, after=False)
    for (_gpu, q), n in now.items():
        if n > 0 and (q == "" or p.node.mig_strategy != "single"):
            room.free_now[q] += n
    if p.changed:
        later = free(p.proposed, after=True)
        for (gpu, q), n in sorted(later.items()):
            extra = n - max(0, now.get((gpu, q), 0))
            if q == "":
                if extra > 0:
                    room.freed.append(gpu)
            elif extra > 0 and p.node.mig_strategy != "single":
                room.new.setdefault(q, []).extend([gpu] * extra)
    return room


def serve(proposals: Sequence[NodeProposal], analysis: Analysis) -> tuple[list[NodeProposal], list[str]]:
    """The proposals with the pending pods they admit (GPUs re-partitioned for them), and notes."""
    rooms = [_room(p, analysis) for p in proposals]
    notes: list[str] = []
    waiting: list[PendingPod] = []
    for pod in analysis.pending:
        free_here = next(
            (r for r in rooms if _fits_model(r, pod) and r.free_now[pod.profile] >= pod.count), None
        )
        if free_here is not None:
            notes.append(
                f"pending pod {pod} ({pod.count}× {pod.resource}): {free_here.p.node.name} has that free already; "
                "something other than capacity keeps it pending (node selector, affinity, taints, quota)"
            )
            continue
        if not _admit_on_new_room(rooms, pod):
            waiting.append(pod)
    # Whole GPUs first: a freed GPU can hold them only whole, MIG pods also by re-partitioning it.
    remaining = sorted(waiting, key=lambda w: bool(w.profile))
    left = []
    while remaining:
        pod = remaining.pop(0)
        if pod.profile:
            ok = _admit_on_new_room(rooms, pod) or _admit_on_freed_gpus(rooms, pod, remaining)
        else:
            ok = _admit_whole(rooms, pod)
        if not ok:
            left.append(pod)
    for pod in left:
        notes.append(
            f"pending pod {pod} ({pod.count}× {pod.resource}): no capacity this plan frees can hold it"
        )
    out = []
    for r in rooms:
        p = r.p
        if r.layouts:
            proposed = tuple(r.layouts.get(g.index, g) for g in p.proposed)
            p = replace(p, proposed=proposed)
        out.append(replace(p, admits=tuple(r.admits)) if r.admits else p)
    return out, notes


def _fits_model(r: _Room, pod: PendingPod) -> bool:
    if not pod.profile:
        return True
    model = r.p.model
    return model is not None and model.profile(pod.profile) is not None and r.p.node.mig_strategy != "single"


def _admit_on_new_room(rooms: Sequence[_Room], pod: PendingPod) -> bool:
    for r in rooms:
        slots = r.new.get(pod.profile, []) if pod.profile else []
        if pod.profile and _fits_model(r, pod) and len(slots) >= pod.count:
            r.admits.append(Admission(pod=pod, gpus=tuple(sorted(set(slots[: pod.count])))))
            del slots[: pod.count]
            return True
    return False


def _admit_whole(rooms: Sequence[_Room], pod: PendingPod) -> bool:
    for r in rooms:
        if len(r.freed) >= pod.count:
            r.admits.append(Admission(pod=pod, gpus=tuple(r.freed[: pod.count])))
            del r.freed[: pod.count]
            return True
    return False


def _admit_on_freed_gpus(rooms: Sequence[_Room], pod: PendingPod, waiting: Sequence[PendingPod]) -> bool:
    """Re-partition a node's freed GPUs for ``pod`` and the MIG pods ``waiting`` after it on the same
    model (as many as fit, in order); ``pod`` is admitted, the others take the new slots in turn."""
    for r in rooms:
        if not r.freed or not _fits_model(r, pod) or r.p.model is None:
            continue
        model = r.p.model
        # This pod plus the other waiting pods of the model that still fit the freed GPUs.
        group = [pod, *(w for w in waiting if w.profile and model.profile(w.profile) is not None)]
        while group:
            demand = Counter({w.profile: 0 for w in group})
            for w in group:
                demand[w.profile] += w.count
            res = packing.pack_greedy(model, demand, gpus=len(r.freed))
            if res.feasible:
                break
            group.pop()
        if not group or group[0] is not pod:
            continue
        gpus = r.freed[: res.gpus]
        del r.freed[: res.gpus]
        slots: list[tuple[int, str]] = []
        for gpu, layout in zip(gpus, res.layouts, strict=True):
            r.layouts[gpu] = GpuPlan(gpu, True, dict(layout))
            slots += [(gpu, q) for q, n in layout for _ in range(n)]
        for name, gpu in ((q, g) for g, q in slots):
            r.new.setdefault(name, []).append(gpu)
        return _admit_on_new_room([r], pod)
    return False
