"""Test PKI minted with ``cryptography``: CAs, a server certificate for 127.0.0.1, client certs."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    cert: Path
    key: Path


@dataclass
class CA:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    path: Path

    def issue(
        self,
        directory: Path,
        *,
        cn: str,
        orgs: tuple[str, ...] = (),
        server: bool = False,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
    ) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] + [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs
        ]
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
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
        stem = directory / cn.replace(":", "_").replace(" ", "_")
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return Issued(cert_path, key_path)


def make_ca(directory: Path, name: str) -> CA:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
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
    return CA(name, key, cert, path)


@dataclass
class Pki:
    serving_ca: CA
    front_proxy_ca: CA
    client_ca: CA
    rogue_ca: CA
    server: Issued
    front_proxy: Issued
    """CN front-proxy-client: in the allowed names."""
    wrong_cn_proxy: Issued
    """Issued by the front-proxy CA, but CN not allowed."""
    alice: Issued
    """Client CA user alice, group team-a."""
    rogue: Issued
    """From a CA the adapter does not trust."""


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    serving = make_ca(directory, "serving-ca")
    front = make_ca(directory, "front-proxy-ca")
    client = make_ca(directory, "client-ca")
    rogue = make_ca(directory, "rogue-ca")
    return Pki(
        serving_ca=serving,
        front_proxy_ca=front,
        client_ca=client,
        rogue_ca=rogue,
        server=serving.issue(directory, cn="gpupilot-adapter", server=True),
        front_proxy=front.issue(directory, cn="front-proxy-client"),
        wrong_cn_proxy=front.issue(directory, cn="evil-proxy"),
        alice=client.issue(directory, cn="alice", orgs=("team-a",)),
        rogue=rogue.issue(directory, cn="mallory"),
    )
