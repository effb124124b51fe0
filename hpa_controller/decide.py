"""The HorizontalPodAutoscaler's decision as one pure function, following ``horizontal.go`` of
**Kubernetes v1.35** (``HPAConfigurableTolerance`` beta and on; ``HPAScaleToZero`` honoured when
``minReplicas`` is 0).

``decide(hpa, spec_replicas=…, status_replicas=…, pods=…, observations=…, history=…, now=…)``:

1. The controller's memory starts with the current size (``recordInitialRecommendation``).
2. Before any metric: current 0 with ``minReplicas`` ≠ 0 → autoscaling off; current > max → max;
   current < min → min.
3. Each metric → a proposal (:mod:`hpa_controller.calc`); the largest wins; a failed metric blocks the
   whole decision when all failed or when the others would scale down.
4. Without ``behavior`` (it stays nil through API defaulting): stabilise to the highest
   recommendation of the last 300 s, limit a scale-up to max(2 × current, 4), clamp to min/max.
   With ``behavior`` (unset fields defaulted): stabilise between the lowest recommendation of the
   scale-up window and the highest of the scale-down window, then limit by the policies measured
   against the scale events of each policy's period, then min/max.
5. A change stores a scale event (behaviour only); the new history is returned with the decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpa_controller import calc as hpa_calc
from hpa_controller.calc import MetricUnavailable, PodState, Proposal, Tolerances
from hpa_controller.milli import target_milli, to_milli

__all__ = ["MetricUnavailable", "PodState", "Proposal", "Tolerances"]

KUBERNETES_RELEASE = "v1.35"
DEFAULT_TOLERANCE = 0.1
DOWNSCALE_STABILISATION = 300
"""``--horizontal-pod-autoscaler-downscale-stabilization`` default (5 min)."""
SCALE_UP_LIMIT_FACTOR = 2.0
SCALE_UP_LIMIT_MINIMUM = 4.0


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
    tolerance: float | None = None


def scale_up_rules(
    *,
    stabilization_seconds: int | None = None,
    select_policy: str | None = None,
    policies: tuple[Policy, ...] | None = None,
    tolerance: float | None = None,
) -> Rules:
    """``GenerateHPAScaleUpRules``: unset fields take 0 s, Max, [4 pods / 15 s, 100 % / 15 s]."""
    return Rules(
        0 if stabilization_seconds is None else stabilization_seconds,
        select_policy or "Max",
        policies if policies else (Policy("Pods", 4, 15), Policy("Percent", 100, 15)),
        tolerance,
    )


def scale_down_rules(
    *,
    stabilization_seconds: int | None = None,
    select_policy: str | None = None,
    policies: tuple[Policy, ...] | None = None,
    tolerance: float | None = None,
) -> Rules:
    """``GenerateHPAScaleDownRules`` (+ the controller's 300 s window when unset): Max, [100 % / 15 s]."""
    return Rules(
        DOWNSCALE_STABILISATION if stabilization_seconds is None else stabilization_seconds,
        select_policy or "Max",
        policies if policies else (Policy("Percent", 100, 15),),
        tolerance,
    )


@dataclass(frozen=True)
class Behavior:
    scale_up: Rules = field(default_factory=scale_up_rules)
    scale_down: Rules = field(default_factory=scale_down_rules)


@dataclass(frozen=True)
class MetricSpec:
    kind: str
    """``Pods``, ``Object``, ``External``, ``Resource`` or ``ContainerResource``."""
    name: str
    target_type: str
    """``AverageValue``, ``Value`` or ``Utilization``."""
    target: float
    """In the metric's units; whole percent for Utilization."""
    container: str = ""
    label: str = ""


@dataclass(frozen=True)
class Observation:
    """What the metrics APIs returned for one metric (plain units, not milli)."""

    per_pod: Mapping[str, float] | None = None
    """Pods / Resource: value per pod name."""
    values: tuple[float, ...] = ()
    """Object: one value; External: every series (summed)."""
    error: str = ""
    """The metric could not be fetched (the HPA records it as failed)."""
    timestamp: float | None = None
    window_seconds: float = 60.0


@dataclass(frozen=True)
class HpaModel:
    min_replicas: int
    max_replicas: int
    metrics: tuple[MetricSpec, ...]
    behavior: Behavior | None = None
    tolerance: float = DEFAULT_TOLERANCE
    """The controller's ``--horizontal-pod-autoscaler-tolerance``."""
    cpu_initialization_period: float = hpa_calc.CPU_INITIALIZATION_PERIOD
    """``--horizontal-pod-autoscaler-cpu-initialization-period`` (5 min)."""
    initial_readiness_delay: float = hpa_calc.INITIAL_READINESS_DELAY
    """``--horizontal-pod-autoscaler-initial-readiness-delay`` (30 s)."""

    def tolerances(self) -> Tolerances:
        down = up = self.tolerance
        if self.behavior is not None:
            if self.behavior.scale_down.tolerance is not None:
                down = self.behavior.scale_down.tolerance
            if self.behavior.scale_up.tolerance is not None:
                up = self.behavior.scale_up.tolerance
        return Tolerances(down=down, up=up)


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    change: int
    """Absolute replica change (non-negative)."""
    outdated: bool = False


@dataclass(frozen=True)
class History:
    """The controller's in-memory state for one HPA."""

    recommendations: tuple[Recommendation, ...] = ()
    scale_up_events: tuple[ScaleEvent, ...] = ()
    scale_down_events: tuple[ScaleEvent, ...] = ()
    started: bool = False
    """False: the controller has not seen this HPA yet (it starts from the current size)."""


@dataclass(frozen=True)
class MetricOutcome:
    spec: MetricSpec
    proposal: Proposal | None
    error: str = ""


@dataclass
class Decision:
    current: int
    recommended: int
    """Largest metric proposal (or the pre-check's target), before behaviour and bounds."""
    final: int
    steps: list[str] = field(default_factory=list)
    outcomes: list[MetricOutcome] = field(default_factory=list)
    history: History = field(default_factory=History)
    failed: bool = False
    """The controller would record FailedComputeMetricsReplicas and keep the size."""


def decide(
    hpa: HpaModel,
    *,
    spec_replicas: int,
    status_replicas: int | None = None,
    pods: Sequence[PodState],
    observations: Sequence[Observation],
    history: History,
    now: float,
) -> Decision:
    """One reconcile of ``hpa`` at ``now``: the replica count the controller would set, and why."""
    current = spec_replicas
    status = current if status_replicas is None else status_replicas
    new = not history.started
    if new:
        history = History(
            (Recommendation(now, current),), history.scale_up_events, history.scale_down_events, True
        )
    decision = Decision(current, current, current, history=history)
    if new:
        decision.steps.append(
            f"new HPA: the controller's first recommendation is the current size, {current} "
            "(its stabilisation windows start from it)"
        )
    if current == 0 and hpa.min_replicas != 0:
        decision.steps.append(
            "current replicas 0 and minReplicas ≠ 0: autoscaling is disabled for this target"
        )
        return decision
    if current > hpa.max_replicas:
        decision.recommended = hpa.max_replicas
        decision.steps.append(
            f"current {current} > maxReplicas: set to {hpa.max_replicas} before reading metrics"
        )
        return _rescale(decision, hpa, hpa.max_replicas, now)
    if current < hpa.min_replicas:
        decision.recommended = hpa.min_replicas
        decision.steps.append(
            f"current {current} < minReplicas: set to {hpa.min_replicas} before reading metrics"
        )
        return _rescale(decision, hpa, hpa.min_replicas, now)

    tolerances = hpa.tolerances()
    proposed = 0
    invalid = 0
    for i, spec in enumerate(hpa.metrics):
        obs = observations[i] if i < len(observations) else Observation(error="no observation given")
        try:
            proposal = evaluate_metric(
                spec,
                obs,
                spec_replicas=current,
                status_replicas=status,
                pods=pods,
                tolerances=tolerances,
                now=now,
                periods=(hpa.cpu_initialization_period, hpa.initial_readiness_delay),
            )
        except MetricUnavailable as exc:
            decision.outcomes.append(MetricOutcome(spec, None, str(exc)))
            invalid += 1
            continue
        decision.outcomes.append(MetricOutcome(spec, proposal))
        if proposed == 0 or proposal.replicas > proposed:
            proposed = proposal.replicas
    if invalid >= len(hpa.metrics) or (invalid > 0 and proposed < current):
        decision.failed = True
        why = (
            "no metric could be evaluated"
            if invalid >= len(hpa.metrics)
            else (f"{invalid} metric(s) failed and the others propose {proposed} < {current}")
        )
        decision.steps.append(f"{why}: the HPA keeps {current} (FailedComputeMetricsReplicas)")
        return decision
    decision.recommended = proposed
    decision.steps.append(f"largest proposal over {len(hpa.metrics) - invalid} metric(s): {proposed}")
    if invalid:
        decision.steps.append(
            f"{invalid} metric(s) failed; the others propose {proposed} ≥ {current}, so the HPA acts on them"
        )
    if hpa.behavior is None:
        final, history = _normalize_legacy(
            hpa, decision.history, current=current, desired=proposed, now=now, steps=decision.steps
        )
    else:
        final, history = _normalize_behavior(
            hpa,
            hpa.behavior,
            decision.history,
            current=current,
            desired=proposed,
            now=now,
            steps=decision.steps,
        )
    decision.history = history
    return _rescale(decision, hpa, final, now)


def _rescale(decision: Decision, hpa: HpaModel, final: int, now: float) -> Decision:
    decision.final = final
    if final != decision.current and hpa.behavior is not None:
        decision.history = store_scale_event(
            decision.history, hpa.behavior, prev=decision.current, new=final, now=now
        )
    return decision


def evaluate_metric(
    spec: MetricSpec,
    obs: Observation,
    *,
    spec_replicas: int,
    status_replicas: int,
    pods: Sequence[PodState],
    tolerances: Tolerances,
    now: float,
    periods: tuple[float, float] = (hpa_calc.CPU_INITIALIZATION_PERIOD, hpa_calc.INITIAL_READINESS_DELAY),
) -> Proposal:
    """One metric's proposal (``computeReplicasForMetric``); ``MetricUnavailable`` when it fails.
    ``periods``: the CPU initialisation period and initial readiness delay."""
    if obs.error:
        raise MetricUnavailable(obs.error)
    if spec.target <= 0 or not math.isfinite(spec.target):
        raise MetricUnavailable(f"target must be a positive number, got {spec.target:g}")
    kind, ttype = spec.kind, spec.target_type
    if kind in ("Pods", "Resource", "ContainerResource"):
        if obs.per_pod is None or (kind == "Pods" and not obs.per_pod):
            raise MetricUnavailable("no values returned for the selected pods")
        metrics = {name: to_milli(v) for name, v in obs.per_pod.items()}
        resource = spec.name if kind != "Pods" else ""
        if ttype == "Utilization":
            if kind == "Pods":
                raise MetricUnavailable("Pods metrics take an AverageValue target")
            return hpa_calc.utilization_replicas(
                current=spec_replicas,
                target_percent=int(spec.target),
                metrics=metrics,
                pods=pods,
                tolerances=tolerances,
                resource=resource,
                request_key=f"{spec.container}/{resource}" if spec.container else "",
                now=now,
                metric_time=obs.timestamp,
                metric_window=obs.window_seconds,
                cpu_initialization_period=periods[0],
                initial_readiness_delay=periods[1],
            )
        return hpa_calc.plain_metric_replicas(
            current=spec_replicas,
            target=target_milli(spec.target),
            metrics=metrics,
            pods=pods,
            tolerances=tolerances,
            resource=resource,
            now=now,
            metric_time=obs.timestamp,
            metric_window=obs.window_seconds,
            cpu_initialization_period=periods[0],
            initial_readiness_delay=periods[1],
        )
    if kind in ("Object", "External"):
        if not obs.values:
            raise MetricUnavailable(f"no value returned (the HPA reports FailedGet{kind}Metric)")
        milli = [to_milli(v) for v in obs.values]
        value = milli[0] if kind == "Object" else hpa_calc.external_sum(milli)
        if ttype == "Value":
            return hpa_calc.value_replicas(
                current=spec_replicas,
                target=target_milli(spec.target),
                value=value,
                pods=pods,
                tolerances=tolerances,
            )
        if ttype == "AverageValue":
            return hpa_calc.average_value_replicas(
                status_replicas=status_replicas,
                target=target_milli(spec.target),
                value=value,
                tolerances=tolerances,
            )
        raise MetricUnavailable(f"{kind} metrics take a Value or AverageValue target, not {ttype}")
    raise MetricUnavailable(f"unknown metric source type {kind!r}")


# -- without behavior ---------------------------------------------------------------------------
def _normalize_legacy(
    hpa: HpaModel, history: History, *, current: int, desired: int, now: float, steps: list[str]
) -> tuple[int, History]:
    stabilized, recs = stabilize_legacy(
        history.recommendations, desired, now=now, window=DOWNSCALE_STABILISATION
    )
    history = History(recs, history.scale_up_events, history.scale_down_events, history.started)
    if stabilized != desired:
        steps.append(
            f"stabilisation (no behavior, {DOWNSCALE_STABILISATION}s): highest recent recommendation {stabilized}"
        )
    final = convert_with_rules(current, stabilized, hpa.min_replicas, hpa.max_replicas)
    if final != stabilized:
        limit = scale_up_limit(current)
        why = (
            f"max(2×current, 4) = {limit}"
            if final == limit and limit < hpa.max_replicas
            else "[minReplicas, maxReplicas]"
        )
        steps.append(f"limited by {why}: {final}")
    return final, history


def stabilize_legacy(
    recs: tuple[Recommendation, ...], desired: int, *, now: float, window: float
) -> tuple[int, tuple[Recommendation, ...]]:
    """``stabilizeRecommendation``: the highest recommendation of the window; the new one replaces an
    expired entry or is appended."""
    cutoff = now - window
    best, old = desired, -1
    for i, rec in enumerate(recs):
        if rec.at < cutoff:
            old = i
        elif rec.replicas > best:
            best = rec.replicas
    new = Recommendation(now, desired)
    out = (*recs[:old], new, *recs[old + 1 :]) if old >= 0 else (*recs, new)
    return best, out


def scale_up_limit(current: int) -> int:
    return int(max(SCALE_UP_LIMIT_FACTOR * current, SCALE_UP_LIMIT_MINIMUM))


def convert_with_rules(current: int, desired: int, min_replicas: int, max_replicas: int) -> int:
    """``convertDesiredReplicasWithRules``."""
    maximum = min(max_replicas, scale_up_limit(current))
    if desired < min_replicas:
        return min_replicas
    return min(desired, maximum)


# -- with behavior ------------------------------------------------------------------------------
def _normalize_behavior(
    hpa: HpaModel,
    behavior: Behavior,
    history: History,
    *,
    current: int,
    desired: int,
    now: float,
    steps: list[str],
) -> tuple[int, History]:
    stabilized, recs = stabilize_with_behavior(
        history.recommendations, behavior, current=current, desired=desired, now=now
    )
    history = History(recs, history.scale_up_events, history.scale_down_events, history.started)
    if stabilized != desired:
        which = "lowest" if desired >= current else "highest"
        window = behavior.scale_up if desired >= current else behavior.scale_down
        steps.append(
            f"stabilisation window {window.stabilization_seconds}s: {which} recent recommendation → {stabilized}"
        )
    final = convert_with_behavior_rate(
        current=current,
        desired=stabilized,
        min_replicas=hpa.min_replicas,
        max_replicas=hpa.max_replicas,
        behavior=behavior,
        history=history,
        now=now,
        steps=steps,
    )
    return final, history


def stabilize_with_behavior(
    recs: tuple[Recommendation, ...], behavior: Behavior, *, current: int, desired: int, now: float
) -> tuple[int, tuple[Recommendation, ...]]:
    """``stabilizeRecommendationWithBehaviors``."""
    up_cut = now - behavior.scale_up.stabilization_seconds
    down_cut = now - behavior.scale_down.stabilization_seconds
    up_rec, down_rec, old = desired, desired, -1
    for i, rec in enumerate(recs):
        if rec.at > up_cut:
            up_rec = min(up_rec, rec.replicas)
        if rec.at > down_cut:
            down_rec = max(down_rec, rec.replicas)
        if rec.at < up_cut and rec.at < down_cut:
            old = i
    recommendation = max(current, up_rec)
    recommendation = min(recommendation, down_rec)
    new = Recommendation(now, desired)
    out = (*recs[:old], new, *recs[old + 1 :]) if old >= 0 else (*recs, new)
    return recommendation, out


def replicas_changed_in(period: int, events: Sequence[ScaleEvent], now: float) -> int:
    """``getReplicasChangePerPeriod``: the replicas added (or removed) by events newer than ``period``."""
    cutoff = now - period
    return sum(e.change for e in events if e.at > cutoff)


def scale_up_limit_with_rules(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: Rules, now: float
) -> int:
    """``calculateScaleUpLimitWithScalingRules``."""
    if rules.select_policy == "Disabled":
        return current
    pick = min if rules.select_policy == "Min" else max
    result: int | None = None
    for p in rules.policies:
        start = (
            current
            - replicas_changed_in(p.period_seconds, up, now)
            + replicas_changed_in(p.period_seconds, down, now)
        )
        proposed = start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return -(2**31) if result is None and pick is max else (2**31 - 1 if result is None else result)


def scale_down_limit_with_rules(
    current: int, up: Sequence[ScaleEvent], down: Sequence[ScaleEvent], rules: Rules, now: float
) -> int:
    """``calculateScaleDownLimitWithBehaviors``."""
    if rules.select_policy == "Disabled":
        return current
    pick = max if rules.select_policy == "Min" else min
    result: int | None = None
    for p in rules.policies:
        start = (
            current
            - replicas_changed_in(p.period_seconds, up, now)
            + replicas_changed_in(p.period_seconds, down, now)
        )
        proposed = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return (2**31 - 1 if pick is min else -(2**31)) if result is None else result


def convert_with_behavior_rate(
    *,
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    behavior: Behavior,
    history: History,
    now: float,
    steps: list[str] | None = None,
) -> int:
    """``convertDesiredReplicasWithBehaviorRate``."""
    steps = steps if steps is not None else []
    up, down = history.scale_up_events, history.scale_down_events
    if desired > current:
        limit = max(scale_up_limit_with_rules(current, up, down, behavior.scale_up, now), current)
        allowed = min(max_replicas, limit)
        if desired > allowed:
            why = (
                policy_limit_text(
                    "scaleUp", behavior.scale_up, current=current, limit=limit, history=history, now=now
                )
                if limit < max_replicas
                else f"maxReplicas {max_replicas}"
            )
            steps.append(f"limited by {why}")
            return allowed
    elif desired < current:
        limit = min(scale_down_limit_with_rules(current, up, down, behavior.scale_down, now), current)
        allowed = max(min_replicas, limit)
        if desired < allowed:
            why = (
                policy_limit_text(
                    "scaleDown", behavior.scale_down, current=current, limit=limit, history=history, now=now
                )
                if limit > min_replicas
                else f"minReplicas {min_replicas}"
            )
            steps.append(f"limited by {why}")
            return allowed
    return desired


def _policy_proposal(p: Policy, start: int, *, up: bool) -> int:
    if up:
        return start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
    return start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))


