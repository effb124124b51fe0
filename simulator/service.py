"""An autoscaled inference service: offered load → the HPA's decision every 15 s → ready pods →
per-pod queue depth, queue wait, KV-cache use, served and rejected requests.

The load is a pure function of (seed, service, time): a cosine day on weekdays, a share of it on
weekends, bursts at seed-chosen times with two-minute ramps, and relative noise per 15-second step.

The replicas are not: they are what the HPA decided from what the pods published. The controller is
:func:`hpa_controller.decide.decide` (Kubernetes v1.35's decision: tolerance, stabilisation, policies,
missing and unready pods), run every :data:`SYNC_S` seconds. To stay a pure function of time, the
run restarts every week, on Monday 00:00 UTC, after a warm-up of :data:`WARMUP_S` from
``minReplicas`` ready pods: each week is one run, the same for the live endpoint, the backfill and a
re-simulation; at a week's start its pods (created in the warm-up) replace the previous week's.

Each step, with ``n`` ready pods serving ``μ`` requests/s each (fluid model, per step):

* arrivals ``λ·dt`` join the backlog; ``min(backlog, n·μ·dt)`` are served; what exceeds
  ``max_queue`` per ready pod is rejected;
* utilisation ``ρ = λ / (n·μ)`` (capped at :data:`RHO_MAX` in the curves below); a replica runs
  ``slots`` requests at once (continuous batching), so it queues as an M/M/c server with
  ``c = slots``: ``C`` = Erlang C's probability of waiting;
* per pod, waiting requests = ``C·ρ/(1-ρ)`` + backlog ÷ n;
* queue-wait quantile q = ``ln(C/(1-q))/(μ(1-ρ))`` (0 when C ≤ 1-q) + backlog ÷ (n·μ);
* KV-cache use = ``0.05 + 0.9·ρ`` (the share of slots busy) + up to 0.04 more with backlog, at most 0.99;
* each pod's gauges carry ±:data:`POD_NOISE` relative noise of their own.

Pods start ``startup`` seconds before they are Ready and publish nothing until then (the HPA counts
them as pods without a value, as it does a loading model server). A scale-down removes unready pods
first, then the newest (as the ReplicaSet controller ranks them).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hpa_controller import decide as hpa
from hpa_controller.calc import PodState
from simulator import identity, patterns
from simulator.model import Service
from simulator.patterns import Array

SYNC_S = 15.0
"""The HPA controller's sync period (``--horizontal-pod-autoscaler-sync-period``)."""
DAY_S = 86400.0
WEEK_S = 7 * DAY_S
WARMUP_S = 6 * 3600.0
"""Each week's run starts this long before Monday 00:00 UTC (longer than any stabilisation window)."""
MONDAY_ORIGIN = 4 * DAY_S
"""1970-01-05T00:00:00Z, a Monday: weeks start at MONDAY_ORIGIN + k·WEEK_S."""
BURST_RAMP_S = 120.0
RHO_MAX = 0.97
POD_NOISE = 0.05
METRICS = ("inference_queue_depth", "inference_kv_cache_usage_ratio", "inference_requests_per_second")
"""Per-pod metrics a service's HPA may scale on (``inference_requests_per_second``: served rate)."""

IntArray = npt.NDArray[np.int64]


def offered(service: Service, seed: int, t: Array) -> Array:
    """Offered requests per second at each time in ``t``."""
    load = service.load
    phase = 2.0 * math.pi * (t / DAY_S - load.peak_hour / 24.0)
    daily = load.base + (load.peak - load.base) * (0.5 + 0.5 * np.cos(phase))
    weekday = np.floor((t - MONDAY_ORIGIN) / DAY_S).astype(np.int64) % 7
    value = daily * np.where(weekday >= 5, load.weekend, 1.0)
    if load.bursts_per_day and load.burst_height:
        value = value * (1.0 + load.burst_height * bursts(service, seed, t))
    if load.noise:
        value = value * (1.0 + load.noise * patterns.noise(seed, f"{_key(service)}:load", t))
    return np.asarray(np.maximum(value, 0.0), dtype=np.float64)


