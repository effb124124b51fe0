"""A throw-away PKI minted with ``cryptography``: a CA, a server certificate for 127.0.0.1, client certificates."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    """Signed by another CA: must be refused."""
    stranger_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    *,
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer or _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
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
    elif server:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def mint(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, other_ca_key = _key(), _key()
    ca = _cert(subject="gpupilot test CA", key=ca_key, issuer=None, issuer_key=ca_key, ca=True)
    other_ca = _cert(
        subject="someone else's CA", key=other_ca_key, issuer=None, issuer_key=other_ca_key, ca=True
    )
    ca_path, _ = _write(folder / "ca", ca, ca_key)
    skey, ckey, xkey = _key(), _key(), _key()
    server = _cert(subject="exporter", key=skey, issuer=ca.subject, issuer_key=ca_key, server=True)
    client = _cert(subject="prometheus", key=ckey, issuer=ca.subject, issuer_key=ca_key)
    stranger = _cert(subject="stranger", key=xkey, issuer=other_ca.subject, issuer_key=other_ca_key)
    s_cert, s_key = _write(folder / "server", server, skey)
    c_cert, c_key = _write(folder / "client", client, ckey)
    x_cert, x_key = _write(folder / "stranger", stranger, xkey)
    return Pki(ca_path, s_cert, s_key, c_cert, c_key, x_cert, x_key)
