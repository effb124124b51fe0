"""DRA attribution: a claim's pool/device → the GPU or MIG instance it names, then → the container.

For a container whose GPU came from a ResourceClaim, the kubelet's ``List`` answer leaves
``devices[]`` empty and names the device in ``dynamic_resources[].claim_resources[]`` by driver,
pool and device name. Two ways lead from that name to a UUID NVML reports:

1. the driver's ResourceSlices (:mod:`exporter.attribute.kubeapi` keeps them, watched from the API): each
   device carries a ``uuid`` attribute (a GPU UUID, or a MIG UUID with ``profile`` and ``parentUUID``);
2. when the slices cannot be read, NVIDIA's canonical device names: ``gpu-<minor>`` is the GPU behind
   ``/dev/nvidia<minor>``; ``gpu-<minor>-mig-<giProfileId>-<start>-<size>`` is the MIG instance at
   that placement on it (looked up in the snapshot, so its current MIG UUID is used).

Everything here is pure: a ``List`` response, a slice index and a snapshot in, allocations out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from exporter.attribute.podresources import api_pb2
from exporter.snapshot import Allocations, DraDevice, GpuSnapshot, MigInstance, NodeSnapshot, PodRef
from mig_geometry import catalogue

NVIDIA_DRIVER = "gpu.nvidia.com"
"""The DRA driver name of NVIDIA's GPU driver (kubernetes-sigs/dra-driver-nvidia-gpu)."""

_CANONICAL = re.compile(r"gpu-(\d+)(?:-mig-(\d+)-(\d+)-(\d+))?")


@dataclass(frozen=True)
class ClaimDevice:
    """One device of one claim, as the kubelet names it, held by one container."""

    namespace: str
    pod: str
    container: str
    claim_name: str
    claim_namespace: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True)
class SliceDevice:
    """What a ResourceSlice says about one device: its UUID and, for a MIG device, its profile."""

    uuid: str
    mig_profile: str = ""
    parent_uuid: str = ""


SliceIndex = Mapping[tuple[str, str], SliceDevice]
"""(pool, device name) → the device, for one driver's slices on this node."""


@dataclass(frozen=True)
class Resolved:
    """Allocations after DRA resolution, and the claimed devices that named nothing on this node."""

    allocations: Allocations
    unresolved: tuple[ClaimDevice, ...] = ()


def claims_from_response(
    response: api_pb2.ListPodResourcesResponse, *, drivers: Iterable[str] = (NVIDIA_DRIVER,)
) -> tuple[ClaimDevice, ...]:
    """Pure: every claimed device of the given drivers in a ``List`` response, in response order."""
    wanted = frozenset(drivers)
    out: list[ClaimDevice] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            for dyn in container.dynamic_resources:
                for res in dyn.claim_resources:
                    if res.driver_name not in wanted:
                        continue
                    cd = ClaimDevice(
                        namespace=pod.namespace,
                        pod=pod.name,
                        container=container.name,
                        claim_name=dyn.claim_name,
                        claim_namespace=dyn.claim_namespace or pod.namespace,
                        driver=res.driver_name,
                        pool=res.pool_name,
                        device=res.device_name,
                    )
                    if cd not in out:
                        out.append(cd)
    return tuple(out)


def _attribute(attrs: Mapping[str, Any], name: str) -> str:
    """A string/int attribute by name; qualified names (``gpu.nvidia.com/uuid``) match too."""
    for key, value in attrs.items():
        if key == name or key.rpartition("/")[2] == name:
            if isinstance(value, Mapping):
                for kind in ("string", "version", "int"):
                    if kind in value:
                        return str(value[kind])
            return ""
    return ""


def slice_index(
    items: Iterable[Mapping[str, Any]], *, driver: str = NVIDIA_DRIVER
) -> dict[tuple[str, str], SliceDevice]:
    """Pure: ResourceSlice objects (``resource.k8s.io`` v1, or v1beta1 where attributes sit under
    ``basic``) → (pool, device) → device, for ``driver``. Devices without a ``uuid`` are left out."""
    out: dict[tuple[str, str], SliceDevice] = {}
    for item in items:
        spec = item.get("spec") if isinstance(item, Mapping) else None
        if not isinstance(spec, Mapping) or spec.get("driver") != driver:
            continue
        pool = spec.get("pool")
        pool_name = pool.get("name") if isinstance(pool, Mapping) else None
        devices = spec.get("devices")
        if not isinstance(pool_name, str) or not isinstance(devices, list):
            continue
        for dev in devices:
            if not isinstance(dev, Mapping) or not isinstance(dev.get("name"), str):
                continue
            basic = dev.get("basic")
            attrs = (basic if isinstance(basic, Mapping) else dev).get("attributes")
            if not isinstance(attrs, Mapping):
                continue
            uuid = _attribute(attrs, "uuid")
            if not uuid:
                continue
            out[(pool_name, dev["name"])] = SliceDevice(
                uuid=uuid,
                mig_profile=_attribute(attrs, "profile") if uuid.startswith("MIG-") else "",
                parent_uuid=_attribute(attrs, "parentUUID"),
            )
    return out


