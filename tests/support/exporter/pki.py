"""The exporter tests' PKI: a CA, a server certificate for 127.0.0.1, client certificates (devkit.pki)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devkit.pki import make_ca


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
    other_ca_cert: Path
    """The other CA (the stranger's): a CA the exporter's certificates do not chain to."""


def mint(folder: Path) -> Pki:
    ca = make_ca(folder, "ca", cn="gpupilot test CA")
    other = make_ca(folder, "other-ca", cn="someone else's CA")
    server = ca.issue(folder, cn="exporter", server=True, stem="server")
    client = ca.issue(folder, cn="prometheus", stem="client")
    stranger = other.issue(folder, cn="stranger", stem="stranger")
    return Pki(
        ca.path, server.cert, server.key, client.cert, client.key, stranger.cert, stranger.key, other.path
    )
