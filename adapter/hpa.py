"""The HorizontalPodAutoscaler's replica arithmetic (``replica_calculator.go`` and the controller's
normalisation), as pure functions over plain values, for ``explain-hpa``.

Per metric:

* Pods (AverageValue): average over pods with a value; ``desired = ceil(ratio × ready pods)``,
  unchanged inside the tolerance (|1 − ratio| ≤ 0.1). Pods without a value count as 100 % of the
  target when scaling down and as 0 when scaling up; Pending pods count as 0 when scaling up; if
  that rebalancing flips the direction or lands inside the tolerance, nothing changes.
* Object (Value): ``ceil(value / target × ready pods)``; Object and External AverageValue:
  ``ceil(value / target)``. External values are summed first.

Then: the largest proposal wins; if some metric failed no scale-down happens; ``behavior`` rate
limits apply (stabilisation windows need history and are reported, not simulated); min/max clamp.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TOLERANCE = 0.1


@dataclass(frozen=True)
class PodState:
    name: str
    phase: str = "Running"
    ready: bool = True
    deleting: bool = False


@dataclass(frozen=True)
class Proposal:
    replicas: int
    usage: float
    """What the HPA reports as the current value (average for Pods/AverageValue)."""
    ratio: float
    ready_pods: int = 0
    missing_pods: tuple[str, ...] = ()
    unready_pods: tuple[str, ...] = ()
    note: str = ""


class MetricUnavailable(ValueError):
    """The HPA would record this metric as failed (e.g. no values for any targeted pod)."""


def _ceil(x: float) -> int:
    # plain float64 ceil, as the controller's math.Ceil: 3.0000000000000004 gives 4 there too
    return math.ceil(x)


def pods_metric(
    *, current_replicas: int, target: float, values: Mapping[str, float], pods: Sequence[PodState] | None
) -> Proposal:
    """Pods metric with an AverageValue target (``calcPlainMetricReplicas``)."""
    if target <= 0:
        raise MetricUnavailable(f"target averageValue must be positive, got {target:g}")
    metrics = dict(values)
    ready = 0
    unready: list[str] = []
    missing: list[str] = []
    if pods is None:  # no pod source: every pod with a value is taken as ready
        ready = len(metrics)
    else:
        ignored: set[str] = set()
        for pod in pods:
            if pod.deleting or pod.phase == "Failed":
                ignored.add(pod.name)
            elif pod.phase == "Pending":
                unready.append(pod.name)
            elif pod.name not in metrics:
                missing.append(pod.name)
            else:
                ready += 1
        known = {p.name for p in pods}
        for name in list(metrics):
            if name in ignored or name in unready or name not in known:
                del metrics[name]
    if not metrics:
        raise MetricUnavailable(
            "no values for any of the targeted pods (the HPA reports FailedGetPodsMetric)"
        )
    usage = sum(metrics.values()) / len(metrics)
    ratio = usage / target
    scale_up_with_unready = bool(unready) and ratio > 1.0

    def mk(replicas: int, used_ratio: float, note: str = "") -> Proposal:
        return Proposal(replicas, usage, used_ratio, ready, tuple(missing), tuple(unready), note)

    if not scale_up_with_unready and not missing:
        if abs(1.0 - ratio) <= TOLERANCE:
            return mk(current_replicas, ratio, "within tolerance")
        return mk(_ceil(ratio * ready), ratio)
    if missing:
        fill = target if ratio < 1.0 else 0.0
        for name in missing:
            metrics[name] = fill
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0.0
    new_ratio = (sum(metrics.values()) / len(metrics)) / target
    how = (
        f"{len(missing)} pod(s) without a value counted as {'100 % of target' if ratio < 1.0 else '0'}"
        if missing
        else ""
    )
    if scale_up_with_unready:
        how = (how + "; " if how else "") + f"{len(unready)} pending pod(s) counted as 0"
    if abs(1.0 - new_ratio) <= TOLERANCE or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return mk(current_replicas, new_ratio, f"{how}; rebalanced ratio {new_ratio:.3f} → no change")
    replicas = _ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and replicas > current_replicas) or (new_ratio > 1.0 and replicas < current_replicas):
        return mk(current_replicas, new_ratio, f"{how}; would move the wrong way → no change")
    return mk(replicas, new_ratio, how)


def _ready_count(pods: Sequence[PodState] | None, current_replicas: int) -> int:
    if pods is None:
        return current_replicas
    return sum(1 for p in pods if p.phase == "Running" and p.ready and not p.deleting)


def value_metric(
    *, current_replicas: int, target: float, value: float, pods: Sequence[PodState] | None
) -> Proposal:
    """Object or External metric with a Value target (``getUsageRatioReplicaCount``)."""
    if target <= 0:
        raise MetricUnavailable(f"target value must be positive, got {target:g}")
    ratio = value / target
    if current_replicas == 0:
        return Proposal(_ceil(ratio), value, ratio)
    if abs(1.0 - ratio) <= TOLERANCE:
        return Proposal(current_replicas, value, ratio, note="within tolerance")
    ready = _ready_count(pods, current_replicas)
    return Proposal(_ceil(ratio * ready), value, ratio, ready_pods=ready)


def average_value_metric(*, current_replicas: int, target: float, value: float) -> Proposal:
    """Object or External metric with an AverageValue target: total ÷ target, per current replica."""
    if target <= 0:
        raise MetricUnavailable(f"target averageValue must be positive, got {target:g}")
    replicas_for_ratio = max(current_replicas, 1)
    ratio = value / (target * replicas_for_ratio)
    if abs(1.0 - ratio) <= TOLERANCE:
        return Proposal(current_replicas, value / replicas_for_ratio, ratio, note="within tolerance")
    return Proposal(_ceil(value / target), value / replicas_for_ratio, ratio)


@dataclass(frozen=True)
class Policy:
    kind: str
    """``Pods`` or ``Percent``."""
    value: int
    period_seconds: int


@dataclass(frozen=True)
class Rules:
    stabilization_seconds: int
    select_policy: str = "Max"
    policies: tuple[Policy, ...] = ()


DEFAULT_SCALE_UP = Rules(0, "Max", (Policy("Percent", 100, 15), Policy("Pods", 4, 15)))
DEFAULT_SCALE_DOWN = Rules(300, "Max", (Policy("Percent", 100, 15),))


@dataclass
class Decision:
    current: int
    recommended: int
    """Largest proposal (before behavior and bounds)."""
    final: int
    steps: list[str] = field(default_factory=list)


def _up_limit(rules: Rules, current: int) -> int | None:
    if rules.select_policy == "Disabled":
        return current
    limits = [
        current + p.value if p.kind == "Pods" else _ceil(current * (1 + p.value / 100))
        for p in rules.policies
    ]
    if not limits:
        return None
    return min(limits) if rules.select_policy == "Min" else max(limits)


def _down_limit(rules: Rules, current: int) -> int | None:
    if rules.select_policy == "Disabled":
        return current
    limits = [
        current - p.value if p.kind == "Pods" else math.floor(current * (1 - p.value / 100))
        for p in rules.policies
    ]
    if not limits:
        return None
    return max(limits) if rules.select_policy == "Min" else min(limits)


def decide(
    *,
    current: int,
    min_replicas: int,
    max_replicas: int,
    proposals: Sequence[int],
    failed_metrics: int,
    scale_up: Rules | None,
    scale_down: Rules | None,
    behavior_given: bool,
) -> Decision:
    """Combine per-metric proposals into the replica count the HPA would set now."""
    if current == 0:
        return Decision(0, 0, 0, ["current replicas is 0: the HPA does not scale a workload scaled to zero"])
    if not proposals:
        return Decision(
            current, current, current, ["no metric could be evaluated: the HPA keeps the current count"]
        )
    recommended = max(proposals)
    decision = Decision(
        current,
        recommended,
        recommended,
        [f"largest proposal over {len(proposals)} metric(s): {recommended}"],
    )
    if failed_metrics and recommended < current:
        decision.final = current
        decision.steps.append(f"{failed_metrics} metric(s) failed: no scale-down, stays at {current}")
    target = decision.final
    if behavior_given:
        up, down = scale_up or DEFAULT_SCALE_UP, scale_down or DEFAULT_SCALE_DOWN
        if target > current:
            limit = _up_limit(up, current)
            if limit is not None:
                limiting = target > limit
                decision.steps.append(
                    f"scaleUp policies ({up.select_policy}) allow at most {limit} now"
                    + ("" if limiting else " (not limiting)")
                )
                target = min(target, limit)
            if up.stabilization_seconds:
                decision.steps.append(
                    f"scaleUp stabilisation {up.stabilization_seconds}s: the HPA uses the lowest recommendation of "
                    "that window (history not simulated here)"
                )
        elif target < current:
            limit = _down_limit(down, current)
            if limit is not None:
                limiting = target < limit
                decision.steps.append(
                    f"scaleDown policies ({down.select_policy}) allow at least {limit} now"
                    + ("" if limiting else " (not limiting)")
                )
                target = max(target, limit)
            if down.stabilization_seconds:
                decision.steps.append(
                    f"scaleDown stabilisation {down.stabilization_seconds}s: the HPA uses the highest recommendation "
                    "of that window, so it scales down only if this holds for that long"
                )
    elif target > current:
        limit = max(2 * current, 4)
        if target > limit:
            decision.steps.append(f"no behavior: scale-up limited to max(2×current, 4) = {limit}")
            target = limit
    clamped = min(max(target, min_replicas), max_replicas)
    if clamped != target:
        decision.steps.append(
            f"clamped to [minReplicas {min_replicas}, maxReplicas {max_replicas}]: {clamped}"
        )
    decision.final = clamped
    return decision