def parse_canonical(name: str) -> tuple[int, tuple[int, int, int] | None] | None:
    """``gpu-3`` → (3, None); ``gpu-3-mig-19-2-1`` → (3, (19, 2, 1)); anything else → None."""
    m = _CANONICAL.fullmatch(name)
    if m is None:
        return None
    minor = int(m.group(1))
    if m.group(2) is None:
        return minor, None
    return minor, (int(m.group(2)), int(m.group(3)), int(m.group(4)))


def _gi_profile_id(gpu: GpuSnapshot, inst: MigInstance) -> int | None:
    model = catalogue.by_device_id(gpu.info.pci_device_id)
    prof = model.profile(inst.profile) if model is not None else None
    return None if prof is None or prof.gi_profile_id < 0 else prof.gi_profile_id


def _by_canonical_name(snapshot: NodeSnapshot, name: str) -> tuple[str, str] | None:
    """(UUID, MIG profile or "") of the device a canonical name points at in this snapshot."""
    parsed = parse_canonical(name)
    if parsed is None:
        return None
    minor, mig = parsed
    for gpu in snapshot.gpus:
        if gpu.info.minor_number != minor:
            continue
        if mig is None:
            return None if gpu.info.mig_enabled else (gpu.info.uuid, "")
        profile_id, start, size = mig
        for inst in gpu.instances:
            if (inst.placement_start, inst.placement_size) != (start, size):
                continue
            known = _gi_profile_id(gpu, inst)
            if known is not None and known != profile_id:
                return None  # another profile sits at that placement now: not the claimed device
            return inst.uuid, inst.profile
        return None
    return None


def _parent_of(snapshot: NodeSnapshot, mig_uuid: str) -> MigInstance | None:
    for gpu in snapshot.gpus:
        for inst in gpu.instances:
            if inst.uuid == mig_uuid:
                return inst
    return None


def resolve(
    devices: Allocations,
    claims: Iterable[ClaimDevice],
    snapshot: NodeSnapshot,
    *,
    slices: SliceIndex | None,
) -> Resolved:
    """Device-plugin allocations plus the claimed devices, each keyed by the UUID NVML reports.

    A device the slice index knows is resolved through it; one it does not know (or every device,
    when ``slices`` is None: the API could not be read) through the canonical names."""
    out: dict[str, list[PodRef]] = {k: list(v) for k, v in devices.items()}
    unresolved: list[ClaimDevice] = []
    for cd in claims:
        known = slices.get((cd.pool, cd.device)) if slices is not None else None
        if known is not None:
            uuid, profile = known.uuid, known.mig_profile
            if uuid.startswith("MIG-") and not profile:
                inst = _parent_of(snapshot, uuid)
                profile = inst.profile if inst is not None else ""
        else:
            found = _by_canonical_name(snapshot, cd.device)
            if found is None:
                unresolved.append(cd)
                continue
            uuid, profile = found
        is_mig = uuid.startswith("MIG-")
        ref = PodRef(
            namespace=cd.namespace,
            pod=cd.pod,
            container=cd.container,
            resource=cd.driver,
            dra=DraDevice(
                claim_name=cd.claim_name,
                claim_namespace=cd.claim_namespace,
                pool_name=cd.pool,
                device_name=cd.device,
                mig_profile=profile if is_mig else "",
                mig_device_uuid=uuid if is_mig else "",
            ),
        )
        holders = out.setdefault(uuid, [])
        if ref not in holders:
            holders.append(ref)
    return Resolved(MappingProxyType({k: tuple(v) for k, v in out.items()}), tuple(unresolved))


@dataclass(frozen=True)
class Attribution:
    """One ``List`` answer: device-plugin allocations (already keyed by UUID) and claimed devices,
    which need the snapshot (canonical names) or the slices to find their UUID."""

    devices: Allocations
    claims: tuple[ClaimDevice, ...] = ()
    slices: SliceIndex | None = None
    slices_note: str = ""
    """Why ``slices`` is None (the API's last error), for the log line on unresolved claims."""

    def resolve(self, snapshot: NodeSnapshot) -> Resolved:
        if not self.claims:
            return Resolved(self.devices)
        return resolve(self.devices, self.claims, snapshot, slices=self.slices)
