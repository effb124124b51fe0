"""What a `helm install` with the defaults needs to work on a real cluster, checked object by object
on `helm template` (real Helm v4): a trust path for every APIService (the generated CA verifies the
generated serving certificate for the Service's DNS name), the Secret the adapter mounts, write RBAC
only with auto-apply, the DaemonSet's placement, the volume, the namespace, the `helm test` hook and
NOTES.txt."""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from tests.deploy.test_helm import CHART, NAMESPACE, VARIANTS, run_helm, template
from tests.deploy.test_manifests import pod_spec, write_rules
from tests.support.yamldocs import load_all

# Each test renders with kubectl kustomize or helm (subprocesses): make unit leaves them out.
pytestmark = pytest.mark.slow

Objects = dict[tuple[str, str], dict[str, Any]]


def by_name(objs: tuple[dict[str, Any], ...]) -> Objects:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def apiservices(objs: Objects) -> list[dict[str, Any]]:
    return [o for (k, _), o in objs.items() if k == "APIService"]


def verifies(ca_pem: bytes, cert_pem: bytes) -> None:
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = ca.public_key()
    assert cert.issuer == ca.subject
    if isinstance(key, rsa.RSAPublicKey):
        assert cert.signature_hash_algorithm is not None
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm
        )
    else:
        assert isinstance(key, ec.EllipticCurvePublicKey) and cert.signature_hash_algorithm is not None
        key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_apiservice_has_a_trust_path(variant: str) -> None:
    objs = by_name(template(variant))
    services = apiservices(objs)
    if ("Deployment", "gpupilot-adapter") not in objs:
        assert not services, f"{variant}: an APIService without its adapter"
        return
    assert services
    spec = pod_spec(objs[("Deployment", "gpupilot-adapter")])
    (volume,) = (v for v in spec["volumes"] if v["name"] == "serving-cert")
    secret_name = volume["secret"]["secretName"]
    cert_manager = ("Certificate", secret_name) in objs
    for api in services:
        where = f"{variant}: APIService {api['metadata']['name']}"
        annotations = api["metadata"].get("annotations", {})
        assert api["spec"]["insecureSkipTLSVerify"] is False, where
        if cert_manager:
            # The CA certificate's: its Secret outlives every renewal of the serving certificate.
            assert annotations == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/gpupilot-adapter-ca"}, (
                where
            )
            assert "caBundle" not in api["spec"], where
        else:
            assert "cert-manager.io/inject-ca-from" not in annotations, f"{where}: cert-manager is off"
            assert api["spec"]["caBundle"], f"{where}: no caBundle and no cert-manager"
        assert api["spec"]["service"] == {"name": "gpupilot-adapter", "namespace": NAMESPACE, "port": 443}
    if ("Secret", secret_name) in objs:  # generated: the chart's own CA and certificate
        secret = objs[("Secret", secret_name)]
        assert secret["type"] == "kubernetes.io/tls"
        assert {api["spec"]["caBundle"] for api in services} == {secret["data"]["ca.crt"]}
        ca_pem = base64.b64decode(secret["data"]["ca.crt"])
        cert_pem = base64.b64decode(secret["data"]["tls.crt"])
        verifies(ca_pem, cert_pem)
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"gpupilot-adapter.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
        now = datetime.datetime.now(datetime.UTC)
        assert (
            now + datetime.timedelta(days=364) < cert.not_valid_after_utc < now + datetime.timedelta(days=366)
        )
        noted = secret["metadata"]["annotations"]["gpupilot.io/not-after"]
        assert abs(datetime.datetime.fromisoformat(noted) - cert.not_valid_after_utc) < datetime.timedelta(
            minutes=5
        )
        ca = objs[("Secret", f"{secret_name}-ca")]
        assert ca["data"]["tls.crt"] == secret["data"]["ca.crt"] and "tls.key" in ca["data"]
        assert x509.load_pem_x509_certificate(ca_pem).not_valid_after_utc > now + datetime.timedelta(
            days=3000
        )
        assert base64.b64decode(secret["data"]["tls.key"]).startswith(b"-----BEGIN RSA PRIVATE KEY-----")


