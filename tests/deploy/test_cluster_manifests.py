"""deploy/ for a real GPU cluster: exporter privileges and their opt-out, settings that reach every
object, NetworkPolicies, the adapter's availability, the rightsizer's admission policies, OpenShift."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_manifests import DEPLOY, OVERLAY, ROOT, find, pod_spec, render, render_with
from tests.support.yamldocs import load_all

# Each test renders with kubectl kustomize or helm (subprocesses): make unit leaves them out.
pytestmark = pytest.mark.slow


def build(
    tmp_path: Path, *, resources: list[str], components: list[str], extra: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    doc: dict[str, Any] = {
        "resources": [r if r.endswith(".yaml") else os.path.relpath(DEPLOY / r, tmp_path) for r in resources],
        "components": [os.path.relpath(DEPLOY / c, tmp_path) for c in components],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    for name, content in (extra or {}).items():
        (tmp_path / name).write_text(yaml.safe_dump(content))
    res = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return load_all(res.stdout)


def one(objs: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def exporter_container(ds: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod_spec(ds)["containers"]
    (c,) = containers
    return c


def test_exporter_privileges_are_the_documented_minimum() -> None:
    """By default: no hostPID, no added capability, no MIG monitor capability, one hostPath (the
    kubelet's pod-resources socket, read-only)."""
    ds = find("exporter", "DaemonSet", "gpupilot-exporter")
    spec, c = pod_spec(ds), exporter_container(ds)
    assert "hostPID" not in spec and not spec.get("hostNetwork") and not spec.get("hostIPC")
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["privileged"] is False
    assert {e["name"] for e in c["env"]} == {
        "NODE_NAME",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
    }
    assert [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v] == [
        "/var/lib/kubelet/pod-resources"
    ]
    assert all(m["readOnly"] for m in c["volumeMounts"] if m["name"] == "pod-resources")
    text = (DEPLOY / "exporter" / "daemonset.yaml").read_text()
    for evidence in ("CAP_SYS_ADMIN", "NO_PERMISSION", "hostPID", "gpupilot_exporter_process_visibility"):
        assert evidence in text, f"the DaemonSet no longer explains {evidence}"


@pytest.mark.slow
def test_feature_components_add_exactly_their_privileges(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    ds = one(
        build(tmp_path / "p", resources=["exporter"], components=["exporter/processes"]),
        "DaemonSet",
        "gpupilot-exporter",
    )
    spec, c = pod_spec(ds), exporter_container(ds)
    assert spec["hostPID"] is True and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v} == {
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "container-logs": "/var/log/containers",
    }
    assert {"name": "container-logs", "mountPath": "/var/log/containers", "readOnly": True} in c[
        "volumeMounts"
    ]
    (tmp_path / "m").mkdir()
    ds = one(
        build(tmp_path / "m", resources=["exporter"], components=["exporter/mig-monitor"]),
        "DaemonSet",
        "gpupilot-exporter",
    )
    spec, c = pod_spec(ds), exporter_container(ds)
    assert "hostPID" not in spec
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"} in c["env"]


def test_client_component_swaps_the_dcgm_pause_for_the_client_key(tmp_path: Path) -> None:
    objs = build(tmp_path, resources=["exporter"], components=["exporter/mig-pause-client"])
    spec = pod_spec(one(objs, "DaemonSet", "gpupilot-exporter"))
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.client": "true"}
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    exprs = {e["key"]: (e["operator"], e["values"]) for e in term["matchExpressions"]}
    assert exprs == {"nvidia.com/gpu.deploy.gpupilot-exporter": ("NotIn", ["false"])}


SETTINGS = {
    "operatorNamespace": "gpu-ops-x",
    "migConfigMap": "my-mig-config",
    "kubeletPodResourcesDir": "/data/kubelet/pod-resources",
    "runtimeClassName": "nvidia-cdi",
    "exporterPriorityClassName": "gpu-node-critical",
    "adapterPriorityClassName": "metrics-critical",
    "monitoringNamespace": "observability",
}


@pytest.mark.slow
def test_every_setting_reaches_its_objects(tmp_path: Path) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpupilot-settings",
            "annotations": {"config.kubernetes.io/local-config": "true"},
        },
        "data": SETTINGS,
    }
    objs = build(
        tmp_path,
        resources=["settings.yaml", "exporter", "adapter", "rightsizer"],
        components=["settings"],
        extra={"settings.yaml": cm},
    )
    assert not [o for o in objs if o["metadata"]["name"] == "gpupilot-settings"], (
        "local-config is not applied"
    )
    ds = pod_spec(one(objs, "DaemonSet", "gpupilot-exporter"))
    assert ds["runtimeClassName"] == "nvidia-cdi" and ds["priorityClassName"] == "gpu-node-critical"
    vol = next(v for v in ds["volumes"] if v["name"] == "pod-resources")
    assert vol["hostPath"]["path"] == "/data/kubelet/pod-resources"
    assert pod_spec(one(objs, "Deployment", "gpupilot-adapter"))["priorityClassName"] == "metrics-critical"
    role = one(objs, "Role", "gpupilot-rightsizer-mig-config")
    assert role["metadata"]["namespace"] == "gpu-ops-x"
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    assert one(objs, "RoleBinding", "gpupilot-rightsizer-mig-config")["metadata"]["namespace"] == "gpu-ops-x"
    # The write rights of deploy/rightsizer/auto-apply, listed before settings, get the same values.
    (tmp_path / "auto").mkdir()
    auto = build(
        tmp_path / "auto",
        resources=["settings.yaml", "rightsizer"],
        components=["rightsizer/auto-apply", "settings"],
        extra={"settings.yaml": cm},
    )
    apply_role = one(auto, "Role", "gpupilot-rightsizer-apply")
    assert apply_role["metadata"]["namespace"] == "gpu-ops-x"
    assert apply_role["rules"][0]["resourceNames"] == ["my-mig-config"]
    assert one(auto, "RoleBinding", "gpupilot-rightsizer-apply")["metadata"]["namespace"] == "gpu-ops-x"
    np = one(objs, "NetworkPolicy", "gpupilot-exporter")
    assert np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"
    }


