"""Demand before replicas: the load the service was offered, recovered from what its pods did.

The per-pod series in history were shaped by the HPA being replaced (fewer replicas, longer queues),
so they cannot be replayed as they are. Per step, summed over the Ready pods::

    demand = served requests/s + rejected requests/s + growth of the queued requests per second

(the queue's growth by a centred difference over two steps). Steps where requests were rejected or
the queue grew faster than 5 % of the served rate (saturated), or the HPA stood at ``maxReplicas``,
are **lower bounds** of demand: clients that gave up without being counted are not in any series.

The start-up delay (creation → Ready) is measured where the recorded replica count rose: the time
until as many pods published a value; the median over those scale-ups. The per-replica capacity is
the 90th percentile of the served rate per Ready pod over the saturated steps (at least :data:`MIN_SATURATED` of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MIN_SATURATED = 20
GROWTH_SHARE = 0.05


@dataclass(frozen=True)
class Demand:
    offered: Array
    """Requests/s offered to the service at each step."""
    saturated: npt.NDArray[np.bool_]
    censored: npt.NDArray[np.bool_]
    """Saturated or at maxReplicas: demand is a lower bound there."""
    per_replica: Array
    """Demand per Ready pod (NaN where none was Ready)."""
    capacity: float | None
    """Requests/s one Ready replica serves at saturation; None when history never saturated it."""
    saturated_steps: int


def recover(
    *,
    step: float,
    served: Array,
    rejected: Array | None,
    queued: Array | None,
    ready: IntArray,
    recorded: IntArray,
    max_replicas: int,
) -> Demand:
    growth = np.zeros_like(served)
    if queued is not None and len(queued) > 2:
        growth = np.gradient(queued, step)
    rejected_rate = rejected if rejected is not None else np.zeros_like(served)
    offered = np.maximum(served + rejected_rate + growth, 0.0)
    saturated = (rejected_rate > 1e-9) | (growth > GROWTH_SHARE * np.maximum(served, 1e-9))
    censored = saturated | (recorded >= max_replicas)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_replica = np.where(ready > 0, offered / np.maximum(ready, 1), np.nan)
        served_per = np.where(ready > 0, served / np.maximum(ready, 1), np.nan)
    usable = saturated & np.isfinite(served_per)
    # a replica serves its capacity while saturated; steps flagged by a noisy queue serve less
    capacity = float(np.quantile(served_per[usable], 0.9)) if usable.sum() >= MIN_SATURATED else None
    return Demand(offered, saturated, censored, per_replica, capacity, int(usable.sum()))


def startup_delay(times: Array, recorded: IntArray, ready: IntArray) -> tuple[float | None, int]:
    """Median seconds from a rise of the recorded replicas to as many Ready pods, and how many
    rises were measured (a rise undone before its pods were Ready is skipped)."""
    delays: list[float] = []
    n = len(times)
    for i in range(1, n):
        want = int(recorded[i])
        if want <= recorded[i - 1]:
            continue
        for j in range(i, n):
            if recorded[j] < want:
                break
            if ready[j] >= want:
                delays.append(float(times[j] - times[i]))
                break
    if not delays:
        return None, 0
    return float(np.median(delays)), len(delays)