@pytest.mark.slow
def test_default_install_generates_the_certificate_and_cert_manager_only_when_enabled() -> None:
    defaults = by_name(template("defaults"))
    assert ("Secret", "gpupilot-adapter-tls") in defaults
    assert not {k for k, _ in defaults} & {"Certificate", "Issuer"}
    with_cm = by_name(template("defaults", "adapter.certManager.enabled=true"))
    assert ("Secret", "gpupilot-adapter-tls") not in with_cm, "cert-manager writes that Secret"
    assert ("Certificate", "gpupilot-adapter-tls") in with_cm
    days = by_name(template("defaults", "adapter.generatedCertDays=30"))
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(days[("Secret", "gpupilot-adapter-tls")]["data"]["tls.crt"])
    )
    assert cert.not_valid_after_utc < datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=31)


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_write_rights_unless_auto_apply(variant: str) -> None:
    objs = template(variant)
    config = by_name(objs).get(("ConfigMap", "gpupilot-rightsizer"))
    text = config["data"]["rightsizer.yaml"] if config else "{}"
    auto_apply = bool(yaml.safe_load(text).get("auto_apply", {}).get("enabled"))
    granted = write_rules(objs)
    if auto_apply:
        names = {line.split(":")[0] for line in granted}
        assert names == {"ClusterRole/gpupilot-rightsizer-apply", "Role/gpupilot-rightsizer-apply"}, granted
    else:
        assert granted == [], f"{variant}: write rights without auto-apply: {granted}"
    if config:  # serve's own Lease and ledger, whatever auto-apply says (rightsizer.replicas)
        assert ("Role", "gpupilot-rightsizer-serve") in by_name(objs)


@pytest.mark.slow
def test_auto_apply_from_a_config_of_ones_own_gets_its_rights() -> None:
    config = "prometheus_url: http://p:9090\nauto_apply:\n  enabled: true\n"
    objs = by_name(template("defaults", f"rightsizer.config={config}"))
    assert ("ClusterRole", "gpupilot-rightsizer-apply") in objs
    apply = objs[("ClusterRole", "gpupilot-rightsizer-apply")]
    assert {(res, v) for r in apply["rules"] for res in r["resources"] for v in r["verbs"]} == {
        ("nodes", "patch"),
        ("pods/eviction", "create"),
        ("clusterpolicies", "patch"),
        ("events", "create"),
        ("deployments", "patch"),  # the new GPU request in a resized pod's template
        ("statefulsets", "patch"),
        ("replicasets", "patch"),
    }
    read = by_name(template("defaults"))[("ClusterRole", "gpupilot-rightsizer")]
    assert {v for r in read["rules"] for v in r["verbs"]} == {"get", "list", "watch"}


