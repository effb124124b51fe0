"""apply against an API server that answers 429 (with Retry-After) and 5xx: a fault matrix over every
call apply makes, success path and rollback path; the outcome and the cluster must be as without the
fault. Plus: retries that run out, a rollback that fails, and the multi-budget 500."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from rightsizer.apply import protocol as proto
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import (
    FAST,
    GOOD,
    Change,
    break_node,
    make_plan,
    run_apply,
    seed_node,
)

SCENARIOS = {
    "success": (False, "applied", "done"),
    "rollback": (True, "rolled-back", "rolled-back"),  # the MIG Manager fails: rollback calls too
}


def scenario_run(broken, *, fault=None):
    """One apply on a fresh double; ``fault`` = (status, method, path, skip) fails that one call."""
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        if broken:
            break_node(kube, "gpu-a")
        injected = None
        if fault is not None:
            status, method, path, skip = fault
            injected = kube.inject_fault(
                status,
                method=method,
                path_contains=path,
                skip=skip,
                # Retry-After: 0: the matrix proves each call is retried, not the wait (which
                # test_429_on_the_first_node_read_and_on_the_cordon_are_retried measures)
                retry_after_s=0 if status == 429 else None,
                message="injected by the fault matrix",
            )
        report, lines = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
        calls = [(m, urllib.parse.urlsplit(p).path) for m, p in kube.api.request_log]
        state = {
            "config": kube.labels("gpu-a")[proto.CONFIG_LABEL],
            "cordoned": bool(kube.node("gpu-a")["spec"].get("unschedulable")),
            "step": kube.annotations("gpu-a").get(proto.ANN_STEP),
            "gpu_pods": len([p for p in kube.pods(node="gpu-a") if "infer" in p["metadata"]["name"]]),
        }
        taken = injected is not None and injected.hits > injected.skip
        return report, lines, calls, state, taken


def matrix() -> list[tuple[str, int, str, str, int]]:
    cases = []
    for name, (broken, _, _) in SCENARIOS.items():
        _, _, calls, _, _ = scenario_run(broken)
        seen: Counter[tuple[str, str]] = Counter()
        for method, path in calls:
            if path.startswith(("/api/v1/namespaces/default/events", "/version")) or path in (
                "/api",
                "/apis",
            ):
                continue
            for status in (503, 429):
                cases.append((name, status, method, path, seen[(method, path)]))
            seen[(method, path)] += 1
    return cases


@pytest.mark.slow
def test_one_transient_error_on_any_call_changes_nothing_in_the_outcome():
    cases = matrix()
    assert len(cases) >= 100  # every read, patch, list, eviction, watch, Lease and event, both scenarios

    def one(case: tuple[str, int, str, str, int]):
        name, status, method, path, skip = case
        return scenario_run(SCENARIOS[name][0], fault=(status, method, path, skip))

    with ThreadPoolExecutor(max_workers=8) as pool:  # each case has its own double; mostly waiting
        results = list(pool.map(one, cases))
    failures = []
    not_taken = []
    for (name, status, method, path, skip), (report, lines, _, state, taken) in zip(
        cases, results, strict=True
    ):
        _, want_result, want_step = SCENARIOS[name]
        if not taken:
            not_taken.append((name, status, method, path, skip))
        got = (report.outcomes[0].result, state["step"], state["cordoned"], state["gpu_pods"])
        want = (want_result, want_step, False, 0)
        if got != want or state["config"] != ("all-1g.10gb" if name == "rollback" else state["config"]):
            failures.append(f"{name} {status} on {method} {path} #{skip}: {got} != {want}")
        elif (
            taken
            and not any("retrying in" in m for _, m in lines)
            # a failed watch (GET /api/v1/nodes) is answered by polling, a 429 with Retry-After on an
            # idempotent method (GET, PUT) by urllib3 itself; every other fault by apply's retry,
            # which it reports
            and path != "/api/v1/nodes"
            and not (method in ("GET", "PUT") and status == 429)
        ):
            failures.append(f"{name} {status} on {method} {path} #{skip}: no retry was reported")
    assert failures == []
    assert len(not_taken) <= len(cases) // 10, not_taken  # the matrix really hit (almost) every call


@pytest.mark.slow
def test_429_on_the_first_node_read_and_on_the_cordon_are_retried():
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        read = kube.inject_fault(429, method="GET", path_contains="/api/v1/nodes/gpu-a")
        cordon = kube.inject_fault(429, method="PATCH", path_contains="/api/v1/nodes/gpu-a", retry_after_s=1)
        report, lines = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
        assert report.outcomes[0].result == "applied"
        assert read.count == 0 and cordon.count == 0
        retry = [m for _, m in lines if "retrying in" in m]
        assert len(retry) == 2
        assert "read node gpu-a: node gpu-a: HTTP 429" in retry[0] and "(backoff)" in retry[0]
        assert "patch node gpu-a" in retry[1] and "retrying in 1.0s (Retry-After)" in retry[1]


@pytest.mark.slow
def test_the_client_transport_itself_honours_retry_after_on_reads():
    """urllib3 (under the official client) retries idempotent requests answered 429/503 with
    Retry-After on its own; apply sees the answer after it."""
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        fault = kube.inject_fault(503, method="GET", path_contains="/api/v1/nodes/gpu-a", retry_after_s=1)
        report, lines = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
        assert report.outcomes[0].result == "applied" and fault.count == 0
        assert not [m for _, m in lines if "retrying in" in m]


@pytest.mark.slow
def test_503_on_the_pod_list_then_on_the_rollback_read_is_never_reported_rolled_back_when_it_was_not():
    """The issue's case: the pod list fails for good, then so does every node read during rollback."""
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        settings = dataclasses.replace(FAST, api_retry_s=0.3)
        # the first list (before any change: which workloads the pods belong to) still answers
        kube.inject_fault(503, method="GET", path_contains="/api/v1/pods", count=None, skip=1)
        lines: list[str] = []

        def on_progress(node: str, msg: str) -> None:
            lines.append(msg)
            if msg.endswith("rolling back"):  # from now on the node cannot be read either
                kube.inject_fault(503, method="GET", path_contains="/api/v1/nodes/gpu-a", count=None)

        report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings, on_progress)
        out = report.outcomes[0]
        assert out.result == "rollback-failed" and not report.ok
        assert "ROLLBACK FAILED" in out.reason and "run apply again to resume" in out.reason
        assert "HTTP 503" in out.reason and "attempt(s)" in out.reason
        # what a rerun needs: the node still says where it stopped
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "requests-set"
        assert kube.node("gpu-a")["spec"]["unschedulable"] is True
        kube.clear_faults()
        again, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
        assert again.outcomes[0].result == "applied"
        assert not kube.node("gpu-a")["spec"].get("unschedulable")


