"""What cert-manager and its CA injector do with a rendering's Issuers and Certificates: each
Certificate's Secret (``tls.crt``, ``tls.key``, ``ca.crt``) signed as its Issuer says (selfSigned, or
ca: the key pair in the named Secret), and each APIService annotated
``cert-manager.io/inject-ca-from: NS/NAME`` given that Certificate's ``ca.crt`` as ``caBundle``."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devkit.e2e.render import Rendering

Obj = dict[str, Any]
KINDS = ("Certificate", "Issuer", "ClusterIssuer")
"""cert-manager's kinds: not installed in the test cluster; this module stands in for them."""
INJECT = "cert-manager.io/inject-ca-from"


class CertManagerError(RuntimeError):
    pass


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _sign(
    spec: Obj, issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None
) -> tuple[bytes, bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(
                NameOID.COMMON_NAME, spec.get("commonName") or (spec.get("dnsNames") or ["gpupilot"])[0]
            )
        ]
    )
    now = dt.datetime.now(dt.UTC)
    is_ca = bool(spec.get("isCA"))
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if spec.get("dnsNames"):
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in spec["dnsNames"]]), critical=False
        )
    if not is_ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    ca_pem = _pem(issuer[0]) if issuer else _pem(cert)
    return _pem(cert), _key_pem(key), ca_pem


def issue(rendering: Rendering) -> dict[str, Obj]:
    """Secrets (name → Secret object) for every Certificate; APIServices given their caBundle in place."""
    secrets: dict[str, Obj] = {}
    certs = rendering.of_kind("Certificate")
    pending = list(certs)
    while pending:
        progressed = False
        for cert in list(pending):
            ref = cert["spec"]["issuerRef"]
            issuer = rendering.find(ref.get("kind", "Issuer"), ref["name"])
            if issuer is None:
                raise CertManagerError(
                    f"Certificate {cert['metadata']['name']}: Issuer {ref['name']} not rendered"
                )
            signer = None
            if "ca" in issuer["spec"]:
                secret = secrets.get(issuer["spec"]["ca"]["secretName"])
                if secret is None:
                    continue  # its CA is issued later in this loop
                data = secret["data"]
                signer = (
                    x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"])),
                    serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), None),
                )
            elif "selfSigned" not in issuer["spec"]:
                raise CertManagerError(f"Issuer {ref['name']}: only selfSigned and ca are stood in for")
            crt, key, ca = _sign(cert["spec"], signer)  # type: ignore[arg-type]
            name = cert["spec"]["secretName"]
            secrets[name] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": cert["metadata"]["namespace"]},
                "data": {
                    k: base64.b64encode(v).decode()
                    for k, v in (("tls.crt", crt), ("tls.key", key), ("ca.crt", ca))
                },
            }
            pending.remove(cert)
            progressed = True
        if not progressed:
            raise CertManagerError(
                "Certificates whose CA Issuer's Secret nothing issues: "
                + ", ".join(c["metadata"]["name"] for c in pending)
            )
    for api in rendering.of_kind("APIService"):
        source = (api["metadata"].get("annotations") or {}).get(INJECT)
        if not source:
            continue
        _, name = source.split("/", 1)
        source_cert = rendering.find("Certificate", name)
        if source_cert is None:
            raise CertManagerError(
                f"APIService {api['metadata']['name']}: {INJECT} names Certificate {name}, not rendered"
            )
        api["spec"]["caBundle"] = secrets[source_cert["spec"]["secretName"]]["data"]["ca.crt"]
    return secrets
