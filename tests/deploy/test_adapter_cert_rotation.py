"""The chart's generated adapter certificate rotates on `helm upgrade`: Helm's lookup reads the Secrets
of the previous install from the Kubernetes API double, and their gpupilot.io/not-after annotation
decides what is kept (more than 30 days left) and what is made anew (the serving certificate signed by
the kept CA, so the APIServices' caBundle stays the same)."""

from __future__ import annotations

import base64
import copy
import datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from tests.deploy.test_helm_install import apiservices, by_name, install_secrets, template_against
from tests.support.yamldocs import load_all

TLS = ("Secret", "gpupilot-adapter-tls")
CA = ("Secret", "gpupilot-adapter-tls-ca")


def render(kube: Any, tmp_path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    res = template_against(kube, tmp_path)
    assert res.returncode == 0, res.stderr
    return by_name(tuple(load_all(res.stdout)))


def expiring(
    objs: dict[tuple[str, str], dict[str, Any]], key: tuple[str, str], days: int
) -> dict[tuple[str, str], dict[str, Any]]:
    out = copy.deepcopy(objs)
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days)
    out[key]["metadata"]["annotations"]["gpupilot.io/not-after"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def cert(pem_b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(pem_b64))


def upgrade(
    tmp_path: Path, first: dict[tuple[str, str], dict[str, Any]]
) -> dict[tuple[str, str], dict[str, Any]]:
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with KubeDouble() as kube:
        install_secrets(kube, first)
        return render(kube, tmp_path)


@pytest.mark.slow
def test_upgrade_renews_the_serving_certificate_with_the_same_ca(tmp_path: Path) -> None:
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with KubeDouble() as kube:
        first = render(kube, tmp_path)
    kept = upgrade(tmp_path, expiring(first, TLS, 31))
    assert kept[TLS]["data"] == first[TLS]["data"] and kept[CA]["data"] == first[CA]["data"]

    renewed = upgrade(tmp_path, expiring(first, TLS, 29))
    assert renewed[CA]["data"] == first[CA]["data"], "the CA is kept"
    assert renewed[TLS]["data"]["ca.crt"] == first[TLS]["data"]["ca.crt"]
    assert renewed[TLS]["data"]["tls.crt"] != first[TLS]["data"]["tls.crt"]
    assert {a["spec"]["caBundle"] for a in apiservices(renewed)} == {first[TLS]["data"]["ca.crt"]}
    new = cert(renewed[TLS]["data"]["tls.crt"])
    new.verify_directly_issued_by(cert(first[CA]["data"]["tls.crt"]))
    now = datetime.datetime.now(datetime.UTC)
    assert now + datetime.timedelta(days=364) < new.not_valid_after_utc < now + datetime.timedelta(days=366)
    noted = datetime.datetime.fromisoformat(renewed[TLS]["metadata"]["annotations"]["gpupilot.io/not-after"])
    assert abs(noted - new.not_valid_after_utc) < datetime.timedelta(minutes=5)


@pytest.mark.slow
def test_an_expiring_ca_is_replaced_with_its_certificate(tmp_path: Path) -> None:
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with KubeDouble() as kube:
        first = render(kube, tmp_path)
    renewed = upgrade(tmp_path, expiring(first, CA, 20))
    assert renewed[CA]["data"]["tls.crt"] != first[CA]["data"]["tls.crt"]
    assert renewed[TLS]["data"]["ca.crt"] == renewed[CA]["data"]["tls.crt"]
    cert(renewed[TLS]["data"]["tls.crt"]).verify_directly_issued_by(cert(renewed[CA]["data"]["tls.crt"]))
    assert {a["spec"]["caBundle"] for a in apiservices(renewed)} == {renewed[CA]["data"]["tls.crt"]}


@pytest.mark.slow
def test_cert_manager_signs_with_a_ca_the_apiservices_trust() -> None:
    from tests.deploy.test_helm import template  # noqa: PLC0415

    objs = by_name(template("defaults", "adapter.certManager.enabled=true"))
    ca = objs[("Certificate", "gpupilot-adapter-ca")]["spec"]
    assert ca["isCA"] is True and ca["issuerRef"] == {"name": "gpupilot-adapter-selfsigned", "kind": "Issuer"}
    assert objs[("Issuer", "gpupilot-adapter-ca")]["spec"] == {"ca": {"secretName": ca["secretName"]}}
    serving = objs[("Certificate", "gpupilot-adapter-tls")]["spec"]
    assert serving["issuerRef"] == {"name": "gpupilot-adapter-ca", "kind": "Issuer"}
    assert "isCA" not in serving and serving["secretName"] == "gpupilot-adapter-tls"
    for api in apiservices(objs):
        assert api["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": "gpupilot/gpupilot-adapter-ca"
        }
