"""An independent exact answer to the fleet's GPU count when pods may move (``--allow-moves``): one
MILP over every pool GPU of the fleet by placement position (each instance a profile at one of its
allowed starts, memory slices disjoint, compute within the GPU), every device on a slot of a profile
covering its class (or, ``exact``, of its class itself), fewest GPUs holding devices.

It shares nothing with :mod:`rightsizer.optimise` but the geometry catalogue and each device's class;
small fleets only (a column per GPU × profile × start and per device × GPU × profile).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from mig_geometry.catalogue import GpuModel


def fewest_gpus(model: GpuModel, gpus: int, classes: Sequence[str], *, exact: bool = False) -> int:
    """Fewest of ``gpus`` GPUs of ``model`` that hold devices of ``classes`` (one entry per device)."""
    profs = [p for p in model.profiles if not p.media_extensions]
    cols: list[float] = []

    def var(upper: float = 1) -> int:
        cols.append(upper)
        return len(cols) - 1

    x = {(g, q.name, s): var() for g in range(gpus) for q in profs for s in q.starts}
    used = {g: var() for g in range(gpus)}
    a: dict[tuple[int, int, str], int] = {}
    for i, k in enumerate(classes):
        kp = model.profile(k)
        assert kp is not None, k
        for g in range(gpus):
            for q in profs:
                fits = (
                    q == kp
                    if exact
                    else q.compute_slices >= kp.compute_slices and q.memory_slices >= kp.memory_slices
                )
                if fits:
                    a[(i, g, q.name)] = var()
    rows: list[dict[int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(coef: dict[int, float], low: float, high: float) -> None:
        rows.append(coef)
        lo.append(low)
        hi.append(high)

    for g in range(gpus):
        for j in range(model.memory_slices):
            row(
                {x[(g, q.name, s)]: 1.0 for q in profs for s in q.starts if s <= j < s + q.memory_slices},
                -np.inf,
                1,
            )
        row(
            {x[(g, q.name, s)]: float(q.compute_slices) for q in profs for s in q.starts},
            -np.inf,
            model.compute_slices,
        )
        for q in profs:
            served = {v: 1.0 for (_i, gg, qq), v in a.items() if gg == g and qq == q.name}
            if served:
                row({**served, **{x[(g, q.name, s)]: -1.0 for s in q.starts}}, -np.inf, 0)
        # A GPU holds devices only when it counts as used (at most 7 devices on one GPU).
        held = {v: 1.0 for (_i, gg, _q), v in a.items() if gg == g}
        if held:
            row({**held, used[g]: -7.0}, -np.inf, 0)
    for i in range(len(classes)):
        row({v: 1.0 for (ii, _g, _q), v in a.items() if ii == i}, 1, 1)
    # GPUs used in order: the answers differ only by which GPU is which.
    for g in range(1, gpus):
        row({used[g]: 1.0, used[g - 1]: -1.0}, -np.inf, 0)
    r, c, v = [], [], []
    for n, coef in enumerate(rows):
        for j, val in coef.items():
            r.append(n)
            c.append(j)
            v.append(val)
    cost = np.zeros(len(cols))
    for col in used.values():
        cost[col] = 1.0
    res = milp(
        cost,
        constraints=[LinearConstraint(coo_array((v, (r, c)), shape=(len(rows), len(cols))), lo, hi)],
        integrality=np.ones(len(cols)),
        bounds=Bounds(np.zeros(len(cols)), np.array(cols)),
    )
    assert res.status == 0, res.message
    return round(float(res.fun))