def bursts(service: Service, seed: int, t: Array) -> Array:
    """0..1 per time: how far into a burst (ramps of :data:`BURST_RAMP_S` either side)."""
    load = service.load
    day = np.floor(t / DAY_S).astype(np.int64)
    span = load.burst_duration + 2 * BURST_RAMP_S
    room = max(DAY_S - span, 0.0)
    out = np.zeros_like(t)
    for k in range(load.bursts_per_day):
        start = day * DAY_S + patterns.uniform(seed, f"{_key(service)}:burst{k}", day) * room
        x = t - start
        shape = np.clip(np.minimum(x, span - x) / BURST_RAMP_S, 0.0, 1.0)
        out = np.maximum(out, shape)
    return out


def _key(service: Service) -> str:
    return f"{service.namespace}/{service.deployment}"


def week_start(t: float) -> float:
    """Monday 00:00 UTC at or before ``t``."""
    return MONDAY_ORIGIN + math.floor((t - MONDAY_ORIGIN) / WEEK_S) * WEEK_S


@dataclass(frozen=True)
class PodLife:
    name: str
    slot: int
    """Which row of the per-pod noise it uses (its index among the pods when it was created)."""
    created: float
    ready_at: float
    deleted: float
    """The decision that removed it; the week's end when it lived to it."""


@dataclass(frozen=True)
class Week:
    """One week's run, one entry per step of :data:`SYNC_S` from ``start`` (Monday 00:00 UTC).

    Step ``i`` covers ``[start + i·SYNC_S, start + (i+1)·SYNC_S)``: the HPA decided at its start
    (``spec``), then the pods alive after that decision served it."""

    start: float
    offered: Array
    spec: IntArray
    ready: IntArray
    served: Array
    """Requests/s per ready pod."""
    rejected: Array
    """Requests/s per ready pod."""
    queue: Array
    wait_p50: Array
    wait_p95: Array
    kv: Array
    pods: tuple[PodLife, ...]
    slot_noise: Array
    """[slot, step] uniform noise in [-1, 1)."""

    @property
    def steps(self) -> int:
        return len(self.spec)

    def index(self, t: Array) -> IntArray:
        """Step of each time (−1 outside the week)."""
        i = np.floor((t - self.start) / SYNC_S + 1e-9).astype(np.int64)
        return np.where((i >= 0) & (i < self.steps), i, -1)

    @functools.cached_property
    def served_cumulative(self) -> Array:
        """Requests served per ready pod before each step (for the counters)."""
        return np.concatenate(([0.0], np.cumsum(self.served * SYNC_S)))

    @functools.cached_property
    def rejected_cumulative(self) -> Array:
        return np.concatenate(([0.0], np.cumsum(self.rejected * SYNC_S)))


@dataclass
class _Pod:
    name: str
    slot: int
    created: float
    ready_at: float


def erlang_c(slots: int, rho: float) -> float:
    """Probability that a request waits (Erlang C) with ``slots`` servers at utilisation ``rho`` < 1."""
    a = slots * rho
    b = 1.0
    for k in range(1, slots + 1):  # Erlang B by recursion: stable for any number of slots
        b = a * b / (k + a * b)
    return slots * b / (slots - a * (1.0 - b))


def _curves(
    rho: float, backlog_per_pod: float, mu: float, max_queue: float, slots: int
) -> tuple[float, float, float, float]:
    """(queue, wait p50, wait p95, kv) per pod at utilisation ``rho`` with a backlog."""
    r = min(max(rho, 0.0), RHO_MAX)
    waits = erlang_c(slots, r) if r > 0 else 0.0
    drain = backlog_per_pod / mu
    queue = waits * r / (1.0 - r) + backlog_per_pod
    p50 = (math.log(waits / 0.5) / (mu * (1.0 - r)) if waits > 0.5 else 0.0) + drain
    p95 = (math.log(waits / 0.05) / (mu * (1.0 - r)) if waits > 0.05 else 0.0) + drain
    kv = min(0.99, 0.05 + 0.9 * r + 0.04 * min(1.0, backlog_per_pod / max_queue))
    return queue, p50, p95, kv


