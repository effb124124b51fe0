"""DRA attribution: a claim's pool/device → the GPU or MIG instance it names, then → the container.

For a container whose GPU came from a ResourceClaim, the kubelet's ``List`` answer leaves
``devices[]`` empty and names the device in ``dynamic_resources[].claim_resources[]`` by driver,
pool and device name. Two ways lead from that name to a UUID NVML reports:

1. the driver's ResourceSlices (:mod:`exporter.attribute.kubeapi` keeps them, watched from the API): a
   device carries a ``uuid`` attribute (a GPU UUID, or a MIG UUID with ``profile`` and ``parentUUID``);
   with ``DynamicMIG`` a MIG device has no ``uuid`` (the instance exists only once a claim is
   prepared): it is found by its ``parentUUID`` GPU and the placement its name gives, matched to the
   GPU instance NVML reports at that placement with that ``profile``;
2. when the slices cannot be read, NVIDIA's device names alone: ``gpu-<minor>`` is the GPU behind
   ``/dev/nvidia<minor>``; a MIG device is the instance at a placement of that GPU, named
   ``gpu-<minor>-mig-<giProfileId>-<start>-<size>`` by drivers v25.3.0-v25.8.1 and
   ``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<start>`` (``gpu-0-mig-1g10gb-19-0``) from
   v25.12.0, static and dynamic MIG alike (looked up in the snapshot, so its current MIG UUID is used).

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

_N = r"([0-9]{1,6})"
"""A number in a device name: ASCII digits, at most six (a minor number, a profile id, a placement);
anything longer or in other scripts is a name this module does not know, not a number to convert."""
_GPU = re.compile(rf"gpu-{_N}")
_MIG_V25_3 = re.compile(rf"gpu-{_N}-mig-{_N}-{_N}-{_N}")
"""Drivers v25.3.0-v25.8.1: ``gpu-<minor>-mig-<giProfileId>-<start>-<size>``."""
_MIG_V25_12 = re.compile(rf"gpu-{_N}-mig-([0-9]{{1,2}}g[0-9]{{1,4}}gb[a-z0-9]{{0,16}})-{_N}-{_N}")
"""Drivers v25.12.0 and v0.4.0: ``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<start>``."""


@dataclass(frozen=True)
class MigName:
    """What a MIG device's name says of its instance (None: that release's name does not carry it)."""

    gi_profile_id: int
    start: int
    size: int | None = None
    profile: str | None = None
    """The profile as the name spells it: without dots or other punctuation (``1g10gb``)."""


def profile_token(profile: str) -> str:
    """``1g.10gb`` → ``1g10gb``, ``1g.10gb+me`` → ``1g10gbme``: a profile as device names spell it."""
    return re.sub(r"[^a-z0-9]", "", profile.lower())


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
    """What a ResourceSlice says about one device: its UUID and, for a MIG device, its profile and
    parent GPU. ``uuid`` is "" for a DynamicMIG device (it has none until claimed)."""

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
    out: dict[ClaimDevice, None] = {}  # in response order, each once (6,000 claims: no list scans)
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
                    out[cd] = None
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
    ``basic``) → (pool, device) → device, for ``driver``. A device without a ``uuid`` is kept when it is
    a MIG device with a ``parentUUID`` (DynamicMIG); other devices without one are left out."""
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
            parent = _attribute(attrs, "parentUUID")
            mig = uuid.startswith("MIG-") or _attribute(attrs, "type") == "mig"
            if not uuid and not (mig and parent):
                continue
            out[(pool_name, dev["name"])] = SliceDevice(
                uuid=uuid, mig_profile=_attribute(attrs, "profile") if mig else "", parent_uuid=parent
            )
    return out


def mig_mode(slices: SliceIndex | None) -> str:
    """How the driver serves this node, from its slices: ``dynamic`` when a MIG device has no ``uuid``
    (DynamicMIG: instances made per claim), ``static`` for other slices, "" without slices."""
    if not slices:
        return ""
    return "dynamic" if any(not d.uuid and d.mig_profile for d in slices.values()) else "static"