@pytest.mark.parametrize("overlay", [OVERLAY, "overlays/openshift/app"])
def test_overlays_set_every_setting(overlay: str) -> None:
    settings = yaml.safe_load((DEPLOY / overlay / "settings.yaml").read_text())["data"]
    used = set(
        re.findall(r"fieldPath: data\.(\w+)", (DEPLOY / "settings" / "kustomization.yaml").read_text())
    )
    assert set(settings) == used == set(SETTINGS)


@pytest.mark.slow
def test_openshift_overlay_uses_its_operator_namespace_and_scc() -> None:
    objs = render("overlays/openshift")
    assert not [o for o in objs if o["metadata"].get("namespace") == "gpu-operator"]
    scc = next(o for o in objs if o["kind"] == "SecurityContextConstraints")
    assert "namespace" not in scc["metadata"]
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    spec, c = pod_spec(ds), exporter_container(ds)
    # The SCC admits exactly what the exporter asks for.
    assert scc["allowHostPID"] is spec.get("hostPID", False) is False
    assert (
        set(scc["allowedCapabilities"]) == set(c["securityContext"]["capabilities"].get("add", [])) == set()
    )
    assert scc["allowPrivilegedContainer"] is False and scc["allowHostNetwork"] is False
    assert scc["allowHostDirVolumePlugin"] is True and "hostPath" in scc["volumes"]
    binding = one(objs, "RoleBinding", "gpupilot-exporter-scc")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpupilot-exporter", "namespace": "gpupilot"}
    ]
    role = one(objs, "ClusterRole", binding["roleRef"]["name"])
    assert role["rules"][0]["resourceNames"] == [scc["metadata"]["name"]]
    ns = next(o for o in objs if o["kind"] == "Namespace")
    assert ns["metadata"]["labels"]["security.openshift.io/scc.podSecurityLabelSync"] == "false"


