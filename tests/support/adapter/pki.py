"""The adapter tests' PKI: serving, front-proxy, client and rogue CAs (minted by devkit.pki)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from devkit.pki import CA, Issued, make_ca

__all__ = ["CA", "Issued", "Pki", "make_ca", "make_pki"]


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
