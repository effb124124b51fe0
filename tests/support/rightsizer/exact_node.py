"""An independent exact solver for one node, for the optimiser's tests: a position-based MILP over
NVIDIA's placement tables (each instance is a profile at one allowed start; memory slices disjoint),
solved lexicographically (four HiGHS solves, each criterion fixed before the next): most GPUs freed,
most allocated compute slices freed, fewest pods disrupted, fewest GPUs re-created.

It shares nothing with :mod:`rightsizer.optimise` but the geometry catalogue and the demand each
device has (its class); layouts are built from starts, not from an enumeration of layouts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from mig_geometry.catalogue import GpuModel, find_model
from mig_geometry.layouts import valid_layouts
from rightsizer.analysis.types import PodKey
from tests.support.rightsizer.fleetspec import Dev, Node


@dataclass(frozen=True)
class Device:
    gpu: int
    profile_now: str
    klass: str
    pods: tuple[PodKey, ...]


@dataclass(frozen=True)
class Gpu:
    index: int
    mig_enabled: bool
    counts: dict[str, int]
    pinned: bool


@dataclass(frozen=True)
class Optimum:
    used: int
    """Pool GPUs (not pinned) holding devices."""
    slices: int
    disrupted: int
    reconfigured: int


def solve(
    model: GpuModel, gpus: Sequence[Gpu], devices: Sequence[Device], pinned_pods: set[PodKey]
) -> Optimum:
    profs = [p for p in model.profiles if not p.media_extensions]
    pool = [g for g in gpus if not g.pinned]
    pinned = [g for g in gpus if g.pinned]
    used_now = {d.gpu for d in devices}
    cols: list[str] = []
    ub: list[float] = []

    def var(name: str, upper: float = 1) -> int:
        cols.append(name)
        ub.append(upper)
        return len(cols) - 1

    x = {(g.index, q.name, s): var(f"x{g.index}{q.name}@{s}") for g in pool for q in profs for s in q.starts}
    off = {g.index: var(f"off{g.index}") for g in pool}
    used = {g.index: var(f"used{g.index}") for g in pool}
    keep = {g.index: var(f"keep{g.index}") for g in pool}
    reconf = {g.index: var(f"reconf{g.index}") for g in pool}
    m = var("mode")
    a: dict[tuple[int, int, str], int] = {}
    for i, d in enumerate(devices):
        k = model.profile(d.klass)
        assert k is not None
        for g in pool:
            for q in profs:
                if q.compute_slices >= k.compute_slices and q.memory_slices >= k.memory_slices:
                    a[(i, g.index, q.name)] = var(f"a{i}{g.index}{q.name}")
    stay = {i: var(f"stay{i}") for i, d in enumerate(devices) if (i, d.gpu, d.profile_now) in a}
    pods = sorted({p for d in devices for p in d.pods} | pinned_pods, key=str)
    dp = {p: var(f"d{p}") for p in pods}
    n = len(cols)
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(coef: dict[int, float], low: float, high: float) -> None:
        r = np.zeros(n)
        for j, v in coef.items():
            r[j] += v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    big = 8
    for g in pool:
        gi = g.index
        for j in range(model.memory_slices):  # memory slices disjoint
            cover = {x[(gi, q.name, s)]: 1.0 for q in profs for s in q.starts if s <= j < s + q.memory_slices}
            row(cover, -np.inf, 1)
        row(
            {**{x[(gi, q.name, s)]: q.compute_slices for q in profs for s in q.starts}},
            -np.inf,
            model.compute_slices,
        )
        row({**{x[(gi, q.name, s)]: 1.0 for q in profs for s in q.starts}, off[gi]: big}, -np.inf, big)
        for q in profs:  # devices on slots that exist
            served = {v: 1.0 for (i, gg, qq), v in a.items() if gg == gi and qq == q.name}
            row({**served, **{x[(gi, q.name, s)]: -1.0 for s in q.starts}}, -np.inf, 0)
        for (_i, gg, _q), v in a.items():
            if gg == gi:
                row({used[gi]: 1, v: -1}, 0, np.inf)
        row({used[gi]: 1, off[gi]: 1}, -np.inf, 1)
        if gi in used_now:
            row({used[gi]: 1, off[gi]: 1}, 1, 1)  # a GPU left without its pods goes MIG off
        if g.mig_enabled:
            row({m: 1, off[gi]: -1}, 0, np.inf)
            row({keep[gi]: 1, off[gi]: 1}, -np.inf, 1)
        else:
            row({m: 1, off[gi]: 1}, 1, np.inf)
            row({keep[gi]: 1, off[gi]: -1}, -np.inf, 0)
        for q in profs:  # keep ⇒ same count of every profile
            have = {x[(gi, q.name, s)]: 1.0 for s in q.starts}
            now = g.counts.get(q.name, 0) if g.mig_enabled else 0
            row({**have, keep[gi]: big}, -np.inf, now + big)
            row({**have, keep[gi]: -big}, now - big, np.inf)
        row({reconf[gi]: 1, keep[gi]: 1}, 1, np.inf)
        row({reconf[gi]: 1, m: -1}, 0, np.inf)
    for i, d in enumerate(devices):
        row({v: 1.0 for (ii, _g, _q), v in a.items() if ii == i}, 1, 1)
        if i in stay:
            row({stay[i]: 1, a[(i, d.gpu, d.profile_now)]: -1}, -np.inf, 0)
            row({stay[i]: 1, keep[d.gpu]: -1}, -np.inf, 0)
            row({stay[i]: 1, m: 1}, -np.inf, 1)
        for p in d.pods:
            row({dp[p]: 1, **({stay[i]: 1} if i in stay else {})}, 1, np.inf)
    for p in pinned_pods:
        row({dp[p]: 1, m: -1}, 0, np.inf)

    objectives = [
        {used[g.index]: 1.0 for g in pool},
        {v: float(model.profile(q).compute_slices) for (_i, _g, q), v in a.items()},  # type: ignore[union-attr]
        {dp[p]: 1.0 for p in pods},
        {**{reconf[g.index]: 1.0 for g in pool}, m: float(len(pinned))},
    ]
    values = []
    for obj in objectives:
        c = np.zeros(n)
        for j, v in obj.items():
            c[j] += v
        res = milp(
            c,
            constraints=[LinearConstraint(np.array(rows), np.array(lo), np.array(hi))],
            integrality=np.ones(n),
            bounds=Bounds(np.zeros(n), np.array(ub)),
        )
        assert res.status == 0, res.message
        best = round(res.fun)
        values.append(best)
        rows.append(c)
        lo.append(-np.inf)
        hi.append(best + 1e-6)
    return Optimum(values[0], values[1], values[2], values[3])


def random_node(rng: random.Random, name: str) -> Node:
    """A seeded random H100 node of 1-3 GPUs: random valid layouts, some whole GPUs held by pods,
    some +me instances, pods idle, near idle or busy up to 80 %."""
    h100 = find_model("H100 80GB")
    assert h100 is not None
    layouts = valid_layouts(h100)
    gpus: list[list[Dev]] = []
    for g in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.08:
            gpus.append([Dev("", f"{name}-w{g}", rng.uniform(0.3, 0.8), 1000)])
            continue
        layout = dict(rng.choice(layouts))
        if roll < 0.16 and layout.get("1g.10gb"):
            layout["1g.10gb"] -= 1
            layout["1g.10gb+me"] = 1
        devs = []
        for prof, count in sorted(layout.items()):
            for k in range(count):
                if not count or rng.random() < 0.4:
                    devs.append(Dev(prof))
                    continue
                mem = h100.profile(prof).memory_mib  # type: ignore[union-attr]
                devs.append(
                    Dev(
                        prof,
                        f"{name}-{g}-{prof}-{k}",
                        rng.choice([0.0, 0.02, rng.uniform(0, 0.8)]),
                        rng.uniform(0, mem / 1.25),
                    )
                )
        gpus.append(devs)
    return Node(name, "H100 80GB", gpus)