def test_exporter_network_policy_admits_only_the_monitoring_namespace() -> None:
    np = find("exporter", "NetworkPolicy", "gpupilot-exporter")
    ds = find("exporter", "DaemonSet", "gpupilot-exporter")
    assert (
        np["spec"]["podSelector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert np["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = np["spec"]["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_adapter_network_policy_opens_only_https() -> None:
    np = find("adapter", "NetworkPolicy", "gpupilot-adapter")
    (rule,) = np["spec"]["ingress"]
    assert rule == {"ports": [{"port": "https", "protocol": "TCP"}]}
    dep = find("adapter", "Deployment", "gpupilot-adapter")
    assert any(p["name"] == "https" for p in pod_spec(dep)["containers"][0]["ports"])


def test_adapter_survives_drains_and_node_loss() -> None:
    dep = find("adapter", "Deployment", "gpupilot-adapter")
    spec = pod_spec(dep)
    assert spec["priorityClassName"] == "system-cluster-critical"
    term = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "podAffinityTerm"
    ]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pdb = find("adapter", "PodDisruptionBudget", "gpupilot-adapter")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert 1 <= pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]


def rightsizer_annotation_keys() -> set[str]:
    source = "\n".join(p.read_text() for p in (ROOT / "rightsizer").rglob("*.py"))
    return set(re.findall(r'"(gpupilot\.io/[a-z-]+)"', source))


@pytest.mark.slow
def test_admission_policies_bind_to_the_rightsizer_and_cover_its_writes() -> None:
    """Every write the auto-apply component grants (node, ClusterPolicy and workload patches) is bound
    by a Deny policy matching the rightsizer's user; tests/deploy/test_admission_policies.py
    evaluates what they admit."""
    objs = render(OVERLAY)
    sa = one(objs, "ServiceAccount", "gpupilot-rightsizer")
    username = f"system:serviceaccount:{sa['metadata']['namespace']}:gpupilot-rightsizer"
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {b["spec"]["policyName"] for b in bindings} == set(policies) and len(policies) == 3
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    covered = set()
    for policy in policies.values():
        (cond,) = policy["spec"]["matchConditions"]
        assert cond["expression"] == f"request.userInfo.username == '{username}'"
        assert policy["spec"]["failurePolicy"] == "Fail"
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
            covered |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    grants = one(render_with(OVERLAY, "rightsizer/auto-apply"), "ClusterRole", "gpupilot-rightsizer-apply")
    patched = {
        (g, r)
        for rule in grants["rules"]
        if "patch" in rule["verbs"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert patched and patched <= covered, f"patch rights without a policy: {patched - covered}"
    nodes = "\n".join(v["expression"] for v in policies["gpupilot-rightsizer-nodes"]["spec"]["validations"])
    ours = next(
        v["expression"]
        for v in policies["gpupilot-rightsizer-nodes"]["spec"]["variables"]
        if v["name"] == "ours"
    )
    annotations = rightsizer_annotation_keys()
    assert annotations, "the scan no longer finds the rightsizer's node annotations"
    assert all(k.startswith("gpupilot.io/") for k in annotations) and "'gpupilot.io/'" in ours
    assert "'unschedulable'" in nodes


@pytest.mark.parametrize("overlay", [OVERLAY, "overlays/openshift"])
def test_rightsizer_config_agrees_with_the_settings(overlay: str) -> None:
    objs = render(overlay)
    cm = one(
        list(objs),
        "ConfigMap",
        next(
            o["metadata"]["name"]
            for o in objs
            if o["metadata"]["name"].startswith("gpupilot-rightsizer") and o["kind"] == "ConfigMap"
        ),
    )
    auto = yaml.safe_load(cm["data"]["rightsizer.yaml"])["auto_apply"]
    role = one(list(objs), "Role", "gpupilot-rightsizer-mig-config")
    assert auto["operator_namespace"] == role["metadata"]["namespace"]
    for apply_role in [
        o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "gpupilot-rightsizer-apply"
    ]:
        assert [auto["mig_configmap"]] == apply_role["rules"][0]["resourceNames"]


def test_every_apiservice_carries_cert_managers_trust_path(tmp_path: Path) -> None:
    """deploy/adapter and its external component: every APIService is annotated for cert-manager's
    CA injector from the serving Certificate, which a CA Issuer of the adapter's own signs."""
    objs = build(tmp_path, resources=["adapter"], components=["adapter/external"])
    services = [o for o in objs if o["kind"] == "APIService"]
    cert = one(objs, "Certificate", "gpupilot-adapter-tls")
    issuer = one(objs, "Issuer", cert["spec"]["issuerRef"]["name"])
    ca = one(objs, "Certificate", "gpupilot-adapter-ca")
    assert issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"] and ca["spec"]["isCA"] is True
    assert len(services) == 3
    for api in services:
        assert api["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "gpupilot/gpupilot-adapter-tls"
        }
