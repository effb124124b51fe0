"""MIG devices of one physical GPU: enumeration every collection, identity read once per MIG UUID.

Enumeration (``nvmlDeviceGetMigDeviceHandleByIndex`` over every slot, then the MIG UUID) runs each
collection, so instances created or destroyed under us show up on the next one. What does not
change while an instance lives — GPU/compute instance ids, profile name, placement — is read once per
MIG UUID (a destroyed and re-created instance gets a new UUID, so it is read again). The library
object is injected; this module never imports ``pynvml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporter.nvml.fields import GpuLost, NvmlCalls, text


@dataclass(frozen=True)
class MigIdentity:
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    """``1g.10gb``; from the GPU instance profile, else from the MIG device's name."""
    placement_start: int
    """First memory slice; -1 when the GPU instance could not be read (e.g. NO_PERMISSION)."""
    placement_size: int


@dataclass(frozen=True)
class MigDevice:
    handle: Any
    uuid: str
    identity: MigIdentity


class MigTopology:
    """The MIG devices of the GPU behind ``parent`` (a device handle)."""

    def __init__(self, calls: NvmlCalls, parent: Any) -> None:
        self.calls = calls
        self.parent = parent
        self._identity: dict[str, MigIdentity] = {}
        self._profiles: dict[int, tuple[str, int]] | None = None

    def reset(self) -> None:
        """Forget everything (MIG mode changed, or a handle went stale)."""
        self._identity.clear()
        self._profiles = None

    def devices(self) -> list[MigDevice]:
        lib = self.calls.lib
        found: list[MigDevice] = []
        try:
            for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(self.parent))):
                try:
                    mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(self.parent, slot)
                    uuid = text(lib.nvmlDeviceGetUUID(mig))
                    found.append(MigDevice(mig, uuid, self._identity_of(mig, uuid)))
                except lib.NVMLError as exc:
                    code = getattr(exc, "value", None)
                    if code == lib.NVML_ERROR_GPU_IS_LOST:
                        raise
                    if code not in (lib.NVML_ERROR_NOT_FOUND, lib.NVML_ERROR_INVALID_ARGUMENT):
                        self.calls.errors["mig:enumerate"] += 1
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) == lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"MIG enumeration: {exc}") from exc
            raise
        seen = {d.uuid for d in found}
        self._identity = {u: i for u, i in self._identity.items() if u in seen}
        return found

    def _profile_names(self) -> dict[int, tuple[str, int]]:
        """GPU instance profile id → (name such as ``1g.10gb``, slice count), read once."""
        if self._profiles is None:
            lib = self.calls.lib
            found: dict[int, tuple[str, int]] = {}
            for profile in range(int(lib.NVML_GPU_INSTANCE_PROFILE_COUNT)):
                try:
                    p = lib.nvmlDeviceGetGpuInstanceProfileInfo(self.parent, profile)
                except lib.NVMLError:
                    continue  # a profile this GPU does not offer
                name = text(getattr(p, "name", b"")).removeprefix("MIG ").strip()
                found[int(p.id)] = (name, int(p.sliceCount))
            self._profiles = found
        return self._profiles

    def _identity_of(self, mig: Any, uuid: str) -> MigIdentity:
        known = self._identity.get(uuid)
        if known is not None:
            return known
        lib = self.calls.lib
        gi_id = int(lib.nvmlDeviceGetGpuInstanceId(mig))
        ci_id = int(lib.nvmlDeviceGetComputeInstanceId(mig))
        profile, start, size = "", -1, 0
        try:
            gi_info = lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(self.parent, gi_id))
            profile, slices = self._profile_names().get(int(gi_info.profileId), ("", 0))
            start, size = int(gi_info.placement.start), int(gi_info.placement.size) or slices
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) == lib.NVML_ERROR_GPU_IS_LOST:
                raise
            self.calls.errors["mig:placement"] += 1
        if not profile:
            # "NVIDIA H100 80GB HBM3 MIG 1g.10gb" → "1g.10gb"
            profile = text(lib.nvmlDeviceGetName(mig)).rpartition("MIG ")[2].strip()
        identity = MigIdentity(gi_id, ci_id, profile, start, size)
        self._identity[uuid] = identity
        return identity
