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
from rightsizer.optimise import packing
from rightsizer.optimise.packing import plain_profiles
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
    exact_profiles: bool = False
    """Each device served by its own class only (``--keep-profiles``)."""


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


def solve(shape: NodeShape, *, time_limit: float) -> Repartition:
    """The lexicographic optimum for ``shape`` (:class:`NoRepartition` when HiGHS has none in time)."""
    node = _NodeMilp(shape)
    node.gpu_rows()
    node.device_rows()
    node.cuts()
    x, status = node.run(time_limit)
    return node.read(x, status)


class _NodeMilp:
    """The node's MILP: the columns named in the module docstring, rows as sparse maps."""

    def __init__(self, shape: NodeShape) -> None:
        self.shape, self.model = shape, shape.model
        self.profs = list(plain_profiles(shape.model))
        self.pool = list(shape.pool)
        self.groups = _groups(shape.items, shape.pinned_pods)
        self.now: dict[int, Layout | None] = {g.index: current_layout(shape.model, g) for g in self.pool}
        self.used_now = {it.gpu for it in shape.items}
        self.v = _Vars()
        self.rows: list[dict[int, float]] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        # Per GPU: its layout choices (maximal layouts, its current one, MIG off last), y, e, r.
        self.choices: dict[int, list[Layout | None]] = {}
        self.y: dict[tuple[int, int], int] = {}
        for g in self.pool:
            opts: list[Layout | None] = list(maximal_layouts(self.model))
            cur = self.now[g.index]
            if cur is not None and cur not in opts:
                opts.append(cur)
            opts.append(None)
            self.choices[g.index] = opts
            for k in range(len(opts)):
                self.y[(g.index, k)] = self.v.add(1)
        self.e = {g.index: self.v.add(1) for g in self.pool}
        self.r = {g.index: self.v.add(1) for g in self.pool}
        self.m = self.v.add(1)
        # Per device group: z by GPU and serving profile, s (stay); d per tied pod.
        self.z: dict[tuple[int, int, str], int] = {}
        self.s: dict[int, int] = {}
        for ci, grp in enumerate(self.groups):
            serving = packing.serving(self.model, grp.klass, exact=shape.exact_profiles)
            for g in self.pool:
                for q in serving:
                    self.z[(ci, g.index, q.name)] = self.v.add(len(grp.items))
            if (ci, grp.gpu, grp.profile_now) in self.z:
                self.s[ci] = self.v.add(len(grp.items))
        self.tied = sorted({p for grp in self.groups for p in grp.tied}, key=str)
        self.d = {p: self.v.add(1) for p in self.tied}
        self.loose_pinned = len(shape.pinned_pods - set(self.tied))

    def row(self, coef: Mapping[int, float], low: float, high: float) -> None:
        self.rows.append(dict(coef))
        self.lo.append(low)
        self.hi.append(high)

    def off(self, gpu: int) -> int:
        return self.y[(gpu, len(self.choices[gpu]) - 1)]

    def kept(self, gpu: int) -> int:
        """The column of ``gpu`` keeping its current layout (MIG off when it is off now)."""
        return self.y[(gpu, self.choices[gpu].index(self.now[gpu]))]

    def gpu_rows(self) -> None:
        """One layout per GPU, slots that exist, empty ⇔ no device, freed ⇒ MIG off, mode change and
        re-creation."""
        cap = max(1, len(self.shape.items))
        on_gpu: dict[tuple[int, str], dict[int, float]] = {}
        for (_c, gi, qn), var in self.z.items():
            on_gpu.setdefault((gi, qn), {})[var] = 1.0
        for g in self.pool:
            idx, off = g.index, self.off(g.index)
            self.row({self.y[(idx, k)]: 1 for k in range(len(self.choices[idx]))}, 1, 1)
            for q in self.profs:
                coef = dict(on_gpu.get((idx, q.name), {}))
                if not coef:
                    continue
                for k, lay in enumerate(self.choices[idx]):
                    if n := (dict(lay).get(q.name, 0) if lay is not None else 0):
                        coef[self.y[(idx, k)]] = -n
                self.row(coef, -np.inf, 0)
            held = {var: 1.0 for (gi, _q), cols in on_gpu.items() if gi == idx for var in cols}
            self.row({**held, self.e[idx]: cap}, -np.inf, cap)
            # A GPU left without its pods is handed back whole; MIG off means no device.
            self.row({off: 1, self.e[idx]: -1}, 0 if idx in self.used_now else -np.inf, 0)
            if self.now[idx] is None:
                self.row({self.m: 1, off: 1}, 1, np.inf)
            else:
                self.row({self.m: 1, off: -1}, 0, np.inf)
            self.row({self.r[idx]: 1, self.kept(idx): 1}, 1, np.inf)
            self.row({self.r[idx]: 1, self.m: -1}, 0, np.inf)

    def device_rows(self) -> None:
        """Every device served; a device stays only on its own slot of a kept GPU without a mode
        change; a tied pod is disrupted unless all its devices stay (or by a mode change when pinned)."""
        for ci, grp in enumerate(self.groups):
            n = len(grp.items)
            self.row({var: 1 for (c, _g, _q), var in self.z.items() if c == ci}, n, n)
            if ci in self.s:
                stay = self.s[ci]
                self.row({stay: 1, self.z[(ci, grp.gpu, grp.profile_now)]: -1}, -np.inf, 0)
                self.row({stay: 1, self.kept(grp.gpu): -n}, -np.inf, 0)
                self.row({stay: 1, self.m: n}, -np.inf, n)
            for pod in grp.tied:
                self.row({self.d[pod]: 1, **({self.s[ci]: 1} if ci in self.s else {})}, 1, np.inf)
        for pod in self.tied:
            if pod in self.shape.pinned_pods:
                self.row({self.d[pod]: 1, self.m: -1}, 0, np.inf)

    def cuts(self) -> None:
        """Cuts from a known answer: they change no optimum and prune HiGHS' search."""
        if self.shape.most_gpus is not None:
            self.row({self.e[g.index]: -1 for g in self.pool}, -np.inf, self.shape.most_gpus - len(self.pool))
        if self.shape.most_slices is not None:
            self.row(
                {var: float(_compute(self.model, qn)) for (_c, _g, qn), var in self.z.items()},
                -np.inf,
                self.shape.most_slices,
            )

    def cost(self) -> np.ndarray:
        """Weights such that each criterion outweighs the largest possible total of all below it; under
        the four, serving a device with its own class, then layouts with more spare instances."""
        model, groups, pool = self.model, self.groups, self.pool
        gpus_total = len(pool) + self.shape.pinned_gpus
        pods_total = (
            sum(len(grp.items) for grp in groups if not grp.tied) + len(self.tied) + self.loose_pinned
        )
        w6 = 1.0
        w5 = (7 * len(pool) + 1) * w6
        w4 = (sum(len(grp.items) for grp in groups) * (model.memory_slices + 1) + 1) * w5
        w3 = (gpus_total + 1) * w4
        w2 = (pods_total + 1) * w3
        w1 = (model.compute_slices * len(pool) + 1) * w2
        cost = np.zeros(self.v.n)
        for g in pool:
            cost[self.e[g.index]] -= w1  # GPUs used = len(pool) - Σe; the constant is dropped
            for k, lay in enumerate(self.choices[g.index]):
                cost[self.y[(g.index, k)]] -= w6 * (sum(n for _, n in lay) if lay is not None else 0)
            cost[self.r[g.index]] += w4
        cost[self.m] += w4 * self.shape.pinned_gpus + w3 * self.loose_pinned
        for (c, _g, qn), var in self.z.items():
            prof, kp = model.profile(qn), model.profile(groups[c].klass)
            extra = (prof.memory_slices - kp.memory_slices if prof and kp else 0) + (qn != groups[c].klass)
            cost[var] += w2 * (prof.compute_slices if prof else 0) + w5 * extra
        for ci, grp in enumerate(groups):
            if not grp.tied and ci in self.s:
                cost[self.s[ci]] -= w3  # disrupted = n - s; the constant is dropped
        for pod in self.tied:
            cost[self.d[pod]] += w3
        return cost

    def run(self, time_limit: float) -> tuple[np.ndarray, str]:
        a = np.zeros((len(self.rows), self.v.n))
        for i, coef in enumerate(self.rows):
            for j, val in coef.items():
                a[i, j] += val
        res = milp(
            self.cost(),
            constraints=[LinearConstraint(a, np.array(self.lo), np.array(self.hi))],
            integrality=np.array(self.v.integer),
            bounds=Bounds(np.zeros(self.v.n), np.array(self.v.upper)),
            options={"time_limit": max(0.05, time_limit), "mip_rel_gap": 0.0},
        )
        if res.x is None:
            raise NoRepartition(f"HiGHS status {res.status}: {res.message}")
        return np.round(res.x).astype(int), "optimal" if res.status == 0 else "time-limit"

    def read(self, x: np.ndarray, status: str) -> Repartition:
        """The answer ``x`` as GPU plans, devices that stay first on their own slots."""
        plans: list[GpuPlan] = []
        for g in self.pool:
            k = next(k for k in range(len(self.choices[g.index])) if x[self.y[(g.index, k)]])
            lay = self.choices[g.index][k]
            plans.append(GpuPlan(g.index, lay is not None, dict(lay) if lay is not None else {}))
        by_index = {p.index: p for p in plans}
        for ci, grp in enumerate(self.groups):
            keep = int(x[self.s[ci]]) if ci in self.s else 0
            for it in grp.items[:keep]:
                by_index[grp.gpu].items.append(_served(it, grp.profile_now))
            todo = list(grp.items[keep:])
            for (c, gi, qn), var in sorted(self.z.items(), key=lambda kv: (kv[0][1] != grp.gpu, kv[0])):
                if c != ci:
                    continue
                n = max(0, int(x[var]) - (keep if (gi, qn) == (grp.gpu, grp.profile_now) else 0))
                for it in todo[:n]:
                    by_index[gi].items.append(_served(it, qn))
                todo = todo[n:]
        simple = sum(len(grp.items) for grp in self.groups if not grp.tied)
        stayed = sum(
            int(x[self.s[ci]]) for ci, grp in enumerate(self.groups) if not grp.tied and ci in self.s
        )
        mode = int(x[self.m])
        return Repartition(
            tuple(plans),
            status,
            sum(1 for p in plans if p.items),
            sum(_compute(self.model, it.klass) for p in plans for it in p.items),
            simple - stayed + sum(int(x[self.d[p]]) for p in self.tied) + self.loose_pinned * mode,
            sum(int(x[self.r[g.index]]) for g in self.pool) + self.shape.pinned_gpus * mode,
        )


def _compute(model: GpuModel, name: str) -> int:
    prof = model.profile(name)
    return prof.compute_slices if prof else 0


def _served(it: Item, profile: str) -> Item:
    return replace(it, klass=profile)
