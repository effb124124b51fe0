"""deploy/helm/gpupilot with a real Helm v4 (``python -m devkit.helm``, from the PyPI wheel):
``helm lint``, ``helm template`` over the chart's ci/ values files, every rendered object checked as
the kustomize ones are, the schema refusing bad values, and the chart with its defaults rendering
the same objects as ``kubectl kustomize deploy/overlays/gpu-operator`` where the two overlap."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit import manifests
from tests.deploy.test_manifests import (
    CLUSTER_SCOPED,
    KNOWN_API_VERSIONS,
    OVERLAY,
    WORKLOAD_KINDS,
    check_pod_security,
    check_rbac_rule,
    check_resources_and_probes,
    ident,
    pod_spec,
    render,
)
from tests.support.yamldocs import load_all

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gpupilot"
VALUES_FILES = sorted((CHART / "ci").glob("*.yaml"))
NAMESPACE = "gpupilot"
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
}
API_VERSIONS = {
    **KNOWN_API_VERSIONS,
    "PodMonitor": "monitoring.coreos.com/v1",
    "Pod": "v1",  # the `helm test` hook
    "PersistentVolumeClaim": "v1",
}
VARIANTS = ["defaults", *[p.stem for p in VALUES_FILES]]


@functools.cache
def helm() -> str:
    here = Path(sys.executable).parent / "helm"
    found = str(here) if os.access(here, os.X_OK) else shutil.which("helm")
    assert found, "helm not found: run 'make helm' (python -m devkit.helm --into .venv/bin/helm)"
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, check=False, timeout=120)


@functools.cache
def template(variant: str, *sets: str) -> tuple[dict[str, Any], ...]:
    args = ["template", "gpupilot", str(CHART), "--namespace", NAMESPACE]
    if variant != "defaults":
        args += ["-f", str(CHART / "ci" / f"{variant}.yaml")]
    for s in sets:
        args += ["--set", s]
    res = run_helm(*args)
    assert res.returncode == 0, f"helm template ({variant}) failed: {res.stderr.strip()}"
    return tuple(load_all(res.stdout))


def without_generated_tls(objs: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """The objects with the generated CA and certificate blanked (each render makes a new pair)."""
    out = copy.deepcopy(objs)
    for obj in out:
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == "gpupilot-adapter-tls":
            assert set(obj["data"]) == {"ca.crt", "tls.crt", "tls.key"}
            obj["data"] = {}
            obj["metadata"].pop("annotations")  # the expiry: a few seconds apart between renders
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == "gpupilot-adapter-tls-ca":
            assert set(obj["data"]) == {"tls.crt", "tls.key"}
            obj["data"] = {}
            obj["metadata"].pop("annotations")
        if obj["kind"] == "APIService":
            assert obj["spec"]["caBundle"]
            obj["spec"]["caBundle"] = ""
    return out


def kinds(objs: tuple[dict[str, Any], ...]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objs}


def test_helm_is_v4() -> None:
    res = run_helm("version", "--short")
    assert res.returncode == 0 and res.stdout.startswith("v4."), res.stdout + res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_lint_is_clean(variant: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    if variant != "defaults":
        args += ["-f", str(CHART / "ci" / f"{variant}.yaml")]
    res = run_helm(*args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 chart(s) failed" in res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_pass_the_kustomize_checks(variant: str) -> None:
    objs = template(variant)
    assert objs
    names = kinds(objs)
    for obj in objs:
        where = f"helm {variant}: {ident(obj)}"
        assert obj["apiVersion"] == API_VERSIONS.get(obj["kind"]), where
        labels = obj["metadata"].get("labels", {})
        assert labels.keys() >= HELM_LABELS and labels["app.kubernetes.io/part-of"] == "gpupilot", where
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"].get("namespace"), f"{where}: no namespace"
        for rule in obj.get("rules", []) if obj["kind"] in {"Role", "ClusterRole"} else []:
            check_rbac_rule(f"helm {variant}", obj, rule)
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        spec = pod_spec(obj)
        assert ("ServiceAccount", spec["serviceAccountName"]) in names, where
        for vol in spec.get("volumes", []):
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in names, where
        check_pod_security(f"helm {variant}", obj)
        check_resources_and_probes(f"helm {variant}", obj)


@pytest.mark.slow
def test_each_component_switches_off() -> None:
    full = kinds(template("everything"))
    only = kinds(template("exporter-only"))
    assert {k for k, _ in only} == {
        "ServiceAccount",
        "Service",
        "DaemonSet",
        "PodMonitor",
        "NetworkPolicy",
        "ClusterRole",  # DRA: the node's ResourceSlices, list/watch
        "ClusterRoleBinding",
    }
    assert ("PodMonitor", "gpupilot-exporter") in full and ("ServiceMonitor", "gpupilot-exporter") in full
    assert ("APIService", "v1beta1.external.metrics.k8s.io") in full
    assert {("Certificate", "gpupilot-adapter-tls"), ("Issuer", "gpupilot-adapter-selfsigned")} <= full
    assert {n for k, n in full if k == "NetworkPolicy"} == {
        "gpupilot-exporter",
        "gpupilot-adapter",
        "gpupilot-rightsizer",
    }
    none = template("defaults", "exporter.enabled=false", "adapter.enabled=false", "rightsizer.enabled=false")
    assert {o["kind"] for o in none} == {"PrometheusRule", "ConfigMap"}
    assert not template("exporter-only", "exporter.enabled=false"), "everything off must render nothing"


@pytest.mark.slow
def test_values_reach_the_objects() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in template("everything")}
    ds = pod_spec(objs[("DaemonSet", "gpupilot-exporter")])
    (exporter,) = ds["containers"]
    assert exporter["image"] == "registry.example.com/gpupilot-exporter:0.1.0-rc1"
    assert exporter["imagePullPolicy"] == "Always"
    assert exporter["args"][-1] == "--hostname-label=Hostname"
    vm = {(o["kind"], o["metadata"]["name"]): o for o in template("victoriametrics")}
    adapter = pod_spec(vm[("Deployment", "gpupilot-adapter")])["containers"][0]
    assert "--prometheus-url=http://vmselect-vm.monitoring.svc:8481/select/0/prometheus" in adapter["args"]
    api = vm[("APIService", "v1beta2.custom.metrics.k8s.io")]
    assert api["spec"]["caBundle"] == "LS0tLS1CRUdJTi0tLS0t"
    assert "annotations" not in api["metadata"], "a given caBundle must not be overwritten by cert-manager"
    assert ("Secret", "gpupilot-adapter-tls") not in vm, "with a caBundle given, the Secret is the user's"
    rules = [o for o in vm.values() if o["kind"] == "PrometheusRule"]
    assert rules and all("release" not in o["metadata"]["labels"] for o in rules)
    config = yaml.safe_load(vm[("ConfigMap", "gpupilot-rightsizer")]["data"]["rightsizer.yaml"])
    assert config["prometheus_url"].endswith("/select/0/prometheus")


AUTH_DIR = "/etc/gpupilot-prometheus-auth"


def _auth_secret(folder: Path) -> Path:
    """ci/mimir.yaml's Secret keys as files: a password and a CA bundle."""
    from devkit.pki import make_ca  # noqa: PLC0415

    make_ca(folder, "ca")
    (folder / "password").write_text("not-the-real-one")
    return folder


