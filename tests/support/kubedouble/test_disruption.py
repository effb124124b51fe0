"""PodDisruptionBudgets in the double behave as the eviction registry and the disruption controller
do: decremented on each eviction, restored only by a Ready replacement, scale from the controller,
Ready pods only, and the multi-budget 500."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.kubedouble import KubeDouble
from tests.support.kubedouble.disruption import MULTIPLE_PDBS


def evict(kube: KubeDouble, name: str, namespace: str = "default") -> int:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    try:
        client.CoreV1Api(kube.api_client()).create_namespaced_pod_eviction(name, namespace, body)
    except ApiException as exc:
        return int(exc.status)
    return 201


def pdb_status(kube: KubeDouble, name: str) -> client.V1PodDisruptionBudgetStatus:
    api = client.PolicyV1Api(kube.api_client())
    status = api.read_namespaced_pod_disruption_budget(name, "default").status
    assert status is not None
    return status


@pytest.mark.slow
def test_max_unavailable_one_over_three_replicas_allows_one_eviction_until_a_replacement_is_ready():
    with KubeDouble() as kube:
        kube.add_replicaset(
            "web", replicas=3, labels={"app": "web"}, nodes=["a", "b", "c"], replacement_ready_after_s=None
        )
        kube.add_pdb("web", match_labels={"app": "web"}, max_unavailable=1)
        status = pdb_status(kube, "web")
        assert (status.expected_pods, status.desired_healthy, status.disruptions_allowed) == (3, 2, 1)
        assert [evict(kube, n) for n in ("web-0", "web-1", "web-2")] == [201, 429, 429]
        status = pdb_status(kube, "web")
        assert status.disruptions_allowed == 0 and status.current_healthy == 2
        kube.wait_for(lambda: not any(p["metadata"]["name"] == "web-0" for p in kube.pods()))
        # the replacement exists but stays Pending: still no disruption allowed
        assert evict(kube, "web-1") == 429
        refused = kube.actions(verb="evict-refused")[-1]
        assert (
            refused.detail["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
        )


@pytest.mark.slow
def test_a_ready_replacement_restores_the_budget():
    with KubeDouble() as kube:
        kube.add_replicaset(
            "web", replicas=3, labels={"app": "web"}, nodes=["a", "b", "c"], replacement_ready_after_s=0.2
        )
        kube.add_pdb("web", match_labels={"app": "web"}, max_unavailable=1)
        assert evict(kube, "web-0") == 201
        assert evict(kube, "web-1") == 429
        kube.wait_for(lambda: pdb_status(kube, "web").disruptions_allowed == 1, timeout=5)
        assert evict(kube, "web-1") == 201
        replacements = [p for p in kube.pods() if p["metadata"]["name"].startswith("web-r")]
        assert len(replacements) == 2


@pytest.mark.slow
def test_min_available_percentage_counts_against_the_scale_and_rounds_up():
    with KubeDouble() as kube:
        kube.add_replicaset(
            "web", replicas=4, labels={"app": "web"}, nodes=["a"] * 4, replacement_ready_after_s=None
        )
        kube.add_pdb("web", match_labels={"app": "web"}, min_available="50%")
        assert [evict(kube, f"web-{i}") for i in range(4)] == [201, 201, 429, 429]
        # 3 of 4 and 75 % of 3 rounds up to 3 (GetScaledValueFromIntOrPercent, roundUp=true)
    with KubeDouble() as kube:
        kube.add_replicaset(
            "w", replicas=3, labels={"app": "w"}, nodes=["a"] * 3, replacement_ready_after_s=None
        )
        kube.add_pdb("w", match_labels={"app": "w"}, min_available="75%")
        assert pdb_status(kube, "w").desired_healthy == 3
        assert evict(kube, "w-0") == 429


@pytest.mark.slow
def test_only_ready_pods_are_healthy_and_unready_pods_follow_the_policy():
    with KubeDouble() as kube:
        kube.add_pod("a", node="n", labels={"app": "x"})
        kube.add_pod("b", node="n", labels={"app": "x"}, ready=False)
        kube.add_pdb("x", match_labels={"app": "x"}, min_available=2)
        assert pdb_status(kube, "x").current_healthy == 1
        # IfHealthyBudget (default): an unready pod may go only while the budget is met — it is not
        assert evict(kube, "b") == 429
    with KubeDouble() as kube:
        kube.add_pod("a", node="n", labels={"app": "x"})
        kube.add_pod("b", node="n", labels={"app": "x"}, ready=False)
        kube.add_pdb(
            "x", match_labels={"app": "x"}, min_available=2, unhealthy_pod_eviction_policy="AlwaysAllow"
        )
        assert evict(kube, "b") == 201
        assert evict(kube, "a") == 429
    with KubeDouble() as kube:  # a controller the PDB cannot find: failSafe, nothing allowed
        kube.add_pod("a", node="n", labels={"app": "x"}, owner=("ReplicaSet", "missing"))
        kube.add_pdb("x", match_labels={"app": "x"}, max_unavailable=1)
        assert evict(kube, "a") == 429


@pytest.mark.slow
def test_a_pod_under_two_budgets_gets_500():
    with KubeDouble() as kube:
        kube.add_pod("a", node="n", labels={"app": "x", "tier": "gpu"})
        kube.add_pod("b", node="n", labels={"app": "x", "tier": "gpu"})
        kube.add_pdb("one", match_labels={"app": "x"}, min_available=0)
        kube.add_pdb("two", match_labels={"tier": "gpu"}, min_available=0)
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name="a", namespace="default"))
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(kube.api_client()).create_namespaced_pod_eviction("a", "default", body)
        assert err.value.status == 500 and MULTIPLE_PDBS in str(err.value.body)
        assert len(kube.pods()) == 2


@pytest.mark.slow
def test_terminal_pending_and_terminating_pods_skip_the_budget():
    with KubeDouble(pod_termination_s=0.5) as kube:
        kube.add_pod("done", node="n", labels={"app": "x"}, phase="Succeeded")
        kube.add_pod("wait", node=None, labels={"app": "x"}, phase="Pending")
        kube.add_pod("run", node="n", labels={"app": "x"})
        kube.add_pdb("x", match_labels={"app": "x"}, min_available=1)
        assert [evict(kube, n) for n in ("done", "wait")] == [201, 201]
        client.CoreV1Api(kube.api_client()).delete_namespaced_pod("run", "default")
        assert evict(kube, "run") == 201  # already terminating: canIgnorePDB


@pytest.mark.slow
def test_eviction_name_must_match_the_url():
    with KubeDouble() as kube:
        kube.add_pod("a", node="n")
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name="b", namespace="default"))
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(kube.api_client()).create_namespaced_pod_eviction("a", "default", body)
        assert err.value.status == 400
        assert "name in URL does not match name in Eviction object" in str(err.value.body)
