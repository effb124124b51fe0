"""A throw-away CA and server certificate for the demo's adapter, and a kubeconfig for kubectl.

Local use only: the key files stay under ``.demo/tls`` and the kubeconfig trusts that CA alone, so
``kubectl get --raw`` checks the adapter's certificate instead of skipping verification.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from devkit import pki


@dataclass(frozen=True)
class DemoTls:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    """kubectl's identity (CN gpupilot-demo), checked by the adapter's --client-ca-file."""
    client_key: Path


def ensure_tls(directory: Path, *, days: int = 30) -> DemoTls:
    """Reuse the pair under ``directory`` while it is valid for another day; else mint a new one."""
    tls = DemoTls(
        directory / "ca.crt",
        directory / "server.crt",
        directory / "server.key",
        directory / "client.crt",
        directory / "client.key",
    )
    files = (tls.ca_cert, tls.server_cert, tls.server_key, tls.client_cert, tls.client_key)
    if all(p.exists() for p in files) and pki.valid_for(tls.server_cert, at_least=dt.timedelta(days=1)):
        return tls
    ca = pki.make_ca(directory, "ca", cn="gpupilot demo CA", days=days)
    ca.issue(directory, cn="gpupilot-adapter.local", server=True, stem="server")
    ca.issue(directory, cn="gpupilot-demo", stem="client")
    return tls


def write_kubeconfig(path: Path, *, server: str, tls: DemoTls) -> Path:
    """A kubeconfig whose only cluster is the adapter, trusted through the demo CA, with a client cert."""
    client = pki.Issued(tls.client_cert, tls.client_key)
    return pki.write_kubeconfig(path, server=server, ca_cert=tls.ca_cert, client=client, name="gpupilot-demo")
