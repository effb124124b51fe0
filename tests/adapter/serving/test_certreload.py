"""Certificate rotation without a restart, laid out as the kubelet mounts a Secret (files are
symlinks through ``..data``, swapped atomically): a renewed serving certificate is presented to new
connections, a rotated request-header CA is trusted (and the old one no longer), and a broken update
is refused while the previous material keeps serving."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

from adapter.config.settings import AuthSettings, ServeSettings, TlsSettings
from adapter.serving.app import Adapter
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki, make_ca

V2 = "/apis/custom.metrics.k8s.io/v1beta2"
HPA = {"X-Remote-User": "system:serviceaccount:kube-system:horizontal-pod-autoscaler"}


def mount(secret_dir: Path, files: dict[str, Path], generation: int) -> None:
    """Write ``files`` as the kubelet does: into a fresh timestamped folder, then swap ``..data``."""
    version = secret_dir / f"..2026_11_30_{generation:04d}"
    version.mkdir(parents=True)
    for name, source in files.items():
        shutil.copy(source, version / name)
    tmp = secret_dir / "..data_tmp"
    tmp.symlink_to(version.name)
    os.replace(tmp, secret_dir / "..data")
    for name in files:
        link = secret_dir / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def served_serial(port: int, ca: Path) -> int:
    ctx = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_serving_certificate_and_request_header_ca_are_reloaded(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    tls_dir, ca_dir, minted = tmp_path / "tls", tmp_path / "front-proxy-ca", tmp_path / "minted"
    minted.mkdir()
    mount(tls_dir, {"tls.crt": pki.server.cert, "tls.key": pki.server.key}, 1)
    mount(ca_dir, {"ca.crt": pki.front_proxy_ca.path}, 1)
    settings = base_settings(prom.url, pki)
    settings = ServeSettings(
        **{
            **settings.__dict__,
            "tls": TlsSettings(tls_dir / "tls.crt", tls_dir / "tls.key"),
            "auth": AuthSettings(
                requestheader_client_ca_file=ca_dir / "ca.crt",
                requestheader_allowed_names=("front-proxy-client",),
                authorization_mode="none",
            ),
        }
    )
    adapter = start_adapter(settings)
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    old_proxy = (pki.front_proxy.cert, pki.front_proxy.key)
    assert client.get(V2, cert=old_proxy, headers=HPA).status_code == 200
    first = served_serial(adapter.port, pki.serving_ca.path)

    # cert-manager renews the serving certificate (same CA, new key and serial)
    renewed = pki.serving_ca.issue(minted, cn="gpupilot-adapter", server=True, stem="renewed")
    mount(tls_dir, {"tls.crt": renewed.cert, "tls.key": renewed.key}, 2)
    assert wait_for(lambda: served_serial(adapter.port, pki.serving_ca.path) != first)
    assert (
        served_serial(adapter.port, pki.serving_ca.path)
        == x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number
    )

    # the cluster rotates its front-proxy CA: the new client certificate is trusted, the old is not
    new_ca = make_ca(minted, "front-proxy-ca-2")
    new_proxy = new_ca.issue(minted, cn="front-proxy-client", stem="proxy-2")
    mount(ca_dir, {"ca.crt": new_ca.path}, 2)

    def code(cert: tuple[Path, Path]) -> int:
        try:
            return client.get(V2, cert=cert, headers=HPA).status_code
        except OSError:  # refused by the TLS layer: the certificate's CA is not trusted
            return 0

    assert wait_for(lambda: code((new_proxy.cert, new_proxy.key)) == 200)
    assert code(old_proxy) in (0, 401)

    # a half-written update (a key that does not match) is refused; the renewed pair keeps serving
    other = pki.serving_ca.issue(minted, cn="gpupilot-adapter", server=True, stem="other")
    mount(tls_dir, {"tls.crt": other.cert, "tls.key": renewed.key}, 3)
    assert wait_for(
        lambda: (
            'gpupilot_adapter_tls_reloads_total{result="failure"} 1.0'
            in client.get("/metrics", cert=(new_proxy.cert, new_proxy.key), headers=HPA).text
        )
    )
    assert (
        served_serial(adapter.port, pki.serving_ca.path)
        == x509.load_pem_x509_certificate(renewed.cert.read_bytes()).serial_number
    )
