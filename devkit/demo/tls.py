"""A throw-away CA and server certificate for the demo's adapter, and a kubeconfig for kubectl.

Local use only: the key files stay under ``.demo/tls`` and the kubeconfig trusts that CA alone, so
``kubectl get --raw`` checks the adapter's certificate instead of skipping verification.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class DemoTls:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    """kubectl's identity (CN gpupilot-demo), checked by the adapter's --client-ca-file."""
    client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def ensure_tls(directory: Path, *, days: int = 30) -> DemoTls:
    """Reuse the pair under ``directory`` while it is valid for another day; else mint a new one."""
    tls = DemoTls(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )
    if all(
        p.exists() for p in (tls.ca_cert, tls.server_cert, tls.server_key, tls.client_cert, tls.client_key)
    ):
        cert = x509.load_pem_x509_certificate(tls.server_cert.read_bytes())
        if cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=1):
            return tls
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gpupilot demo CA"))
        .issuer_name(_name("gpupilot demo CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .subject_name(_name("gpupilot-adapter.local"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (
        x509.CertificateBuilder()
        .subject_name(_name("gpupilot-demo"))
        .issuer_name(ca.subject)
        .public_key(client_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    tls.client_cert.write_bytes(client.public_bytes(serialization.Encoding.PEM))
    _write_key(client_key, tls.client_key)
    tls.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.server_cert.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    _write_key(key, tls.server_key)
    return tls


def write_kubeconfig(path: Path, *, server: str, tls: DemoTls) -> Path:
    """A kubeconfig whose only cluster is the adapter, trusted through the demo CA, with a client cert."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpupilot-demo",
                "cluster": {"server": server, "certificate-authority": str(tls.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "gpupilot-demo",
                "user": {"client-certificate": str(tls.client_cert), "client-key": str(tls.client_key)},
            }
        ],
        "contexts": [
            {"name": "gpupilot-demo", "context": {"cluster": "gpupilot-demo", "user": "gpupilot-demo"}}
        ],
        "current-context": "gpupilot-demo",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