@pytest.mark.slow
def test_prometheus_auth_reaches_both_services() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in template("mimir")}
    flags = {
        "--prometheus-url=https://mimir-gateway.mimir.svc/prometheus",
        "--prometheus-tenant=gpu-fleet",
        "--prometheus-username=gpupilot",
        f"--prometheus-password-file={AUTH_DIR}/password",
        f"--prometheus-ca-file={AUTH_DIR}/ca.crt",
    }
    for name in ("gpupilot-adapter", "gpupilot-rightsizer"):
        spec = pod_spec(objs[("Deployment", name)])
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["prometheus-auth"] == {
            "name": "prometheus-auth",
            "mountPath": AUTH_DIR,
            "readOnly": True,
        }
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["prometheus-auth"]["secret"] == {"secretName": "gpupilot-mimir"}
    adapter = pod_spec(objs[("Deployment", "gpupilot-adapter")])["containers"][0]
    assert flags <= set(adapter["args"])
    config = yaml.safe_load(objs[("ConfigMap", "gpupilot-rightsizer")]["data"]["rightsizer.yaml"])
    settings = {f"--{k.replace('_', '-')}={v}" for k, v in config.items() if k.startswith("prometheus_")}
    assert settings == flags  # the same settings, as config fields
    defaults = {(o["kind"], o["metadata"]["name"]): o for o in template("defaults")}
    adapter = pod_spec(defaults[("Deployment", "gpupilot-adapter")])
    assert "prometheus-auth" not in {v["name"] for v in adapter["volumes"]}
    assert not [a for a in adapter["containers"][0]["args"] if a.startswith("--prometheus-tenant")]


