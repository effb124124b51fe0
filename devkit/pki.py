"""A throw-away PKI minted with ``cryptography``: CAs that issue server and client certificates.

Used by the demo (the adapter's local CA, kubectl's client certificate) and by the tests (exporter
web-config TLS, the adapter's request-header authentication). Local use only: keys are written
unencrypted, mode 0600.
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
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


@dataclass(frozen=True)
class CA:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path
    """The CA certificate (PEM) on disk, what clients and servers are told to trust."""
    days: int = 2

    def issue(
        self,
        directory: Path,
        *,
        cn: str,
        orgs: tuple[str, ...] = (),
        server: bool = False,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        stem: str | None = None,
    ) -> Issued:
        """A leaf certificate for ``cn`` (organisations = Kubernetes groups); SANs when ``server``."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] + [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs
        ]
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=self.days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        if server:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        base = directory / (stem or cn.replace(":", "_").replace(" ", "_"))
        cert_path, key_path = base.with_suffix(".crt"), base.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return Issued(cert_path, key_path)


def make_ca(directory: Path, name: str, *, cn: str | None = None, days: int = 2) -> CA:
    """A self-signed CA written to ``directory/<name>.crt``; its leaves live ``days`` days too."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn or name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CA(name, key, cert, path, days)


def valid_for(cert_path: Path, *, at_least: dt.timedelta) -> bool:
    """Whether the certificate at ``cert_path`` stays valid for ``at_least`` from now."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + at_least


def write_kubeconfig(
    path: Path, *, server: str, ca_cert: Path, client: Issued, name: str = "gpupilot"
) -> Path:
    """A kubeconfig whose only cluster is ``server``, trusted through ``ca_cert``, with a client cert."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [
            {"name": name, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
