"""The decision function on the seed's HPA shape (two Pods metrics, behavior with Pods policies):
tolerance, missing and pending pods, failed metrics, policies measured against past scale events,
stabilisation over the recommendation history, and the history the function hands back."""

from __future__ import annotations

import pytest

from hpa_controller import decide as hpa
from hpa_controller.calc import PodState
from hpa_controller.decide import (
    Behavior,
    History,
    HpaModel,
    MetricSpec,
    Observation,
    Policy,
    Recommendation,
    ScaleEvent,
)

NOW = 1_800_000_000.0
UTIL = MetricSpec("Pods", "DCGM_FI_DEV_GPU_UTIL", "AverageValue", 75)
QUEUE = MetricSpec("Pods", "inference_queue_depth", "AverageValue", 10)
SEED_BEHAVIOR = Behavior(
    hpa.scale_up_rules(stabilization_seconds=60, policies=(Policy("Pods", 2, 120),)),
    hpa.scale_down_rules(stabilization_seconds=300, policies=(Policy("Pods", 1, 300),)),
)
SEED = HpaModel(2, 8, (UTIL, QUEUE), SEED_BEHAVIOR)
PODS = [PodState(f"p{i}") for i in range(3)]
STARTED = History(started=True)


def obs(**per_pod: float) -> Observation:
    return Observation(per_pod=per_pod)


def run(
    model: HpaModel,
    *observations: Observation,
    current: int = 3,
    pods: list[PodState] | None = None,
    history: History = STARTED,
) -> hpa.Decision:
    return hpa.decide(
        model,
        spec_replicas=current,
        pods=PODS if pods is None else pods,
        observations=observations,
        history=history,
        now=NOW,
    )


def test_seed_values_scale_up_by_queue() -> None:
    # util mean 80 vs 75: ratio 1.067 inside 0.1 → 3; queue mean 12 vs 10 → ceil(1.2 × 3) = 4
    d = run(SEED, obs(p0=90, p1=80, p2=70), obs(p0=14, p1=12, p2=10))
    assert [o.proposal.replicas for o in d.outcomes if o.proposal] == [3, 4]
    assert d.final == 4
    # the recommendation is remembered, and the scale-up stored as an event of +1
    assert d.history.recommendations[-1] == Recommendation(NOW, 4)
    assert [(e.change, e.at) for e in d.history.scale_up_events] == [(1, NOW)]


def test_scale_up_stabilisation_uses_lowest_recent_recommendation() -> None:
    recent = History((Recommendation(NOW - 30, 3),), started=True)
    d = run(SEED, obs(p0=90, p1=80, p2=70), obs(p0=14, p1=12, p2=10), history=recent)
    assert d.final == 3  # 30 s ago the HPA recommended 3, inside the 60 s scale-up window
    assert any("lowest recent recommendation" in s for s in d.steps)


def test_new_hpa_starts_its_history_from_the_current_size() -> None:
    d = run(
        SEED,
        obs(**{f"p{i}": 10.0 for i in range(6)}),
        obs(**{f"p{i}": 1.0 for i in range(6)}),
        current=6,
        pods=[PodState(f"p{i}") for i in range(6)],
        history=History(),
    )
    assert d.recommended == 1  # ceil(0.133 × 6) and ceil(0.1 × 6)
    assert d.final == 6  # the controller's own start (6, now) is inside the 300 s window
    assert d.history.recommendations[0] == Recommendation(NOW, 6)


def test_scale_down_policy_counts_past_events() -> None:
    pods = [PodState(f"p{i}") for i in range(6)]
    low, short = obs(**{f"p{i}": 10.0 for i in range(6)}), obs(**{f"p{i}": 1.0 for i in range(6)})
    d = run(SEED, low, short, current=6, pods=pods)
    assert d.final == 5  # at most -1 pod per 300 s
    earlier = History(scale_down_events=(ScaleEvent(NOW - 100, 1),), started=True)
    d = run(SEED, low, short, current=6, pods=pods, history=earlier)
    assert d.final == 6  # that pod was already removed inside the period


def test_failed_metric_blocks_scale_down_only() -> None:
    failed = Observation(error="no series")
    pods = [PodState(f"p{i}") for i in range(5)]
    d = run(SEED, obs(**{f"p{i}": 10.0 for i in range(5)}), failed, current=5, pods=pods)
    assert (d.final, d.failed) == (5, True)
    d = run(SEED, obs(p0=150, p1=150, p2=150), failed)
    assert d.final == 5  # 6 proposed, +2 pods per 120 s


def test_missing_and_pending_pods() -> None:
    pods = [*PODS, PodState("p3", phase="Pending")]
    # ratio 2 with a pending pod: it counts as 0 → mean 100 vs 75 → ceil(1.333 × 4) = 6
    d = run(HpaModel(1, 10, (UTIL,), None), obs(p0=150, p1=150, p2=150), current=4, pods=pods)
    assert d.outcomes[0].proposal is not None and d.outcomes[0].proposal.replicas == 6
    # missing p2 while the others are below target: counted as 100 % → (30+30+75)/3 = 45 → 0.6 → 2
    d = run(HpaModel(1, 10, (UTIL,), None), obs(p0=30, p1=30))
    assert d.outcomes[0].proposal is not None and d.outcomes[0].proposal.replicas == 2


@pytest.mark.parametrize(("current", "expected"), [(10, 5), (1, 2)])
def test_bounds_before_metrics(current: int, expected: int) -> None:
    pods = [PodState(f"p{i}") for i in range(current)]
    model = HpaModel(2, 5, (UTIL,), None)
    d = run(model, Observation(error="not read"), current=current, pods=pods)
    assert d.final == expected and not d.outcomes


def test_value_targets_count_terminating_ready_pods() -> None:
    # getReadyPodsCount counts Running+Ready pods, deletionTimestamp or not: 2 × 3 ready = 6
    pods = [PodState("a"), PodState("b"), PodState("c", deleting=True), PodState("d", ready=False)]
    model = HpaModel(1, 10, (MetricSpec("Object", "q", "Value", 10),), None)
    d = run(model, Observation(values=(20.0,)), current=4, pods=pods)
    assert d.outcomes[0].proposal is not None and d.outcomes[0].proposal.replicas == 6


def test_pods_metric_ignores_terminating_pods() -> None:
    # the same pods under a Pods metric: c is ignored, d (Running, not Ready, with a value) counts
    pods = [PodState("a"), PodState("b"), PodState("c", deleting=True), PodState("d", ready=False)]
    model = HpaModel(1, 10, (MetricSpec("Pods", "q", "AverageValue", 10),), None)
    d = run(model, obs(a=20, b=20, c=20, d=20), current=4, pods=pods)
    assert d.outcomes[0].proposal is not None and d.outcomes[0].proposal.replicas == 6  # ceil(2 × 3)
