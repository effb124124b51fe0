"""One metric → one replica proposal, as ``replica_calculator.go`` of Kubernetes v1.35 computes it.

Pure functions over plain values. Every value and target is an int64 **milli-unit** (the controller's
``MilliValue()``), averages are integer divisions (they truncate), ratios and tolerances are float64.

* Pods (AverageValue), and Resource AverageValue: ``calcPlainMetricReplicas``.
* Resource Utilization: ``GetResourceReplicas`` (usage ÷ requests, in whole percent).
* Object/External Value: ``getUsageRatioReplicaCount`` (× Running+Ready pods; from zero: ``ceil(ratio)``).
* Object/External AverageValue: ``Get*PerPodMetricReplicas`` (÷ the scale's status replicas).

Pod grouping (``groupPods``): deleted and Failed pods are ignored; Pending pods are unready; pods
without a value are missing; for CPU only, a Running pod counts as unready while it initialises
(no Ready condition or start time, or still inside the CPU initialisation period with the Ready
condition False or too new for one metric window, or never ready since start). Unready pods count as
0 only when scaling up; missing pods as 100 % of target below ratio 1.0 and 0 above; at exactly 1.0
nothing is filled in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

INT32_MAX = 2**31 - 1
CPU_INITIALIZATION_PERIOD = 300.0
"""``--horizontal-pod-autoscaler-cpu-initialization-period`` default (5 min)."""
INITIAL_READINESS_DELAY = 30.0
"""``--horizontal-pod-autoscaler-initial-readiness-delay`` default (30 s)."""


@dataclass(frozen=True)
class Tolerances:
    """No change while ``1 - down <= ratio <= 1 + up`` (``--horizontal-pod-autoscaler-tolerance`` 0.1,
    or ``behavior.scale{Up,Down}.tolerance``)."""

    down: float = 0.1
    up: float = 0.1

    def within(self, ratio: float) -> bool:
        return (1.0 - self.down) <= ratio <= (1.0 + self.up)


@dataclass(frozen=True)
class PodState:
    name: str
    phase: str = "Running"
    ready: bool = True
    """The Ready condition's status (True)."""
    deleting: bool = False
    """``metadata.deletionTimestamp`` is set."""
    start_time: float | None = None
    """``status.startTime`` (Unix seconds); None = unknown (the CPU initialisation check is skipped)."""
    ready_transition: float | None = None
    """The Ready condition's ``lastTransitionTime``; None = unknown."""
    has_ready_condition: bool = True
    requests: Mapping[str, int] = field(default_factory=dict)
    """Resource requests in milli-units, summed over containers (``cpu``, ``memory``), and per
    container as ``CONTAINER/RESOURCE`` for ContainerResource metrics."""


class MetricUnavailable(ValueError):
    """The controller records this metric as failed (it blocks scale-down, not scale-up)."""


@dataclass(frozen=True)
class Proposal:
    replicas: int
    usage: int
    """What the HPA reports as current, milli-units (average per pod, or the object's value)."""
    ratio: float
    utilization: int | None = None
    """Whole percent of requests (Resource Utilization only)."""
    counted: int = 0
    missing: tuple[str, ...] = ()
    unready: tuple[str, ...] = ()
    note: str = ""


def _ceil_int32(x: float) -> int:
    return INT32_MAX if x > INT32_MAX else math.ceil(x)


def group_pods(
    pods: Sequence[PodState],
    metrics: Mapping[str, int],
    *,
    resource: str = "",
    now: float = 0.0,
    metric_time: float | None = None,
    metric_window: float = 60.0,
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY,
) -> tuple[int, set[str], set[str], set[str]]:
    """(ready count, unready, missing, ignored) as ``groupPods``."""
    ready, unready, missing, ignored = 0, set(), set(), set()
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            unready.add(pod.name)
            continue
        if pod.name not in metrics:
            missing.add(pod.name)
            continue
        if resource == "cpu" and _cpu_unready(
            pod,
            now=now,
            metric_time=metric_time if metric_time is not None else now,
            metric_window=metric_window,
            init_period=cpu_initialization_period,
            readiness_delay=initial_readiness_delay,
        ):
            unready.add(pod.name)
            continue
        ready += 1
    return ready, unready, missing, ignored


