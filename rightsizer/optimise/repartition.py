"""One mixed-strategy node as one exact MILP over its physical GPUs: which layout each GPU carries and
which device each pod gets, under a lexicographic objective.

In order of priority the answer (1) frees the most GPUs, (2) frees the most allocated compute slices,
(3) disrupts the fewest pods, (4) re-creates the fewest GPUs. The disruption rules are those of
:mod:`rightsizer.plan.disruption` (what mig-parted does): a GPU whose layout changes loses its
instances; when any GPU switches MIG mode every GPU of the node is reset; a pod given another GPU or
profile is evicted. A GPU left without pods that held some before is handed back whole (MIG off).

Variables, per pool GPU ``g``: ``y[g,L]`` (binary) the layout ``L`` it carries, among the model's
maximal layouts, its current layout and MIG off (a non-maximal layout other than the current one
never beats the maximal layout containing it); ``e[g]`` it holds no device. Per *group* ``c`` of
interchangeable devices (same GPU, profile and class now; one pod each): ``z[c,g,q]`` (integer) how
many are served by profile ``q`` on ``g``; ``s[c]`` how many stay on their slot untouched. ``m`` a
MIG mode change; ``r[g]`` GPU ``g`` re-created; ``d[p]`` for pods whose devices cannot be grouped.
The four criteria are weighted so that each outweighs everything below it, so one solve gives the
lexicographic optimum (tie-breaks below them: serve a device with its own class, then prefer
layouts with more spare instances). Devices on pinned GPUs (whole GPUs held by pods, ``+me`` GPUs) stay; their
pods are disrupted only by a mode change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from mig_geometry.catalogue import GpuModel
from mig_geometry.layouts import Layout, as_layout, maximal_layouts
from rightsizer.analysis.types import GpuInventory, PodKey
from rightsizer.optimise.packing import dominates, plain_profiles
from rightsizer.optimise.proposal import GpuPlan, Item


@dataclass(frozen=True)
class NodeShape:
    """What the MILP needs of one node: its pool GPUs, their devices, and what is pinned."""

    model: GpuModel
    pool: Sequence[GpuInventory]
    items: Sequence[Item]
    """Devices on pool GPUs (their class decides which profiles may serve them)."""
    pinned_gpus: int
    """GPUs the optimiser leaves as they are (re-created only by a mode change)."""
    pinned_pods: frozenset[PodKey]
    """Pods holding devices on pinned GPUs (disrupted only by a mode change)."""
    most_gpus: int | None = None
    """Pool GPUs holding devices in a known answer (the packing's): a cut, the optimum uses no more."""
    most_slices: int | None = None
    """Allocated compute slices of that answer (the optimum, using as few GPUs, allocates no more)."""


@dataclass(frozen=True)
class Repartition:
    plans: tuple[GpuPlan, ...]
    """One per pool GPU, in pool order, with the devices it serves (``Item.klass`` = profile served)."""
    status: str
    """``optimal`` or ``time-limit`` (HiGHS stopped with a feasible answer)."""
    used: int
    slices: int
    disrupted: int
    reconfigured: int


class NoRepartition(Exception):
    """HiGHS found no answer in time (or the model has none): the caller falls back to packing."""


def current_layout(model: GpuModel, gpu: GpuInventory) -> Layout | None:
    if not gpu.mig_enabled:
        return None  # MIG off
    counts: Counter[str] = Counter()
    for inst in gpu.instances:
        prof = model.profile(inst.profile)
        counts[prof.name if prof else inst.profile] += 1
    return as_layout(dict(counts))


@dataclass(frozen=True)
class _Group:
    gpu: int
    profile_now: str
    klass: str
    items: tuple[Item, ...]
    tied: tuple[PodKey, ...]
    """The pods of a device that is not interchangeable with others (empty for simple groups)."""


def _groups(items: Sequence[Item], pinned_pods: frozenset[PodKey]) -> list[_Group]:
    """Devices with one pod each, whose pod holds no other device, are interchangeable within
    (GPU, profile now, class); every other device is a group of its own, tied to its pods."""
    devices_of: Counter[PodKey] = Counter(p for it in items for p in it.pods)
    simple: dict[tuple[int, str, str], list[Item]] = {}
    out: list[_Group] = []
    for it in items:
        pod = it.pods[0] if len(it.pods) == 1 else None
        if pod is not None and devices_of[pod] == 1 and pod not in pinned_pods:
            simple.setdefault((it.gpu, it.profile_now, it.klass), []).append(it)
        else:
            out.append(_Group(it.gpu, it.profile_now, it.klass, (it,), it.pods))
    for (gpu, now, klass), members in sorted(simple.items()):
        out.append(_Group(gpu, now, klass, tuple(members), ()))
    return out


class _Vars:
    """Column indices of a MILP built incrementally."""

    def __init__(self) -> None:
        self.n = 0
        self.integer: list[int] = []
        self.upper: list[float] = []

    def add(self, upper: float, *, integer: bool = True) -> int:
        self.n += 1
        self.integer.append(1 if integer else 0)
        self.upper.append(upper)
        return self.n - 1


def solve(shape: NodeShape, *, time_limit: float) -> Repartition:  # noqa: PLR0912, PLR0915
    """The lexicographic optimum for ``shape`` (:class:`NoRepartition` when HiGHS has none in time)."""
    model = shape.model
    profs = list(plain_profiles(model))
    pool = list(shape.pool)
    groups = _groups(shape.items, shape.pinned_pods)
    now: dict[int, Layout | None] = {g.index: current_layout(model, g) for g in pool}
    used_now = {it.gpu for it in shape.items}
    v = _Vars()
    # Layout choices per GPU.
    choices: dict[int, list[Layout | None]] = {}
    y: dict[tuple[int, int], int] = {}
    for g in pool:
        opts: list[Layout | None] = list(maximal_layouts(model))
        cur = now[g.index]
        if cur is not None and cur not in opts:
            opts.append(cur)
        opts.append(None)
        choices[g.index] = opts
        for k in range(len(opts)):
            y[(g.index, k)] = v.add(1)
    e = {g.index: v.add(1) for g in pool}
    r = {g.index: v.add(1) for g in pool}
    m = v.add(1)
    z: dict[tuple[int, int, str], int] = {}
    s: dict[int, int] = {}
    for ci, grp in enumerate(groups):
        kp = model.profile(grp.klass)
        for g in pool:
            for q in profs:
                if kp is not None and dominates(q, kp):
                    z[(ci, g.index, q.name)] = v.add(len(grp.items))
        if (ci, grp.gpu, grp.profile_now) in z:
            s[ci] = v.add(len(grp.items))
    tied = sorted({p for grp in groups for p in grp.tied}, key=str)
    d = {p: v.add(1) for p in tied}
    loose_pinned = len(shape.pinned_pods - set(tied))

    rows: list[dict[int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(coef: Mapping[int, float], low: float, high: float) -> None:
        rows.append(dict(coef))
        lo.append(low)
        hi.append(high)

    cap = max(1, len(shape.items))
    for g in pool:
        idx = g.index
        row({y[(idx, k)]: 1 for k in range(len(choices[idx]))}, 1, 1)
        off = y[(idx, len(choices[idx]) - 1)]
        for q in profs:
            coef: dict[int, float] = {var: 1 for (c, gi, qn), var in z.items() if gi == idx and qn == q.name}
            if not coef:
                continue
            for k, lay in enumerate(choices[idx]):
                n = dict(lay).get(q.name, 0) if lay is not None else 0
                if n:
                    coef[y[(idx, k)]] = -n
            row(coef, -np.inf, 0)
        # e[g] = 1 → no device on g.
        held = {var: 1.0 for (c, gi, qn), var in z.items() if gi == idx}
        row({**held, e[idx]: cap}, -np.inf, cap)
        if idx in used_now:
            row({off: 1, e[idx]: -1}, 0, 0)  # freed ⇔ handed back whole
        else:
            row({off: 1, e[idx]: -1}, -np.inf, 0)
        # Mode change and re-creation.
        if now[idx] is None:
            row({m: 1, off: 1}, 1, np.inf)
            row({r[idx]: 1, off: 1}, 1, np.inf)
        else:
            row({m: 1, off: -1}, 0, np.inf)
            k_now = choices[idx].index(now[idx])
            row({r[idx]: 1, y[(idx, k_now)]: 1}, 1, np.inf)
        row({r[idx]: 1, m: -1}, 0, np.inf)
    for ci, grp in enumerate(groups):
        row({var: 1 for (c, _g, _q), var in z.items() if c == ci}, len(grp.items), len(grp.items))
        if ci in s:
            n = len(grp.items)
            k_now = choices[grp.gpu].index(now[grp.gpu])
            row({s[ci]: 1, z[(ci, grp.gpu, grp.profile_now)]: -1}, -np.inf, 0)
            row({s[ci]: 1, y[(grp.gpu, k_now)]: -n}, -np.inf, 0)
            row({s[ci]: 1, m: n}, -np.inf, n)
        if grp.tied:
            for pod in grp.tied:
                row({d[pod]: 1, **({s[ci]: 1} if ci in s else {})}, 1, np.inf)
    for pod in tied:
        if pod in shape.pinned_pods:
            row({d[pod]: 1, m: -1}, 0, np.inf)

    # Cuts from a known answer: they change no optimum and prune HiGHS' search.
    if shape.most_gpus is not None:
        row({e[g.index]: -1 for g in pool}, -np.inf, shape.most_gpus - len(pool))
    if shape.most_slices is not None:
        row({var: float(_compute(model, qn)) for (_c, _g, qn), var in z.items()}, -np.inf, shape.most_slices)

    # Weights: each criterion outweighs the largest possible total of all those below it.
    gpus_total = len(pool) + shape.pinned_gpus
    pods_total = sum(len(grp.items) for grp in groups if not grp.tied) + len(tied) + loose_pinned
    # Below the four criteria, a tie-break: serve a device with its own class when that costs nothing
    # (no extra memory slices, no needless change of resource name).
    # Last, among equal answers, layouts with more (smaller) spare instances: more devices to schedule.
    w6 = 1.0
    w5 = (7 * len(pool) + 1) * w6
    w4 = (sum(len(grp.items) for grp in groups) * (model.memory_slices + 1) + 1) * w5
    w3 = (gpus_total + 1) * w4
    w2 = (pods_total + 1) * w3
    w1 = (model.compute_slices * len(pool) + 1) * w2
    cost = np.zeros(v.n)
    for g in pool:
        cost[e[g.index]] -= w1  # constant len(pool)·w1 dropped
        for k, lay in enumerate(choices[g.index]):
            cost[y[(g.index, k)]] -= w6 * (sum(n for _, n in lay) if lay is not None else 0)
        cost[r[g.index]] += w4
    cost[m] += w4 * shape.pinned_gpus + w3 * loose_pinned
    for (c, _g, qn), var in z.items():
        prof, kp = model.profile(qn), model.profile(groups[c].klass)
        extra = (prof.memory_slices - kp.memory_slices if prof and kp else 0) + (qn != groups[c].klass)
        cost[var] += w2 * (prof.compute_slices if prof else 0) + w5 * extra
    for ci, grp in enumerate(groups):
        if not grp.tied and ci in s:
            cost[s[ci]] -= w3  # n - s disrupted; constant dropped
    for pod in tied:
        cost[d[pod]] += w3
    simple_total = sum(len(grp.items) for grp in groups if not grp.tied)

    a = np.zeros((len(rows), v.n))
    for i, coef in enumerate(rows):
        for j, val in coef.items():
            a[i, j] += val
    res = milp(
        cost,
        constraints=[LinearConstraint(a, np.array(lo), np.array(hi))],
        integrality=np.array(v.integer),
        bounds=Bounds(np.zeros(v.n), np.array(v.upper)),
        options={"time_limit": max(0.05, time_limit), "mip_rel_gap": 0.0},
    )
    if res.x is None:
        raise NoRepartition(f"HiGHS status {res.status}: {res.message}")
    x = np.round(res.x).astype(int)
    plans: list[GpuPlan] = []
    for g in pool:
        k = next(k for k in range(len(choices[g.index])) if x[y[(g.index, k)]])
        lay = choices[g.index][k]
        plans.append(GpuPlan(g.index, lay is not None, dict(lay) if lay is not None else {}))
    by_index = {p.index: p for p in plans}
    for ci, grp in enumerate(groups):
        todo = list(grp.items)
        # Devices that stay on their slot first (they keep their GPU and profile).
        keep = x[s[ci]] if ci in s else 0
        for it in todo[:keep]:
            by_index[grp.gpu].items.append(_served(it, grp.profile_now))
        todo = todo[keep:]
        for (c, gi, qn), var in sorted(z.items(), key=lambda kv: (kv[0][1] != grp.gpu, kv[0])):
            if c != ci:
                continue
            n = x[var] - (keep if (gi, qn) == (grp.gpu, grp.profile_now) else 0)
            for it in todo[: max(0, n)]:
                by_index[gi].items.append(_served(it, qn))
            todo = todo[max(0, n) :]
    used = sum(1 for p in plans if p.items)
    slices = sum(
        (prof.compute_slices if (prof := model.profile(it.klass)) else 0) for p in plans for it in p.items
    )
    stayed = sum(int(x[s[ci]]) for ci, grp in enumerate(groups) if not grp.tied and ci in s)
    disrupted = simple_total - stayed + sum(int(x[d[p]]) for p in tied) + loose_pinned * int(x[m])
    reconfigured = sum(int(x[r[g.index]]) for g in pool) + shape.pinned_gpus * int(x[m])
    status = "optimal" if res.status == 0 else "time-limit"
    return Repartition(tuple(plans), status, used, slices, disrupted, reconfigured)


def _compute(model: GpuModel, name: str) -> int:
    prof = model.profile(name)
    return prof.compute_slices if prof else 0


def _served(it: Item, profile: str) -> Item:
    return replace(it, klass=profile)
