"""devkit.e2e's parts that need no images: mount targets resolved through the image's links, the
cert-manager stand-in's chain and injection, the ServiceMonitor as a Prometheus job, a pod's files,
modes, env and port mapping, and the API double's aggregation layer over real HTTPS (trusting only
the APIService's caBundle, presenting the front-proxy certificate, naming the user)."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from devkit.e2e import certmanager, cluster, render
from devkit.e2e.__main__ import scrape_job
from devkit.e2e.pod import SA_DIR, PodRun, in_rootfs
from devkit.pki import CA, make_ca
from tests.support.kubedouble import KubeDouble
from tests.support.kubedouble.aggregator import register


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


@pytest.mark.slow
def test_pod_files_modes_env_and_port_mapping(chart: render.Rendering, tmp_path: Path) -> None:
    kube = cluster.start(chart, tmp_path / "cluster")
    try:
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
        sizer = PodRun(
            chart.workload("rightsizer", "Deployment"), chart, kube, {}, tmp_path / "pods"
        ).prepare()
        sizer.replace_port(9500, 19500)  # no flag: the mounted config's listen
        conf = {p: h for h, p, _ in sizer.mounts}["/etc/gpupilot"] / "rightsizer.yaml"
        assert "listen: 0.0.0.0:19500" in conf.read_text()
    finally:
        kube.stop()


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(
            {
                "path": self.path,
                "user": self.headers.get("X-Remote-User"),
                "groups": self.headers.get_all("X-Remote-Group"),
                "peer": self.connection.getpeercert()["subject"][0][0][1],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def extension_server(tmp_path: Path) -> Iterator[tuple[int, Path, CA]]:
    """An HTTPS server for gpupilot-adapter.gpupilot.svc requiring a front-proxy client certificate."""
    ca = make_ca(tmp_path, "serving-ca")
    leaf = ca.issue(tmp_path, cn="adapter", server=True, hosts=("gpupilot-adapter.gpupilot.svc",), stem="srv")
    front = make_ca(tmp_path, "front-ca")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(leaf.cert), str(leaf.key))
    ctx.load_verify_locations(str(front.path))
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca.path, front
    finally:
        server.shutdown()


@pytest.mark.slow
def test_aggregation_layer_trusts_the_ca_bundle_and_sends_the_user(
    extension_server: tuple[int, Path, CA], tmp_path: Path
) -> None:
    port, serving_ca, front_ca = extension_server
    (tmp_path / "f").mkdir()
    front = make_ca(tmp_path / "f", "other-ca")  # a CA the server does not trust
    apiservice: dict[str, Any] = {
        "metadata": {"name": "v1beta2.custom.metrics.k8s.io"},
        "spec": {
            "group": "custom.metrics.k8s.io",
            "version": "v1beta2",
            "caBundle": base64.b64encode(serving_ca.read_bytes()).decode(),
            "service": {"name": "gpupilot-adapter", "namespace": "gpupilot"},
        },
    }
    pki = tmp_path / "k"
    pki.mkdir()
    api_ca = make_ca(pki, "api-ca")
    api_cert = api_ca.issue(pki, cn="api", server=True, stem="api")
    with KubeDouble(tls=(api_cert.cert, api_cert.key), require_token=True, run_mig_manager=False) as kube:
        kube.add_token("t", "alice", ["team-a", "system:authenticated"])
        ctx = ssl.create_default_context(cafile=str(api_ca.path))

        def get(path: str, token: str = "t") -> tuple[int, Any]:
            req = urllib.request.Request(kube.url + path, headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as err:
                return err.code, json.loads(err.read())

        # the front-proxy certificate the server does not trust: refused, a 503 as the aggregator's
        untrusted = front.issue(tmp_path / "f", cn=cluster.FRONT_PROXY_CN, stem="client")
        register(
            kube,
            apiservice,
            address=("127.0.0.1", port),
            client_cert=untrusted.cert,
            client_key=untrusted.key,
        )
        assert get("/apis/custom.metrics.k8s.io/v1beta2")[0] == 503
        # the one the requestheader CA signed
        client_dir = tmp_path / "c"
        client_dir.mkdir()
        good = front_ca.issue(client_dir, cn=cluster.FRONT_PROXY_CN, stem="client")
        register(kube, apiservice, address=("127.0.0.1", port), client_cert=good.cert, client_key=good.key)
        code, body = get("/apis/custom.metrics.k8s.io/v1beta2/namespaces/x/pods/*/m")
        assert code == 200, body
        assert body["user"] == "alice" and body["groups"] == ["team-a", "system:authenticated"]
        assert body["path"] == "/apis/custom.metrics.k8s.io/v1beta2/namespaces/x/pods/*/m"
        assert get("/apis/custom.metrics.k8s.io/v1beta2", token="unknown")[0] == 401
        # a caBundle that did not sign the served certificate: 503, never the answer
        wrong = dict(
            apiservice,
            spec=dict(apiservice["spec"], caBundle=base64.b64encode(api_ca.path.read_bytes()).decode()),
        )
        register(kube, wrong, address=("127.0.0.1", port), client_cert=good.cert, client_key=good.key)
        assert get("/apis/custom.metrics.k8s.io/v1beta2")[0] == 503
        without = dict(apiservice, spec=dict(apiservice["spec"], caBundle=""))
        with pytest.raises(ValueError, match="no caBundle"):
            register(kube, without, address=("127.0.0.1", port), client_cert=good.cert, client_key=good.key)
