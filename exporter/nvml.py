"""The NVML backend: GPUs, MIG instances, GPM activity and Xid events through nvidia-ml-py.

The only module that imports ``pynvml`` (an import-linter contract says so). Everything else gets
the library as an object, so the tests drive the same code with a fake NVML library.

One :meth:`NvmlBackend.read` is one collection:

* static identity (UUID, PCI, name, memory total, GPM support) is read once in :meth:`open`;
* MIG mode and the MIG devices are enumerated every cycle (cheap), so instances created or
  destroyed under us show up on the next cycle; a stale MIG handle drops that instance for the
  cycle and forces fresh identity reads on the next;
* a GPU answering ``NVML_ERROR_GPU_IS_LOST`` moves to ``snapshot.lost``; the others keep flowing;
* Xid events are drained from an NVML event set with a zero timeout.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pynvml

from exporter import nvml_fields
from exporter.errors import BackendError, BackendUnavailable
from exporter.nvml_fields import MIB, GpuLost, NvmlCalls, StaleHandle
from exporter.nvml_gpm import GpmSampler
from exporter.snapshot import GpuInfo, GpuSnapshot, LostGpu, MigInstance, NodeSnapshot, XidEvent

MAX_XID_EVENTS_PER_CYCLE = 1024


def _text(value: Any) -> str:
    """nvidia-ml-py returns ``str`` for most strings but ``bytes`` inside structures."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@dataclass
class _MigIdentity:
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    placement_start: int
    placement_size: int


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: GpuInfo
    mig_identity: dict[str, _MigIdentity] = field(default_factory=dict)
    profiles: dict[int, tuple[str, int]] | None = None
    xid_counts: Counter[int] = field(default_factory=Counter)
    last_xid: XidEvent | None = None