@pytest.mark.slow  # a rightsizer process per variant
@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_configs_load(variant: str, tmp_path: Path) -> None:
    from adapter.config.mapping import load_config  # noqa: PLC0415

    objs = {(o["kind"], o["metadata"]["name"]): o for o in template(variant)}
    if ("ConfigMap", "gpupilot-adapter-config") in objs:
        path = tmp_path / "adapter.yaml"
        path.write_text(objs[("ConfigMap", "gpupilot-adapter-config")]["data"]["config.yaml"])
        assert load_config(path).metrics
    if ("ConfigMap", "gpupilot-rightsizer") in objs:
        path = tmp_path / "rightsizer.yaml"
        text = objs[("ConfigMap", "gpupilot-rightsizer")]["data"]["rightsizer.yaml"]
        if AUTH_DIR in text:  # the Secret's files, as the kubelet would mount them
            text = text.replace(AUTH_DIR, str(_auth_secret(tmp_path / "auth")))
        path.write_text(text)
        res = subprocess.run(
            [sys.executable, "-m", "rightsizer", "serve", "--config", str(path), "--check", "--offline"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert res.returncode == 0, f"{variant}: {res.stdout}{res.stderr}"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("adapter.replicas=0", "/adapter/replicas"),
        ("exporter.port=70000", "/exporter/port"),
        ("adapter.prometheusUrl=prometheus:9090", "/adapter/prometheusUrl"),
        ("exporter.serviceMonitor.interval=often", "/exporter/serviceMonitor/interval"),
        ("exporter.resources.limits.memory=lots", "/exporter/resources/limits/memory"),
        ("adapter.enable=true", "enable"),
        ("networkPolicy.monitoringNamespace=Monitoring", "/networkPolicy/monitoringNamespace"),
        ("exporter.kubeletPodResourcesDir=var/lib/kubelet", "/exporter/kubeletPodResourcesDir"),
        ("rightsizer.migConfigMap=MIG_config", "/rightsizer/migConfigMap"),
        ("rightsizer.prometheusUrl=vm:8428", "/rightsizer/prometheusUrl"),
        ("adapter.minAvailable=-1", "/adapter/minAvailable"),
        ("prometheusAuth.tenant=a b", "/prometheusAuth/tenant"),
        ("prometheusAuth.password=x", "password"),
        ("prometheus.url=prometheus:9090", "/prometheus/url"),
        ("exporter.migPause=sometimes", "/exporter/migPause"),
        ("rightsizer.persistence.size=lots", "/rightsizer/persistence/size"),
        ("namespace.podSecurity=open", "/namespace/podSecurity"),
        ("adapter.generatedCertDays=0", "/adapter/generatedCertDays"),
    ],
)
def test_schema_refuses_bad_values(setting: str, message: str) -> None:
    res = run_helm("template", "gpupilot", str(CHART), "--set", setting)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    labels = out["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    if out["kind"] == "ValidatingAdmissionPolicy":
        # kustomize (kyaml) re-folds the `>-` CEL expressions with an extra blank line; Helm keeps
        # what YAML says. CEL ignores whitespace: compare the expressions without it.
        for item in [*out["spec"].get("validations", []), *out["spec"].get("variables", [])]:
            item["expression"] = " ".join(item["expression"].split())
    if out["kind"] == "ConfigMap" and out["metadata"]["name"] == "gpupilot-rightsizer":
        out["data"] = {k: yaml.safe_load(v) for k, v in out["data"].items()}  # comments differ
    if out["kind"] == "APIService":
        # The trust path differs by design: the chart generates its CA (caBundle), kustomize has
        # cert-manager inject it; test_trust_path checks that each has one.
        out["metadata"].pop("annotations", None)
        out["spec"].pop("caBundle", None)
    return out


# The chart's own extras: the adapter's generated serving certificate and the `helm test` hook's
# objects.
CHART_EXTRAS = {
    "Secret/gpupilot/gpupilot-adapter-tls",
    "Secret/gpupilot/gpupilot-adapter-tls-ca",
    "ServiceAccount/gpupilot/gpupilot-adapter-test",
    "ClusterRoleBinding/-/gpupilot-adapter-test",
    "Pod/gpupilot/gpupilot-adapter-test",
}
# The chart's default (auto) renders dcgm-exporter's pause without a cluster to look at, as
# deploy/exporter places it; nothing to set.
AS_KUSTOMIZE = "exporter.migPause=dcgm-exporter"
# kustomize's own: the Namespace (the chart leaves it to namespace.create) and cert-manager's
# objects, its trust path where the chart generates one (the Secret among CHART_EXTRAS).
KUSTOMIZE_EXTRAS = {
    "Namespace/-/gpupilot",
    "Issuer/gpupilot/gpupilot-adapter-selfsigned",
    "Certificate/gpupilot/gpupilot-adapter-ca",
    "Issuer/gpupilot/gpupilot-adapter-ca",
    "Certificate/gpupilot/gpupilot-adapter-tls",
}
# overlay → the chart's values variant that installs the same.
COUNTERPARTS = {OVERLAY: "defaults", "overlays/openshift": "openshift"}


def _compare(
    chart_objs: tuple[dict[str, Any], ...],
    kustomize_objs: tuple[dict[str, Any], ...],
    *,
    ignore_labels: frozenset[str] = frozenset(),
) -> int:
    chart = {ident(o): _comparable(o) for o in chart_objs}
    kustomize = {ident(o): _comparable(o) for o in kustomize_objs}
    for obj in [*chart.values(), *kustomize.values()]:
        labels = obj["metadata"].get("labels", {})
        for key in ignore_labels:
            labels.pop(key, None)
        if "labels" in obj["metadata"] and not labels:
            del obj["metadata"]["labels"]
    shared = chart.keys() & kustomize.keys()
    for key in sorted(shared):
        assert chart[key] == kustomize[key], f"{key}: chart and kustomize differ"
    assert set(chart) - set(kustomize) <= CHART_EXTRAS
    return len(shared)


@pytest.mark.slow
@pytest.mark.parametrize("overlay", sorted(COUNTERPARTS))
def test_chart_and_kustomize_render_the_same_objects(overlay: str) -> None:
    """Each overlay against its values file, both rendered (kustomize's output, not a copy): every
    object both produce is identical but for Helm's own labels; each side's extras are known."""
    variant = COUNTERPARTS[overlay]
    chart = {ident(o) for o in template(variant, AS_KUSTOMIZE)}
    kustomize = {ident(o) for o in render(overlay)}
    assert _compare(template(variant, AS_KUSTOMIZE), render(overlay)) >= 40
    assert kustomize - chart == KUSTOMIZE_EXTRAS
    assert chart - kustomize == CHART_EXTRAS
    with_ns = template(variant, AS_KUSTOMIZE, "namespace.create=true")
    assert _compare(with_ns, render(overlay)) >= 41  # the Namespace too, Pod Security labels and all


# kustomize component → the chart setting that does the same.
COMPONENTS = {
    "exporter/processes": "exporter.processes.enabled=true",
    "exporter/mig-monitor": "exporter.migMonitor.enabled=true",
    "exporter/mig-pause-client": "exporter.migPause=client",
    "adapter/external": "adapter.externalMetrics=true",
    "adapter/keda": "adapter.externalScaler.enabled=true",
    "adapter/keda-tls": (
        "adapter.externalScaler.enabled=true,adapter.externalScaler.tls.secretName=gpupilot-keda-scaler-tls"
    ),
    "adapter/keda-mtls": (
        "adapter.externalScaler.enabled=true,adapter.externalScaler.tls.secretName=gpupilot-keda-scaler-tls,"
        "adapter.externalScaler.tls.clientCAKey=ca.crt"
    ),
    "rightsizer/auto-apply": "rightsizer.autoApply.enabled=true",
}
# components added before one (in this order), as an overlay must list them.
COMPONENTS_BEFORE = {
    "adapter/keda-tls": ("adapter/keda",),
    "adapter/keda-mtls": ("adapter/keda", "adapter/keda-tls"),
}


@pytest.mark.slow
@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_chart_settings_match_kustomize_components(component: str, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / OVERLAY, tmp_path)],
                "components": [
                    os.path.relpath(DEPLOY / c, tmp_path)
                    for c in (*COMPONENTS_BEFORE.get(component, ()), component)
                ],
            }
        )
    )
    res = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    kustomize = tuple(load_all(res.stdout))
    chart = template("defaults", AS_KUSTOMIZE, COMPONENTS[component])
    assert chart != template("defaults", AS_KUSTOMIZE), f"{COMPONENTS[component]} changes nothing"
    if component == "rightsizer/auto-apply":  # the component grants; auto_apply.enabled is the config's
        (config,) = (
            o for o in chart if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpupilot-rightsizer"
        )
        assert yaml.safe_load(config["data"]["rightsizer.yaml"])["auto_apply"]["enabled"] is True
        chart = tuple(o for o in chart if o is not config)
        kustomize = tuple(
            o for o in kustomize if o["metadata"]["name"] != "gpupilot-rightsizer" or o["kind"] != "ConfigMap"
        )
    # Objects a component adds miss the overlay's part-of label (kustomize applies labels before
    # components); the chart labels every object.
    assert _compare(chart, kustomize, ignore_labels=frozenset({"app.kubernetes.io/part-of"})) >= 40
    assert {ident(o) for o in kustomize} - {ident(o) for o in chart} == KUSTOMIZE_EXTRAS


