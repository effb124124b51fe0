"""TLS material: the server's SSL context (client certificates requested, optional), and a
self-signed pair for local use only (``--self-signed-cert-dir``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from adapter.errors import ConfigError
from gpupilot_common import atomicfile, yamlsafe
from gpupilot_common.paths import file_problem


def self_signed_pair(
    directory: Path, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
) -> tuple[Path, Path]:
    """``directory/apiserver.crt`` and ``.key``, created (valid one year) if missing."""
    cert_path, key_path = directory / "apiserver.crt", directory / "apiserver.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupilot-adapter (self-signed, local use)")])
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    # atomically, and the key never readable by others, not even between its write and a chmod
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    atomicfile.write_bytes(key_path, key_pem, mode=0o600)
    atomicfile.write_bytes(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def server_context(*, cert_file: Path, key_file: Path, client_ca_pems: list[bytes]) -> ssl.SSLContext:
    """TLS 1.2+; client certificates requested but optional, verified against ``client_ca_pems``;
    no renegotiation (as Go's TLS servers: kube-apiserver's included), so a connection's client
    certificate is the one its handshake verified."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    for flag, path in (("--tls-cert-file", cert_file), ("--tls-private-key-file", key_file)):
        if problem := file_problem(path):  # OpenSSL opens it itself: a named pipe would block here
            raise ConfigError(f"{flag} {path}: {problem}; give the PEM file")
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"--tls-cert-file {cert_file} / --tls-private-key-file {key_file}: cannot load: {exc}"
        ) from exc
    if client_ca_pems:
        ctx.load_verify_locations(cadata=_pem_text(client_ca_pems))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _pem_text(pems: list[bytes]) -> str:
    """The certificates of ``pems`` as clean PEM text: what lies between the blocks (comments, a byte
    that is not UTF-8) is left out, as Go's PEM decoder (kube-apiserver's) skips it."""
    try:
        certs = x509.load_pem_x509_certificates(b"\n".join(pems))
    except ValueError as exc:
        raise ConfigError(f"client CA bundle: not PEM certificates ({exc})") from None
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in certs)


def certificate_expiry(cert_file: Path) -> float:
    """Unix time the first certificate in ``cert_file`` expires (0 when unreadable)."""
    try:
        cert = x509.load_pem_x509_certificate(yamlsafe.read_bytes(cert_file))
    except (OSError, ValueError):
        return 0.0
    return cert.not_valid_after_utc.timestamp()