def _cpu_unready(
    pod: PodState,
    *,
    now: float,
    metric_time: float,
    metric_window: float,
    init_period: float,
    readiness_delay: float,
) -> bool:
    if not pod.has_ready_condition:
        return True
    if pod.start_time is None:  # unknown start: trust the Ready condition
        return not pod.ready
    transition = pod.ready_transition if pod.ready_transition is not None else pod.start_time
    if pod.start_time + init_period > now:
        return (not pod.ready) or metric_time < transition + metric_window
    return (not pod.ready) and pod.start_time + readiness_delay > transition


def _counted_values(
    pods: Sequence[PodState],
    metrics: Mapping[str, int],
    *,
    resource: str,
    now: float,
    metric_time: float | None,
    metric_window: float,
    cpu_initialization_period: float,
    initial_readiness_delay: float,
) -> tuple[dict[str, int], int, set[str], set[str]]:
    """(values of the pods that count, ready count, unready, missing), as both replica calculations
    start: no pods or no value left after dropping ignored and unready pods is :class:`MetricUnavailable`."""
    if not pods:
        raise MetricUnavailable("no pods returned by selector while calculating replica count")
    values = dict(metrics)
    ready, unready, missing, ignored = group_pods(
        pods,
        values,
        resource=resource,
        now=now,
        metric_time=metric_time,
        metric_window=metric_window,
        cpu_initialization_period=cpu_initialization_period,
        initial_readiness_delay=initial_readiness_delay,
    )
    for name in ignored | unready:
        values.pop(name, None)
    if not values:
        raise MetricUnavailable("did not receive metrics for targeted pods (pods might be unready)")
    return values, ready, unready, missing