class NvmlBackend:
    """:class:`exporter.backend.Backend` over NVML. ``library`` defaults to the real ``pynvml``."""

    name = "nvml"

    def __init__(
        self,
        *,
        library: Any = None,
        gpm_min_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.lib: Any = pynvml if library is None else library
        self._gpm_min_interval_s = gpm_min_interval_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._calls = NvmlCalls(self.lib)
        self._gpm = GpmSampler(self._calls, min_interval_s=gpm_min_interval_s, clock=clock)
        self._gpus: list[_Gpu] = []
        self._lost_at_open: list[LostGpu] = []
        self._events: Any = None
        self._driver = ""
        self._open = False
        self._first_read = False

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        lib = self.lib
        try:
            lib.nvmlInit()
        except Exception as exc:  # NVMLError, or OSError from loading libnvidia-ml.so
            raise BackendUnavailable(
                f"NVML init failed: {_one_line(exc)}; is the NVIDIA driver installed and are "
                "/dev/nvidia* and libnvidia-ml.so visible to this process?"
            ) from exc
        self._open = True
        self._calls = NvmlCalls(lib)
        self._gpm = GpmSampler(self._calls, min_interval_s=self._gpm_min_interval_s, clock=self._clock)
        try:
            self._driver = _text(lib.nvmlSystemGetDriverVersion())
            count = int(lib.nvmlDeviceGetCount())
        except lib.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"NVML could not list GPUs: {_one_line(exc)}") from exc
        self._gpus, self._lost_at_open = [], []
        for index in range(count):
            try:
                self._gpus.append(self._enumerate(index))
            except lib.NVMLError as exc:
                self._lost_at_open.append(LostGpu(index, "", "", f"enumeration failed: {_one_line(exc)}"))
        self._register_xid_events()
        self._prime_gpm()
        self._first_read = True

    def close(self) -> None:
        lib = self.lib
        self._gpm.close()
        if self._events is not None:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlEventSetFree(self._events)
            self._events = None
        if self._open:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlShutdown()
        self._open = False
        self._gpus = []

    # -- enumeration -------------------------------------------------------------------------

    def _enumerate(self, index: int) -> _Gpu:
        lib = self.lib
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        pci = lib.nvmlDeviceGetPciInfo(handle)
        memory = lib.nvmlDeviceGetMemoryInfo(handle)
        try:
            minor = int(lib.nvmlDeviceGetMinorNumber(handle))
        except lib.NVMLError:
            minor = index
        info = GpuInfo(
            index=index,
            uuid=_text(lib.nvmlDeviceGetUUID(handle)),
            pci_bus_id=_text(pci.busId),
            minor_number=minor,
            model_name=_text(lib.nvmlDeviceGetName(handle)),
            pci_device_id=(int(pci.pciDeviceId) >> 16) & 0xFFFF,
            driver_version=self._driver,
            mig_enabled=self._mig_mode(handle),
            gpm_supported=self._gpm.supported(handle),
            memory_total_mib=int(memory.total) // MIB,
        )
        return _Gpu(index=index, handle=handle, info=info)

    def _mig_mode(self, handle: Any) -> bool:
        lib = self.lib
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) == lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"nvmlDeviceGetMigMode: {exc}") from exc
            return False  # NOT_SUPPORTED: a GPU without MIG
        return bool(current == lib.NVML_DEVICE_MIG_ENABLE)

    def _profiles(self, gpu: _Gpu) -> dict[int, tuple[str, int]]:
        """GPU instance profile id → (name such as ``1g.10gb``, slice count), read once per GPU."""
        if gpu.profiles is None:
            lib = self.lib
            found: dict[int, tuple[str, int]] = {}
            for profile in range(int(lib.NVML_GPU_INSTANCE_PROFILE_COUNT)):
                try:
                    p = lib.nvmlDeviceGetGpuInstanceProfileInfo(gpu.handle, profile)
                except lib.NVMLError:
                    continue
                name = _text(getattr(p, "name", b"")).removeprefix("MIG ").strip()
                found[int(p.id)] = (name, int(p.sliceCount))
            gpu.profiles = found
        return gpu.profiles

    def _mig_identity(self, gpu: _Gpu, mig: Any, uuid: str) -> _MigIdentity:
        lib = self.lib
        known = gpu.mig_identity.get(uuid)
        if known is not None:
            return known
        gi_id = int(lib.nvmlDeviceGetGpuInstanceId(mig))
        ci_id = int(lib.nvmlDeviceGetComputeInstanceId(mig))
        profile, start, size = "", -1, 0
        try:
            gi_info = lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(gpu.handle, gi_id))
            name, slices = self._profiles(gpu).get(int(gi_info.profileId), ("", 0))
            profile = name
            start, size = int(gi_info.placement.start), int(gi_info.placement.size) or slices
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) == lib.NVML_ERROR_GPU_IS_LOST:
                raise
            self._calls.errors["mig:placement"] += 1  # e.g. NO_PERMISSION without root
        if not profile:
            # "NVIDIA H100 80GB HBM3 MIG 1g.10gb" → "1g.10gb"
            profile = _text(lib.nvmlDeviceGetName(mig)).rpartition("MIG ")[2].strip()
        identity = _MigIdentity(gi_id, ci_id, profile, start, size)
        gpu.mig_identity[uuid] = identity
        return identity

    def _mig_devices(self, gpu: _Gpu) -> list[tuple[Any, str, _MigIdentity]]:
        lib = self.lib
        found: list[tuple[Any, str, _MigIdentity]] = []
        for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, slot)
                uuid = _text(lib.nvmlDeviceGetUUID(mig))
                found.append((mig, uuid, self._mig_identity(gpu, mig, uuid)))
            except lib.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == lib.NVML_ERROR_GPU_IS_LOST:
                    raise
                if code not in (lib.NVML_ERROR_NOT_FOUND, lib.NVML_ERROR_INVALID_ARGUMENT):
                    self._calls.errors["mig:enumerate"] += 1
        seen = {uuid for _, uuid, _ in found}
        gpu.mig_identity = {u: i for u, i in gpu.mig_identity.items() if u in seen}
        return found

    # -- events ------------------------------------------------------------------------------

    def _register_xid_events(self) -> None:
        lib = self.lib
        try:
            self._events = lib.nvmlEventSetCreate()
        except lib.NVMLError:
            self._events = None
            return
        for gpu in self._gpus:
            try:
                lib.nvmlDeviceRegisterEvents(gpu.handle, lib.nvmlEventTypeXidCriticalError, self._events)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) != lib.NVML_ERROR_NOT_SUPPORTED:
                    self._calls.errors["xid"] += 1

    def _drain_xid_events(self) -> None:
        lib = self.lib
        if self._events is None:
            return
        by_uuid = {g.info.uuid: g for g in self._gpus}
        for _ in range(MAX_XID_EVENTS_PER_CYCLE):
            try:
                data = lib.nvmlEventSetWait(self._events, 0)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) != lib.NVML_ERROR_TIMEOUT:
                    self._calls.errors["xid"] += 1
                return
            if not int(data.eventType) & int(lib.nvmlEventTypeXidCriticalError):
                continue
            try:
                gpu = by_uuid.get(_text(lib.nvmlDeviceGetUUID(data.device)))
            except lib.NVMLError:
                gpu = None
            if gpu is None:
                self._calls.errors["xid"] += 1
                continue
            code = int(data.eventData)
            gpu.xid_counts[code] += 1
            gpu.last_xid = XidEvent(code=code, timestamp=self._wall_clock())

    # -- GPM ---------------------------------------------------------------------------------

    def _prime_gpm(self) -> None:
        """First GPM samples at open, so the first read (``--once``) already has activity."""
        for gpu in self._gpus:
            if not gpu.info.gpm_supported:
                continue
            try:
                self._gpm_whole(gpu)
                if self._mig_mode(gpu.handle):
                    for _mig, uuid, ident in self._mig_devices(gpu):
                        self._gpm_instance(gpu, uuid, ident)
            except (GpuLost, StaleHandle, self.lib.NVMLError):
                continue  # read() reports it

    def _gpm_whole(self, gpu: _Gpu) -> dict[str, float] | None:
        lib = self.lib
        return self._gpm.collect(
            gpu.info.uuid, lambda s: lib.nvmlGpmSampleGet(gpu.handle, s), with_rates=True
        )

    def _gpm_instance(self, gpu: _Gpu, uuid: str, ident: _MigIdentity) -> dict[str, float] | None:
        lib = self.lib
        return self._gpm.collect(
            uuid,
            lambda s: lib.nvmlGpmMigSampleGet(gpu.handle, ident.gpu_instance_id, s),
            with_rates=False,
        )

    # -- collection --------------------------------------------------------------------------

    def read(self) -> NodeSnapshot:
        if not self._open:
            raise BackendError("NVML backend is not open")
        if self._first_read:
            # Right after open(): GPM needs its two samples ≥100 ms apart, so --once has activity.
            self._first_read = False
            age = self._gpm.oldest_age()
            if age is not None and age < self._gpm_min_interval_s:
                self._sleep(self._gpm_min_interval_s - age)
        self._calls.errors.clear()
        self._drain_xid_events()
        gpus: list[GpuSnapshot] = []
        lost = list(self._lost_at_open)
        live_entities: set[str] = set()
        for gpu in self._gpus:
            try:
                snap = self._read_gpu(gpu)
            except GpuLost as exc:
                lost.append(LostGpu(gpu.index, gpu.info.uuid, gpu.info.pci_bus_id, f"GPU is lost ({exc})"))
                continue
            except self.lib.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == self.lib.NVML_ERROR_GPU_IS_LOST:
                    lost.append(
                        LostGpu(gpu.index, gpu.info.uuid, gpu.info.pci_bus_id, f"GPU is lost ({exc})")
                    )
                    continue
                if code in (self.lib.NVML_ERROR_UNINITIALIZED, self.lib.NVML_ERROR_DRIVER_NOT_LOADED):
                    raise BackendError(f"NVML stopped answering: {_one_line(exc)}") from exc
                self._calls.errors[f"gpu:{gpu.index}"] += 1
                continue
            gpus.append(snap)
            live_entities.add(gpu.info.uuid)
            live_entities.update(i.uuid for i in snap.instances)
        self._gpm.keep_only(live_entities)
        if not gpus and self._gpus and not lost:
            raise BackendError("NVML: no GPU could be read this cycle")
        return NodeSnapshot(
            taken_at=self._wall_clock(),
            gpus=tuple(gpus),
            lost=tuple(lost),
            field_errors=MappingProxyType(dict(self._calls.errors)),
            driver_version=self._driver,
        )

    def _read_gpu(self, gpu: _Gpu) -> GpuSnapshot:
        calls, key, handle = self._calls, gpu.info.uuid, gpu.handle
        mig_enabled = self._mig_mode(handle)
        if mig_enabled != gpu.info.mig_enabled:
            gpu.info = replace(gpu.info, mig_enabled=mig_enabled)
            gpu.mig_identity.clear()
            gpu.profiles = None
            calls.forget(key)
        values: dict[str, float] = {}
        nvml_fields.read_gpu_level(calls, key, handle, values)
        gpm_values = self._gpm_whole(gpu) if gpu.info.gpm_supported else None
        if gpm_values:
            values.update({k: v for k, v in gpm_values.items() if not mig_enabled or "PCIE" in k})
        if "DCGM_FI_PROF_PCIE_TX_BYTES" not in values:
            nvml_fields.read_pcie_throughput(calls, key, handle, values)
        processes: int | None = None
        instances: tuple[MigInstance, ...] = ()
        if mig_enabled:
            instances = self._read_instances(gpu)
        else:
            nvml_fields.read_whole_gpu(calls, key, handle, values)
            processes = nvml_fields.read_device(calls, key, handle, values)
        return GpuSnapshot(
            info=gpu.info,
            values=MappingProxyType(values),
            instances=instances,
            xid_counts=MappingProxyType(dict(gpu.xid_counts)),
            last_xid=gpu.last_xid,
            compute_processes=processes,
        )

    def _read_instances(self, gpu: _Gpu) -> tuple[MigInstance, ...]:
        out: list[MigInstance] = []
        for mig, uuid, ident in self._mig_devices(gpu):
            values: dict[str, float] = {}
            try:
                processes = nvml_fields.read_device(self._calls, uuid, mig, values, mig=True)
                if gpu.info.gpm_supported:
                    values.update(self._gpm_instance(gpu, uuid, ident) or {})
            except StaleHandle:
                # Destroyed between enumeration and read: drop it now, re-identify all next cycle.
                self._calls.errors["mig:reconfigured"] += 1
                gpu.mig_identity.clear()
                continue
            out.append(
                MigInstance(
                    gpu_instance_id=ident.gpu_instance_id,
                    compute_instance_id=ident.compute_instance_id,
                    profile=ident.profile,
                    placement_start=ident.placement_start,
                    placement_size=ident.placement_size,
                    uuid=uuid,
                    values=MappingProxyType(values),
                    compute_processes=processes,
                )
            )
        out.sort(key=lambda i: (i.placement_start, i.gpu_instance_id))
        return tuple(out)
