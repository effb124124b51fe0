"""The control plane's certificates, minted per cluster with :mod:`devkit.pki`.

One cluster CA signs the API server's serving certificate and every client certificate (the admin's,
the controller-manager's, the scheduler's, KWOK's); a separate front-proxy CA signs the certificate
the aggregator presents to APIService backends (``--proxy-client-cert-file``), as kubeadm lays it
out; a key pair signs and verifies ServiceAccount tokens. Local use only: keys are unencrypted, 0600.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from devkit import pki

SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
"""The first address of the service range: the ``kubernetes`` Service's cluster IP."""
APISERVER_HOSTS = (
    "127.0.0.1",
    "localhost",
    KUBERNETES_SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class ClusterPKI:
    ca: pki.CA
    ca_key: Path
    """The cluster CA's key (the controller-manager signs CSRs with it)."""
    front_proxy_ca: pki.CA
    apiserver: pki.Issued
    admin: pki.Issued
    controller_manager: pki.Issued
    scheduler: pki.Issued
    kwok: pki.Issued
    proxy_client: pki.Issued
    sa_public: Path
    sa_private: Path


def _write_private_key(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def mint(directory: Path) -> ClusterPKI:
    """Every certificate and key a loopback control plane needs, under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca(directory, "ca", cn="kubernetes", days=7)
    ca_key = directory / "ca.key"
    _write_private_key(ca.key, ca_key)
    front = pki.make_ca(directory, "front-proxy-ca", cn="front-proxy-ca", days=7)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_private, sa_public = directory / "sa.key", directory / "sa.pub"
    _write_private_key(sa_key, sa_private)
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return ClusterPKI(
        ca=ca,
        ca_key=ca_key,
        front_proxy_ca=front,
        apiserver=ca.issue(directory, cn="kube-apiserver", server=True, hosts=APISERVER_HOSTS),
        admin=ca.issue(directory, cn="kubernetes-admin", orgs=("system:masters",), stem="admin"),
        controller_manager=ca.issue(
            directory, cn="system:kube-controller-manager", stem="controller-manager"
        ),
        scheduler=ca.issue(directory, cn="system:kube-scheduler", stem="scheduler"),
        kwok=ca.issue(directory, cn="kwok-controller", orgs=("system:masters",), stem="kwok"),
        proxy_client=front.issue(directory, cn="front-proxy-client", stem="front-proxy-client"),
        sa_public=sa_public,
        sa_private=sa_private,
    )