def plain_metric_replicas(
    *,
    current: int,
    target: int,
    metrics: Mapping[str, int],
    pods: Sequence[PodState],
    tolerances: Tolerances,
    resource: str = "",
    now: float = 0.0,
    metric_time: float | None = None,
    metric_window: float = 60.0,
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY,
) -> Proposal:
    """Pods metric (AverageValue), or Resource with an AverageValue target (``resource`` set)."""
    values, ready, unready, missing = _counted_values(
        pods,
        metrics,
        resource=resource,
        now=now,
        metric_time=metric_time,
        metric_window=metric_window,
        cpu_initialization_period=cpu_initialization_period,
        initial_readiness_delay=initial_readiness_delay,
    )
    usage = sum(values.values()) // len(values)
    ratio = usage / target
    up_with_unready = bool(unready) and ratio > 1.0

    def mk(replicas: int, note: str = "") -> Proposal:
        return Proposal(
            replicas, usage, ratio, None, ready, tuple(sorted(missing)), tuple(sorted(unready)), note
        )

    if not up_with_unready and not missing:
        if tolerances.within(ratio):
            return mk(current, "within tolerance")
        return mk(math.ceil(ratio * ready))
    notes = []
    if missing and ratio < 1.0:
        values.update(dict.fromkeys(missing, target))
        notes.append(f"{len(missing)} pod(s) without a value counted as 100 % of target")
    elif missing and ratio > 1.0:
        values.update(dict.fromkeys(missing, 0))
        notes.append(f"{len(missing)} pod(s) without a value counted as 0")
    elif missing:
        notes.append(f"{len(missing)} pod(s) without a value; ratio exactly 1.0: none filled in")
    if up_with_unready:
        values.update(dict.fromkeys(unready, 0))
        notes.append(f"{len(unready)} unready pod(s) counted as 0")
    new_ratio = (sum(values.values()) // len(values)) / target
    how = "; ".join(notes)
    if tolerances.within(new_ratio) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return mk(current, f"{how}; rebalanced ratio {new_ratio:.3f} → no change")
    replicas = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return mk(current, f"{how}; would move the other way → no change")
    return mk(replicas, how)


def utilization_replicas(
    *,
    current: int,
    target_percent: int,
    metrics: Mapping[str, int],
    pods: Sequence[PodState],
    tolerances: Tolerances,
    resource: str,
    request_key: str = "",
    now: float = 0.0,
    metric_time: float | None = None,
    metric_window: float = 60.0,
    cpu_initialization_period: float = CPU_INITIALIZATION_PERIOD,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY,
) -> Proposal:
    """Resource (or ContainerResource, ``request_key`` = ``container/resource``) Utilization target."""
    values, ready, unready, missing = _counted_values(
        pods,
        metrics,
        resource=resource,
        now=now,
        metric_time=metric_time,
        metric_window=metric_window,
        cpu_initialization_period=cpu_initialization_period,
        initial_readiness_delay=initial_readiness_delay,
    )
    key = request_key or resource
    requests: dict[str, int] = {}
    for pod in pods:
        if key not in pod.requests:
            raise MetricUnavailable(f"missing request for {resource} in pod {pod.name}")
        requests[pod.name] = pod.requests[key]
    ratio, utilization, raw = _utilization(values, requests, target_percent)

    def mk(replicas: int, note: str = "") -> Proposal:
        return Proposal(
            replicas, raw, ratio, utilization, ready, tuple(sorted(missing)), tuple(sorted(unready)), note
        )

    up_with_unready = bool(unready) and ratio > 1.0
    if not up_with_unready and not missing:
        if tolerances.within(ratio):
            return mk(current, "within tolerance")
        return mk(math.ceil(ratio * ready))
    if missing and ratio < 1.0:
        fallback = max(100, target_percent)
        values.update({n: requests[n] * fallback // 100 for n in missing})
    elif missing and ratio > 1.0:
        values.update(dict.fromkeys(missing, 0))
    if up_with_unready:
        values.update(dict.fromkeys(unready, 0))
    new_ratio, _, _ = _utilization(values, requests, target_percent)
    if tolerances.within(new_ratio) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return mk(current, f"rebalanced ratio {new_ratio:.3f} → no change")
    replicas = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return mk(current, "would move the other way → no change")
    return mk(replicas)


def _utilization(
    values: Mapping[str, int], requests: Mapping[str, int], target: int
) -> tuple[float, int, int]:
    total = requested = entries = 0
    for name, value in values.items():
        if name not in requests:  # values for pods outside the pod list are not counted
            continue
        total += value
        requested += requests[name]
        entries += 1
    if requested == 0:
        raise MetricUnavailable("no metrics returned matched known pods")
    utilization = (total * 100) // requested
    return utilization / target, utilization, total // entries


def ready_pod_count(pods: Sequence[PodState]) -> int:
    """Running and Ready pods — terminating ones included, as ``getReadyPodsCount`` counts them."""
    if not pods:
        raise MetricUnavailable("no pods returned by selector while calculating replica count")
    return sum(1 for p in pods if p.phase == "Running" and p.ready)


def value_replicas(
    *, current: int, target: int, value: int, pods: Sequence[PodState], tolerances: Tolerances
) -> Proposal:
    """Object or External metric with a Value target; ``value`` is the object's value or the sum of
    the external series."""
    ratio = value / target
    if current == 0:  # scale from zero: no tolerance, no pods
        return Proposal(math.ceil(ratio), value, ratio, note="from zero: ceil(ratio)")
    if tolerances.within(ratio):
        return Proposal(current, value, ratio, note="within tolerance")
    ready = ready_pod_count(pods)
    return Proposal(_ceil_int32(ratio * ready), value, ratio, counted=ready)


def average_value_replicas(
    *, status_replicas: int, target: int, value: int, tolerances: Tolerances
) -> Proposal:
    """Object or External metric with an AverageValue target: total ÷ target, checked per replica."""
    replicas = status_replicas
    ratio = value / (target * status_replicas) if status_replicas else math.inf
    if not tolerances.within(ratio):
        replicas = _ceil_int32(value / target)
    usage = math.ceil(value / status_replicas) if status_replicas else value
    return Proposal(replicas, usage, ratio, note="" if replicas != status_replicas else "within tolerance")


def external_sum(values: Sequence[int]) -> int:
    """Sum of the external series, capped at int64 max like the controller."""
    total = 0
    for v in values:
        total += v
    return min(total, 2**63 - 1)