def parse_canonical(name: str) -> tuple[int, MigName | None] | None:
    """A device name of NVIDIA's driver → (minor, what it says of the MIG instance; None for a whole
    GPU): ``gpu-3`` → (3, None); ``gpu-3-mig-19-2-1`` (v25.3-v25.8) → (3, gi 19, start 2, size 1);
    ``gpu-3-mig-1g10gb-19-2`` (v25.12+) → (3, gi 19, start 2, profile ``1g10gb``); anything else → None."""
    if m := _GPU.fullmatch(name):
        return int(m.group(1)), None
    if m := _MIG_V25_3.fullmatch(name):
        return int(m.group(1)), MigName(int(m.group(2)), int(m.group(3)), size=int(m.group(4)))
    if m := _MIG_V25_12.fullmatch(name):
        return int(m.group(1)), MigName(int(m.group(3)), int(m.group(4)), profile=m.group(2))
    return None


def _gi_profile_id(gpu: GpuSnapshot, inst: MigInstance) -> int | None:
    model = catalogue.by_device_id(gpu.info.pci_device_id)
    prof = model.profile(inst.profile) if model is not None else None
    return None if prof is None or prof.gi_profile_id < 0 else prof.gi_profile_id


def _instance_at(gpu: GpuSnapshot, mig: MigName, *, profile: str = "") -> MigInstance | None:
    """The GPU instance NVML reports at the name's placement, when its profile is the one named
    (by GI profile id, by the name's profile spelling, and by the slice's ``profile`` when given)."""
    for inst in gpu.instances:
        if inst.placement_start != mig.start or (mig.size is not None and inst.placement_size != mig.size):
            continue
        known = _gi_profile_id(gpu, inst)
        if known is not None and known != mig.gi_profile_id:
            return None  # another profile sits at that placement now: not the claimed device
        if mig.profile is not None and profile_token(inst.profile) != mig.profile:
            return None
        if profile and profile_token(inst.profile) != profile_token(profile):
            return None
        return inst
    return None


def _by_canonical_name(
    snapshot: NodeSnapshot, name: str, *, parent_uuid: str = "", profile: str = ""
) -> tuple[str, str] | None:
    """(UUID, MIG profile or "") of the device a name points at in this snapshot; ``parent_uuid``
    (a DynamicMIG slice's ``parentUUID``) picks the GPU before the name's minor does."""
    parsed = parse_canonical(name)
    if parsed is None:
        return None
    minor, mig = parsed
    for gpu in snapshot.gpus:
        if (gpu.info.uuid != parent_uuid) if parent_uuid else (gpu.info.minor_number != minor):
            continue
        if mig is None:
            return None if gpu.info.mig_enabled else (gpu.info.uuid, "")
        inst = _instance_at(gpu, mig, profile=profile)
        return None if inst is None else (inst.uuid, inst.profile)
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
    out: dict[str, dict[PodRef, None]] = {k: dict.fromkeys(v) for k, v in devices.items()}
    unresolved: list[ClaimDevice] = []
    for cd in claims:
        try:
            found_ref = _resolve_one(cd, snapshot, slices)
        except (ValueError, LookupError, TypeError, AttributeError):  # one odd name: that claim only
            found_ref = None
        if found_ref is None:
            unresolved.append(cd)
            continue
        uuid, ref = found_ref
        out.setdefault(uuid, {})[ref] = None
    return Resolved(MappingProxyType({k: tuple(v) for k, v in out.items()}), tuple(unresolved))


def _resolve_one(
    cd: ClaimDevice, snapshot: NodeSnapshot, slices: SliceIndex | None
) -> tuple[str, PodRef] | None:
    """(UUID, holder) of one claimed device; None when it names nothing on this node."""
    known = slices.get((cd.pool, cd.device)) if slices is not None else None
    if known is not None and not known.uuid:  # DynamicMIG: parent GPU + placement, no MIG UUID
        found = _by_canonical_name(
            snapshot, cd.device, parent_uuid=known.parent_uuid, profile=known.mig_profile
        )
        if found is None:
            return None
        uuid, profile = found
    elif known is not None:
        uuid, profile = known.uuid, known.mig_profile
        if uuid.startswith("MIG-") and not profile:
            inst = _parent_of(snapshot, uuid)
            profile = inst.profile if inst is not None else ""
    else:
        found = _by_canonical_name(snapshot, cd.device)
        if found is None:
            return None
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
            driver_name=cd.driver,
            pool_name=cd.pool,
            device_name=cd.device,
            mig_profile=profile if is_mig else "",
            mig_device_uuid=uuid if is_mig else "",
        ),
    )
    return uuid, ref


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