@pytest.mark.slow
def test_a_failed_first_read_is_failed_not_rolled_back_and_stops_later_batches():
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        seed_node(kube, "gpu-b")
        kube.inject_fault(500, method="GET", path_contains="/api/v1/nodes/gpu-a", count=None)
        settings = dataclasses.replace(FAST, api_retry_s=0.2)
        plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])
        report, _ = run_apply(kube, plan, settings)
        assert [o.result for o in report.outcomes] == ["failed", "not-started"]
        assert report.outcomes[0].reason.startswith("nothing changed: node gpu-a: HTTP 500")
        assert kube.actions(resource="nodes") == []


@pytest.mark.slow
def test_pod_under_two_budgets_fails_the_node_at_once_with_a_clear_reason():
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a", pods=1, app="infer")
        kube.add_pdb("by-app", namespace="ml", match_labels={"app": "infer"}, min_available=0)
        kube.add_pdb("by-app-too", namespace="ml", match_labels={"app": "infer"}, min_available=0)
        settings = dataclasses.replace(FAST, eviction_timeout_s=30)
        report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings)
        out = report.outcomes[0]
        assert out.result == "rolled-back"
        assert "ml/gpu-a-infer-0 is selected by more than one PodDisruptionBudget" in out.reason
        assert out.seconds < 5  # not retried until the eviction timeout
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"
        assert not kube.node("gpu-a")["spec"].get("unschedulable")


def seed_replicated(kube: KubeDouble, *, ready_after_s: float | None) -> None:
    """gpu-a runs two of three replicas of a GPU service under ``maxUnavailable: 1``."""
    kube.add_node("gpu-a", mig_config="all-1g.10gb")
    kube.add_replicaset(
        "llm",
        namespace="ml",
        replicas=3,
        labels={"app": "llm"},
        nodes=["gpu-a", "gpu-a", "gpu-b"],
        resources={"nvidia.com/mig-1g.10gb": 1},
        replacement_ready_after_s=ready_after_s,
        replacement_node="gpu-b",
    )
    kube.add_pdb("llm", namespace="ml", match_labels={"app": "llm"}, max_unavailable=1)


@pytest.mark.slow
def test_max_unavailable_one_waits_for_a_ready_replacement_between_evictions():
    with KubeDouble() as kube:
        seed_replicated(kube, ready_after_s=0.3)
        settings = dataclasses.replace(FAST, eviction_timeout_s=10)
        report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings)
        assert report.outcomes[0].result == "applied", report.outcomes
        evictions = kube.actions(verb="evict")
        refused = kube.actions(verb="evict-refused")
        assert [e.name for e in evictions] == ["llm-0", "llm-1"]
        # the second eviction was refused until the first pod's replacement was Ready
        assert refused and all(r.name == "llm-1" for r in refused)
        assert evictions[0].seq < refused[0].seq < evictions[1].seq
        assert not [p for p in kube.pods(node="gpu-a")]


@pytest.mark.slow
def test_max_unavailable_one_without_a_ready_replacement_rolls_back_at_the_eviction_timeout():
    with KubeDouble() as kube:
        seed_replicated(kube, ready_after_s=None)  # the replacement stays Pending
        settings = dataclasses.replace(FAST, eviction_timeout_s=0.5)
        report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings)
        out = report.outcomes[0]
        assert out.result == "rolled-back"
        assert "pods still hold the GPUs after 0.5s: ml/llm-1" in out.reason
        assert "The disruption budget llm needs 2 healthy pods and has 2 currently" in out.reason
        assert [e.name for e in kube.actions(verb="evict")] == ["llm-0"]
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"
        assert not kube.node("gpu-a")["spec"].get("unschedulable")
