"""Hand-written doubles at the exporter's backend boundary: snapshot builders and a scriptable backend."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType

from exporter.errors import BackendError, BackendUnavailable
from exporter.snapshot import GpuInfo, GpuSnapshot, LostGpu, MigInstance, NodeSnapshot, XidEvent

H100_ID = 0x2330
DRIVER = "550.127.05"

GPU_VALUES = {
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
    "DCGM_FI_DEV_GPU_TEMP": 41.0,
    "DCGM_FI_DEV_POWER_USAGE": 312.5,
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 123456789.0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
}
WHOLE_VALUES = {
    "DCGM_FI_DEV_GPU_UTIL": 87.0,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 30.0,
    "DCGM_FI_DEV_FB_USED": 40000.0,
    "DCGM_FI_DEV_FB_FREE": 41000.0,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.85,
}


def gpu_info(index: int, *, mig: bool = False, uuid: str | None = None) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=uuid or f"GPU-0000000{index}-aaaa-bbbb-cccc-00000000000{index}",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        minor_number=index,
        model_name="NVIDIA H100 80GB HBM3",
        pci_device_id=H100_ID,
        driver_version=DRIVER,
        mig_enabled=mig,
        gpm_supported=True,
        memory_total_mib=81559,
    )


def mig_instance(
    gpu: int, gi: int, *, profile: str = "1g.10gb", start: int = 0, activity: float = 0.25
) -> MigInstance:
    return MigInstance(
        gpu_instance_id=gi,
        compute_instance_id=0,
        profile=profile,
        placement_start=start,
        placement_size=1,
        uuid=f"MIG-{gpu:02d}{gi:02d}0000-1111-2222-3333-444444444444",
        values=MappingProxyType(
            {
                "DCGM_FI_DEV_FB_USED": 5000.0 + gi,
                "DCGM_FI_DEV_FB_FREE": 4800.0 - gi,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": activity,
                "DCGM_FI_PROF_SM_ACTIVE": activity / 2,
            }
        ),
        compute_processes=1,
    )


def whole_gpu(index: int, *, values: Mapping[str, float] | None = None, **kw: object) -> GpuSnapshot:
    merged = {**GPU_VALUES, **WHOLE_VALUES, **(values or {})}
    return GpuSnapshot(info=gpu_info(index), values=MappingProxyType(merged), compute_processes=1, **kw)  # type: ignore[arg-type]


def mig_gpu(index: int, instances: int = 7, *, profile: str = "1g.10gb") -> GpuSnapshot:
    insts = tuple(mig_instance(index, 9 + i, profile=profile, start=i) for i in range(instances))
    return GpuSnapshot(
        info=gpu_info(index, mig=True), values=MappingProxyType(dict(GPU_VALUES)), instances=insts
    )


def node(*gpus: GpuSnapshot, taken_at: float = 1767225600.0, **kw: object) -> NodeSnapshot:
    return NodeSnapshot(taken_at=taken_at, gpus=tuple(gpus), driver_version=DRIVER, **kw)  # type: ignore[arg-type]


def with_xid(gpu: GpuSnapshot, code: int, count: int = 1) -> GpuSnapshot:
    return GpuSnapshot(
        info=gpu.info,
        values=gpu.values,
        instances=gpu.instances,
        xid_counts=MappingProxyType({code: count}),
        last_xid=XidEvent(code=code, timestamp=1767225600.0),
        compute_processes=gpu.compute_processes,
    )


def lost(index: int) -> LostGpu:
    return LostGpu(
        index=index, uuid=gpu_info(index).uuid, pci_bus_id=gpu_info(index).pci_bus_id, reason="gpu_is_lost"
    )


class FakeBackend:
    """A backend whose next answers are scripted.

    ``snapshots`` is served in order (the last one repeats); ``open_failures`` makes the first N
    ``open()`` calls raise BackendUnavailable; ``read_error`` (when set) is raised by ``read``;
    ``hang`` (an Event) makes ``read`` block until it is set.
    """

    name = "fake"

    def __init__(self, *snapshots: NodeSnapshot, open_failures: int = 0) -> None:
        self.snapshots = list(snapshots)
        self.open_failures = open_failures
        self.open_calls = 0
        self.read_calls = 0
        self.close_calls = 0
        self.read_error: BackendError | None = None
        self.hang: threading.Event | None = None
        self.open_hang: threading.Event | None = None
        self.on_read: Callable[[], None] | None = None

    def open(self) -> None:
        self.open_calls += 1
        if self.open_hang is not None:
            self.open_hang.wait()
        if self.open_calls <= self.open_failures:
            raise BackendUnavailable("NVML_ERROR_LIBRARY_NOT_FOUND: libnvidia-ml.so.1 not found")

    def read(self) -> NodeSnapshot:
        self.read_calls += 1
        if self.hang is not None:
            self.hang.wait()
        if self.read_error is not None:
            raise self.read_error
        snap = self.snapshots[0] if len(self.snapshots) == 1 else self.snapshots.pop(0)
        return snap

    def close(self) -> None:
        self.close_calls += 1