def simulate(
    service: Service,
    seed: int,
    *,
    start: float,
    steps: int,
    model: hpa.HpaModel | None = None,
    warmup: float = WARMUP_S,
) -> Week:
    """The service over ``steps`` steps from ``start``, after ``warmup`` seconds of warm-up from
    ``minReplicas`` ready pods; ``model`` replaces the scenario's HPA (a what-if re-simulation)."""
    run = _Run(service, seed, start=start, steps=steps, model=model or service.hpa, warmup=warmup)
    for i in range(len(run.times)):
        if i:  # the HPA reads what the pods published in the step before
            run.decide(i)
        run.serve(i)
    return run.week()


class _Run:
    """One run of a service: its pods, the controller's memory and the backlog, step by step."""

    def __init__(
        self, service: Service, seed: int, *, start: float, steps: int, model: hpa.HpaModel, warmup: float
    ) -> None:
        self.service, self.seed, self.start, self.steps, self.model = service, seed, start, steps, model
        total = steps + round(warmup / SYNC_S)
        t0 = start - warmup
        self.times = t0 + SYNC_S * np.arange(total, dtype=np.float64)
        self.lam = offered(service, seed, self.times)
        self.noise = _slot_noise(service, seed, self.times)
        self.week_no = round((start - MONDAY_ORIGIN) / WEEK_S)
        self.made = 0
        self.pods = [self._new(t0 - service.startup, i, t0) for i in range(max(model.min_replicas, 1))]
        self.lives: list[PodLife] = []
        self.history = hpa.History()
        self.backlog = 0.0
        self.spec = np.zeros(total, dtype=np.int64)
        self.ready = np.zeros(total, dtype=np.int64)
        self.out = {k: np.zeros(total) for k in ("served", "rejected", "queue", "p50", "p95", "kv")}
        self.published: dict[str, tuple[float, ...]] = {}
        """Each Ready pod's values of the HPA's metrics in the last step."""

    def _new(self, at: float, slot: int, ready_at: float) -> _Pod:
        self.made += 1
        s = self.service
        name = identity.service_pod_name(self.seed, s.namespace, s.deployment, self.week_no, self.made)
        return _Pod(name, slot, at, ready_at)

    def decide(self, i: int) -> None:
        t = float(self.times[i])
        pods, model = self.pods, self.model
        states = [PodState(p.name, ready=p.ready_at <= t) for p in pods]
        observations = [
            hpa.Observation(per_pod={n: v[j] for n, v in self.published.items()})
            for j in range(len(model.metrics))
        ]
        d = hpa.decide(
            model,
            spec_replicas=len(pods),
            pods=states,
            observations=observations,
            history=self.history,
            now=t,
        )
        self.history = d.history
        if d.final > len(pods):
            taken = {p.slot for p in pods}
            free = [s for s in range(max(model.max_replicas, 1)) if s not in taken]
            self.pods += [self._new(t, free[k], t + self.service.startup) for k in range(d.final - len(pods))]
        elif d.final < len(pods):
            order = sorted(pods, key=lambda p: (p.ready_at <= t, -p.created, p.name))
            gone = {p.name for p in order[: len(pods) - d.final]}
            self.lives += [
                PodLife(p.name, p.slot, p.created, p.ready_at, t)
                for p in pods
                if p.name in gone and t >= self.start
            ]
            self.pods = [p for p in pods if p.name not in gone]

    def serve(self, i: int) -> None:
        s = self.service
        t = float(self.times[i])
        self.spec[i] = len(self.pods)
        ready = [p for p in self.pods if p.ready_at <= t]
        n = len(ready)
        self.ready[i] = n
        work = self.backlog + float(self.lam[i]) * SYNC_S
        served = min(work, n * s.capacity * SYNC_S)
        self.backlog = work - served
        rejected = max(0.0, self.backlog - n * s.max_queue) if n else self.backlog
        self.backlog -= rejected
        self.published = {}
        if not n:
            return
        rho = float(self.lam[i]) / (n * s.capacity)
        queue, p50, p95, kv = _curves(rho, self.backlog / n, s.capacity, s.max_queue, s.slots)
        per_pod = served / SYNC_S / n
        base = {
            "inference_queue_depth": queue,
            "inference_kv_cache_usage_ratio": kv,
            "inference_requests_per_second": per_pod,
        }
        for p in ready:
            u = float(self.noise(p.slot)[i])
            self.published[p.name] = tuple(pod_value(m.name, base[m.name], u) for m in self.model.metrics)
        out = self.out
        out["queue"][i], out["p50"][i], out["p95"][i], out["kv"][i] = queue, p50, p95, kv
        out["served"][i], out["rejected"][i] = per_pod, rejected / SYNC_S / n

    def week(self) -> Week:
        end = self.start + self.steps * SYNC_S
        lives = self.lives + [PodLife(p.name, p.slot, p.created, p.ready_at, end) for p in self.pods]
        w = len(self.times) - self.steps
        out = self.out
        return Week(
            start=self.start,
            offered=self.lam[w:],
            spec=self.spec[w:],
            ready=self.ready[w:],
            served=out["served"][w:],
            rejected=out["rejected"][w:],
            queue=out["queue"][w:],
            wait_p50=out["p50"][w:],
            wait_p95=out["p95"][w:],
            kv=out["kv"][w:],
            pods=tuple(sorted(lives, key=lambda p: (p.created, p.name))),
            slot_noise=np.stack(
                [self.noise(k)[w:] for k in range(1 + max((p.slot for p in lives), default=0))]
            ),
        )


