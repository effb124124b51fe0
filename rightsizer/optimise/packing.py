"""Pack MIG demand into the fewest GPUs of one model: exact MILP (HiGHS via scipy) or greedy.

Demand is a count per *class*: the smallest profile whose compute slices and memory cover one
device's need. A class-``k`` device may be served by any profile ``q`` at least as large in both
compute and memory (a bigger slice is allowed, at the cost of idle allocated slices).

MILP (``scipy.optimize.milp``): integer ``x_L`` = GPUs carrying maximal layout ``L`` (every valid
layout is a subset of a maximal one, so maximal layouts lose nothing), continuous ``z_kq`` = class-k
devices served by profile q (integral at a vertex once ``x`` is integral: a transportation problem)::

    minimise   W·Σ x_L + Σ z_kq·cost(k,q)      W > any possible waste; cost: idle compute slices,
                                               then 0.1 per extra memory slice, 0.01 for q ≠ k
    subject to Σ_q z_kq = d_k                     every device served
               Σ_k z_kq ≤ Σ_L n(L,q)·x_L          slots of profile q exist
               Σ_L x_L ≤ G                        GPUs available

The LP relaxation's ``ceil(Σ x_L)`` is the lower bound reported beside the answer. A best-fit
decreasing greedy runs first: when it reaches that bound it is optimal (it serves every device with
its own class, so it has no waste either) and the MILP is skipped. With a time limit HiGHS may stop
early; then its best feasible answer is used, or the greedy one if it has none.
Uniform layouts (``nvidia.com/mig.strategy=single``) are solved exactly by enumeration. With
``exact`` every device is served by its own class only (``--keep-profiles``: no pod's resource name
changes), in the MILP and in its LP bound alike.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from mig_geometry.catalogue import GpuModel, Profile
from mig_geometry.layouts import Layout, as_layout, maximal_layouts
from mig_geometry.placement import fits

WASTE_WEIGHT = 1000.0


@dataclass(frozen=True)
class PackResult:
    layouts: tuple[Layout, ...]
    """One maximal (or uniform) layout per GPU used."""
    serve: Mapping[tuple[str, str], int]
    """(class, profile) → devices of that class served by that profile."""
    method: str
    """``milp``, ``greedy``, ``uniform`` or ``none`` (nothing to pack)."""
    status: str
    """``optimal``, ``time-limit``, ``heuristic`` or ``infeasible``."""
    lower_bound: int
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> int:
        return len(self.layouts)

    @property
    def feasible(self) -> bool:
        return self.status != "infeasible"

    def allocated_slices(self, model: GpuModel) -> int:
        total = 0
        for (_k, q), n in self.serve.items():
            prof = model.profile(q)
            total += n * (prof.compute_slices if prof else 0)
        return total


def plain_profiles(model: GpuModel) -> tuple[Profile, ...]:
    return tuple(p for p in model.profiles if not p.media_extensions)


def dominates(q: Profile, k: Profile) -> bool:
    return q.compute_slices >= k.compute_slices and q.memory_slices >= k.memory_slices


def class_for(model: GpuModel, *, compute: float, memory_mib: float) -> Profile:
    """The smallest profile covering ``compute`` slices and ``memory_mib``; the full GPU if none does."""
    need_c = max(1, math.ceil(round(compute, 6)))
    fitting = [p for p in plain_profiles(model) if p.compute_slices >= need_c and p.memory_mib >= memory_mib]
    full = model.full_profile
    assert full is not None
    if not fitting:
        return full
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_slices, p.name))


def meet(model: GpuModel, a: str, b: str) -> str:
    """The largest profile both ``a`` and ``b`` dominate (``a`` when they are one profile): what a
    device needs at least when either may serve it (its slice now, or its class once it moves)."""
    if a == b:
        return a
    pa, pb = model.profile(a), model.profile(b)
    if pa is None or pb is None:
        return a
    both = [q for q in plain_profiles(model) if dominates(pa, q) and dominates(pb, q)]
    if not both:
        return a
    return max(both, key=lambda q: (q.compute_slices, q.memory_slices, q.name)).name


def size(model: GpuModel, name: str) -> int:
    """Compute slices of profile ``name`` on ``model`` (0 if it is not one of its profiles)."""
    prof = model.profile(name)
    return prof.compute_slices if prof else 0


def _count(layout: Layout, name: str) -> int:
    return dict(layout).get(name, 0)


def pack(
    model: GpuModel,
    demand: Mapping[str, int],
    *,
    gpus: int,
    time_limit: float = 10.0,
    uniform: bool = False,
    exact: bool = False,
) -> PackResult:
    """Fewest GPUs of ``model`` (at most ``gpus``) carrying ``demand`` (class profile → devices);
    ``exact``: each device served by its own class only.

    Answers are memoised per (model, demand, GPUs, uniform, exact): fleets repeat the same node shapes.
    """
    key = tuple(sorted((k, v) for k, v in demand.items() if v > 0))
    return _pack_cached(model, key, gpus, (uniform, exact), time_limit)


@lru_cache(maxsize=4096)
def _pack_cached(
    model: GpuModel,
    key: tuple[tuple[str, int], ...],
    gpus: int,
    kind: tuple[bool, bool],
    time_limit: float,
) -> PackResult:
    """``kind``: (uniform, exact)."""
    uniform, exact = kind
    return _pack(model, dict(key), gpus=gpus, time_limit=time_limit, uniform=uniform, exact=exact)


def _pack(
    model: GpuModel,
    demand: Mapping[str, int],
    *,
    gpus: int,
    time_limit: float,
    uniform: bool,
    exact: bool = False,
) -> PackResult:
    demand = {k: v for k, v in demand.items() if v > 0}
    if not demand:
        return PackResult((), {}, "none", "optimal", 0)
    if uniform:
        return pack_uniform(model, demand, gpus=gpus)
    started = time.perf_counter()
    greedy = pack_greedy(model, demand, gpus=gpus)
    # A GPU holds at most its compute and memory slices, and a device needs its class's at least:
    # when greedy meets that bound, the LP bound (between the two) is the same; no LP to solve.
    lb = slice_lower_bound(model, demand)
    if not (greedy.feasible and greedy.gpus == lb):
        lb = lp_lower_bound(model, demand, gpus=gpus, exact=exact)
    if greedy.feasible and greedy.gpus == lb:
        # The LP bound proves the greedy answer optimal: fewest GPUs, and every device served by
        # its own class (no idle allocated slices, no profile change). No MILP needed.
        return _with_time(PackResult(greedy.layouts, greedy.serve, "greedy", "optimal", lb), started)
    try:
        res = _milp(model, demand, gpus=gpus, time_limit=time_limit, lb=lb, exact=exact)
    except (ValueError, RuntimeError) as exc:  # pragma: no cover - solver trouble: fall back
        res = None
        note = f"MILP failed ({exc}); greedy used"
    else:
        note = ""
    if res is not None and res.feasible:
        return _with_time(res, started)
    notes: tuple[str, ...] = (note,) if note else ()
    if res is not None and res.status == "time-limit":
        notes += ("MILP hit its time limit without a feasible answer; greedy used",)
    if res is not None and res.status == "infeasible" and not greedy.feasible:
        return _with_time(res, started)
    return _with_time(
        PackResult(greedy.layouts, greedy.serve, "greedy", greedy.status, lb, notes=notes), started
    )


def _with_time(res: PackResult, started: float) -> PackResult:
    return PackResult(
        res.layouts,
        res.serve,
        res.method,
        res.status,
        res.lower_bound,
        time.perf_counter() - started,
        res.notes,
    )


@cache
def _model_tables(model: GpuModel) -> tuple[tuple[Layout, ...], tuple[Profile, ...]]:
    return maximal_layouts(model), plain_profiles(model)


def serving(model: GpuModel, klass: str, *, exact: bool = False) -> tuple[Profile, ...]:
    """The profiles that may serve a device of ``klass``: any at least as large in compute and memory,
    or (``exact``) its own only."""
    kp = model.profile(klass)
    if kp is None:
        return ()
    if exact:
        return (kp,)
    return tuple(q for q in plain_profiles(model) if dominates(q, kp))


def _build(
    model: GpuModel, demand: Mapping[str, int], gpus: int, *, exact: bool = False
) -> tuple[np.ndarray, list[LinearConstraint], np.ndarray, Bounds, list[tuple[str, str]], tuple[Layout, ...]]:
    layouts, profs = _model_tables(model)
    classes = sorted(demand)
    pairs = [(k, q.name) for k in classes for q in serving(model, k, exact=exact)]
    nl, nz = len(layouts), len(pairs)
    cost = np.zeros(nl + nz)
    # Among equally good answers, prefer layouts with more (smaller) spare instances.
    cost[:nl] = [WASTE_WEIGHT - 1e-4 * sum(n for _, n in lay) for lay in layouts]
    for j, (kname, qname) in enumerate(pairs):
        # Idle allocated compute first; then extra memory slices; then any change of profile
        # (a pod asking for nvidia.com/mig-<k> keeps its resource name when served by k).
        kp, qp = model.profile(kname), model.profile(qname)
        assert kp is not None and qp is not None
        cost[nl + j] = (
            qp.compute_slices
            - kp.compute_slices
            + 0.1 * (qp.memory_slices - kp.memory_slices)
            + (0.01 if qname != kname else 0.0)
        )
    rows: list[np.ndarray] = []
    lo: list[float] = []
    hi: list[float] = []
    for k in classes:  # every device served
        row = np.zeros(nl + nz)
        for j, (kk, _q) in enumerate(pairs):
            if kk == k:
                row[nl + j] = 1
        rows.append(row)
        lo.append(demand[k])
        hi.append(demand[k])
    for q in profs:  # slots exist
        row = np.zeros(nl + nz)
        for i, lay in enumerate(layouts):
            row[i] = -_count(lay, q.name)
        for j, (_k, qq) in enumerate(pairs):
            if qq == q.name:
                row[nl + j] = 1
        if row[nl:].any():
            rows.append(row)
            lo.append(-np.inf)
            hi.append(0)
    row = np.zeros(nl + nz)
    row[:nl] = 1
    rows.append(row)
    lo.append(0)
    hi.append(gpus)
    constraints = [LinearConstraint(np.array(rows), np.array(lo, dtype=float), np.array(hi, dtype=float))]
    integrality = np.zeros(nl + nz)
    integrality[:nl] = 1
    bounds = Bounds(np.zeros(nl + nz), np.concatenate([np.full(nl, gpus), np.full(nz, np.inf)]))
    return cost, constraints, integrality, bounds, pairs, layouts


def slice_lower_bound(model: GpuModel, demand: Mapping[str, int]) -> int:
    """GPUs needed by the compute and memory slices of ``demand`` alone (a bound the LP's meets or beats)."""
    compute = memory = 0
    for name, n in demand.items():
        prof = model.profile(name)
        if prof is None or n <= 0:
            continue
        compute += prof.compute_slices * n
        memory += prof.memory_slices * n
    bounds = [0]
    if model.compute_slices > 0:
        bounds.append(math.ceil(compute / model.compute_slices))
    if model.memory_slices > 0:
        bounds.append(math.ceil(memory / model.memory_slices))
    return max(bounds)


def lp_lower_bound(
    model: GpuModel, demand: Mapping[str, int], *, gpus: int | None = None, exact: bool = False
) -> int:
    """``ceil`` of the LP relaxation's GPU count: no packing can use fewer GPUs."""
    demand = {k: v for k, v in demand.items() if v > 0}
    if not demand:
        return 0
    limit = gpus if gpus is not None else sum(demand.values())
    cost, cons, _integ, bounds, _pairs, layouts = _build(model, demand, limit, exact=exact)
    cost = cost.copy()
    cost[len(layouts) :] = 0.0  # the bound concerns GPUs only
    res = milp(cost, constraints=cons, integrality=np.zeros_like(cost), bounds=bounds)
    if res.x is None:
        return math.ceil(sum(demand.values()) / 7)
    return math.ceil(float(np.sum(res.x[: len(layouts)])) - 1e-6)


def _milp(
    model: GpuModel,
    demand: Mapping[str, int],
    *,
    gpus: int,
    time_limit: float,
    lb: int | None = None,
    exact: bool = False,
) -> PackResult:
    cost, cons, integ, bounds, pairs, layouts = _build(model, demand, gpus, exact=exact)
    if lb is None:
        lb = lp_lower_bound(model, demand, gpus=gpus, exact=exact)
    res = milp(
        cost,
        constraints=cons,
        integrality=integ,
        bounds=bounds,
        options={"time_limit": max(0.05, time_limit), "mip_rel_gap": 1e-6},
    )
    if res.status == 2 or (res.x is None and res.status != 1):
        return PackResult((), {}, "milp", "infeasible", lb)
    if res.x is None:
        return PackResult((), {}, "milp", "time-limit", lb)
    status = "optimal" if res.status == 0 else "time-limit"
    x = np.round(res.x[: len(layouts)])
    # With x fixed the rest is a transportation problem: its LP vertex is integral. Re-solving it
    # removes any fractional z a time-limited MILP may have left behind.
    z = res.x[len(layouts) :]
    if not np.allclose(z, np.round(z), atol=1e-6):
        fixed = Bounds(
            np.concatenate([x, np.zeros(len(pairs))]), np.concatenate([x, np.full(len(pairs), np.inf)])
        )
        lp = milp(cost, constraints=cons, integrality=np.zeros_like(cost), bounds=fixed)
        if lp.x is None:
            return PackResult((), {}, "milp", "time-limit", lb)
        z = lp.x[len(layouts) :]
    chosen: list[Layout] = []
    for i, lay in enumerate(layouts):
        chosen += [lay] * int(x[i])
    serve: Counter[tuple[str, str]] = Counter()
    for j, pair in enumerate(pairs):
        n = round(z[j])
        if n:
            serve[pair] += n
    _repair(model, demand, chosen, serve, exact=exact)
    return PackResult(tuple(chosen), dict(serve), "milp", status, lb)


def _repair(
    model: GpuModel,
    demand: Mapping[str, int],
    chosen: Sequence[Layout],
    serve: Counter[tuple[str, str]],
    *,
    exact: bool = False,
) -> None:
    """Make ``serve`` match ``demand`` exactly after rounding (a no-op at an integral vertex)."""
    for k, d in demand.items():
        have = sum(n for (kk, _q), n in serve.items() if kk == k)
        kp = model.profile(k)
        assert kp is not None
        while have > d:
            key = next(p for p in serve if p[0] == k and serve[p] > 0)
            serve[key] -= 1
            have -= 1
        while have < d:
            slots: Counter[str] = Counter()
            for lay in chosen:
                for name, n in lay:
                    slots[name] += n
            for (_k, q), n in serve.items():
                slots[q] -= n
            free = [q for q in serving(model, k, exact=exact) if slots[q.name] > 0]
            if not free:
                raise RuntimeError(f"rounding left class {k} unserved")
            best = min(free, key=lambda q: (q.compute_slices, q.memory_slices))
            serve[(k, best.name)] += 1
            have += 1


def pack_uniform(model: GpuModel, demand: Mapping[str, int], *, gpus: int) -> PackResult:
    """Every GPU carries the same single profile: try each, keep the fewest GPUs, then least waste."""
    best: tuple[tuple[int, int], PackResult] | None = None
    total = sum(demand.values())
    for q in plain_profiles(model):
        if not all((kp := model.profile(k)) is not None and dominates(q, kp) for k in demand):
            continue
        per_gpu = max(n for n in range(1, q.max_count + 1) if fits(model, {q.name: n}))
        need = math.ceil(total / per_gpu)
        if need > gpus:
            continue
        waste = sum(v * (q.compute_slices - size(model, k)) for k, v in demand.items())
        res = PackResult(
            tuple(as_layout({q.name: per_gpu}) for _ in range(need)),
            {(k, q.name): v for k, v in demand.items()},
            "uniform",
            "optimal",
            need,
        )
        if best is None or (need, waste) < best[0]:
            best = ((need, waste), res)
    if best is None:
        return PackResult((), {}, "uniform", "infeasible", 0)
    return best[1]


@lru_cache(maxsize=65536)
def fits_layout(model: GpuModel, layout: Layout) -> bool:
    """:func:`mig_geometry.placement.fits`, memoised: a model has at most a few hundred layouts."""
    return fits(model, dict(layout))


@lru_cache(maxsize=65536)
def _plus(layout: Layout, name: str) -> Layout:
    counts = dict(layout)
    counts[name] = counts.get(name, 0) + 1
    return as_layout(counts)


def complete(model: GpuModel, counts: Mapping[str, int]) -> dict[str, int]:
    """Add instances (smallest first, as the MILP's tie-break does) until nothing else fits, so spare
    capacity stays schedulable as the most devices."""
    return dict(_completed(model, as_layout(dict(counts))))


@lru_cache(maxsize=65536)
def _completed(model: GpuModel, layout: Layout) -> Layout:
    """:func:`complete` of one layout, memoised: a fleet completes the same few layouts many times."""
    order = sorted(plain_profiles(model), key=lambda p: (p.compute_slices, p.memory_slices))
    changed = True
    while changed:
        changed = False
        for q in order:
            trial = _plus(layout, q.name)
            if fits_layout(model, trial):
                layout = trial
                changed = True
                break
    return layout


def pack_greedy(model: GpuModel, demand: Mapping[str, int], *, gpus: int) -> PackResult:
    """Best-fit decreasing: each device (largest first) joins the fullest open GPU it fits on, else
    opens a new one. GPUs are tracked by layout, so a step costs O(distinct layouts), not O(GPUs)."""
    items = sorted((k for k, v in demand.items() for _ in range(v)), key=lambda k: (-size(model, k), k))
    open_gpus: Counter[Layout] = Counter()
    opened = 0
    for k in items:
        best: Layout | None = None
        best_key: tuple[int, Layout] | None = None
        for sig, n in open_gpus.items():
            if n <= 0 or not fits_layout(model, _plus(sig, k)):
                continue
            key = (-sum(size(model, name) * c for name, c in sig), sig)
            if best_key is None or key < best_key:
                best, best_key = sig, key
        if best is None:
            if opened >= gpus:
                return PackResult((), {}, "greedy", "infeasible", 0)
            opened += 1
            open_gpus[as_layout({k: 1})] += 1
        else:
            open_gpus[best] -= 1
            open_gpus[_plus(best, k)] += 1
    layouts: list[Layout] = []
    for sig, n in sorted(open_gpus.items()):
        layouts += [as_layout(complete(model, dict(sig)))] * n
    serve = {(k, k): v for k, v in demand.items() if v > 0}
    return PackResult(tuple(layouts), serve, "greedy", "heuristic", 0)
