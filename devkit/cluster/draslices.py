"""ResourceSlices as NVIDIA's DRA driver (``gpu.nvidia.com``) publishes them, for tests.

From ../shared/reference/dra-keda.md: one pool per node (the node name); whole GPUs ``gpu-<minor>``;
MIG devices ``gpu-<minor>-mig-<giProfileId>-<start>-<size>`` (v25.3.0-v25.8.1) or
``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<start>`` (v25.12.0, v0.4.0). Static MIG
devices carry ``uuid`` (the MIG UUID), ``parentUUID`` and ``profile``; DynamicMIG devices carry no
``uuid`` and consume counters of their GPU's shared counter set, which the pool publishes in a slice
of its own (kube-apiserver v1.37 refuses a slice holding both ``sharedCounters`` and ``devices``:
:func:`counter_slice`). ``resource.k8s.io/v1`` puts a device's attributes on the device, ``v1beta1``
under ``basic``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DRIVER = "gpu.nvidia.com"


@dataclass(frozen=True)
class MigDevice:
    minor: int
    profile: str
    gi_profile_id: int
    start: int
    size: int
    uuid: str | None = None
    """The MIG UUID (static MIG); None for DynamicMIG."""


def mig_name(d: MigDevice, *, release: str = "v25.12") -> str:
    """The device's name as the driver release names it (``v25.12`` and later, or ``v25.8``)."""
    if release == "v25.8":
        return f"gpu-{d.minor}-mig-{d.gi_profile_id}-{d.start}-{d.size}"
    return f"gpu-{d.minor}-mig-{d.profile.replace('.', '')}-{d.gi_profile_id}-{d.start}"


def _attrs(values: dict[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"version" if k == "driverVersion" else "string": v} for k, v in values.items()}


def resource_slice(
    node: str,
    *,
    gpus: dict[int, str],
    migs: Sequence[MigDevice] = (),
    release: str = "v25.12",
    api_version: str = "v1",
    product: str = "NVIDIA H100 80GB HBM3",
) -> dict[str, Any]:
    """One slice of ``node``'s pool: whole GPUs (minor → GPU UUID) and MIG devices. DynamicMIG devices
    (no ``uuid``) consume their parent's counters, as the driver advertises every valid placement."""
    devices: list[dict[str, Any]] = []
    counters = []
    dynamic = any(m.uuid is None for m in migs)
    for minor, uuid in sorted(gpus.items()):
        if dynamic:
            counters.append(
                {
                    "name": f"gpu-{minor}-counter-set",
                    "counters": {"multiprocessors": {"value": "132"}, "memory": {"value": "80Gi"}},
                }
            )
        fields: dict[str, Any] = {
            "attributes": _attrs(
                {
                    "type": "gpu",
                    "uuid": uuid,
                    "productName": product,
                    "brand": "Nvidia",
                    "architecture": "Hopper",
                    "cudaComputeCapability": "9.0.0",
                    "driverVersion": "570.133.20",
                    "resource.kubernetes.io/pciBusID": f"0000:{0x18 + minor:02x}:00.0",
                }
            ),
            "capacity": {"memory": {"value": "80Gi"}},
        }
        devices.append({"name": f"gpu-{minor}", **_shape(fields, api_version)})
    for m in migs:
        values = {"type": "mig", "parentUUID": gpus[m.minor], "profile": m.profile, "productName": product}
        if m.uuid is not None:
            values["uuid"] = m.uuid
        fields = {
            "attributes": _attrs(values),
            "capacity": {"multiprocessors": {"value": str(16 * m.size)}, "memory": {"value": "10Gi"}},
        }
        if m.uuid is None:
            fields["consumesCounters"] = [
                {"counterSet": f"gpu-{m.minor}-counter-set", "counters": {"multiprocessors": {"value": "16"}}}
            ]
        devices.append({"name": mig_name(m, release=release), **_shape(fields, api_version)})
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 2 if counters else 1},
        "devices": devices,
    }
    return {
        "apiVersion": f"resource.k8s.io/{api_version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-x7k2p"},
        "spec": spec,
    }


def counter_slice(node: str, *, minors: Sequence[int], api_version: str = "v1") -> dict[str, Any]:
    """The pool's other slice when it has DynamicMIG devices: each GPU's shared counter set (what
    its MIG devices consume), and no device."""
    counters = [
        {
            "name": f"gpu-{minor}-counter-set",
            "counters": {"multiprocessors": {"value": "132"}, "memory": {"value": "80Gi"}},
        }
        for minor in sorted(minors)
    ]
    return {
        "apiVersion": f"resource.k8s.io/{api_version}",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-counters"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 2},
            "sharedCounters": counters,
        },
    }


def _shape(fields: dict[str, Any], api_version: str) -> dict[str, Any]:
    return {"basic": fields} if api_version == "v1beta1" else fields