def pod_value(metric: str, base: float, u: float) -> float:
    """A pod's own value of a per-pod gauge: the service's ``base`` with the pod's noise ``u`` in
    [-1, 1) (none on the served rate, whose sum over pods is what was served)."""
    if metric == "inference_requests_per_second":
        return base
    value = base * (1.0 + POD_NOISE * u)
    return min(value, 1.0) if metric == "inference_kv_cache_usage_ratio" else value


def pod_values(metric: str, base: Array, u: Array) -> Array:
    """:func:`pod_value` over arrays."""
    if metric == "inference_requests_per_second":
        return base
    value = base * (1.0 + POD_NOISE * u)
    return np.minimum(value, 1.0) if metric == "inference_kv_cache_usage_ratio" else value


def _slot_noise(service: Service, seed: int, times: Array) -> functools._lru_cache_wrapper[Array]:
    """Noise in [-1, 1) per step for a pod slot, computed on first use."""
    steps = np.floor(times / SYNC_S).astype(np.int64)

    @functools.cache
    def row(slot: int) -> Array:
        return patterns.uniform(seed, f"{_key(service)}:pod{slot}", steps) * 2.0 - 1.0

    return row


@functools.lru_cache(maxsize=8)
def week(service: Service, seed: int, start: float) -> Week:
    """The week's run that starts on Monday ``start`` (cached: a few seconds of the controller's
    decisions)."""
    return simulate(service, seed, start=start, steps=int(WEEK_S / SYNC_S))


def weeks_between(t0: float, t1: float) -> list[float]:
    """The Mondays of the weeks that hold a moment of ``[t0, t1]``."""
    out = []
    w = week_start(t0)
    while w <= t1:
        out.append(w)
        w += WEEK_S
    return out


def replica_seconds(spec: Sequence[int] | IntArray) -> float:
    return float(np.sum(np.asarray(spec))) * SYNC_S
