"""What one collection saw: immutable snapshots, the contract between backends and exposition.

A backend (NVML or the simulator) returns a :class:`NodeSnapshot`; turning it into metric families
is a pure function (:mod:`exporter.expose.exposition`). Field values are keyed by DCGM field name
(:mod:`exporter.contract.fields`); a field a device does not support is simply absent, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class GpuInfo:
    """Identity of a physical GPU."""

    index: int
    uuid: str
    pci_bus_id: str
    minor_number: int
    model_name: str
    pci_device_id: int
    """PCI device id (``0x2330`` for H100 SXM 80GB); the key of the MIG geometry catalogue."""
    driver_version: str
    mig_enabled: bool
    gpm_supported: bool
    memory_total_mib: int = 0

    @property
    def device(self) -> str:
        return f"nvidia{self.minor_number}"


@dataclass(frozen=True)
class MigInstance:
    """One MIG device: a GPU instance with its (first) compute instance."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    """Profile name as the driver prints it (``1g.10gb``)."""
    placement_start: int
    placement_size: int
    uuid: str
    """MIG device UUID (``MIG-…``), what the device plugin hands to pods."""
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    """Per-instance fields (``level == "device"``): framebuffer, profiling activity."""
    compute_processes: int | None = None
    """Compute processes running on the instance; the idle signal where GPM is missing (Ampere)."""


@dataclass(frozen=True)
class XidEvent:
    code: int
    timestamp: float


@dataclass(frozen=True)
class ProcessUsage:
    """One compute process on a whole GPU, from NVML's per-process accounting."""

    pid: int
    """In the host PID namespace: only with hostPID (the chart's exporter.processes.enabled) does NVML
    list other pods' processes at all."""
    memory_bytes: float | None = None
    """Framebuffer the process holds (``nvmlDeviceGetComputeRunningProcesses``); None: not reported."""
    sm_util: float | None = None
    """SM utilisation in percent over the last interval (``nvmlDeviceGetProcessUtilization``
    samples, averaged); None: no sample (idle, or a client NVML cannot see, e.g. behind MPS)."""


@dataclass(frozen=True)
class GpuSnapshot:
    info: GpuInfo
    values: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    """GPU-level fields, and on non-MIG GPUs the device-level ones too."""
    instances: tuple[MigInstance, ...] = ()
    xid_counts: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    """Xid events seen since the exporter started, by code (a counter per code)."""
    last_xid: XidEvent | None = None
    compute_processes: int | None = None
    processes: tuple[ProcessUsage, ...] | None = None
    """Per-process accounting of a whole GPU (None: not collected: MIG, or no host PID view)."""
    process_util_visible: bool = True
    """False when NVML gives no per-process utilisation on this GPU (``NOT_SUPPORTED``: MPS on older
    drivers, vGPU); per-pod utilisation is then not published (absent, never 0), memory still is."""


@dataclass(frozen=True)
class LostGpu:
    """A GPU that was enumerated before but is gone now (fell off the bus, NVML_ERROR_GPU_IS_LOST)."""

    index: int
    uuid: str
    pci_bus_id: str
    reason: str


@dataclass(frozen=True)
class NodeSnapshot:
    taken_at: float
    """Wall-clock time (Unix seconds) the collection finished."""
    gpus: tuple[GpuSnapshot, ...]
    lost: tuple[LostGpu, ...] = ()
    field_errors: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """Errors during this collection by kind (``field:DCGM_FI_DEV_POWER_USAGE``, ``gpm``, ``xid``…)."""
    driver_version: str = ""
    processes_visible: bool | None = None
    """Whether process counts cover every container on the node (host PID namespace). False: no
    process counts are published (absent = unknown, never 0); None: the backend does not say."""
    processes_visibility_reason: str = ""


@dataclass(frozen=True)
class DraDevice:
    """How a container got a device through Dynamic Resource Allocation: dcgm-exporter's ``dra_*`` labels."""

    claim_name: str
    claim_namespace: str
    pool_name: str
    device_name: str
    """The driver's device name in the pool (``gpu-0``, ``gpu-0-mig-1g10gb-19-0``, ``gpu-0-mig-19-0-1``)."""
    mig_profile: str = ""
    """MIG profile (``1g.10gb``) when the device is a MIG instance; empty for a whole GPU."""
    mig_device_uuid: str = ""
    """MIG device UUID when the device is a MIG instance (it changes with each claim on dynamic MIG)."""
    driver_name: str = "gpu.nvidia.com"
    """The DRA driver that allocated the device (dcgm-exporter's ``dra_driver_name``)."""


@dataclass(frozen=True)
class PodRef:
    """A container that holds a device, from kubelet's pod-resources API."""

    namespace: str
    pod: str
    container: str
    resource: str = "nvidia.com/gpu"
    """Device-plugin resource name; the DRA driver name (``gpu.nvidia.com``) for a claimed device."""
    dra: DraDevice | None = None
    """Set when the device came from a ResourceClaim (``dynamic_resources``), not a device plugin."""
    replica: str = ""
    """The sharing replica the device plugin handed out (``N`` of a ``GPU-…::N`` device id: time-slicing
    or MPS), "" for an unshared device; dcgm-exporter's ``vgpu`` label with ``KUBERNETES_VIRTUAL_GPUS``."""
    pod_uid: str = ""
    """The pod's UID where known (from a process's cgroup path; the kubelet's ``List`` does not say)."""


@dataclass(frozen=True)
class DeviceShares:
    """Each container's own part of one shared whole GPU, from per-process accounting
    (:mod:`exporter.attribute.sharing`): keys are (namespace, pod, container)."""

    utilisation: Mapping[tuple[str, str, str], float] | None
    """SM utilisation ratio (0-1) per container; None where NVML cannot tell it per process."""
    memory_bytes: Mapping[tuple[str, str, str], float]
    pod_uids: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    """The pod UID of each container with a process (from its cgroup path)."""


Allocations = Mapping[str, tuple[PodRef, ...]]
"""Device id (GPU UUID or MIG UUID, sharing suffix stripped) → the containers holding it."""
