"""``--allow-moves``: which nodes change, and how, as one MILP over the whole fleet.

Every node may end in one of three ways: as it is now (*stay*), with its own best answer (*own*,
the per-node optimum of :mod:`rightsizer.optimise.node`: pods stay on the node), or *repacked*: its
devices join its model's pool and its GPUs are laid out anew. Devices of repacked nodes land on new
layouts (the model's maximal layouts, as in :mod:`rightsizer.optimise.packing`) or on free slots of
GPUs that hold devices on nodes that stay or take their own answer (a pod moving there restarts,
which its repacked node already counts; the GPU keeps its layout). Nodes alike in everything the
model sees form one group with a count, so a fleet of thousands of nodes has a few hundred columns.

Per model ``m`` (pool of the mixed-strategy nodes of that GPU model), with ``o_g``, ``r_g`` the nodes
of group ``g`` taking their own answer or repacked (integers, ``o_g + r_g ≤ n_g``), ``x_L`` GPUs
carrying maximal layout ``L``, ``z_kq`` devices of class ``k`` served by profile ``q``::

    Σ_q z_kq = Σ_g r_g·d_gk                                         every moving device served
    Σ_k z_kq ≤ Σ_L n(L,q)·x_L + Σ_g (n_g − o_g − r_g)·f⁰_gq + o_g·f¹_gq   slots exist
    Σ_L x_L ≤ Σ_g r_g·G_g                                            repacked nodes' GPUs
    Σ_g (o_g + r_g) ≤ max_nodes                                     the plan's budget (all models)

Objectives, lexicographic, one HiGHS solve each with the earlier ones held at their optimum:
(1) GPUs holding devices, (2) allocated compute slices, (3) pods disrupted (a repacked node counts
every GPU pod it has: freeing a GPU switches its MIG mode, which resets every GPU of the node), then
the fewest nodes changed. Solving every node repacked is the fleet's packing: (1)'s optimum is the
fleet optimum whenever the budget allows. A solve that runs out of time keeps its best answer (or,
in (1), the earlier stage's); the answer "every node stays" is always feasible.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from mig_geometry.catalogue import GpuModel
from mig_geometry.layouts import Layout, maximal_layouts
from rightsizer.optimise import packing


@dataclass(frozen=True)
class Ending:
    """One way a node ends (as it is now, or with its own answer): what it costs and offers."""

    used: int
    """Pool GPUs holding devices."""
    slices: int
    """Allocated compute slices of its pool devices."""
    disrupted: int
    """Pods it restarts."""
    free: tuple[tuple[str, int], ...]
    """Profile → free slots on its GPUs that hold devices (where others' devices may land)."""


@dataclass(frozen=True)
class Repack:
    """What repacking a node moves and frees."""

    demand: tuple[tuple[str, int], ...]
    """Class → devices on its pool GPUs."""
    gpus: int
    """Its pool GPUs."""
    pods: int
    """Every GPU pod of the node (all restart when its MIG mode changes)."""


@dataclass(frozen=True)
class Candidate:
    """A node as the selection sees it; nodes with equal candidates are one group."""

    model: str
    """The pool's model key; ``""`` for nodes outside every pool (their own answer or nothing)."""
    now: Ending
    own: Ending | None
    """Its own answer, when that changes anything."""
    repack: Repack | None
    """``None``: the node cannot be repacked (not in a pool, or a pod holds several devices)."""


@dataclass(frozen=True)
class Choice:
    """The answer: per group, how many nodes take their own answer and how many are repacked; per
    model, the new layouts and how each class is served."""

    own: tuple[int, ...]
    repacked: tuple[int, ...]
    layouts: Mapping[str, tuple[Layout, ...]]
    serve: Mapping[str, Mapping[tuple[str, str], int]]
    gpus: int
    slices: int
    disrupted: int
    status: str
    """``optimal``, or ``time-limit`` when a stage stopped at its time limit with an answer."""


class _Model:
    """The selection MILP's columns, rows and objectives (see the module docstring)."""

    def __init__(
        self,
        groups: Sequence[tuple[Candidate, int]],
        models: Mapping[str, GpuModel],
        *,
        budget: int | None,
        exact: bool,
    ) -> None:
        self.groups, self.models = groups, models
        self.upper: list[float] = []
        self.integer: list[int] = []
        self.own = [self._col(n) if c.own is not None else -1 for c, n in groups]
        self.rep = [self._col(n) if c.repack is not None else -1 for c, n in groups]
        self.x: dict[tuple[str, Layout], int] = {}
        self.z: dict[tuple[str, str, str], int] = {}
        self.rows: list[dict[int, float]] = []
        self.lo: list[float] = []
        self.hi: list[float] = []
        for i, (_c, n) in enumerate(groups):
            if self.own[i] >= 0 and self.rep[i] >= 0:
                self._row({self.own[i]: 1.0, self.rep[i]: 1.0}, -np.inf, n)
        for key in sorted(models):
            self._pool(key, exact=exact)
        if budget is not None:
            self._row({col: 1.0 for col in [*self.own, *self.rep] if col >= 0}, -np.inf, float(budget))

    def _col(self, upper: float, *, integer: bool = True) -> int:
        self.upper.append(upper)
        self.integer.append(1 if integer else 0)
        return len(self.upper) - 1

    def _row(self, coef: dict[int, float], low: float, high: float) -> None:
        self.rows.append(coef)
        self.lo.append(low)
        self.hi.append(high)

    def _pool(self, key: str, *, exact: bool) -> None:
        """One model's pool: its layouts, how its classes are served, and its three kinds of rows."""
        model, groups = self.models[key], self.groups
        members = [i for i, (c, _) in enumerate(groups) if c.model == key]
        repacks = {i: r for i in members if (r := groups[i][0].repack) is not None}
        demand = {i: dict(r.demand) for i, r in repacks.items()}
        if not demand:
            return
        gpus = sum(r.gpus * groups[i][1] for i, r in repacks.items())
        devices = sum(n * groups[i][1] for i, d in demand.items() for n in d.values())
        for lay in maximal_layouts(model):
            self.x[(key, lay)] = self._col(gpus)
        for k in sorted({k for d in demand.values() for k in d}):
            # Devices served (a transportation problem once the rest is integral: continuous).
            cols = {q.name: self._col(devices, integer=False) for q in packing.serving(model, k, exact=exact)}
            self.z.update({(key, k, q): col for q, col in cols.items()})
            coef = {col: 1.0 for col in cols.values()}
            for i, d in demand.items():
                if d.get(k):
                    coef[self.rep[i]] = -float(d[k])
            self._row(coef, 0.0, 0.0)
        for q in sorted({q for (m, _k, q) in self.z if m == key}):
            coef = {col: 1.0 for (m, _k, qq), col in self.z.items() if m == key and qq == q}
            for (m, lay), col in self.x.items():
                if m == key and (n_q := dict(lay).get(q, 0)):
                    coef[col] = -float(n_q)
            constant = 0.0
            for i in members:
                c, n = groups[i]
                f0 = dict(c.now.free).get(q, 0)
                constant += n * f0
                if self.own[i] >= 0 and c.own is not None:
                    coef[self.own[i]] = f0 - dict(c.own.free).get(q, 0)
                if self.rep[i] >= 0:
                    coef[self.rep[i]] = coef.get(self.rep[i], 0.0) + f0
            self._row(coef, -np.inf, constant)
        coef = {col: 1.0 for (m, _lay), col in self.x.items() if m == key}
        coef.update({self.rep[i]: -float(r.gpus) for i, r in repacks.items()})
        self._row(coef, -np.inf, 0.0)

    def objectives(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """GPUs, allocated slices, and pods disrupted (then nodes changed), each relative to every
        node staying as it is."""
        width = len(self.upper)
        gpus, slices, disrupted = np.zeros(width), np.zeros(width), np.zeros(width)
        changes = np.zeros(width)
        for i, (c, _n) in enumerate(self.groups):
            if self.own[i] >= 0 and c.own is not None:
                gpus[self.own[i]] = c.own.used - c.now.used
                slices[self.own[i]] = c.own.slices - c.now.slices
                disrupted[self.own[i]] = c.own.disrupted
                changes[self.own[i]] = 1.0
            if self.rep[i] >= 0 and c.repack is not None:
                gpus[self.rep[i]] = -c.now.used
                slices[self.rep[i]] = -c.now.slices
                disrupted[self.rep[i]] = c.repack.pods
                changes[self.rep[i]] = 1.0
        for col in self.x.values():
            gpus[col] = 1.0
        for (m, _k, q), col in self.z.items():
            slices[col] = packing.size(self.models[m], q)
        return gpus, slices, disrupted * (len(self.groups) + 1) + changes

    def solve(self, time_limit: float) -> tuple[np.ndarray, str]:
        """The three stages (see the module docstring): the best answer and its status."""
        deadline = time.perf_counter() + max(time_limit, 0.0)
        matrix = _matrix(self.rows, len(self.upper))
        bounds = Bounds(np.zeros(len(self.upper)), np.array(self.upper, dtype=float))
        integrality = np.array(self.integer)
        best = np.zeros(len(self.upper))  # every node stays: always feasible
        status = "optimal"
        held: list[tuple[np.ndarray, float]] = []
        for objective in self.objectives():
            constraints = [LinearConstraint(matrix, np.array(self.lo), np.array(self.hi))]
            constraints += [LinearConstraint(cost.reshape(1, -1), -np.inf, cap) for cost, cap in held]
            res = milp(
                objective,
                constraints=constraints,
                integrality=integrality,
                bounds=bounds,
                options={"time_limit": max(deadline - time.perf_counter(), 0.05), "mip_rel_gap": 0.0},
            )
            if res.x is None:
                status = "time-limit"
                break
            found = self._vertex(res.x, objective, constraints)
            if found is None:
                status = "time-limit"
                break
            if res.status != 0:
                status = "time-limit"
            # An answer no better than the one held (a stage cut short) is not taken.
            if float(objective @ found) <= float(objective @ best) + 1e-9:
                best = found
            held.append((objective, float(objective @ best) + 1e-6))
            if res.status != 0:
                break
        return best, status

    def _vertex(
        self, x: np.ndarray, objective: np.ndarray, constraints: list[LinearConstraint]
    ) -> np.ndarray | None:
        """``x`` with its integer columns rounded and the devices served integral: given the rest,
        serving is a transportation problem whose vertices are integral, so a fractional answer
        (from a heuristic, not a vertex) is solved again as an LP with the rest fixed."""
        integer = np.array(self.integer) > 0
        fixed = np.where(integer, np.round(x), x)
        if np.allclose(fixed, np.round(fixed), atol=1e-6):
            return np.round(fixed)
        low = np.where(integer, fixed, 0.0)
        high = np.where(integer, fixed, np.array(self.upper, dtype=float))
        lp = milp(objective, constraints=constraints, bounds=Bounds(low, high))
        answer: np.ndarray | None = lp.x
        if answer is None or not np.allclose(answer, np.round(answer), atol=1e-6):
            return None  # not for integral rows; the stage's answer is then not taken
        return np.round(answer)


def choose(
    groups: Sequence[tuple[Candidate, int]],
    models: Mapping[str, GpuModel],
    *,
    budget: int | None,
    exact: bool,
    time_limit: float,
) -> Choice:
    """The lexicographic optimum over ``groups`` (candidate, node count); ``exact``: devices keep their
    class (``--keep-profiles``)."""
    model = _Model(groups, models, budget=budget, exact=exact)
    best, status = model.solve(time_limit)
    return _read(model, best, status)


def _matrix(rows: Sequence[Mapping[int, float]], width: int) -> coo_array:
    r, c, v = [], [], []
    for i, coef in enumerate(rows):
        for j, val in coef.items():
            if val:
                r.append(i)
                c.append(j)
                v.append(val)
    return coo_array((v, (r, c)), shape=(len(rows), width))


def _read(m: _Model, sol: np.ndarray, status: str) -> Choice:
    owns = tuple(int(sol[c]) if c >= 0 else 0 for c in m.own)
    reps = tuple(int(sol[c]) if c >= 0 else 0 for c in m.rep)
    layouts: dict[str, list[Layout]] = {}
    for (key, lay), col in m.x.items():
        layouts.setdefault(key, []).extend([lay] * int(sol[col]))
    serve: dict[str, dict[tuple[str, str], int]] = {}
    for (key, k, q), col in m.z.items():
        if round(sol[col]):
            serve.setdefault(key, {})[(k, q)] = round(sol[col])
    gpus_cost, slices_cost, _ = m.objectives()
    disrupted = sum(
        owns[i] * (c.own.disrupted if c.own else 0) + reps[i] * (c.repack.pods if c.repack else 0)
        for i, (c, _n) in enumerate(m.groups)
    )
    return Choice(
        owns,
        reps,
        {key: tuple(v) for key, v in layouts.items()},
        serve,
        round(sum(c.now.used * n for c, n in m.groups) + float(gpus_cost @ sol)),
        round(sum(c.now.slices * n for c, n in m.groups) + float(slices_cost @ sol)),
        disrupted,
        status,
    )