def policy_limit_text(
    direction: str, rules: Rules, *, current: int, limit: int, history: History, now: float
) -> str:
    """Which policy set a rate limit, from what count, and the scale events of its period that moved
    that count: ``scaleUp policy Pods 2 per 120s (its only policy), which allows 5 now: it counts
    from 3 (current 4, less 1 added by the scale event(s) of its period: +1 90s ago)``."""
    if rules.select_policy == "Disabled":
        return f"{direction} selectPolicy Disabled: no {direction} at all, {limit} now"
    up = direction == "scaleUp"
    for p in rules.policies:
        added = replicas_changed_in(p.period_seconds, history.scale_up_events, now)
        removed = replicas_changed_in(p.period_seconds, history.scale_down_events, now)
        start = current - added + removed
        if _policy_proposal(p, start, up=up) != limit:
            continue
        events = [
            f"{'+' if kind == 'up' else '-'}{e.change} {max(now - e.at, 0):.0f}s ago"
            for kind, events_of in (("up", history.scale_up_events), ("down", history.scale_down_events))
            for e in events_of
            if e.at > now - p.period_seconds
        ]
        moved = [f"less {added} added" if added else "", f"plus {removed} removed" if removed else ""]
        counted = (
            f"it counts from {start} (current {current}, {', '.join(m for m in moved if m)} by the scale "
            f"event(s) of its period: {', '.join(events)})"
            if events
            else f"it counts from the current {current} (no scale event in its period)"
        )
        unit = "%" if p.kind == "Percent" else ""
        among = (
            "its only policy"
            if len(rules.policies) == 1
            else f"selectPolicy {rules.select_policy} over {len(rules.policies)} policies"
        )
        return (
            f"{direction} policy {p.kind} {p.value}{unit} per {p.period_seconds}s ({among}), "
            f"which allows {limit} now: {counted}"
        )
    return f"{direction} policies ({rules.select_policy}) allow {limit} now"


def store_scale_event(history: History, behavior: Behavior, *, prev: int, new: int, now: float) -> History:
    """``storeScaleEvent``: mark events older than the longest policy period outdated, then reuse the
    last outdated slot or append."""
    up = new > prev
    rules = behavior.scale_up if up else behavior.scale_down
    longest = max((p.period_seconds for p in rules.policies), default=0)
    cutoff = now - longest
    events = [
        ScaleEvent(e.at, e.change, True) if e.at < cutoff else e
        for e in (history.scale_up_events if up else history.scale_down_events)
    ]
    event = ScaleEvent(now, abs(new - prev))
    slot = max((i for i, e in enumerate(events) if e.outdated), default=-1)
    if slot >= 0:
        events[slot] = event
    else:
        events.append(event)
    if up:
        return History(history.recommendations, tuple(events), history.scale_down_events, history.started)
    return History(history.recommendations, history.scale_up_events, tuple(events), history.started)
