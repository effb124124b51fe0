"""The adapter exports its serving certificate's expiry (what the GPUAdapterCertificateExpiring alert
reads), and the figure follows a renewal mounted as the kubelet mounts a Secret."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

from adapter.config.settings import AuthSettings, ServeSettings, TlsSettings
from adapter.serving.app import Adapter
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.adapter.serving.test_certreload import HPA, mount, wait_for
from tests.support.adapter.pki import Pki

GAUGE = re.compile(r"^gpupilot_adapter_serving_certificate_expiry_timestamp_seconds (\S+)$", re.M)


def not_after(path: Path) -> float:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()


@pytest.mark.slow
def test_expiry_gauge_is_the_served_certificates_and_follows_a_renewal(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    tls_dir, minted = tmp_path / "tls", tmp_path / "minted"
    minted.mkdir()
    mount(tls_dir, {"tls.crt": pki.server.cert, "tls.key": pki.server.key}, 1)
    settings = base_settings(prom.url, pki)
    settings = ServeSettings(
        **{
            **settings.__dict__,
            "tls": TlsSettings(tls_dir / "tls.crt", tls_dir / "tls.key"),
            "auth": AuthSettings(
                requestheader_client_ca_file=pki.front_proxy_ca.path,
                requestheader_allowed_names=("front-proxy-client",),
                authorization_mode="none",
            ),
        }
    )
    adapter = start_adapter(settings)
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)

    def gauge() -> float:
        text = client.get("/metrics", cert=(pki.front_proxy.cert, pki.front_proxy.key), headers=HPA).text
        found = GAUGE.search(text)
        return float(found.group(1)) if found else -1.0

    assert gauge() == not_after(pki.server.cert)
    # Renewed by the same CA for 20 days instead of 2: the gauge moves with the mounted files.
    longer = dataclasses.replace(pki.serving_ca, days=20)
    renewed = longer.issue(minted, cn="gpupilot-adapter", server=True, stem="renewed")
    mount(tls_dir, {"tls.crt": renewed.cert, "tls.key": renewed.key}, 2)
    assert wait_for(lambda: gauge() == not_after(renewed.cert))
    assert not_after(renewed.cert) - not_after(pki.server.cert) > 17 * 86400
