"""devkit.e2e's parts that need no images: mount targets resolved through the image's links, the
cert-manager stand-in's chain and injection, the ServiceMonitor as a Prometheus job, a pod's files,
modes, env and port mapping, and the chart's monitoring kinds left out where a cluster lacks their
CRDs. The aggregation layer itself is kube-apiserver's: tests/kube/test_aggregator.py."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509

from devkit.e2e import certmanager, render
from devkit.e2e.__main__ import scrape_job
from devkit.e2e.pod import SA_DIR, PodRun, in_rootfs


@pytest.fixture(scope="module")
def chart() -> render.Rendering:
    return render.chart("http://127.0.0.1:9")


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> render.Rendering:
    return render.overlay("gpu-operator", "http://127.0.0.1:9", tmp_path_factory.mktemp("k"))


def test_mount_targets_follow_the_images_links(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("/run")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "conf").symlink_to("../opt/conf")
    assert in_rootfs(tmp_path, SA_DIR) == "/run/secrets/kubernetes.io/serviceaccount"
    assert in_rootfs(tmp_path, "/etc/conf/x.yaml") == "/opt/conf/x.yaml"
    assert in_rootfs(tmp_path, "/etc/gpupilot") == "/etc/gpupilot"


@pytest.mark.slow
def test_overlay_prometheus_url_replaced_and_cert_manager_stood_in(overlay: render.Rendering) -> None:
    args = overlay.workload("adapter", "Deployment").container["args"]
    assert "--prometheus-url=http://127.0.0.1:9" in args
    secrets = certmanager.issue(overlay)
    tls = secrets["gpupilot-adapter-tls"]["data"]
    leaf = x509.load_pem_x509_certificate(base64.b64decode(tls["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["ca.crt"]))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gpupilot-adapter.gpupilot.svc" in sans.get_values_for_type(x509.DNSName)
    ca_secret = secrets["gpupilot-adapter-ca"]["data"]
    assert ca_secret["tls.crt"] == tls["ca.crt"], "signed by the CA Certificate's own Secret"
    apis = overlay.of_kind("APIService")
    assert apis and all(a["spec"]["caBundle"] == tls["ca.crt"] for a in apis)


@pytest.mark.slow
def test_service_monitor_becomes_the_scrape_job(chart: render.Rendering) -> None:
    job = scrape_job(chart, 9400)
    assert list(job.targets) == ["127.0.0.1:9400"]
    assert (job.interval, job.metrics_path, job.honor_labels) == ("15s", "/metrics", True)
    assert job.labels == {"node": "gpu-h100-a", "Hostname": "gpu-h100-a"}
    assert list(job.metric_relabel_configs) == [
        {"source_labels": ["hostname"], "regex": "(.+)", "target_label": "Hostname"}
    ]


@dataclass
class _Api:
    """The API server as a pod sees it: an address, a CA, a token per ServiceAccount."""

    where: Path
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def ca_cert(self) -> Path:
        path = self.where / "ca.crt"
        path.write_text("-----BEGIN CERTIFICATE-----\n")
        return path

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", 6443

    def token(self, namespace: str, service_account: str) -> str:
        return self.tokens.setdefault(f"{namespace}/{service_account}", f"token-of-{service_account}")


def test_monitoring_kinds_without_crds_are_switched_off() -> None:
    assert render.monitoring_switches({"PrometheusRule"}) == ["monitoring.prometheusRules.enabled"]
    assert "exporter.podMonitor.enabled" in render.monitoring_switches({"ServiceMonitor", "PodMonitor"})
    with pytest.raises(render.RenderError, match="Frobnicator"):
        render.monitoring_switches({"Frobnicator"})


@pytest.mark.slow
def test_pod_files_modes_env_and_port_mapping(chart: render.Rendering, tmp_path: Path) -> None:
    kube = _Api(tmp_path)
    pod = PodRun(chart.workload("adapter", "Deployment"), chart, kube, {}, tmp_path / "pods").prepare()
    mounts = {path: host for host, path, _ in pod.mounts}
    config = mounts["/etc/gpupilot-adapter"] / "config.yaml"
    assert config.stat().st_mode & 0o777 == 0o644
    key = mounts["/var/run/serving-cert"] / "tls.key"
    assert key.stat().st_mode & 0o777 == 0o644, "a Secret volume's default mode"
    assert (mounts["/tmp"].stat().st_mode & 0o777) == 0o777
    sa = mounts[SA_DIR]
    assert (sa / "token").read_text() == kube.tokens["gpupilot/gpupilot-adapter"]
    assert (sa / "ca.crt").read_bytes() == kube.ca_cert.read_bytes()
    host, port = kube.host_port
    assert pod.env["KUBERNETES_SERVICE_HOST"] == host and pod.env["KUBERNETES_SERVICE_PORT"] == str(port)
    assert pod.env["MALLOC_ARENA_MAX"] == "2"
    assert pod.user() == "65532:65532"
    assert pod.args[:2] == ["gpupilot-adapter", "serve"] and "--secure-port=6443" in pod.args
    pod.replace_port(6443, 16443)
    assert "--secure-port=16443" in pod.args and any("16443" in n for n in pod.notes)
    sizer = PodRun(chart.workload("rightsizer", "Deployment"), chart, kube, {}, tmp_path / "pods").prepare()
    sizer.replace_port(9500, 19500)  # no flag: the mounted config's listen
    conf = {p: h for h, p, _ in sizer.mounts}["/etc/gpupilot"] / "rightsizer.yaml"
    assert "listen: 0.0.0.0:19500" in conf.read_text()