@pytest.mark.slow
def test_chart_files_are_plain_copies_and_package_renders_the_same(tmp_path: Path) -> None:
    """rules/, dashboards/ (through deploy/monitoring), the default configs, admission policies and
    the SCC reach the chart as plain files equal to their one source under deploy/ (`make manifests`
    copies them; Helm prints a line for every symbolic link in a chart); a packaged chart (what
    `helm package`/`helm push` ship) renders the same objects as the chart directory."""
    files = sorted((CHART / "files").iterdir())
    assert {p.name for p in files} == set(manifests.CHART_FILES)
    for path in files:
        assert not path.is_symlink() and path.is_file(), path
        source = DEPLOY / manifests.CHART_FILES[path.name]
        assert path.read_bytes() == source.read_bytes(), f"{path.name} differs: run 'make manifests'"
    res = run_helm("package", str(CHART), "--destination", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "symlink" not in res.stderr.lower() and "symbolic" not in res.stderr.lower(), res.stderr
    (packaged,) = tmp_path.glob("gpupilot-*.tgz")
    res = run_helm("template", "gpupilot", str(packaged), "--namespace", NAMESPACE)
    assert res.returncode == 0, res.stderr
    packaged_objs = tuple(load_all(res.stdout))
    assert without_generated_tls(packaged_objs) == without_generated_tls(template("defaults"))


@pytest.mark.slow
def test_settings_reach_the_objects() -> None:
    objs = template(
        "defaults",
        "exporter.kubeletPodResourcesDir=/data/kubelet/pod-resources",
        "exporter.runtimeClassName=",
        "adapter.priorityClassName=",
        "adapter.minAvailable=null",
        "rightsizer.migConfigMap=mig-a",
        "rightsizer.admissionPolicy.enabled=false",
    )
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    ds = pod_spec(by[("DaemonSet", "gpupilot-exporter")])
    volume = next(v for v in ds["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"]["path"] == "/data/kubelet/pod-resources"
    assert "runtimeClassName" not in ds
    assert "priorityClassName" not in pod_spec(by[("Deployment", "gpupilot-adapter")])
    assert ("PodDisruptionBudget", "gpupilot-adapter") not in by
    assert not {k for k, _ in by} & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    role = by[("Role", "gpupilot-rightsizer-mig-config")]
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
    config = yaml.safe_load(by[("ConfigMap", "gpupilot-rightsizer")]["data"]["rightsizer.yaml"])
    assert config["auto_apply"]["mig_configmap"] == "mig-a"


@pytest.mark.slow
def test_clusters_older_than_the_tested_range_are_refused() -> None:
    res = run_helm("template", "gpupilot", str(CHART), "--kube-version", "1.33.9")
    assert res.returncode != 0 and "kubeVersion: >=1.34.0-0" in res.stderr, res.stderr
    assert run_helm("template", "gpupilot", str(CHART), "--kube-version", "1.34.0").returncode == 0


@pytest.mark.slow
def test_dra_resourceslice_access_is_list_watch_and_switches_off() -> None:
    on = template("defaults")
    roles = [
        o for o in on if o["kind"] == "ClusterRole" and o["metadata"]["name"].startswith("gpupilot-exporter")
    ]
    assert [r["rules"] for r in roles] == [
        [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list", "watch"]}]
    ]
    ds = next(o for o in on if o["kind"] == "DaemonSet")
    assert pod_spec(ds)["automountServiceAccountToken"] is True
    off = template("defaults", "exporter.dra.readResourceSlices=false")
    assert not [o for o in off if o["metadata"]["name"] == "gpupilot-exporter-resourceslice-reader"]
    assert pod_spec(next(o for o in off if o["kind"] == "DaemonSet"))["automountServiceAccountToken"] is False
    no_dra = template("defaults", "exporter.dra.enabled=false")
    args = next(o for o in no_dra if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--kubernetes-enable-dra" not in args
    on_args = next(o for o in on if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert "--kubernetes-enable-dra" in on_args


def _ingress_to(objs: tuple[dict[str, Any], ...], policy: str, port: str) -> list[dict[str, Any]]:
    (netpol,) = (o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == policy)
    return [rule for rule in netpol["spec"]["ingress"] if any(p["port"] == port for p in rule["ports"])]


@pytest.mark.slow
def test_the_keda_scaler_port_is_open_to_kedas_namespace_only() -> None:
    """The scaler answers any namespace's external metrics without authorisation: its port is let in
    from KEDA's namespace alone (networkPolicy.kedaNamespace), never from any source as https is."""
    for sets, namespace in (
        ((), "keda"),
        (("networkPolicy.kedaNamespace=keda-system",), "keda-system"),
    ):
        objs = template("defaults", "adapter.externalScaler.enabled=true", *sets)
        (rule,) = _ingress_to(objs, "gpupilot-adapter", "keda")
        assert rule["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
        ]
        assert [p["port"] for p in rule["ports"]] == ["keda"]
    (https,) = _ingress_to(
        template("defaults", "adapter.externalScaler.enabled=true"), "gpupilot-adapter", "https"
    )
    assert "from" not in https  # the aggregation layer calls from the control plane's host network


@pytest.mark.slow
def test_the_keda_scaler_serves_tls_from_a_secret() -> None:
    def adapter_pod(*sets: str) -> dict[str, Any]:
        objs = template("defaults", "adapter.externalScaler.enabled=true", *sets)
        (deployment,) = (
            o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupilot-adapter"
        )
        pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
        return pod

    plain = adapter_pod()
    assert not [a for a in plain["containers"][0]["args"] if a.startswith("--external-scaler-tls")]
    pod = adapter_pod(
        "adapter.externalScaler.tls.secretName=keda-tls", "adapter.externalScaler.tls.clientCAKey=ca.crt"
    )
    (container,) = pod["containers"]
    assert [a for a in container["args"] if a.startswith("--external-scaler-")] == [
        "--external-scaler-address=:9443",
        "--external-scaler-tls-cert-file=/var/run/keda-serving-cert/tls.crt",
        "--external-scaler-tls-key-file=/var/run/keda-serving-cert/tls.key",
        "--external-scaler-client-ca-file=/var/run/keda-serving-cert/ca.crt",
    ]
    assert {
        "name": "keda-serving-cert",
        "mountPath": "/var/run/keda-serving-cert",
        "readOnly": True,
    } in container["volumeMounts"]
    assert {"name": "keda-serving-cert", "secret": {"secretName": "keda-tls"}} in pod["volumes"]
    res = run_helm(
        "template", "gpupilot", str(CHART), "--set", "adapter.externalScaler.enabled=true",
        "--set", "adapter.externalScaler.tls.clientCAKey=ca.crt",
    )  # fmt: skip
    assert res.returncode != 0
    assert "adapter.externalScaler.tls.clientCAKey needs adapter.externalScaler.tls.secretName" in res.stderr
