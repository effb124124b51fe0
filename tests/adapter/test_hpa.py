"""The HPA replica arithmetic against hand-computed cases (replica_calculator.go semantics)."""

import pytest

from adapter import hpa
from adapter.hpa import PodState, Policy, Rules

RUNNING = [PodState(f"p{i}") for i in range(4)]


def decide(
    *,
    current: int,
    min_replicas: int,
    max_replicas: int,
    proposals: list[int],
    failed_metrics: int = 0,
    scale_up: Rules | None = None,
    scale_down: Rules | None = None,
    behavior_given: bool = False,
) -> hpa.Decision:
    """``hpa.decide`` with the HPA's defaults: no failed metric, no behavior section."""
    return hpa.decide(
        current=current,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        proposals=proposals,
        failed_metrics=failed_metrics,
        scale_up=scale_up,
        scale_down=scale_down,
        behavior_given=behavior_given,
    )


def test_inside_tolerance_keeps_replicas() -> None:
    # mean 80 vs target 75: ratio 1.067, |1 - r| <= 0.1
    p = hpa.pods_metric(
        current_replicas=3, target=75, values={"p0": 90, "p1": 80, "p2": 70}, pods=RUNNING[:3]
    )
    assert (p.replicas, p.usage) == (3, 80)
    assert p.ratio == pytest.approx(80 / 75)


def test_just_outside_tolerance_scales() -> None:
    # mean 12 vs 10: ratio 1.2 → ceil(1.2 × 3) = ceil(3.6) = 4
    p = hpa.pods_metric(
        current_replicas=3, target=10, values={"p0": 14, "p1": 12, "p2": 10}, pods=RUNNING[:3]
    )
    assert p.replicas == 4
    # ratio 1.05 is inside the band
    p = hpa.pods_metric(
        current_replicas=3, target=10, values={"p0": 10.5, "p1": 10.5, "p2": 10.5}, pods=RUNNING[:3]
    )
    assert p.replicas == 3
    # 11/10 in float64 is 1.1000000000000001, so |1 - r| > 0.1 and Go's controller scales: so do we
    p = hpa.pods_metric(
        current_replicas=3, target=10, values={"p0": 11, "p1": 11, "p2": 11}, pods=RUNNING[:3]
    )
    assert p.replicas == 4


def test_scale_down_counts_missing_pods_as_target() -> None:
    # 4 pods, p3 has no value; measured mean 30 vs 75 → ratio 0.4 < 1: p3 counts as 75.
    # new mean (30+30+30+75)/4 = 41.25 → ratio 0.55 → ceil(0.55 × 4) = ceil(2.2) = 3
    p = hpa.pods_metric(current_replicas=4, target=75, values={"p0": 30, "p1": 30, "p2": 30}, pods=RUNNING)
    assert p.missing_pods == ("p3",)
    assert p.ratio == pytest.approx(0.55)
    assert p.replicas == 3


def test_scale_up_counts_missing_pods_as_zero() -> None:
    # measured mean 150 vs 75 → ratio 2; p3 counts as 0: mean (450)/4 = 112.5 → ratio 1.5 → ceil(6) = 6
    p = hpa.pods_metric(current_replicas=4, target=75, values={"p0": 150, "p1": 150, "p2": 150}, pods=RUNNING)
    assert p.ratio == pytest.approx(1.5)
    assert p.replicas == 6


def test_missing_pods_that_flip_the_direction_mean_no_change() -> None:
    # measured 80 vs 75 with ratio 1.067 > 1 but a missing pod counted as 0: 160/3 = 53.3 → ratio 0.71 < 1
    p = hpa.pods_metric(current_replicas=3, target=75, values={"p0": 80, "p1": 80}, pods=RUNNING[:3])
    assert p.replicas == 3
    assert "no change" in p.note


def test_pending_pods_count_as_zero_on_scale_up() -> None:
    pods = [*RUNNING[:2], PodState("p2", phase="Pending")]
    # ready mean 150 vs 75 → ratio 2; pending p2 counts 0: 300/3 = 100 → ratio 1.333 → ceil(4) = 4
    p = hpa.pods_metric(current_replicas=3, target=75, values={"p0": 150, "p1": 150}, pods=pods)
    assert p.unready_pods == ("p2",)
    assert p.replicas == 4


def test_no_values_is_a_failed_metric() -> None:
    with pytest.raises(hpa.MetricUnavailable):
        hpa.pods_metric(current_replicas=3, target=75, values={}, pods=RUNNING[:3])


def test_value_and_average_value_targets() -> None:
    # Object Value: 30 vs 10, ready 2 → ceil(3 × 2) = 6
    assert hpa.value_metric(current_replicas=2, target=10, value=30, pods=RUNNING[:2]).replicas == 6
    # External AverageValue: total 45 vs 10 per replica → ceil(4.5) = 5
    p = hpa.average_value_metric(current_replicas=3, target=10, value=45)
    assert (p.replicas, p.usage) == (5, 15)
    assert hpa.average_value_metric(current_replicas=3, target=10, value=31).replicas == 3  # ratio 1.03


def test_two_metrics_largest_wins_and_clamp() -> None:
    d = decide(current=3, min_replicas=2, max_replicas=8, proposals=[3, 4])
    assert (d.recommended, d.final) == (4, 4)
    d = decide(current=3, min_replicas=2, max_replicas=5, proposals=[2, 12])
    assert d.final == 5  # limited to 6 by max(2×3, 4), then clamped to maxReplicas 5
    d = decide(current=3, min_replicas=2, max_replicas=8, proposals=[1])
    assert d.final == 2  # minReplicas


def test_failed_metric_blocks_scale_down_only() -> None:
    d = decide(current=5, min_replicas=1, max_replicas=10, proposals=[2], failed_metrics=1)
    assert d.final == 5
    d = decide(current=5, min_replicas=1, max_replicas=10, proposals=[7], failed_metrics=1)
    assert d.final == 7


def test_behavior_policies_of_the_seed() -> None:
    up = Rules(60, "Max", (Policy("Pods", 2, 120),))
    down = Rules(300, "Max", (Policy("Pods", 1, 300),))
    d = decide(
        current=3,
        min_replicas=2,
        max_replicas=8,
        proposals=[8],
        scale_up=up,
        scale_down=down,
        behavior_given=True,
    )
    assert d.final == 5  # at most +2 pods per period
    assert any("stabilisation 60s" in s for s in d.steps)
    d = decide(
        current=6,
        min_replicas=2,
        max_replicas=8,
        proposals=[2],
        scale_up=up,
        scale_down=down,
        behavior_given=True,
    )
    assert d.final == 5  # at most -1 pod per period
    d = decide(
        current=6,
        min_replicas=2,
        max_replicas=8,
        proposals=[2],
        scale_up=up,
        scale_down=Rules(300, "Disabled"),
        behavior_given=True,
    )
    assert d.final == 6


def test_percent_policy_and_min_select() -> None:
    rules = Rules(0, "Min", (Policy("Percent", 50, 60), Policy("Pods", 4, 60)))
    d = decide(
        current=4, min_replicas=1, max_replicas=100, proposals=[20], scale_up=rules, behavior_given=True
    )
    assert d.final == 6  # min(4 × 1.5, 4 + 4) = 6


def test_scaled_to_zero_is_left_alone() -> None:
    d = decide(current=0, min_replicas=1, max_replicas=8, proposals=[4])
    assert d.final == 0
