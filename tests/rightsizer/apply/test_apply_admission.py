"""apply under the rightsizer's own RBAC (deploy/rightsizer, the auto-apply component included) and
its ValidatingAdmissionPolicies, enforced by the API double with a real CEL engine: a resize with a
workload request move, and its rollback, pass; any other change the same identity tries is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import FAST, break_node, resize_plan

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
MIG1, MIG3 = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"
SETTINGS = dataclasses.replace(FAST, settle_timeout_s=5, lease_duration_s=3)


def guarded(kube: KubeDouble) -> str:
    """RBAC and admission policies of deploy/rightsizer; the rightsizer's token."""
    assert kube.load_rbac(DEPLOY / "rightsizer") > 0
    assert kube.load_admission_policies(DEPLOY / "rightsizer" / "admission-policy.yaml") == 3
    return kube.add_service_account("gpupilot", "gpupilot-rightsizer")


def seed(kube: KubeDouble) -> str:
    kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
    kube.add_workload("Deployment", "reports", namespace="ml", replicas=1, resources={MIG3: 1}, node="gpu-a")
    (pod,) = [str(p["metadata"]["name"]) for p in kube.pods(node="gpu-a")]
    return pod


def first_container(kube: KubeDouble) -> dict[str, Any]:
    obj = kube.workload("Deployment", "reports", namespace="ml")
    assert obj is not None
    container: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return container


def template_limits(kube: KubeDouble) -> dict[str, str]:
    return dict(first_container(kube)["resources"]["limits"])


@pytest.mark.slow
def test_a_resize_and_a_rollback_pass_the_policies() -> None:
    with KubeDouble() as kube:
        token = guarded(kube)
        pod = seed(kube)
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        report = Applier(Kube(kube.api_client(token)), plan, SETTINGS).run()
        assert [o.result for o in report.outcomes] == ["applied"], report.outcomes
        assert template_limits(kube) == {MIG1: "1"}

    with KubeDouble() as kube:
        token = guarded(kube)
        pod = seed(kube)
        break_node(kube, "gpu-a")  # the MIG Manager fails after the relabel: apply rolls back
        plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod, "1g.10gb")])
        report = Applier(Kube(kube.api_client(token)), plan, SETTINGS).run()
        assert [o.result for o in report.outcomes] == ["rolled-back"], report.outcomes
        assert template_limits(kube) == {MIG3: "1"}


@pytest.mark.slow
def test_the_same_identity_cannot_change_an_image_or_a_node_label() -> None:
    with KubeDouble() as kube:
        token = guarded(kube)
        seed(kube)
        client = kube.api_client(token)
        apps = kubernetes.client.AppsV1Api(client)
        container = first_container(kube)
        evil = {"name": container["name"], "image": "evil/miner:1"}
        body = {"spec": {"template": {"spec": {"containers": [evil]}}}}
        with pytest.raises(kubernetes.client.ApiException) as err:
            apps.patch_namespaced_deployment("reports", "ml", body)
        assert err.value.status == 403
        assert "ValidatingAdmissionPolicy 'gpupilot-rightsizer-workloads'" in str(err.value.body)
        with pytest.raises(kubernetes.client.ApiException) as err:
            kubernetes.client.CoreV1Api(client).patch_node("gpu-a", {"metadata": {"labels": {"team": "x"}}})
        assert err.value.status == 403
        assert "gpupilot-rightsizer-nodes" in str(err.value.body)
        assert first_container(kube)["image"] == container["image"]
