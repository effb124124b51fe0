"""kube-apiserver's aggregation layer in front of an APIService backend, as the adapter meets it:
the backend's certificate checked against the APIService's caBundle for ``<service>.<namespace>.svc``,
the front-proxy client certificate presented, the request authorized by the API server's own RBAC
before it is proxied, the requesting user and groups in the ``X-Remote-User``/``X-Remote-Group``
headers; a caBundle that did not sign the backend's certificate
leaves the APIService unavailable and every request a 503, never the backend's answer."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from devkit.pki import make_ca
from tests.kube.conftest import RealCluster

GROUP, VERSION = "echo.gpupilot.test", "v1alpha1"


class _Echo(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.rstrip("/") == f"/apis/{GROUP}/{VERSION}":
            body: dict[str, Any] = {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{GROUP}/{VERSION}",
                "resources": [{"name": "things", "namespaced": True, "kind": "Thing", "verbs": ["get"]}],
            }
        else:
            peer = self.connection.getpeercert()
            body = {
                "path": self.path,
                "user": self.headers.get("X-Remote-User"),
                "groups": self.headers.get_all("X-Remote-Group"),
                "extra": {k: v for k, v in self.headers.items() if k.lower().startswith("x-remote-extra-")},
                "peer": peer["subject"][0][0][1],
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo(real_cluster: RealCluster, namespace: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """An HTTPS backend for echo.<namespace>.svc that requires a client certificate from the
    control plane's front-proxy CA (what the chart's adapter does with
    --requestheader-client-ca-file)."""
    ca = make_ca(tmp_path, "serving-ca")
    leaf = ca.issue(tmp_path, cn="echo", server=True, hosts=(f"echo.{namespace}.svc",), stem="srv")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(leaf.cert), str(leaf.key))
    ctx.load_verify_locations(str(real_cluster.cp.certs.front_proxy_ca.path))
    ctx.verify_mode = ssl.CERT_REQUIRED
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca.path
    finally:
        server.shutdown()
        real_cluster.kube.delete("apiregistration.k8s.io/v1", "APIService", f"{VERSION}.{GROUP}")


def _register(cluster: RealCluster, namespace: str, port: int, ca_bundle: Path) -> None:
    cluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo", "namespace": namespace},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        }
    )
    cluster.kube.apply(
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{VERSION}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "version": VERSION,
                "groupPriorityMinimum": 100,
                "versionPriority": 10,
                "caBundle": base64.b64encode(ca_bundle.read_bytes()).decode(),
                "service": {"name": "echo", "namespace": namespace, "port": port},
            },
        }
    )


def _available(cluster: RealCluster) -> tuple[bool, str]:
    obj = cluster.kube.get("apiregistration.k8s.io/v1", "APIService", f"{VERSION}.{GROUP}") or {}
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Available":
            return cond.get("status") == "True", str(cond.get("message", ""))
    return False, "no condition yet"


def _wait_available(cluster: RealCluster, want: bool, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        ok, message = _available(cluster)
        if ok == want:
            return message
        if time.monotonic() > deadline:
            raise AssertionError(f"APIService Available={ok} after {timeout:.0f}s: {message}")
        time.sleep(0.5)


def test_the_aggregator_trusts_the_ca_bundle_and_names_the_user(
    real_cluster: RealCluster, namespace: str, echo: tuple[int, Path]
) -> None:
    port, serving_ca = echo
    _register(real_cluster, namespace, port, serving_ca)
    _wait_available(real_cluster, True)
    # the API server authorizes the request itself before it proxies it: without this, a 403
    real_cluster.kubectl(
        "create", "role", "things", "-n", namespace, "--verb=get", f"--resource=things.{GROUP}"
    )
    real_cluster.kubectl("create", "rolebinding", "things", "-n", namespace, "--role=things", "--user=alice")
    res = real_cluster.kubectl(
        "get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/things/x",
        "--as=alice", "--as-group=team-a", "--as-uid=u-1",
    )  # fmt: skip
    body = json.loads(res.stdout)
    assert body["peer"] == "front-proxy-client", "the aggregator presents its --proxy-client-cert-file"
    assert body["user"] == "alice"
    assert "team-a" in body["groups"] and "system:authenticated" in body["groups"]
    assert body["path"] == f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/things/x"


def test_a_ca_bundle_that_did_not_sign_the_backend_is_never_answered(
    real_cluster: RealCluster, namespace: str, echo: tuple[int, Path], tmp_path: Path
) -> None:
    port, _ = echo
    other = make_ca(tmp_path / "other", "other-ca")
    _register(real_cluster, namespace, port, other.path)
    message = _wait_available(real_cluster, False)
    time.sleep(2)  # the availability controller's verdict settles
    ok, message = _available(real_cluster)
    assert not ok
    res = real_cluster.kubectl(
        "get", "--raw", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/things/x", check=False
    )
    assert res.returncode != 0 and "alice" not in res.stdout
    assert "ServiceUnavailable" in res.stderr or "503" in res.stderr or "unavailable" in res.stderr.lower(), (
        res.stderr
    )
    assert "certificate" in message or "x509" in message or "no response" in message or message, message
