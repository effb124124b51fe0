"""deploy/adapter: `kubectl kustomize` renders the base (and with the optional components), and the
objects are right: hardened Deployment with HTTPS probes, APIServices with v1beta2 preferred,
delegated-auth RBAC, the HPA's access to the metrics, and a config the adapter accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.cli import build_parser
from adapter.config import apiservices
from adapter.config.mapping import parse_config
from tests.support.yamldocs import load_all

ROOT = Path(__file__).resolve().parents[3]
BASE = ROOT / "deploy" / "adapter"


pytestmark = pytest.mark.usefixtures("kubectl_present")


def render(path: Path) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return load_all(out.stdout)


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in render(BASE)}


def test_deployment_is_hardened_and_probed_over_https(objects: dict[tuple[str, str], Any]) -> None:
    dep = objects[("Deployment", "gpupilot-adapter")]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "https", "scheme": "HTTPS"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "https", "scheme": "HTTPS"}
    assert pod["serviceAccountName"] == "gpupilot-adapter"
    # every argument is a flag the adapter really has
    args = build_parser().parse_args(c["args"])
    assert args.command == "serve" and args.pod_source == "kubernetes"
    assert str(args.tls_cert_file).startswith("/var/run/serving-cert/")
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert str(args.config.parent) in mounts and "/var/run/serving-cert" in mounts


def test_service_and_apiservices(objects: dict[tuple[str, str], Any]) -> None:
    svc = objects[("Service", "gpupilot-adapter")]
    assert svc["spec"]["ports"][0]["port"] == 443
    v2, v1 = (
        objects[("APIService", "v1beta2.custom.metrics.k8s.io")],
        objects[("APIService", "v1beta1.custom.metrics.k8s.io")],
    )
    assert v2["spec"]["versionPriority"] > v1["spec"]["versionPriority"]
    for api in (v1, v2):
        assert api["spec"]["group"] == "custom.metrics.k8s.io"
        assert api["spec"]["service"] == {"name": "gpupilot-adapter", "namespace": "gpupilot", "port": 443}
        assert api["spec"]["insecureSkipTLSVerify"] is False
    assert not any(k == "APIService" and "external" in n for k, n in objects)  # optional component only


def test_rbac(objects: dict[tuple[str, str], Any]) -> None:
    sa = {"kind": "ServiceAccount", "name": "gpupilot-adapter", "namespace": "gpupilot"}
    delegator = objects[("ClusterRoleBinding", "gpupilot-adapter:system:auth-delegator")]
    assert delegator["roleRef"]["name"] == "system:auth-delegator" and delegator["subjects"] == [sa]
    reader = objects[("RoleBinding", "gpupilot-adapter-auth-reader")]
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "extension-apiserver-authentication-reader",
    }
    rules = objects[("ClusterRole", "gpupilot-adapter-resource-reader")]["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["apiregistration.k8s.io"],
            "resources": ["apiservices"],
            "resourceNames": apiservices.apiservice_names(external=True),
            "verbs": ["get"],  # the startup check of who serves the metrics APIs, nothing else
        },
    ]
    hpa = objects[("ClusterRoleBinding", "gpupilot-adapter-hpa-metrics-reader")]
    assert hpa["subjects"] == [
        {"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}
    ]
    role = objects[("ClusterRole", hpa["roleRef"]["name"])]
    assert "custom.metrics.k8s.io" in role["rules"][0]["apiGroups"] and "get" in role["rules"][0]["verbs"]


def test_configmap_holds_a_valid_config_equal_to_the_packaged_default(
    objects: dict[tuple[str, str], Any],
) -> None:
    cm = objects[("ConfigMap", "gpupilot-adapter-config")]
    text = cm["data"]["config.yaml"]
    cfg = parse_config(yaml.safe_load(text), source="ConfigMap gpupilot-adapter-config")
    assert cfg.metric("DCGM_FI_DEV_GPU_UTIL") is not None
    assert text == (ROOT / "adapter" / "default-config.yaml").read_text()


def test_optional_components_render(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    link = overlay / "base"
    link.symlink_to(BASE)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources:\n  - base\ncomponents:\n  - base/external\n  - base/keda\n"
    )
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in render(overlay)}
    external = rendered[("APIService", "v1beta1.external.metrics.k8s.io")]
    assert ("Certificate", "gpupilot-adapter-tls") in rendered, "the serving certificate comes with the base"
    assert external["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].endswith(
        "/gpupilot-adapter-tls"
    )
    assert ("Deployment", "gpupilot-adapter") in rendered
