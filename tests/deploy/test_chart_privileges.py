"""The chart's smaller least-privilege points: a PodDisruptionBudget only where it cannot block a drain,
`helm test` objects that never outlive the test, a kept claim's namespace kept too, the GPU Operator's
namespace touched only with the ClusterPolicy integration, and the rightsizer's NetworkPolicy in kustomize."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_cluster_manifests import build, one
from tests.deploy.test_helm import CHART, NAMESPACE, run_helm, template
from tests.deploy.test_manifests import DEPLOY, OVERLAY, render


def kinds(objs: tuple[dict[str, Any], ...]) -> set[str]:
    return {o["kind"] for o in objs}


@pytest.mark.slow
def test_one_adapter_replica_gets_no_disruption_budget() -> None:
    assert "PodDisruptionBudget" not in kinds(template("defaults", "adapter.replicas=1"))
    (pdb,) = [o for o in template("defaults", "adapter.replicas=2") if o["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1


@pytest.mark.slow
def test_helm_test_rights_are_deleted_whatever_the_outcome() -> None:
    hooks = [o for o in template("defaults") if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    assert {o["kind"] for o in hooks} == {"ServiceAccount", "ClusterRoleBinding", "Pod"}
    for obj in hooks:
        policy = set(obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(","))
        assert {"before-hook-creation", "hook-succeeded"} <= policy, obj["kind"]
        if obj["kind"] != "Pod":  # the Pod keeps its logs after a failure; it holds no rights then
            assert "hook-failed" in policy, f"{obj['kind']} would stay after a failed test"


@pytest.mark.slow
def test_a_kept_claims_namespace_is_kept_too() -> None:
    def namespace(*sets: str) -> dict[str, Any]:
        (ns,) = [o for o in template("defaults", "namespace.create=true", *sets) if o["kind"] == "Namespace"]
        return ns

    kept = namespace("rightsizer.persistence.enabled=true")
    assert kept["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    (pvc,) = [
        o
        for o in template("defaults", "rightsizer.persistence.enabled=true")
        if o["kind"] == "PersistentVolumeClaim"
    ]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "annotations" not in namespace()
    assert "annotations" not in namespace(
        "rightsizer.persistence.enabled=true", "rightsizer.persistence.existingClaim=mine"
    )


@pytest.mark.slow
def test_operator_namespace_only_with_the_cluster_policy_integration() -> None:
    on = template("defaults", "rightsizer.gpuOperatorNamespace=nvidia-gpu-operator")
    assert {
        (o["kind"], o["metadata"]["name"])
        for o in on
        if o["metadata"].get("namespace") == "nvidia-gpu-operator"
    } == {("Role", "gpupilot-rightsizer-mig-config"), ("RoleBinding", "gpupilot-rightsizer-mig-config")}
    off = template("defaults", "rightsizer.clusterPolicy.enabled=false")
    assert not [o for o in off if o["metadata"].get("namespace") == "gpu-operator"]
    rules = [r for o in off if o["kind"] == "ClusterRole" for r in o.get("rules", [])]
    assert rules and not [r for r in rules if "clusterpolicies" in r["resources"]]
    res = run_helm(
        "template",
        "gpupilot",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--set",
        "rightsizer.clusterPolicy.enabled=false",
        "--set",
        "rightsizer.autoApply.enabled=true",
    )
    assert res.returncode != 0
    assert "set rightsizer.clusterPolicy.enabled=true, or turn auto-apply off" in res.stderr


@pytest.mark.slow
def test_kustomize_rightsizer_admits_only_the_monitoring_namespace(tmp_path: Path) -> None:
    """The overlay's monitoringNamespace setting reaches the rightsizer's NetworkPolicy."""
    settings = yaml.safe_load((DEPLOY / "overlays" / "gpu-operator" / "settings.yaml").read_text())
    settings["data"]["monitoringNamespace"] = "prom-stack"
    objs = build(
        tmp_path,
        resources=["settings.yaml", "rightsizer"],
        components=["settings"],
        extra={"settings.yaml": settings},
    )
    np = one(objs, "NetworkPolicy", "gpupilot-rightsizer")
    assert np["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np["spec"]["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prom-stack"}}}
    ]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert one(list(render(OVERLAY)), "NetworkPolicy", "gpupilot-rightsizer")
