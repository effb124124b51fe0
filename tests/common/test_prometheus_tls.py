"""Both services' Prometheus clients against a real Prometheus serving https itself (its
``--web.config.file``: a server certificate, a required client certificate, basic-auth users), so
the TLS and basic-auth paths meet Go's TLS stack and Prometheus' own checks, not only our gateway."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from adapter.clients.prometheus import PrometheusClient as AdapterClient
from adapter.errors import ConfigError as AdapterConfigError
from adapter.errors import PrometheusDenied as AdapterDenied
from adapter.errors import PrometheusUnavailable as AdapterUnavailable
from devkit.pki import CA, Issued, make_ca
from devkit.process import stop_process
from devkit.prometheus import free_port, require_binaries
from gpupilot_common.promauth import PrometheusAuth
from rightsizer.clients.prometheus import PrometheusClient as RightsizerClient
from rightsizer.clients.prometheus import PrometheusDenied as RightsizerDenied
from rightsizer.clients.prometheus import PrometheusUnavailable as RightsizerUnavailable

pytestmark = pytest.mark.prometheus
PASSWORD = "Pa55-w0rd-Secret"


@dataclass(frozen=True)
class TlsProm:
    url: str
    ca: CA
    client: Issued
    stranger: Issued
    password_file: Path


@pytest.fixture(scope="module")
def tls_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsProm]:
    base = tmp_path_factory.mktemp("prometheus-tls")
    ca, client_ca, other_ca = make_ca(base, "ca"), make_ca(base, "client-ca"), make_ca(base, "other-ca")
    server = ca.issue(base, cn="prometheus", server=True)
    client = client_ca.issue(base, cn="gpupilot")
    stranger = other_ca.issue(base, cn="stranger")
    web = base / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": str(server.cert),
                    "key_file": str(server.key),
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": str(client_ca.path),
                },
                "basic_auth_users": {
                    "gpupilot": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
                },
            }
        )
    )
    (base / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    password = base / "password"
    password.write_text(PASSWORD)
    prom, _ = require_binaries()
    port = free_port()
    log = (base / "prometheus.log").open("ab")
    proc = subprocess.Popen(
        [
            prom,
            f"--config.file={base / 'prometheus.yml'}",
            f"--storage.tsdb.path={base / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={web}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.get(
                    f"{url}/-/ready",
                    verify=str(ca.path),
                    cert=(str(client.cert), str(client.key)),
                    auth=("gpupilot", PASSWORD),
                    timeout=2,
                )
                if r.status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"https Prometheus did not start; see {base / 'prometheus.log'}")
            time.sleep(0.2)
        yield TlsProm(url, ca, client, stranger, password)
    finally:
        stop_process(proc)


def full(env: TlsProm, **changes: object) -> PrometheusAuth:
    settings: dict[str, object] = {
        "username": "gpupilot",
        "password_file": env.password_file,
        "ca_file": env.ca.path,
        "cert_file": env.client.cert,
        "key_file": env.client.key,
    }
    settings.update(changes)
    return PrometheusAuth(**{k: v for k, v in settings.items() if v is not None})  # type: ignore[arg-type]


def test_both_clients_query_over_https_with_client_cert_and_basic_auth(tls_prom: TlsProm) -> None:
    adapter = AdapterClient(tls_prom.url, timeout=5, auth=full(tls_prom))
    try:
        assert [s.value for s in adapter.query("vector(42)")] == [42.0]
    finally:
        adapter.close()
    with RightsizerClient(tls_prom.url, timeout=5, auth=full(tls_prom)) as client:
        assert [s.value for s in client.instant("vector(42)")] == [42.0]


def test_wrong_password_is_401_named(tls_prom: TlsProm, tmp_path: Path) -> None:
    wrong = tmp_path / "pw"
    wrong.write_text("not-the-password")
    adapter = AdapterClient(tls_prom.url, timeout=5, auth=full(tls_prom, password_file=wrong))
    try:
        with pytest.raises(AdapterDenied, match="answered HTTP 401 for /api/v1/query") as err:
            adapter.query("vector(1)")
    finally:
        adapter.close()
    assert "check --prometheus-username/--prometheus-password-file" in str(err.value)
    with (
        RightsizerClient(tls_prom.url, timeout=5, auth=full(tls_prom, password_file=wrong)) as client,
        pytest.raises(RightsizerDenied, match="answered HTTP 401 for /api/v1/query"),
    ):
        client.instant("vector(1)")


@pytest.mark.parametrize("cert", ["none", "stranger"])
def test_a_refused_client_certificate_points_at_the_cert_flags(tls_prom: TlsProm, cert: str) -> None:
    issued = tls_prom.stranger if cert == "stranger" else None
    auth = full(tls_prom, cert_file=issued.cert if issued else None, key_file=issued.key if issued else None)
    adapter = AdapterClient(tls_prom.url, timeout=5, auth=auth)
    try:
        with pytest.raises(AdapterUnavailable) as err:
            adapter.query("vector(1)")
    finally:
        adapter.close()
    assert "--prometheus-cert-file" in str(err.value), err.value
    with (
        RightsizerClient(tls_prom.url, timeout=5, auth=auth) as client,
        pytest.raises(RightsizerUnavailable) as err2,
    ):
        client.instant("vector(1)")
    assert "--prometheus-cert-file" in str(err2.value), err2.value
    for text in (str(err.value), str(err2.value)):
        assert PASSWORD not in text and "\n" not in text


def test_an_untrusted_server_certificate_points_at_the_ca_flag(tls_prom: TlsProm) -> None:
    auth = full(tls_prom, ca_file=tls_prom.client.cert.parent / "other-ca.crt")
    adapter = AdapterClient(tls_prom.url, timeout=5, auth=auth)
    try:
        with pytest.raises(AdapterUnavailable, match=r"TLS handshake failed \(certificate verify failed\)"):
            adapter.query("vector(1)")
    finally:
        adapter.close()
    with (
        RightsizerClient(tls_prom.url, timeout=5, auth=auth) as client,
        pytest.raises(RightsizerUnavailable, match=r"TLS handshake failed \(certificate verify failed\)"),
    ):
        client.instant("vector(1)")


def test_bad_tls_files_stop_both_clients_at_construction(tls_prom: TlsProm, tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("nothing")
    with pytest.raises(AdapterConfigError, match=f"--prometheus-ca-file {garbage}: no PEM certificate"):
        AdapterClient(tls_prom.url, auth=PrometheusAuth(ca_file=garbage))
    from rightsizer.clients.prometheus import PrometheusAuthError  # noqa: PLC0415

    with pytest.raises(PrometheusAuthError, match=f"--prometheus-ca-file {garbage}: no PEM certificate"):
        RightsizerClient(tls_prom.url, auth=PrometheusAuth(ca_file=garbage))
