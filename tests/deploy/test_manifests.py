"""deploy/: every kustomization rendered with the real `kubectl kustomize`, each object checked.

API versions, least-privilege RBAC, pod security (non-root, read-only root filesystem, no
privilege escalation, capabilities dropped), resources and probes on every container, the
exporter's node placement and MIG-pause affinity, ServiceMonitor honorLabels, the overlay's
namespace/image wiring, the generated monitoring manifests being in sync, and the Dockerfile.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit import manifests

# Each test renders with kubectl kustomize or helm (subprocesses): make unit leaves them out.
from tests.support.yamldocs import load_all

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAY = "overlays/gpu-operator"

# kind → the current (non-deprecated) apiVersion we allow.
KNOWN_API_VERSIONS = {
    "ServiceAccount": "v1",
    "Service": "v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "DaemonSet": "apps/v1",
    "Deployment": "apps/v1",
    "CronJob": "batch/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "APIService": "apiregistration.k8s.io/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
    "PodDisruptionBudget": "policy/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "Namespace": "v1",
    "Certificate": "cert-manager.io/v1",
    "Issuer": "cert-manager.io/v1",
    "ValidatingAdmissionPolicy": "admissionregistration.k8s.io/v1",
    "ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io/v1",
    "SecurityContextConstraints": "security.openshift.io/v1",
}
METRICS_GROUPS = {"custom.metrics.k8s.io", "external.metrics.k8s.io"}
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "APIService",
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "SecurityContextConstraints",
}
WORKLOAD_KINDS = {"DaemonSet", "Deployment", "CronJob"}
FORBIDDEN_VERBS = {"*", "delete", "deletecollection", "escalate", "bind", "impersonate"}
# The one documented exception to runAsNonRoot, hostPID and "no added capability": the exporter
# (see deploy/exporter/daemonset.yaml for the evidence behind each).
ROOT_ALLOWED = {("DaemonSet", "gpupilot-exporter")}
EXPORTER_CAPABILITIES = {"SYS_ADMIN"}


def _kind(path: Path) -> str:
    return str(yaml.safe_load(path.read_text()).get("kind", "Kustomization"))


def kustomizations() -> list[str]:
    """Every buildable kustomization under deploy/ (Components are built through overlays)."""
    dirs = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml") if _kind(p) == "Kustomization")
    return [str(d.relative_to(DEPLOY)) for d in dirs]


def components() -> list[str]:
    dirs = sorted(p.parent for p in DEPLOY.rglob("kustomization.yaml") if _kind(p) == "Component")
    return [str(d.relative_to(DEPLOY)) for d in dirs]


@functools.cache
def render(rel: str) -> tuple[dict[str, Any], ...]:
    assert shutil.which("kubectl"), "kubectl (with kustomize) is needed to render deploy/"
    res = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / rel)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, f"kubectl kustomize deploy/{rel} failed: {res.stderr.strip()}"
    return tuple(load_all(res.stdout))


@functools.cache
def render_with(rel: str, component: str) -> tuple[dict[str, Any], ...]:
    """deploy/REL with the Component deploy/COMPONENT added (as an overlay would)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "resources": [os.path.relpath(DEPLOY / rel, tmp)],
                    "components": [os.path.relpath(DEPLOY / component, tmp)],
                }
            )
        )
        res = subprocess.run(["kubectl", "kustomize", tmp], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"deploy/{rel} + {component}: {res.stderr.strip()}"
    return tuple(load_all(res.stdout))


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


def write_rules(objs: tuple[dict[str, Any], ...], prefix: str = "gpupilot-rightsizer") -> list[str]:
    """Role/ClusterRole rules of PREFIX* objects that grant a write verb (events aside: none)."""
    return [
        f"{o['kind']}/{o['metadata']['name']}: {r['resources']} {sorted(WRITE_VERBS & set(r['verbs']))}"
        for o in objs
        if o["kind"] in {"Role", "ClusterRole"} and o["metadata"]["name"].startswith(prefix)
        for r in o["rules"]
        if WRITE_VERBS & set(r["verbs"])
    ]


def all_objects() -> list[tuple[str, dict[str, Any]]]:
    return [(rel, obj) for rel in kustomizations() for obj in render(rel)]


def ident(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{obj.get('kind')}/{meta.get('namespace', '-')}/{meta.get('name')}"


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def workloads() -> list[tuple[str, dict[str, Any]]]:
    return [(rel, o) for rel, o in all_objects() if o["kind"] in WORKLOAD_KINDS]


def find(rel: str, kind: str, name: str) -> dict[str, Any]:
    for obj in render(rel):
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"{kind}/{name} not rendered by deploy/{rel}")


@pytest.mark.slow
def test_every_expected_kustomization_exists_and_renders() -> None:
    found = set(kustomizations())
    assert {"exporter", "adapter", "rightsizer", "monitoring", OVERLAY} <= found
    for rel in found:
        assert render(rel), f"deploy/{rel} renders no objects"


@pytest.mark.slow
def test_api_versions_are_known_and_current() -> None:
    for rel, obj in all_objects():
        kind = obj["kind"]
        assert kind in KNOWN_API_VERSIONS, f"deploy/{rel}: unexpected kind {ident(obj)}"
        assert obj["apiVersion"] == KNOWN_API_VERSIONS[kind], (
            f"deploy/{rel}: {ident(obj)} uses {obj['apiVersion']}, want {KNOWN_API_VERSIONS[kind]}"
        )


def rbac_rules() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [
        (rel, obj, rule)
        for rel, obj in all_objects()
        if obj["kind"] in {"ClusterRole", "Role"}
        for rule in obj.get("rules", [])
    ]


def check_rbac_rule(where: str, obj: dict[str, Any], rule: dict[str, Any]) -> None:
    """Least privilege for one rule of a Role/ClusterRole (also applied to the Helm chart's)."""
    where = f"{where}: {ident(obj)} rule {rule}"
    verbs = set(rule.get("verbs", []))
    assert not FORBIDDEN_VERBS & verbs, where
    if "*" in rule.get("resources", []):
        # The metrics APIs name resources after metrics, which are not known in advance; read
        # access to all of them is what the HPA controller needs (as its own ClusterRole has).
        assert set(rule["apiGroups"]) <= METRICS_GROUPS, where
        assert verbs <= {"get", "list", "watch"}, where
    assert "*" not in rule.get("apiGroups", []), where
    assert "secrets" not in rule.get("resources", []), where
    assert "nonResourceURLs" not in rule or "*" not in rule["nonResourceURLs"], where
    writes = {"create", "update", "patch"}
    for resource in rule.get("resources", []):
        if resource == "pods/eviction":
            assert verbs == {"create"}, where
        elif resource == "configmaps":
            assert obj["kind"] == "Role", f"configmaps must be namespaced (a Role): {where}"
        elif resource == "nodes":
            assert verbs & writes <= {"patch"}, where
        elif resource == "pods":
            assert not verbs & writes, where
        elif resource == "events":
            assert verbs <= {"create", "patch"}, where
        elif resource == "clusterpolicies":
            assert verbs <= {"get", "list", "watch", "patch"}, where
        elif resource in (
            "deployments",
            "statefulsets",
            "replicasets",
        ):  # apply sets a pod template's GPU request
            assert verbs <= {"get", "patch"}, where
        elif resource == "securitycontextconstraints":
            assert verbs == {"use"} and rule.get("resourceNames"), where
        elif resource == "leases":  # one apply at a time / serve's leader: named Leases only
            assert obj["kind"] == "Role", f"leases must be namespaced (a Role): {where}"
            assert verbs <= {"get", "create", "update"}, where
            assert verbs <= {"create"} or rule.get("resourceNames"), where
        elif resource not in {"tokenreviews", "subjectaccessreviews"}:
            assert not verbs & writes, f"unexpected write access: {where}"


def test_rbac_is_least_privilege() -> None:
    rules = rbac_rules()
    assert rules
    for rel, obj, rule in rules:
        check_rbac_rule(f"deploy/{rel}", obj, rule)


def test_rightsizer_is_read_only_without_the_auto_apply_component() -> None:
    for rel in ("rightsizer", OVERLAY, "overlays/openshift"):
        assert write_rules(render(rel)) == [], f"deploy/{rel} grants the rightsizer write rights"
    assert write_rules(render_with("rightsizer", "rightsizer/auto-apply"))


def test_rightsizer_rbac_covers_what_apply_does() -> None:
    objs = render_with("rightsizer", "rightsizer/auto-apply")
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    granted = {
        (g, r, v)
        for name in ("gpupilot-rightsizer", "gpupilot-rightsizer-apply")
        for rule in by[("ClusterRole", name)]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    for need in [
        ("", "nodes", "patch"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods/eviction", "create"),
        ("nvidia.com", "clusterpolicies", "get"),
        ("nvidia.com", "clusterpolicies", "list"),
        ("nvidia.com", "clusterpolicies", "patch"),
        ("resource.k8s.io", "resourceslices", "list"),
        ("", "events", "create"),
        ("apps", "replicasets", "get"),
        ("apps", "replicasets", "patch"),
        ("apps", "deployments", "get"),
        ("apps", "deployments", "patch"),
        ("apps", "statefulsets", "get"),
        ("apps", "statefulsets", "patch"),
    ]:
        assert need in granted, f"rightsizer ClusterRoles lack {need}"
    cm = [""], ["configmaps"]
    read = by[("Role", "gpupilot-rightsizer-mig-config")]
    assert read["metadata"]["namespace"] == "gpu-operator"
    assert [(r["apiGroups"], r["resources"], r.get("resourceNames"), r["verbs"]) for r in read["rules"]] == [
        # every ConfigMap of the namespace: the mig-parted files, the MIG Manager's per-node profile
        # lists and apply's in-flight record (for --dry-run)
        (*cm, None, ["get"]),
    ]
    cm_role = by[("Role", "gpupilot-rightsizer-apply")]
    assert cm_role["metadata"]["namespace"] == "gpu-operator"
    assert [
        (r["apiGroups"], r["resources"], r.get("resourceNames"), r["verbs"])
        for r in cm_role["rules"]
        if r["resources"] == ["configmaps"]
    ] == [
        (*cm, ["gpupilot-mig-parted-config"], ["get", "update", "patch"]),
        (*cm, None, ["create"]),  # create cannot be limited by name
        (*cm, ["gpupilot-rightsizer-in-flight"], ["get", "update"]),  # where nodes cannot write
    ]
    leases = [r for r in cm_role["rules"] if r["resources"] == ["leases"]]
    assert {v for r in leases for v in r["verbs"]} == {"get", "create", "update"}
    assert all(
        r.get("resourceNames") == ["gpupilot-rightsizer-apply"] for r in leases if r["verbs"] != ["create"]
    )


def check_pod_security(where: str, obj: dict[str, Any]) -> None:
    """Pod security of one workload (also applied to the Helm chart's)."""
    spec = pod_spec(obj)
    pod_sc = spec.get("securityContext", {})
    assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", ident(obj)
    exporter = (obj["kind"], obj["metadata"]["name"]) in ROOT_ALLOWED
    assert not spec.get("hostNetwork") and not spec.get("hostIPC"), ident(obj)
    assert not spec.get("hostPID") or exporter, ident(obj)
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        here = f"{where}: {ident(obj)} container {c['name']}"
        assert sc.get("allowPrivilegeEscalation") is False, here
        assert sc.get("readOnlyRootFilesystem") is True, here
        assert not sc.get("privileged"), here
        assert "ALL" in sc.get("capabilities", {}).get("drop", []), here
        added = set(sc.get("capabilities", {}).get("add") or [])
        assert added <= (EXPORTER_CAPABILITIES if exporter else set()), here
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if exporter:
            continue
        assert non_root is True, f"{here}: runAsNonRoot must be true"
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        assert uid is None or uid != 0, here


def check_resources_and_probes(where: str, obj: dict[str, Any]) -> None:
    for c in pod_spec(obj)["containers"]:
        here = f"{where}: {ident(obj)} container {c['name']}"
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(part, {})), f"{here}: {part} cpu+memory"
        assert "livenessProbe" in c and "readinessProbe" in c, f"{here}: probes"


def test_pod_security_on_every_workload() -> None:
    assert workloads()
    for rel, obj in workloads():
        check_pod_security(f"deploy/{rel}", obj)


def test_resources_and_probes_on_every_container() -> None:
    for rel, obj in workloads():
        check_resources_and_probes(f"deploy/{rel}", obj)


def test_exporter_daemonset_placement_and_mounts() -> None:
    ds = find("exporter", "DaemonSet", "gpupilot-exporter")
    spec = pod_spec(ds)
    # Every GPU node on every GPU Operator version (the pause-client key only with its component).
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" and t["operator"] == "Exists" for t in spec["tolerations"])
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    exprs = {e["key"]: e for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]}
    ours = exprs["nvidia.com/gpu.deploy.gpupilot-exporter"]
    assert ours["operator"] == "NotIn" and set(ours["values"]) == {"false"}
    pause = exprs["nvidia.com/gpu.deploy.dcgm-exporter"]
    assert pause["operator"] == "NotIn" and pause["values"] == ["false", "paused-for-mig-change"]
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mount["mountPath"] == "/var/lib/kubelet/pod-resources", (
        "in the container: fixed, whatever the host's"
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert any(p["containerPort"] == 9400 and p["name"] == "metrics" for p in container["ports"])
    assert any(
        a.startswith("--pod-resources-socket=/var/lib/kubelet/pod-resources/") for a in container["args"]
    )


def test_exporter_service_monitor_keeps_workload_labels() -> None:
    svc = find("exporter", "Service", "gpupilot-exporter")
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", 9400)]
    sm = find("exporter", "ServiceMonitor", "gpupilot-exporter")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    drops = [r for r in endpoint.get("relabelings", []) if r.get("action") == "labeldrop"]
    assert drops and all(lbl in drops[0]["regex"] for lbl in ("pod", "namespace")), (
        "unattributed GPUs must not inherit the exporter pod's pod/namespace target labels"
    )


def test_service_accounts_configmaps_and_ports_referenced_exist() -> None:
    for rel in kustomizations():
        objs = render(rel)
        names = {(o["kind"], o["metadata"]["name"]) for o in objs}
        for obj in objs:
            if obj["kind"] not in WORKLOAD_KINDS:
                continue
            spec = pod_spec(obj)
            assert ("ServiceAccount", spec["serviceAccountName"]) in names, f"deploy/{rel}: {ident(obj)}"
            for vol in spec.get("volumes", []):
                if "configMap" in vol:
                    assert ("ConfigMap", vol["configMap"]["name"]) in names, f"deploy/{rel}: {vol}"


# Objects gpupilot places outside its own namespace, and why (see the overlay's kustomization).
def foreign_namespace_objects(operator_namespace: str) -> set[tuple[str, str, str]]:
    return {
        ("Role", operator_namespace, "gpupilot-rightsizer-mig-config"),
        ("RoleBinding", operator_namespace, "gpupilot-rightsizer-mig-config"),
        ("RoleBinding", "kube-system", "gpupilot-adapter-auth-reader"),
    }


OVERLAYS = {OVERLAY: "gpu-operator", "overlays/openshift": "nvidia-gpu-operator"}


@pytest.mark.parametrize(("overlay", "operator_namespace"), sorted(OVERLAYS.items()))
def test_overlay_wires_namespace_images_and_runtime_class(overlay: str, operator_namespace: str) -> None:
    FOREIGN_NAMESPACE_OBJECTS = foreign_namespace_objects(operator_namespace)
    objs = render(overlay)
    namespaces = [o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"]
    assert namespaces == ["gpupilot"], "the overlay owns gpupilot's namespace only, never gpu-operator"
    by_sa = {o["metadata"]["name"]: o["metadata"]["namespace"] for o in objs if o["kind"] == "ServiceAccount"}
    for obj in objs:
        if obj["kind"] not in CLUSTER_SCOPED:
            ns = obj["metadata"].get("namespace")
            key = (obj["kind"], ns, obj["metadata"]["name"])
            assert ns == "gpupilot" or key in FOREIGN_NAMESPACE_OBJECTS, ident(obj)
        if obj["kind"] in WORKLOAD_KINDS:
            for c in pod_spec(obj)["containers"]:
                service = obj["metadata"]["name"].removeprefix("gpupilot-")
                assert c["image"].startswith(f"localhost/gpupilot/gpupilot-{service}:"), (
                    f"{ident(obj)}: {c['image']}"
                )
                assert not c["image"].endswith(":latest"), ident(obj)
        if obj["kind"] in {"RoleBinding", "ClusterRoleBinding"}:
            for subject in obj.get("subjects", []):
                if subject["kind"] != "ServiceAccount":
                    continue
                if subject["name"] in by_sa:
                    assert subject.get("namespace") == by_sa[subject["name"]], f"{ident(obj)}: {subject}"
                else:
                    assert subject.get("namespace") == "kube-system", f"{ident(obj)}: {subject}"
    services = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "Service"}
    for api in (o for o in objs if o["kind"] == "APIService"):
        ref = api["spec"]["service"]
        assert (ref["namespace"], ref["name"]) in services, (
            f"{ident(api)} points at a Service not installed: {ref}"
        )
    ds = next(o for o in objs if o["kind"] == "DaemonSet")
    assert pod_spec(ds)["runtimeClassName"] == "nvidia"
    kinds = {o["kind"] for o in objs}
    assert {"DaemonSet", "Deployment", "ServiceMonitor", "PrometheusRule", "APIService"} <= kinds


@pytest.mark.slow
@pytest.mark.parametrize("component", [c for c in components() if c != "settings"])  # settings: every overlay
def test_overlay_with_each_optional_component_renders(component: str, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / OVERLAY, tmp_path)],
                "components": [os.path.relpath(DEPLOY / component, tmp_path)],
            }
        )
    )
    res = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"overlay + {component}: {res.stderr.strip()}"
    objs = load_all(res.stdout)
    for obj in objs:
        assert obj["apiVersion"] == KNOWN_API_VERSIONS.get(obj["kind"]), ident(obj)
    assert objs != list(render(OVERLAY)), f"{component} changes nothing"


