"""Deterministic names and ids: GPU/MIG UUIDs, PCI bus ids, GPU-instance ids, ReplicaSet pod names.

All derive from ``blake2b(seed, …)``, so two processes on the same scenario agree on every id.
"""

from __future__ import annotations

import hashlib

_POD_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""Kubernetes' safe alphabet for generated name suffixes (no vowels, no 0/1/3)."""
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _digest(seed: int, *parts: object, size: int = 16) -> bytes:
    text = "\0".join(str(p) for p in (seed, *parts))
    return hashlib.blake2b(text.encode(), digest_size=size).digest()


def _uuid_text(raw: bytes) -> str:
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_uuid(seed: int, node: str, index: int) -> str:
    return "GPU-" + _uuid_text(_digest(seed, "gpu", node, index))


def mig_uuid(seed: int, node: str, index: int, gi_id: int) -> str:
    return "MIG-" + _uuid_text(_digest(seed, "mig", node, index, gi_id))


def pci_bus_id(index: int) -> str:
    bus = _PCI_BUSES[index] if index < len(_PCI_BUSES) else 0x10 + index
    return f"00000000:{bus:02X}:00.0"


def gpu_instance_id(compute_slices: int, memory_slices: int, start: int) -> int:
    """A GPU-instance id in NVML's style: unique per GPU for any valid placement.

    7g → 0; 4g → 1; 3g → 1 or 2 (start 0/4); 2g and two-slice 1g → 3–6 (start 0/2/4/6);
    one-slice 1g → 7–13 (start 0–6). Overlapping placements never coexist, so ids never clash.
    """
    if compute_slices >= 7 or memory_slices >= 8:
        return 0
    if memory_slices == 4:
        return 1 if compute_slices == 4 else 1 + start // 4
    if memory_slices == 2:
        return 3 + start // 2
    return 7 + start


def _suffix(raw: bytes, length: int) -> str:
    n = int.from_bytes(raw, "little")
    out = []
    for _ in range(length):
        n, r = divmod(n, len(_POD_ALPHABET))
        out.append(_POD_ALPHABET[r])
    return "".join(out)


def replicaset_name(seed: int, namespace: str, deployment: str) -> str:
    """``<deployment>-<10-char template hash>``, as the Deployment controller names ReplicaSets."""
    return f"{deployment}-{_suffix(_digest(seed, 'rs', namespace, deployment), 10)}"


def replica_pod_name(seed: int, namespace: str, deployment: str, replica: int) -> str:
    """``<deployment>-<hash>-<5-char suffix>``."""
    rs = replicaset_name(seed, namespace, deployment)
    return f"{rs}-{_suffix(_digest(seed, 'pod', namespace, deployment, replica), 5)}"


def process_id(seed: int, namespace: str, pod: str) -> int:
    """A host PID for the pod's GPU process (10000-59999): stable, distinct per pod in practice."""
    return 10000 + int.from_bytes(_digest(seed, "pid", namespace, pod, size=4), "little") % 50000


def claim_suffix(seed: int, namespace: str, pod: str, sequence: int) -> str:
    """The 5-character suffix of a claim generated from a ResourceClaimTemplate."""
    return _suffix(_digest(seed, "claim", namespace, pod, sequence), 5)


def pod_uid(seed: int, namespace: str, pod: str) -> str:
    return _uuid_text(_digest(seed, "uid", namespace, pod))


def service_pod_name(seed: int, namespace: str, deployment: str, week: int, sequence: int) -> str:
    """An autoscaled service's ``sequence``-th pod of a week's run: ``<deployment>-<hash>-<suffix>``."""
    rs = replicaset_name(seed, namespace, deployment)
    return f"{rs}-{_suffix(_digest(seed, 'svc', namespace, deployment, week, sequence), 5)}"