@pytest.mark.slow
def test_exporter_placement() -> None:
    def placement(*sets: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
        spec = pod_spec(by_name(template("defaults", *sets))[("DaemonSet", "gpupilot-exporter")])
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        return spec["nodeSelector"], terms["nodeSelectorTerms"][0]["matchExpressions"]

    selector, expressions = placement()
    assert selector == {"nvidia.com/gpu.present": "true"}, "every GPU node, on every operator version"
    assert {
        "key": "nvidia.com/gpu.deploy.dcgm-exporter",
        "operator": "NotIn",
        "values": ["false", "paused-for-mig-change"],
    } in expressions
    selector, expressions = placement("exporter.migPause=client")
    assert selector == {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.client": "true"}
    assert all(e["key"] != "nvidia.com/gpu.deploy.dcgm-exporter" for e in expressions)
    assert placement("exporter.migPause=dcgm-exporter") == placement()
    values = (CHART / "values.yaml").read_text()
    assert "migPause: auto" in values and "nvidia.com/gpu.deploy.client" in values


@pytest.mark.slow
def test_namespace_with_its_pod_security_level_when_asked() -> None:
    assert ("Namespace", NAMESPACE) not in by_name(template("defaults"))
    ns = by_name(template("defaults", "namespace.create=true"))[("Namespace", NAMESPACE)]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


@pytest.mark.slow
def test_persistence_and_one_prometheus_url() -> None:
    objs = by_name(
        template("defaults", "rightsizer.persistence.enabled=true", "prometheus.url=http://vm:8428")
    )
    pvc = objs[("PersistentVolumeClaim", "gpupilot-rightsizer")]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec = pod_spec(objs[("Deployment", "gpupilot-rightsizer")])
    (data,) = (v for v in spec["volumes"] if v["name"] == "data")
    assert data == {"name": "data", "persistentVolumeClaim": {"claimName": "gpupilot-rightsizer"}}
    config = yaml.safe_load(objs[("ConfigMap", "gpupilot-rightsizer")]["data"]["rightsizer.yaml"])
    assert config["prometheus_url"] == "http://vm:8428"
    adapter = pod_spec(objs[("Deployment", "gpupilot-adapter")])["containers"][0]
    assert "--prometheus-url=http://vm:8428" in adapter["args"]
    own = by_name(
        template(
            "defaults", "rightsizer.persistence.enabled=true", "rightsizer.persistence.existingClaim=mine"
        )
    )
    assert ("PersistentVolumeClaim", "gpupilot-rightsizer") not in own
    (data,) = (
        v for v in pod_spec(own[("Deployment", "gpupilot-rightsizer")])["volumes"] if v["name"] == "data"
    )
    assert data["persistentVolumeClaim"] == {"claimName": "mine"}
    plain = pod_spec(by_name(template("defaults"))[("Deployment", "gpupilot-rightsizer")])
    assert any(v["name"] == "data" and "emptyDir" in v for v in plain["volumes"])
    override = by_name(template("defaults", "adapter.prometheusUrl=http://thanos:9090"))
    assert (
        "--prometheus-url=http://thanos:9090"
        in pod_spec(override[("Deployment", "gpupilot-adapter")])["containers"][0]["args"]
    )


class Discovery(http.server.BaseHTTPRequestHandler):
    """An API server's discovery answers: v1beta2 of custom.metrics.k8s.io available, the rest 503
    (an APIService whose adapter is down or untrusted)."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/apis/custom.metrics.k8s.io/v1beta2":
            body = {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "custom.metrics.k8s.io/v1beta2",
                "resources": [
                    {
                        "name": "pods/gpu_utilization",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "MetricValueList",
                        "verbs": ["get"],
                    }
                ],
            }
            data, status = json.dumps(body).encode(), 200
        else:
            data, status = b'{"kind":"Status","code":503}', 503
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


def run_test_script(args: list[str]) -> tuple[int, list[str]]:
    """The hook's script with its arguments, its in-cluster config pointed at a local discovery
    double (the rest of the script, the Kubernetes client and its requests, as in the Pod)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    prelude = (
        "import kubernetes.config, kubernetes.client\n"
        "def _local():\n"
        "    c = kubernetes.client.Configuration()\n"
        f"    c.host = 'http://127.0.0.1:{server.server_address[1]}'\n"
        "    kubernetes.client.Configuration.set_default(c)\n"
        "kubernetes.config.load_incluster_config = _local\n"
    )
    try:
        res = subprocess.run(
            [sys.executable, "-c", prelude + args[0], *args[1:]],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
    finally:
        server.shutdown()
    return res.returncode, res.stdout.strip().splitlines()


@pytest.mark.slow
def test_helm_test_hook_asks_each_apiservice() -> None:
    objs = by_name(template("everything"))
    pod = objs[("Pod", "gpupilot-adapter-test")]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    adapter = pod_spec(objs[("Deployment", "gpupilot-adapter")])["containers"][0]
    assert container["image"] == adapter["image"], "an image the chart already uses"
    assert container["args"][1:] == [
        "custom.metrics.k8s.io/v1beta1",
        "custom.metrics.k8s.io/v1beta2",
        "external.metrics.k8s.io/v1beta1",
    ]
    assert run_test_script(container["args"]) == (
        1,
        [
            "FAIL /apis/custom.metrics.k8s.io/v1beta1: 503 Service Unavailable",
            "OK   /apis/custom.metrics.k8s.io/v1beta2: 1 resource(s)",
            "FAIL /apis/external.metrics.k8s.io/v1beta1: 503 Service Unavailable",
        ],
    )
    binding = objs[("ClusterRoleBinding", "gpupilot-adapter-test")]
    assert binding["roleRef"]["name"] == "gpupilot-adapter-metrics-reader"
    assert ("Pod", "gpupilot-adapter-test") not in by_name(template("defaults", "adapter.test.enabled=false"))


def test_notes_say_how_to_check_each_part() -> None:
    res = run_helm("install", "gpupilot", str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    assert res.returncode == 0, res.stderr
    notes = res.stdout.split("NOTES:", 1)[1]
    for needed in (
        "make images",
        "kubectl get apiservice v1beta2.custom.metrics.k8s.io",
        "kubectl get --raw /apis/custom.metrics.k8s.io/v1beta2",
        "helm test gpupilot -n gpupilot",
        'up{job="gpupilot-exporter"}',
        "pod-security.kubernetes.io/enforce=privileged",
        "curl -s localhost:9500/plan.json",
        "rightsizer.persistence.enabled=true",
        "a CA the chart generated",
        "count every GPU twice",  # beside NVIDIA's dcgm-exporter
        "--metric-labels-allowlist=nodes=[nvidia.com/mig.config,nvidia.com/mig.config.state",
        "gpupilot-rightsizer serve --config /etc/gpupilot/rightsizer.yaml --check",
    ):
        assert needed in notes, needed
    assert "symlink" not in res.stderr.lower(), res.stderr  # the chart holds plain files


# The parts the double does not serve (CRDs, admission policies) off: Helm maps every rendered kind.
SERVER_SIDE = (
    "monitoring.prometheusRules.enabled=false,monitoring.dashboards.enabled=false,"
    "exporter.serviceMonitor.enabled=false,rightsizer.serviceMonitor.enabled=false,"
    "adapter.serviceMonitor.enabled=false,"
    "rightsizer.admissionPolicy.enabled=false"
)
OWNED_BY_RELEASE = {
    "labels": {"app.kubernetes.io/managed-by": "Helm"},
    "annotations": {"meta.helm.sh/release-name": "gpupilot", "meta.helm.sh/release-namespace": NAMESPACE},
}


def install_secrets(kube: Any, objs: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Put the rendered Secrets into the double, as `helm install` would have left them."""
    for (kind, _name), obj in objs.items():
        if kind == "Secret":
            meta = {**obj["metadata"], **OWNED_BY_RELEASE}
            meta["annotations"] = {
                **obj["metadata"].get("annotations", {}),
                **OWNED_BY_RELEASE["annotations"],
            }
            kube.store.put("/secrets", {**obj, "metadata": meta}, event="ADDED")


def template_against(kube: Any, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`helm template --dry-run=server` against the API double: Helm's lookup reads the cluster,
    as `helm install` and `helm upgrade` do."""
    config = kube.write_kubeconfig(tmp_path / "kubeconfig")
    return run_helm(
        "template", "gpupilot", str(CHART), "--namespace", NAMESPACE, "--set", SERVER_SIDE,
        "--dry-run=server", "--disable-openapi-validation", "--kubeconfig", str(config),
    )  # fmt: skip


@pytest.mark.slow
def test_lookup_keeps_the_certificate_and_finds_the_pause_label(tmp_path: Path) -> None:
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with KubeDouble() as kube:
        kube.add_node("gpu-old")  # GPU Operator before v26.7.0: no client label
        res = template_against(kube, tmp_path)
        assert res.returncode == 0, res.stderr
        fresh = by_name(tuple(load_all(res.stdout)))
        assert (
            "nvidia.com/gpu.deploy.client"
            not in pod_spec(fresh[("DaemonSet", "gpupilot-exporter")])["nodeSelector"]
        )
        generated = fresh[("Secret", "gpupilot-adapter-tls")]["data"]
        # An upgrade: the Secrets of the first install are in the cluster, and a node has the label.
        install_secrets(kube, fresh)
        kube.add_node("gpu-new", labels={"nvidia.com/gpu.deploy.client": "true"})
        res = template_against(kube, tmp_path)
        assert res.returncode == 0, res.stderr
        upgraded = by_name(tuple(load_all(res.stdout)))
    assert upgraded[("Secret", "gpupilot-adapter-tls")]["data"] == generated, "the upgrade kept the pair"
    assert {api["spec"]["caBundle"] for api in apiservices(upgraded)} == {generated["ca.crt"]}
    selector = pod_spec(upgraded[("DaemonSet", "gpupilot-exporter")])["nodeSelector"]
    assert selector == {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.client": "true"}


@pytest.mark.slow
def test_a_namespace_that_refuses_the_exporter_stops_the_install(tmp_path: Path) -> None:
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with KubeDouble() as kube:
        kube.store.put(
            "/namespaces",
            {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}},
            },
            event="ADDED",
        )  # fmt: skip
        res = template_against(kube, tmp_path)
    assert res.returncode != 0
    assert (
        f'namespace {NAMESPACE} enforces Pod Security level "baseline", which refuses the exporter '
        f"(a hostPath for the kubelet's pod-resources socket): run 'kubectl label namespace {NAMESPACE} "
        "pod-security.kubernetes.io/enforce=privileged --overwrite', or set exporter.enabled=false"
    ) in res.stderr


def drain_hook(objs: dict[tuple[str, str], dict[str, Any]]) -> str:
    """The hook the drain Job runs on ("" when the chart renders none)."""
    job = objs.get(("Job", "gpupilot-rightsizer-drain"))
    return job["metadata"]["annotations"]["helm.sh/hook"] if job else ""


@pytest.mark.slow
def test_auto_apply_is_drained_before_its_rights_go(tmp_path: Path) -> None:
    """With auto-apply on, an uninstall first runs `gpupilot-rightsizer drain` (pre-delete); an upgrade
    that switches it off does too (pre-upgrade: Helm's lookup finds the release's apply Role); a
    release that never applied renders no hook at all."""
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    assert drain_hook(by_name(template("defaults"))) == ""
    on = by_name(template("defaults", "rightsizer.autoApply.enabled=true"))
    assert drain_hook(on) == "pre-delete"
    (job,) = pod_spec(on[("Job", "gpupilot-rightsizer-drain")])["containers"]
    assert job["command"] == ["gpupilot-rightsizer"]
    assert job["args"] == [
        "drain", "--namespace=gpupilot", "--configmap=gpupilot-rightsizer",
        "--lease-namespace=gpu-operator", "--timeout=1800s",
    ]  # fmt: skip
    lease_role = on[("Role", "gpupilot-rightsizer-drain")]
    verbs = {
        (tuple(r["resources"]), tuple(r["resourceNames"]), tuple(r["verbs"])) for r in lease_role["rules"]
    }
    assert verbs <= {
        (("leases",), ("gpupilot-rightsizer-apply",), ("get",)),
        (("configmaps",), ("gpupilot-rightsizer",), ("get", "update")),
    }
    with KubeDouble() as kube:
        apply_role = on[("Role", "gpupilot-rightsizer-apply")]
        kube.store.put("rbac.authorization.k8s.io/roles", apply_role, event="ADDED")
        res = template_against(kube, tmp_path)  # auto-apply off now: an upgrade switching it off
        assert res.returncode == 0, res.stderr
    assert drain_hook(by_name(tuple(load_all(res.stdout)))) == "pre-upgrade"