def test_monitoring_is_generated_from_rules_and_dashboards() -> None:
    layout = manifests.Layout(ROOT)
    assert manifests.stale_files(layout) == [], (
        "run 'python -m devkit.manifests' and commit deploy/monitoring"
    )
    objs = render("monitoring")
    rules = [o for o in objs if o["kind"] == "PrometheusRule"]
    sources = sorted((ROOT / "rules").glob("*.rules.yaml"))
    assert len(rules) == len(sources) and sources
    for source in sources:
        name = manifests.k8s_name("gpupilot-" + source.name.removesuffix(".rules.yaml"))
        rule = next(r for r in rules if r["metadata"]["name"] == name)
        assert rule["spec"]["groups"] == yaml.safe_load(source.read_text())["groups"]
        assert rule["metadata"]["labels"]["release"] == "prometheus"
    dashboards = [o for o in objs if o["kind"] == "ConfigMap"]
    assert len(dashboards) == len(list((ROOT / "dashboards").glob("*.json")))
    for cm in dashboards:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        size = len(yaml.safe_dump(cm).encode())
        assert size < 256 * 1024, f"{cm['metadata']['name']}: {size} bytes is too big for kubectl apply"


def test_generator_check_mode_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "dashboards").mkdir()
    (tmp_path / "rules" / "a.rules.yaml").write_text(
        "groups:\n- name: g\n  rules:\n  - record: x:y:z\n    expr: |\n      sum(up)\n"
    )
    (tmp_path / "dashboards" / "Fleet Overview.json").write_text('{"title": "Fleet"}\n')
    assert manifests.main(["--root", str(tmp_path), "--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert manifests.main(["--root", str(tmp_path)]) == 0
    assert manifests.main(["--root", str(tmp_path), "--check"]) == 0
    out = tmp_path / "deploy" / "monitoring"
    docs = list(yaml.safe_load_all((out / "dashboards.yaml").read_text()))
    assert docs[0]["metadata"]["name"] == "gpupilot-dashboard-fleet-overview"
    assert "expr: |\n" in (out / "prometheusrules.yaml").read_text()
    (tmp_path / "rules" / "a.rules.yaml").write_text("groups: [\n")
    assert manifests.main(["--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "a.rules.yaml: not valid YAML" in err and "\n" not in err


def test_dockerfile_builds_every_package_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # The base is a build argument (make images: a Debian root file system from mmdebstrap); every
    # service installs from the host-built wheelhouse only: no index setting reaches an image.
    assert "ARG BASE=" in text and "FROM ${BASE} AS runtime" in text
    assert text.count("--no-index --find-links=/wheels") == 3
    assert not re.search(r"index-url|PIP_INDEX|PIP_EXTRA|trusted-host|/opt/pypi", text, flags=re.I)
    ignored = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "!dist/images/wheels" in ignored[ignored.index("dist") :], "the wheelhouse must reach the build"
    # One target per service, installing only that service's extra, smoke-tested, non-root.
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    by_target = {s.split()[2]: s for s in stages if " AS " in s.splitlines()[0]}
    for script in pyproject["project"]["scripts"]:
        service = script.removeprefix("gpupilot-")
        stage = by_target[service]
        assert stage.startswith("runtime AS"), f"target {service} must start from the shared runtime stage"
        assert f"'gpupilot[{service}]'" in stage and f"{script} --help" in stage, service
        user = [line for line in stage.splitlines() if line.startswith("USER ")]
        assert user and user[-1].split()[1].split(":")[0] not in {"0", "root"}, service
    assert re.split(r"^FROM ", text, flags=re.M)[-1].startswith("runtime AS exporter"), "default target"
    assert "COPY --chmod=0755 scripts/gpu-check /usr/local/bin/gpu-check" in by_target["exporter"]


@pytest.mark.slow
@pytest.mark.parametrize("rel", ["rightsizer", OVERLAY])
def test_rightsizer_config_is_accepted_by_serve_check(rel: str, tmp_path: Path) -> None:
    deployment = find(rel, "Deployment", "gpupilot-rightsizer")
    (container,) = pod_spec(deployment)["containers"]
    config_path = container["args"][container["args"].index("--config") + 1]
    mount = next(m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
    cm = find(rel, "ConfigMap", volume["configMap"]["name"])
    text = cm["data"][config_path.rsplit("/", 1)[1]]
    (tmp_path / "rightsizer.yaml").write_text(text)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rightsizer",
            "serve",
            "--config",
            str(tmp_path / "rightsizer.yaml"),
            "--check",
            "--offline",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert res.returncode == 0, (
        f"deploy/{rel}: serve --check rejects the shipped config: {res.stderr.strip()}"
    )
    listen_port = int(yaml.safe_load(text)["listen"].rsplit(":", 1)[1])
    assert [p["containerPort"] for p in container["ports"]] == [listen_port]
    assert yaml.safe_load(text)["state_dir"] in {m["mountPath"] for m in container["volumeMounts"]}


# kubernetes-client method → the (apiGroup, resource, verb) it needs.
CLIENT_CALLS = {
    "read_node": ("", "nodes", "get"),
    "list_node": ("", "nodes", "list"),
    "patch_node": ("", "nodes", "patch"),
    "read_namespaced_pod": ("", "pods", "get"),
    "list_namespaced_pod": ("", "pods", "list"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
    "read_namespaced_config_map": ("", "configmaps", "get"),
    "create_namespaced_config_map": ("", "configmaps", "create"),
    "replace_namespaced_config_map": ("", "configmaps", "update"),
    "patch_namespaced_config_map": ("", "configmaps", "patch"),
    "get_cluster_custom_object": ("nvidia.com", "clusterpolicies", "get"),
    "list_cluster_custom_object": ("nvidia.com", "clusterpolicies", "list"),
    "patch_cluster_custom_object": ("nvidia.com", "clusterpolicies", "patch"),
    "create_namespaced_event": ("", "events", "create"),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "read_namespaced_replica_set": ("apps", "replicasets", "get"),
    "patch_namespaced_replica_set": ("apps", "replicasets", "patch"),
    "read_namespaced_deployment": ("apps", "deployments", "get"),
    "patch_namespaced_deployment": ("apps", "deployments", "patch"),
    "read_namespaced_stateful_set": ("apps", "statefulsets", "get"),
    "patch_namespaced_stateful_set": ("apps", "statefulsets", "patch"),
}


@pytest.mark.slow
def test_rightsizer_rbac_grants_every_call_its_code_makes() -> None:
    """Read the rightsizer's Kubernetes calls from its source and check each one is granted."""
    source = "\n".join(p.read_text() for p in (ROOT / "rightsizer").rglob("*.py"))
    used = {CLIENT_CALLS[m] for m in CLIENT_CALLS if re.search(rf"\b{m}\b", source)}
    if re.search(r"watch\.Watch\(", source) and ("", "nodes", "list") in used:
        used.add(("", "nodes", "watch"))
    assert ("", "pods/eviction", "create") in used, "the scan no longer finds the eviction call"
    rules = [
        rule
        for obj in render_with(OVERLAY, "rightsizer/auto-apply")
        if obj["kind"] in {"ClusterRole", "Role"}
        and obj["metadata"]["name"].startswith("gpupilot-rightsizer")
        for rule in obj["rules"]
    ]
    granted = {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    missing = sorted(used - granted)
    assert not missing, f"the rightsizer calls the API for {missing} but its RBAC does not grant it"


def test_chart_files_are_copies_kept_in_sync(tmp_path: Path) -> None:
    """The chart's files/ are generated copies: a link or an edited copy is stale, and the generator
    replaces a link by a file without writing through it into the source."""
    source = tmp_path / "deploy" / "adapter" / "config.yaml"
    source.parent.mkdir(parents=True)
    source.write_text("rules: []\n")
    files = tmp_path / "deploy" / "helm" / "gpupilot" / "files"
    files.mkdir(parents=True)
    (files / "adapter-config.yaml").symlink_to(source)
    layout = manifests.Layout(tmp_path)
    assert "helm/gpupilot/files/adapter-config.yaml" in manifests.stale_files(layout)
    assert manifests.main(["--root", str(tmp_path)]) == 0
    copy = files / "adapter-config.yaml"
    assert not copy.is_symlink() and copy.read_text() == "rules: []\n" == source.read_text()
    assert manifests.stale_files(layout) == []
    copy.write_text("rules: [edited]\n")
    assert manifests.stale_files(layout) == ["helm/gpupilot/files/adapter-config.yaml"]
