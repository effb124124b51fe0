"""The Kubernetes HPA controller's own unit-test cases (v1.35, ``pkg/controller/podautoscaler``),
translated by hand into tables of inputs and expected replica counts: ``replica_calculator_test.go``
(Pods, Object, External, Resource, tolerance, missing and unready pods) and ``horizontal_test.go``
(pre-checks, failed metrics, stabilisation with and without behavior, scaling policies and events).

Upstream conventions kept: pods are ``test-pod-N``; levels are milli-units (20000 = 20); a pod's CPU
request of 1.0 with two containers each using the level gives ``requests = 2000m`` and a usage of
``2 × level``; "hot" CPU pods started 1 min before ``NOW`` (inside the initialisation period),
"cool" ones 3 min before (outside the 2 min testing period, which the tests use instead of 5 min);
the fixtures leave the metric timestamp, the Ready transition time and (unless set) the start time at
Go's zero time, written here as 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from hpa_controller import calc as hpa_calc
from hpa_controller import decide as hpa
from hpa_controller.calc import PodState, Tolerances
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
TOL = Tolerances()
HOT, COOL = NOW - 60, NOW - 180


@dataclass(frozen=True)
class Calc:
    """One ``replicaCalcTestCase``."""

    name: str
    current: int
    expected: int | str
    """Replica count, or a fragment of the expected error."""
    kind: str
    """pods | object | object-avg | external | external-avg | cpu."""
    levels: Sequence[int]
    target: int
    readiness: Sequence[bool] = ()
    phases: Sequence[str] = ()
    deleting: Sequence[bool] = ()
    start: Sequence[float] = ()
    requests: Sequence[int] = ()
    """Milli-CPU per pod (both containers)."""
    expected_usage: int | None = None
    pod_names: Sequence[str] = ()


def _pods(c: Calc) -> list[PodState]:
    count = max(c.current, len(c.phases))
    out = []
    for i in range(count):
        out.append(
            PodState(
                name=f"test-pod-{i}",
                phase=c.phases[i] if c.phases else "Running",
                ready=c.readiness[i] if i < len(c.readiness) else True,
                deleting=c.deleting[i] if c.deleting else False,
                start_time=c.start[i] if c.start else 0.0,
                ready_transition=0.0,
                requests={"cpu": c.requests[i]} if i < len(c.requests) else {},
            )
        )
    return out


def _run_calc(c: Calc) -> hpa_calc.Proposal:
    pods = _pods(c)
    names = list(c.pod_names) or [f"test-pod-{i}" for i in range(len(c.levels))]
    per_pod = dict(zip(names, c.levels, strict=False))
    if c.kind == "pods":
        return hpa_calc.plain_metric_replicas(
            current=c.current, target=c.target, metrics=per_pod, pods=pods, tolerances=TOL
        )
    if c.kind == "cpu":
        # the upstream tests run with a 2 min CPU initialisation period and a 10 s readiness delay
        return hpa_calc.utilization_replicas(
            current=c.current,
            target_percent=c.target,
            metrics=per_pod,
            pods=pods,
            tolerances=TOL,
            resource="cpu",
            now=NOW,
            metric_time=0.0,
            metric_window=60.0,
            cpu_initialization_period=120.0,
            initial_readiness_delay=10.0,
        )
    if c.kind == "object":
        return hpa_calc.value_replicas(
            current=c.current, target=c.target, value=c.levels[0], pods=pods, tolerances=TOL
        )
    if c.kind == "external":
        return hpa_calc.value_replicas(
            current=c.current,
            target=c.target,
            value=hpa_calc.external_sum(c.levels),
            pods=pods,
            tolerances=TOL,
        )
    total = c.levels[0] if c.kind == "object-avg" else hpa_calc.external_sum(c.levels)
    return hpa_calc.average_value_replicas(
        status_replicas=c.current, target=c.target, value=total, tolerances=TOL
    )


R1 = [2000] * 10  # request 1.0 CPU in each of two containers
T, F = True, False

CALC_CASES = [
    # -- Pods (custom metrics) --
    Calc("ScaleUpCM", 3, 4, "pods", [20000, 10000, 30000], 15000, expected_usage=20000),
    Calc(
        "ScaleUpCMUnreadyHotCpuNoLessScale",
        3,
        6,
        "pods",
        [50000, 10000, 30000],
        15000,
        readiness=[T, T, F],
        expected_usage=30000,
    ),
    Calc(
        "ScaleUpCMUnreadyHotCpuScaleWouldScaleDown",
        3,
        7,
        "pods",
        [50000, 15000, 30000],
        15000,
        readiness=[F, T, F],
        expected_usage=31666,
    ),
    Calc("ScaleUpCMExternal (as pods)", 1, 2, "pods", [8600], 4400, expected_usage=8600),
    Calc("ScaleUpCMExternalNoLabels (as pods)", 1, 2, "pods", [8600], 4400, expected_usage=8600),
    Calc("ScaleDownCM", 5, 3, "pods", [12000] * 5, 20000, expected_usage=12000),
    Calc("ToleranceCM", 3, 3, "pods", [20000, 21000, 21000], 20000, expected_usage=20666),
    Calc(
        "PlainMetricMissingMetricsNoChangeEq",
        5,
        5,
        "pods",
        [20000, 19000, 21000],
        20000,
        expected_usage=20000,
    ),
    Calc(
        "DuringRollingUpdateWithMaxSurgeCM",
        2,
        2,
        "pods",
        [10000, 10000],
        17000,
        phases=["Running"] * 3,
        expected_usage=10000,
    ),
    # -- Object --
    Calc("ScaleUpCMObject", 3, 4, "object", [20000], 15000, expected_usage=20000),
    Calc(
        "ScaleUpCMObjectIgnoresUnreadyPods",
        3,
        5,
        "object",
        [50000],
        10000,
        readiness=[F, T, F],
        expected_usage=50000,
    ),
    Calc("ScaleDownCMObject", 5, 3, "object", [12000], 20000, expected_usage=12000),
    Calc("ToleranceCMObject", 3, 3, "object", [20666], 20000, expected_usage=20666),
    Calc("ScaleUpCMPerPodObject", 3, 4, "object-avg", [20000], 5000, expected_usage=6667),
    Calc("ScaleDownPerPodCMObject", 5, 3, "object-avg", [6000], 2000, expected_usage=1200),
    Calc("TolerancePerPodCMObject", 4, 4, "object-avg", [20166], 5000, expected_usage=5042),
    # -- External --
    Calc(
        "ScaleUpCMExternalIgnoresUnreadyPods",
        3,
        2,
        "external",
        [8600],
        4400,
        readiness=[F, T, F],
        expected_usage=8600,
    ),
    Calc("ScaleDownCMExternal", 5, 3, "external", [8600], 14334, expected_usage=8600),
    Calc("ToleranceCMExternal", 3, 3, "external", [8600], 8888, expected_usage=8600),
    Calc("ScaleUpPerPodCMExternal", 3, 4, "external-avg", [8600], 2150, expected_usage=2867),
    Calc("ScaleDownPerPodCMExternal", 5, 3, "external-avg", [8600], 2867, expected_usage=1720),
    Calc("TolerancePerPodCMExternal", 3, 3, "external-avg", [8600], 2900, expected_usage=2867),
    # -- Resource (CPU utilization) --
    Calc("ScaleUp", 3, 5, "cpu", [600, 1000, 1400], 30, requests=R1, expected_usage=1000),
    Calc(
        "ScaleUpUnreadyLessScale",
        3,
        4,
        "cpu",
        [600, 1000, 1400],
        30,
        readiness=[F, T, T],
        requests=R1,
        expected_usage=1200,
    ),
    Calc(
        "ScaleUpHotCpuLessScale",
        3,
        4,
        "cpu",
        [600, 1000, 1400],
        30,
        start=[HOT, COOL, COOL],
        requests=R1,
        expected_usage=1200,
    ),
    Calc(
        "ScaleUpUnreadyNoScale",
        3,
        3,
        "cpu",
        [800, 1000, 1400],
        30,
        readiness=[T, F, F],
        requests=R1,
        expected_usage=800,
    ),
    Calc(
        "ScaleHotCpuNoScale",
        3,
        3,
        "cpu",
        [800, 1000, 1400],
        30,
        readiness=[T, F, F],
        start=[COOL, HOT, HOT],
        requests=R1,
        expected_usage=800,
    ),
    Calc(
        "ScaleUpIgnoresFailedPods",
        2,
        4,
        "cpu",
        [1000, 1400],
        30,
        readiness=[T, T, F, F],
        phases=["Running", "Running", "Failed", "Failed"],
        requests=R1,
        expected_usage=1200,
    ),
    Calc(
        "ScaleUpIgnoresDeletionPods",
        2,
        4,
        "cpu",
        [1000, 1400],
        30,
        readiness=[T, T, F, F],
        phases=["Running"] * 4,
        deleting=[F, F, T, T],
        requests=R1,
        expected_usage=1200,
    ),
    Calc("ScaleDown", 5, 3, "cpu", [200, 600, 1000, 500, 500], 50, requests=R1, expected_usage=560),
    Calc(
        "ScaleDownExcludeUnreadyPods",
        5,
        2,
        "cpu",
        [200, 600, 1000, 500, 500],
        50,
        readiness=[T, T, T, F, F],
        requests=R1,
        expected_usage=600,
    ),
    Calc(
        "ScaleDownExcludeUnscheduledPods",
        5,
        1,
        "cpu",
        [200],
        50,
        readiness=[T, F, F, F, F],
        phases=["Running"] + ["Pending"] * 4,
        requests=R1,
        expected_usage=200,
    ),
    Calc(
        "ScaleDownIgnoreHotCpuPods",
        5,
        2,
        "cpu",
        [200, 600, 1000, 500, 500],
        50,
        start=[COOL, COOL, COOL, HOT, HOT],
        requests=R1,
        expected_usage=600,
    ),
    Calc(
        "ScaleDownIgnoresFailedPods",
        5,
        3,
        "cpu",
        [200, 600, 1000, 500, 500],
        50,
        readiness=[T] * 5 + [F, F],
        phases=["Running"] * 5 + ["Failed"] * 2,
        requests=R1,
        expected_usage=560,
    ),
    Calc(
        "ScaleDownIgnoresDeletionPods",
        5,
        3,
        "cpu",
        [200, 600, 1000, 500, 500],
        50,
        readiness=[T] * 5 + [F, F],
        phases=["Running"] * 7,
        deleting=[F] * 5 + [T, T],
        requests=R1,
        expected_usage=560,
    ),
    Calc("Tolerance", 3, 3, "cpu", [2020, 2060, 2040], 100, requests=[1800, 2000, 2200], expected_usage=2040),
    Calc(
        "SuperfluousMetrics",
        4,
        24,
        "cpu",
        [8000, 19000, 6000, 14000, 6400, 4000],
        100,
        requests=R1,
        expected_usage=11750,
    ),
    Calc("MissingMetrics", 4, 3, "cpu", [800, 190], 100, requests=R1, expected_usage=495),
    Calc("MissingMetricsNoChangeEq", 2, 2, "cpu", [2000], 100, requests=R1, expected_usage=2000),
    Calc("MissingMetricsNoChangeGt", 2, 2, "cpu", [3800], 100, requests=R1, expected_usage=3800),
    Calc("MissingMetricsNoChangeLt", 2, 2, "cpu", [1200], 100, requests=R1, expected_usage=1200),
    Calc(
        "MissingMetricsUnreadyChange",
        3,
        3,
        "cpu",
        [200, 900],
        50,
        readiness=[F, T, T],
        requests=R1,
        expected_usage=900,
    ),
    Calc(
        "MissingMetricsHotCpuNoChange",
        3,
        3,
        "cpu",
        [200, 900],
        50,
        start=[HOT, COOL, COOL],
        requests=R1,
        expected_usage=900,
    ),
    Calc(
        "MissingMetricsUnreadyScaleUp",
        3,
        4,
        "cpu",
        [200, 4000],
        50,
        readiness=[F, T, T],
        requests=R1,
        expected_usage=4000,
    ),
    Calc(
        "MissingMetricsHotCpuScaleUp",
        3,
        4,
        "cpu",
        [200, 4000],
        50,
        readiness=[F, T, T],
        start=[HOT, COOL, COOL],
        requests=R1,
        expected_usage=4000,
    ),
    Calc(
        "MissingMetricsUnreadyScaleDown",
        4,
        3,
        "cpu",
        [200, 200, 200],
        50,
        readiness=[F, T, T, T],
        requests=R1,
        expected_usage=200,
    ),
    Calc(
        "MissingMetricsScaleDownTargetOver100",
        4,
        2,
        "cpu",
        [400, 200, 200],
        300,
        readiness=[F, T, T, T],
        requests=[2000, 2000, 4000, 4000],
        expected_usage=200,
    ),
    Calc(
        "DuringRollingUpdateWithMaxSurge",
        2,
        2,
        "cpu",
        [200, 200],
        50,
        phases=["Running"] * 3,
        requests=R1,
        expected_usage=200,
    ),
    Calc(
        "DisjointResourcesMetrics",
        1,
        "no metrics returned matched known pods",
        "cpu",
        [200],
        100,
        requests=R1,
        pod_names=["an-older-pod-name"],
    ),
    Calc("EmptyCPURequest", 1, "missing request for", "cpu", [400], 100),
]


@pytest.mark.parametrize("case", CALC_CASES, ids=[c.name for c in CALC_CASES])
def test_replica_calculator_case(case: Calc) -> None:
    if isinstance(case.expected, str):
        with pytest.raises(hpa_calc.MetricUnavailable, match=case.expected):
            _run_calc(case)
        return
    proposal = _run_calc(case)
    assert proposal.replicas == case.expected
    if case.expected_usage is not None:
        assert proposal.usage == case.expected_usage


def test_computed_tolerance_regression() -> None:
    # TestReplicaCalcComputedToleranceAlgImplementation: 10 pods using 150m each, requests ~300m
    # per container (jittered ±100, ±10, ±2, ±1, 0); target int32((1/(2×0.9) + 0.01) × 100) = 56 %:
    # utilisation 50 % → ratio 0.893 → ceil(8.93) = 9 (upstream: ceil(1500 / (3000 × 0.5656) × 10));
    # then 55 % (+0.004 instead of +0.01) is inside the tolerance → 10.
    requests = [400, 200, 310, 290, 302, 298, 301, 299, 300, 300]
    levels = [300] * 10  # 150m in each of two containers
    base = Calc("ComputedTolerance", 10, 9, "cpu", levels, 56, requests=[r * 2 for r in requests])
    assert _run_calc(base).replicas == 9
    assert (
        _run_calc(
            Calc("ComputedToleranceInside", 10, 10, "cpu", levels, 55, requests=[r * 2 for r in requests])
        ).replicas
        == 10
    )


def test_group_pods_cases() -> None:
    # TestGroupPods: CPU readiness during and after the initialisation period (testing: 2 min / 10 s)
    kw: dict[str, Any] = {
        "resource": "cpu",
        "now": NOW,
        "cpu_initialization_period": 120.0,
        "initial_readiness_delay": 10.0,
    }
    no_condition = PodState("lucretius", has_ready_condition=False, start_time=NOW)
    assert hpa_calc.group_pods([no_condition], {"lucretius": 1}, **kw)[1] == {"lucretius"}
    fresh = PodState("bentham", start_time=NOW - 60, ready_transition=NOW - 30)
    assert hpa_calc.group_pods([fresh], {"bentham": 1}, metric_time=NOW, metric_window=30, **kw)[0] == 1
    assert hpa_calc.group_pods([fresh], {"bentham": 1}, metric_time=NOW, metric_window=60, **kw)[1] == {
        "bentham"
    }
    unready_init = PodState("lucretius", ready=False, start_time=NOW - 600, ready_transition=NOW - 594)
    assert hpa_calc.group_pods([unready_init], {"lucretius": 1}, **kw)[1] == {"lucretius"}
    after = PodState("bentham", start_time=NOW - 180, ready_transition=NOW - 180)
    assert hpa_calc.group_pods([after], {"bentham": 1}, metric_time=NOW - 120, **kw)[0] == 1
    was_ready = PodState("lucretius", ready=False, start_time=NOW - 600, ready_transition=NOW - 540)
    assert hpa_calc.group_pods([was_ready], {"lucretius": 1}, **kw)[0] == 1
    never_ready_long_ago = PodState(
        "lucretius", ready=False, start_time=NOW - 600, ready_transition=NOW - 590
    )
    assert hpa_calc.group_pods([never_ready_long_ago], {"lucretius": 1}, **kw)[0] == 1
    missing = PodState("epicurus", start_time=NOW - 180)
    assert hpa_calc.group_pods([missing], {}, **kw)[2] == {"epicurus"}
    memory_pod = PodState("bentham", phase="Succeeded", has_ready_condition=False)
    assert hpa_calc.group_pods([memory_pod], {"bentham": 1}, resource="memory")[0] == 1
    failed = PodState("f", phase="Failed")
    deleted = PodState("d", deleting=True)
    pending = PodState("p", phase="Pending")
    ready, unready, missing_set, ignored = hpa_calc.group_pods([failed, deleted, pending], {})
    assert (ready, unready, missing_set, ignored) == (0, {"p"}, set(), {"f", "d"})


# -- horizontal_test.go ----------------------------------------------------------------------------
def _rules(pods: int, pods_period: int, percent: int, percent_period: int, window: int) -> hpa.Rules:
    """``generateScalingRules`` (Max; a zero value leaves that policy out)."""
    policies = []
    if pods:
        policies.append(Policy("Pods", pods, pods_period))
    if percent:
        policies.append(Policy("Percent", percent, percent_period))
    return hpa.Rules(window, "Max", tuple(policies))


def _uniform(changes: Sequence[int], period: int) -> tuple[ScaleEvent, ...]:
    """``generateEventsUniformDistribution``: events in the middle of equal slices of the last period."""
    seg = period / len(changes)
    return tuple(ScaleEvent(NOW - (period - seg * (i + 1) + seg / 2), c) for i, c in enumerate(changes))


@dataclass(frozen=True)
class Rate:
    name: str
    current: int
    desired: int
    min: int
    max: int
    expected: int
    up: hpa.Rules | None = None
    down: hpa.Rules | None = None
    up_events: tuple[ScaleEvent, ...] = ()
    down_events: tuple[ScaleEvent, ...] = ()


def _default_up(r: hpa.Rules | None) -> hpa.Rules:
    return r if r is not None else hpa.scale_up_rules()


def _default_down(r: hpa.Rules | None) -> hpa.Rules:
    return r if r is not None else hpa.scale_down_rules()


U = _uniform
RATE_CASES = [
    Rate("within range", 5, 7, 3, 8, 7),
    Rate("below minReplicas", 3, 1, 2, 8, 2),
    Rate("within range, min 0", 1, 0, 0, 10, 0),
    Rate("maxReplicas < scaleUpLimit", 20, 1000, 1, 10, 10),
    Rate("more than maxReplicas", 100, 1000, 100, 150, 150),
    Rate("user percent policy 1%", 3, 1000, 1, 2000, 4, up=_rules(0, 0, 1, 60, 0)),
    Rate("default scale-up behavior", 10, 50, 1, 1000, 20),
    Rate("pods policy > percent", 10, 500, 1, 1000, 110, up=_rules(100, 60, 100, 60, 0)),
    Rate("percent policy > pods", 10, 500, 1, 1000, 20, up=_rules(2, 60, 100, 60, 0)),
    Rate("large pod policy", 10, 50, 1, 1000, 50, up=_rules(100, 60, 0, 0, 0)),
    Rate("large percent policy", 10, 50, 1, 1000, 50, up=_rules(10000, 60, 0, 0, 0)),
    Rate("pod policy limit", 10, 50, 1, 1000, 40, up=_rules(30, 60, 0, 0, 0)),
    Rate("percent policy limit", 10, 50, 1, 1000, 30, up=_rules(0, 0, 200, 60, 0)),
    Rate("down percent > pods", 100, 2, 1, 1000, 80, down=_rules(20, 60, 1, 60, 300)),
    Rate("down pods > percent", 100, 2, 1, 1000, 98, down=_rules(2, 60, 1, 60, 300)),
    Rate("down to min with large pod policy", 10, 0, 1, 1000, 1, down=_rules(100, 60, 0, 0, 300)),
    Rate("down min 5 large percent", 10, 2, 5, 1000, 5, down=_rules(0, 0, 100, 60, 300)),
    Rate("down pod policy limit", 10, 2, 1, 1000, 5, down=_rules(5, 60, 0, 0, 300)),
    Rate("down percent policy limit", 10, 5, 1, 1000, 5, down=_rules(0, 0, 50, 60, 300)),
    Rate(
        "max with large pod policy and events",
        100,
        500,
        1,
        200,
        200,
        up=_rules(300, 60, 0, 0, 0),
        up_events=U([1, 5, 9], 120),
    ),
    Rate(
        "max with large percent policy and events",
        100,
        500,
        1,
        200,
        200,
        up=_rules(0, 0, 10000, 60, 0),
        up_events=U([1, 5, 9], 120),
    ),
    Rate(
        "recent scale-ups block further scale-up",
        100,
        500,
        1,
        1000,
        100,
        up=_rules(5, 120, 0, 0, 0),
        up_events=U([1, 5, 9], 120),
    ),
    Rate(
        "pod policy after scale-ups",
        100,
        500,
        1,
        1000,
        235,
        up=_rules(150, 120, 0, 0, 0),
        up_events=U([1, 5, 9], 120),
    ),
    Rate(
        "percent policy after scale-ups",
        100,
        500,
        1,
        1000,
        255,
        up=_rules(0, 0, 200, 120, 0),
        up_events=U([1, 5, 9], 120),
    ),
    Rate("default down with events", 10, 5, 1, 1000, 5, down_events=U([1, 5, 9], 120)),
    Rate(
        "down to min 1 with events",
        100,
        0,
        1,
        1000,
        1,
        down=_rules(115, 120, 0, 0, 300),
        down_events=U([1, 5, 9], 120),
    ),
    Rate(
        "down to min 5 with events",
        100,
        0,
        5,
        1000,
        5,
        down=_rules(130, 120, 0, 0, 300),
        down_events=U([1, 5, 9], 120),
    ),
    Rate(
        "down 100% to min 5 with events",
        100,
        2,
        5,
        1000,
        5,
        down=_rules(0, 0, 100, 120, 300),
        down_events=U([1, 5, 9], 120),
    ),
    Rate(
        "down pod policy after scale-downs",
        100,
        2,
        1,
        1000,
        100,
        down=_rules(5, 120, 0, 0, 300),
        down_events=U([1, 5, 9], 120),
    ),
    Rate(
        "down percent policy after scale-downs",
        100,
        0,
        1,
        1000,
        56,
        down=_rules(0, 0, 50, 120, 300),
        down_events=U([2, 4, 6], 120),
    ),
    Rate(
        "scale-downs block further scale-down",
        100,
        0,
        1,
        1000,
        100,
        down=_rules(0, 0, 10, 120, 300),
        down_events=U([10, 10, 10], 120),
    ),
    Rate(
        "scale-downs still allow more",
        10,
        5,
        1,
        1000,
        5,
        down=_rules(0, 0, 1000, 120, 300),
        down_events=U([10, 10, 10], 120),
    ),
    Rate(
        "outdated events, one policy, up",
        100,
        200,
        1,
        1000,
        200,
        up=_rules(1000, 60, 0, 0, 0),
        up_events=U([8, 12, 9, 11], 120),
    ),
    Rate(
        "two policies, up",
        100,
        200,
        1,
        1000,
        200,
        up=_rules(1000, 120, 100, 60, 0),
        up_events=U([8, 12, 9, 11], 120),
    ),
    Rate(
        "two policies marked outdated, up",
        100,
        200,
        1,
        1000,
        200,
        up=_rules(1000, 30, 100, 60, 0),
        up_events=U([8, 12, 9, 11], 120),
    ),
    Rate(
        "outdated events, one policy, down",
        100,
        5,
        1,
        1000,
        5,
        down=_rules(1000, 60, 0, 0, 300),
        down_events=U([8, 12, 9, 11], 120),
    ),
    Rate(
        "two policies, down",
        100,
        5,
        1,
        1000,
        5,
        down=_rules(1000, 120, 100, 60, 300),
        down_events=U([8, 12, 9, 11], 120),
    ),
    Rate(
        "two policies marked outdated, down",
        100,
        5,
        1,
        1000,
        5,
        down=_rules(1000, 30, 100, 60, 300),
        down_events=U([8, 12, 9, 11], 120),
    ),
]


@pytest.mark.parametrize("case", RATE_CASES, ids=[c.name for c in RATE_CASES])
def test_scaling_with_rules(case: Rate) -> None:
    """TestScalingWithRules: ``convertDesiredReplicasWithBehaviorRate``."""
    behavior = Behavior(_default_up(case.up), _default_down(case.down))
    got = hpa.convert_with_behavior_rate(
        current=case.current,
        desired=case.desired,
        min_replicas=case.min,
        max_replicas=case.max,
        behavior=behavior,
        history=History(scale_up_events=case.up_events, scale_down_events=case.down_events, started=True),
        now=NOW,
    )
    assert got == case.expected


def test_scale_limits_with_min_select_policy() -> None:
    # TestCalculateScaleUpLimitWithScalingRules / TestCalculateScaleDownLimitWithBehaviors
    rules = hpa.Rules(300, "Min", (Policy("Pods", 2, 60), Policy("Percent", 50, 60)))
    assert hpa.scale_up_limit_with_rules(1, (), (), rules, NOW) == 2
    assert hpa.scale_down_limit_with_rules(5, (), (), rules, NOW) == 3


@pytest.mark.parametrize(
    ("current", "desired", "min_r", "max_r", "expected"),
    [
        (5, 7, 3, 8, 7),  # within range
        (3, 1, 2, 8, 2),  # < minReplicas
        (1, 0, 0, 10, 0),  # zero within range
        (20, 1000, 1, 10, 10),  # maxReplicas < scaleUpLimit
        (3, 1000, 1, 2000, 6),  # scaleUpLimit = max(2 × 3, 4)
    ],
)
def test_convert_desired_replicas_with_rules(
    current: int, desired: int, min_r: int, max_r: int, expected: int
) -> None:
    """TestConvertDesiredReplicasWithRules (the path without behavior)."""
    assert hpa.convert_with_rules(current, desired, min_r, max_r) == expected


def _recs(*pairs: tuple[int, float]) -> tuple[Recommendation, ...]:
    return tuple(Recommendation(NOW - ago, r) for r, ago in pairs)


@pytest.mark.parametrize(
    ("recs", "desired", "expected", "log_length"),
    [
        ((), 5, 5, 1),  # empty log
        (_recs((4, 120), (5, 60)), 3, 5, 3),  # stabilize
        (_recs((1, 120), (2, 60)), 3, 3, 3),  # no stabilize
        (_recs((10, 600), (9, 540)), 3, 3, 2),  # old recommendations: one reused
        (_recs((10, 600), (4, 60), (5, 120), (9, 540)), 3, 5, 4),
    ],
)
def test_normalize_desired_replicas_legacy(
    recs: tuple[Recommendation, ...], desired: int, expected: int, log_length: int
) -> None:
    """TestNormalizeDesiredReplicas: ``stabilizeRecommendation`` over a 5 min window."""
    got, log = hpa.stabilize_legacy(recs, desired, now=NOW, window=300)
    assert (got, len(log)) == (expected, log_length)


@pytest.mark.parametrize(
    ("recs", "current", "desired", "up_window", "down_window", "expected", "stored"),
    [
        ((), 100, 5, 0, 0, 5, [5]),
        (_recs((4, 120), (5, 60)), 100, 3, 0, 180, 5, [4, 5, 3]),
        (_recs((4, 120), (5, 60)), 1, 7, 300, 0, 4, [4, 5, 7]),
        (_recs((1, 120), (2, 60)), 100, 3, 300, 0, 3, [1, 2, 3]),
        (_recs((4, 120), (5, 60)), 1, 3, 0, 300, 3, [4, 5, 3]),
        (_recs((10, 600), (9, 540)), 100, 3, 0, 0, 3, [10, 3]),
        (_recs((10, 600), (9, 540)), 1, 100, 0, 0, 100, [10, 100]),
        (_recs((10, 600), (4, 60), (5, 120), (9, 540)), 100, 3, 0, 180, 5, [10, 4, 5, 3]),
        (_recs((10, 6000), (6, 60), (5, 120), (9, 180)), 1, 100, 300, 300, 5, [100, 6, 5, 9]),
    ],
)
def test_stabilize_with_behavior(
    recs: tuple[Recommendation, ...],
    current: int,
    desired: int,
    up_window: int,
    down_window: int,
    expected: int,
    stored: list[int],
) -> None:
    """TestNormalizeDesiredReplicasWithBehavior: result and the stored recommendation log."""
    behavior = Behavior(hpa.Rules(up_window), hpa.Rules(down_window))
    got, log = hpa.stabilize_with_behavior(recs, behavior, current=current, desired=desired, now=NOW)
    assert got == expected
    assert [r.replicas for r in log] == stored


def test_store_scale_events() -> None:
    """TestStoreScaleEvents: reuse of the last outdated slot, per direction."""
    behavior = Behavior(_rules(10, 60, 100, 30, 0), _rules(10, 60, 100, 30, 0))
    prev = (
        ScaleEvent(NOW - 29, 8),
        ScaleEvent(NOW - 59, 6),
        ScaleEvent(NOW - 61, 7),
        ScaleEvent(NOW - 61, 9),
    )
    assert hpa.replicas_changed_in(60, prev, NOW) == 14
    out = hpa.store_scale_event(
        History(scale_up_events=prev, started=True), behavior, prev=10, new=15, now=NOW
    )
    assert [(e.change, e.outdated) for e in out.scale_up_events] == [
        (8, False),
        (6, False),
        (7, True),
        (5, False),
    ]
    out = hpa.store_scale_event(
        History(scale_down_events=prev, started=True), behavior, prev=10, new=5, now=NOW
    )
    assert [e.change for e in out.scale_down_events] == [8, 6, 7, 5]
    # no behavior: decide() stores nothing
    two = (ScaleEvent(NOW - 58, 7), ScaleEvent(NOW - 59, 6))
    assert hpa.replicas_changed_in(60, two, NOW) == 13


# -- reconcile-level cases (horizontal_test.go testCase) ------------------------------------------
# Pods: one per CPU request (or per specReplicas), a single container; CPU levels are the pod's
# milli-cores. Without ``recommendations: []`` upstream (``fresh=True`` here) the controller's memory
# starts with the current size.
@dataclass(frozen=True)
class Reconcile:
    name: str
    min: int
    max: int
    spec: int
    expected: int
    metrics: tuple[MetricSpec, ...]
    observations: tuple[Observation, ...]
    requests: tuple[int, ...] | None = None
    """Upstream ``reportedCPURequests``: when given (even empty) there is one pod per request, else
    one per replica."""
    readiness: tuple[bool, ...] = ()
    phases: tuple[str, ...] = ()
    deleting: tuple[bool, ...] = ()
    start: tuple[float, ...] = ()
    behavior: Behavior | None = None
    fresh: bool = False


def cpu(target: int) -> MetricSpec:
    return MetricSpec("Resource", "cpu", "Utilization", target)


def pods_metric(target: float) -> MetricSpec:
    return MetricSpec("Pods", "qps", "AverageValue", target)


def obj(target_type: str, target: float) -> MetricSpec:
    return MetricSpec("Object", "qps", target_type, target)


def ext(target_type: str, target: float) -> MetricSpec:
    return MetricSpec("External", "qps", target_type, target)


INVALID = MetricSpec("CheddarCheese", "x", "Value", 1)
FAILED = Observation(error="something went wrong")


def levels(*milli: int) -> Observation:
    return Observation(per_pod={f"test-pod-{i}": m / 1000 for i, m in enumerate(milli)}, timestamp=0.0)


def value(*milli: int) -> Observation:
    return Observation(values=tuple(m / 1000 for m in milli))


R = Reconcile
ONE = (1000,) * 3
FIVE = (1000,) * 5
JITTER = (900, 1000, 1100)
UP700 = Behavior(_rules(0, 0, 700, 60, 0), hpa.scale_down_rules())
RECONCILE = [
    R("ScaleUp", 2, 6, 3, 5, (cpu(30),), (levels(300, 500, 700),), ONE),
    R("ScaleUpUnreadyLessScale", 2, 6, 3, 4, (cpu(30),), (levels(300, 500, 700),), ONE, readiness=(F, T, T)),
    R(
        "ScaleUpHotCpuLessScale",
        2,
        6,
        3,
        4,
        (cpu(30),),
        (levels(300, 500, 700),),
        ONE,
        start=(HOT, COOL, COOL),
    ),
    R("ScaleUpUnreadyNoScale", 2, 6, 3, 3, (cpu(30),), (levels(400, 500, 700),), ONE, readiness=(T, F, F)),
    R(
        "ScaleUpHotCpuNoScale",
        2,
        6,
        3,
        3,
        (cpu(30),),
        (levels(400, 500, 700),),
        ONE,
        readiness=(T, F, F),
        start=(COOL, HOT, HOT),
    ),
    R(
        "ScaleUpIgnoresFailedPods",
        2,
        6,
        2,
        4,
        (cpu(30),),
        (levels(500, 700),),
        (1000,) * 4,
        readiness=(T, T, F, F),
        phases=("Running", "Running", "Failed", "Failed"),
    ),
    R(
        "ScaleUpIgnoresDeletionPods",
        2,
        6,
        2,
        4,
        (cpu(30),),
        (levels(500, 700),),
        (1000,) * 4,
        readiness=(T, T, F, F),
        deleting=(F, F, T, T),
    ),
    R("ScaleUpCM", 2, 6, 3, 4, (pods_metric(15),), (levels(20000, 10000, 30000),), ONE),
    R(
        "ScaleUpCMUnreadyAndHotCpuNoLessScale",
        2,
        6,
        3,
        6,
        (pods_metric(15),),
        (levels(50000, 10000, 30000),),
        ONE,
        readiness=(T, T, F),
        start=(COOL, COOL, HOT),
    ),
    R(
        "ScaleUpCMUnreadyandCpuHot",
        2,
        6,
        3,
        6,
        (pods_metric(15),),
        (levels(50000, 15000, 30000),),
        ONE,
        readiness=(F, T, F),
        start=(HOT, COOL, HOT),
    ),
    R(
        "ScaleUpHotCpuNoScaleWouldScaleDown",
        2,
        6,
        3,
        6,
        (pods_metric(15),),
        (levels(50000, 15000, 30000),),
        ONE,
        start=(HOT, COOL, HOT),
    ),
    R("ScaleUpCMObject", 2, 6, 3, 4, (obj("Value", 15),), (value(20000),)),
    R("ScaleUpFromZeroCMObject", 0, 6, 0, 2, (obj("Value", 15),), (value(20000),)),
    R("ScaleUpFromZeroIgnoresToleranceCMObject", 0, 6, 0, 1, (obj("Value", 1),), (value(1000),)),
    R("ScaleUpPerPodCMObject", 2, 6, 3, 4, (obj("AverageValue", 10),), (value(40000),)),
    R("ScaleUpCMExternal", 2, 6, 3, 4, (ext("Value", 6.666),), (value(8600),)),
    R("ScaleUpPerPodCMExternal", 2, 6, 3, 4, (ext("AverageValue", 2.222),), (value(8600),)),
    R("ScaleDown", 2, 6, 5, 3, (cpu(50),), (levels(100, 300, 500, 250, 250),), FIVE, fresh=False),
    R(
        "ScaleDownWithScalingRules",
        2,
        6,
        5,
        3,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        FIVE,
        behavior=Behavior(_rules(0, 0, 100, 15, 30), hpa.scale_down_rules(stabilization_seconds=0)),
    ),
    R(
        "ScaleUpOneMetricInvalid",
        2,
        6,
        3,
        4,
        (cpu(30), INVALID),
        (levels(300, 400, 500), Observation()),
        ONE,
        fresh=True,
    ),
    R(
        "ScaleUpFromZeroOneMetricInvalid",
        0,
        6,
        0,
        4,
        (cpu(30), INVALID),
        (levels(300, 400, 500), Observation()),
        ONE,
    ),
    R("ScaleUpBothMetricsEmpty", 2, 6, 3, 3, (INVALID,), (Observation(),), ONE, fresh=True),
    R(
        "ScaleDownStabilizeInitialSize",
        2,
        6,
        5,
        5,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        FIVE,
        fresh=True,
    ),
    R("ScaleDownCM", 2, 6, 5, 3, (pods_metric(20),), (levels(*[12000] * 5),), FIVE),
    R("ScaleDownCMObject", 2, 6, 5, 3, (obj("Value", 20),), (value(12000),), FIVE),
    R("ScaleDownToZeroCMObject", 0, 6, 5, 0, (obj("Value", 20),), (value(0),), FIVE),
    R("ScaleDownPerPodCMObject", 2, 6, 5, 3, (obj("AverageValue", 20),), (value(60000),), FIVE),
    R("ScaleDownCMExternal", 2, 6, 5, 3, (ext("Value", 14.4),), (value(8600),)),
    R("ScaleDownToZeroCMExternal", 0, 6, 5, 0, (ext("Value", 14.4),), (value(0),)),
    R("ScaleDownPerPodCMExternal", 2, 6, 5, 3, (ext("AverageValue", 3),), (value(8600),)),
    R(
        "ScaleDownIncludeUnreadyPods",
        2,
        6,
        5,
        2,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        FIVE,
        readiness=(T, T, T, F, F),
    ),
    # v1.35: a failed metric blocks a scale-down (computeReplicasForMetrics returns -1); the
    # pre-1.22 file expected 3 here
    R(
        "ScaleDownOneMetricInvalid (v1.35: blocked)",
        2,
        6,
        5,
        5,
        (cpu(50), INVALID),
        (levels(100, 300, 500, 250, 250), Observation()),
        FIVE,
    ),
    R(
        "ScaleDownOneMetricEmpty (v1.35: blocked)",
        2,
        6,
        5,
        5,
        (cpu(50), ext("AverageValue", 1)),
        (levels(100, 300, 500, 250, 250), FAILED),
        FIVE,
    ),
    R(
        "NoScaleDownOneMetricInvalid",
        2,
        6,
        5,
        5,
        (cpu(50), INVALID),
        (levels(100, 300, 500, 250, 250), Observation()),
        FIVE,
        fresh=True,
    ),
    R(
        "NoScaleDownOneMetricEmpty",
        2,
        6,
        5,
        5,
        (cpu(50), ext("Value", 1)),
        (levels(100, 300, 500, 250, 250), FAILED),
        FIVE,
        fresh=True,
    ),
    R(
        "ScaleUpOneMetricEmpty",
        2,
        6,
        3,
        4,
        (cpu(30), ext("Value", 0.1)),
        (levels(300, 400, 500), FAILED),
        ONE,
        fresh=True,
    ),
    R(
        "ScaleDownIgnoreHotCpuPods",
        2,
        6,
        5,
        2,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        FIVE,
        start=(COOL, COOL, COOL, HOT, HOT),
    ),
    R(
        "ScaleDownIgnoresFailedPods",
        2,
        6,
        5,
        3,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        (1000,) * 7,
        readiness=(T,) * 5 + (F, F),
        phases=("Running",) * 5 + ("Failed",) * 2,
    ),
    R(
        "ScaleDownIgnoresDeletionPods",
        2,
        6,
        5,
        3,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        (1000,) * 7,
        readiness=(T,) * 5 + (F, F),
        deleting=(F,) * 5 + (T, T),
    ),
    R("Tolerance", 1, 5, 3, 3, (cpu(100),), (levels(1010, 1030, 1020),), JITTER, fresh=True),
    R("ToleranceCM", 1, 5, 3, 3, (pods_metric(20),), (levels(20000, 20001, 21000),), JITTER, fresh=True),
    R("ToleranceCMObject", 1, 5, 3, 3, (obj("Value", 20),), (value(20050),), JITTER, fresh=True),
    R("ToleranceCMExternal", 2, 6, 4, 4, (ext("Value", 8.666),), (value(8600),), fresh=True),
    R("TolerancePerPodCMObject", 2, 6, 4, 4, (obj("AverageValue", 2.2),), (value(8600),), fresh=True),
    R("TolerancePerPodCMExternal", 2, 6, 4, 4, (ext("AverageValue", 2.2),), (value(8600),), fresh=True),
    R("MinReplicas", 2, 5, 3, 2, (cpu(90),), (levels(10, 95, 10),), JITTER),
    R("ZeroMinReplicasDesiredZero", 0, 5, 3, 0, (cpu(90),), (levels(0, 0, 0),), JITTER),
    R("MinReplicasDesiredZero", 2, 5, 3, 2, (cpu(90),), (levels(0, 0, 0),), JITTER),
    R("ZeroReplicas", 3, 5, 0, 0, (cpu(90),), (levels(),), (), fresh=True),
    R("TooFewReplicas", 3, 5, 2, 3, (cpu(90),), (levels(),), (), fresh=True),
    R("TooManyReplicas", 3, 5, 10, 5, (cpu(90),), (levels(),), (), fresh=True),
    R("MaxReplicas", 2, 5, 3, 5, (cpu(90),), (levels(8000, 9500, 1000),), JITTER, fresh=True),
    R(
        "SuperfluousMetrics",
        2,
        6,
        4,
        6,
        (cpu(100),),
        (levels(4000, 9500, 3000, 7000, 3200, 2000),),
        (1000,) * 4,
        fresh=True,
    ),
    R("MissingMetrics", 2, 6, 4, 3, (cpu(100),), (levels(400, 95),), (1000,) * 4),
    R("EmptyMetrics", 2, 6, 4, 4, (cpu(100),), (levels(),), (1000,) * 4, fresh=True),
    R("EmptyCPURequest", 1, 5, 1, 1, (cpu(100),), (levels(200),), (), fresh=True),
    R("EventCreated", 1, 5, 1, 2, (cpu(50),), (levels(200),), (200,), fresh=True),
    R("EventNotCreated", 1, 5, 2, 2, (cpu(50),), (levels(200, 200),), (400, 400), fresh=True),
    R("MissingReports", 1, 5, 4, 2, (cpu(50),), (levels(200),), (200,)),
    R(
        "UpscaleCap",
        1,
        100,
        3,
        24,
        (cpu(10),),
        (levels(100, 200, 300),),
        (100,) * 3,
        behavior=UP700,
        fresh=True,
    ),
    R(
        "UpscaleCapGreaterThanMaxReplicas",
        1,
        20,
        3,
        20,
        (cpu(10),),
        (levels(100, 200, 300),),
        (100,) * 3,
        behavior=UP700,
        fresh=True,
    ),
]
OWN = [
    R(
        "own: new HPA, first scale-down held by its own start",
        2,
        6,
        5,
        5,
        (cpu(50),),
        (levels(100, 300, 500, 250, 250),),
        FIVE,
        fresh=True,
    ),
    R(
        "own: current above max goes to max before metrics (10 → 5, not 3)",
        1,
        5,
        10,
        5,
        (cpu(50),),
        (levels(*[100] * 10),),
        (1000,) * 10,
    ),
    R(
        "own: no behavior, scale-up capped at max(2 × current, 4)",
        1,
        100,
        3,
        6,
        (cpu(10),),
        (levels(100, 200, 300),),
        (100,) * 3,
    ),
]


@pytest.mark.parametrize("case", RECONCILE + OWN, ids=[c.name for c in RECONCILE + OWN])
def test_reconcile_case(case: Reconcile) -> None:
    count = len(case.requests) if case.requests is not None else case.spec
    pods = [
        PodState(
            f"test-pod-{i}",
            phase=case.phases[i] if case.phases else "Running",
            ready=case.readiness[i] if i < len(case.readiness) else True,
            deleting=case.deleting[i] if case.deleting else False,
            start_time=case.start[i] if case.start else 0.0,
            ready_transition=0.0,
            requests={"cpu": case.requests[i]} if case.requests else {},
        )
        for i in range(count)
    ]
    # the upstream tests run the controller with a 2 min CPU initialisation period and 10 s delay
    model = HpaModel(
        case.min,
        case.max,
        case.metrics,
        case.behavior,
        cpu_initialization_period=120.0,
        initial_readiness_delay=10.0,
    )
    history = History() if case.fresh else History(started=True)
    d = hpa.decide(
        model, spec_replicas=case.spec, pods=pods, observations=case.observations, history=history, now=NOW
    )
    assert d.final == case.expected, d.steps


def test_missing_pods_at_ratio_exactly_one_fill_nothing() -> None:
    # the first bug: 5 pods, 3 values averaging exactly the target → no change (was 3)
    p = hpa_calc.plain_metric_replicas(
        current=5,
        target=20000,
        metrics={"a": 20000, "b": 19000, "c": 21000},
        pods=[PodState(n) for n in "abcde"],
        tolerances=TOL,
    )
    assert p.replicas == 5


def test_per_hpa_tolerance() -> None:
    # ratio 1.05 scales up with a 1 % scale-up tolerance and not with the default 10 %
    behavior = Behavior(hpa.scale_up_rules(tolerance=0.01), hpa.scale_down_rules())
    model = HpaModel(1, 20, (MetricSpec("Pods", "q", "AverageValue", 10),), behavior)
    obs = (Observation(per_pod={f"p{i}": 10.5 for i in range(10)}),)
    pods = [PodState(f"p{i}") for i in range(10)]
    d = hpa.decide(
        model, spec_replicas=10, pods=pods, observations=obs, history=History(started=True), now=NOW
    )
    assert d.final == 11
    d = hpa.decide(
        HpaModel(1, 20, model.metrics, Behavior()),
        spec_replicas=10,
        pods=pods,
        observations=obs,
        history=History(started=True),
        now=NOW,
    )
    assert d.final == 10
    # and a 20 % scale-down tolerance keeps ratio 0.85
    lax = Behavior(hpa.scale_up_rules(), hpa.scale_down_rules(tolerance=0.2, stabilization_seconds=0))
    low = (Observation(per_pod={f"p{i}": 8.5 for i in range(10)}),)
    d = hpa.decide(
        HpaModel(1, 20, model.metrics, lax),
        spec_replicas=10,
        pods=pods,
        observations=low,
        history=History(started=True),
        now=NOW,
    )
    assert d.final == 10
