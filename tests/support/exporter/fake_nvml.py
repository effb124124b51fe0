"""A hand-written fake of the nvidia-ml-py (``pynvml``) library, for the NVML backend's tests.

Plain classes; functions with the real names and parameters; ``NVMLError`` with the real codes
(``test_nvml_api`` checks both against the installed nvidia-ml-py). Devices are configurable:
``h100_mig()`` (MIG 3g.40gb + 4×1g.10gb, GPM), ``a100_mig()`` (MIG, no GPM), ``l4()`` (no MIG, no
GPM). ``FakeNvml.clock``/``sleep`` are a fake monotonic clock; GPM metrics need samples ≥100 ms
apart on it, as the real library does. ``calls`` counts every call by function name.

Driver behaviour the exporter must survive, each a constructor switch of :class:`FakeNvml`:

* ``admin=False`` — the caller lacks CAP_SYS_ADMIN: in MIG mode the parent GPU's memory info and the
  GPU instance lookups answer ``NO_PERMISSION`` (what the driver does for a non-admin caller);
* ``gpm_admin_only=True`` (with ``admin=False``) — GPM samples of MIG instances answer
  ``NO_PERMISSION`` too (the driver may refuse GPM to non-admin callers);
* ``host_pid=False`` — the caller is in its own PID namespace: process lists drop every process
  of other containers (all of them, here: the exporter itself runs no CUDA);
* ``process_api=2`` — a driver without ``nvmlDeviceGetComputeRunningProcesses_v3``: nvidia-ml-py's
  unversioned call raises ``NVMLLibraryMismatchError`` (not an ``NVMLError``); ``_v2`` works;
* NaN GPM values: put ``float("nan")`` in a device's ``gpm`` dict;
* several compute instances per GPU instance: :func:`add_compute_instance`;
* ``FakeGpu.gpm_whole_in_mig=False`` — whole-GPU GPM samples answer ``NOT_SUPPORTED`` while MIG
  is enabled (some drivers), and work again once MIG is disabled.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

# Real values from nvml.h / nvidia-ml-py.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
NVML_NVLINK_MAX_LINKS = 36
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
nvmlMemory_v2 = 0x02000028
nvmlEventTypeXidCriticalError = 0x0000000000000008
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_AGGREGATE_ECC = 1
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PERF_POLICY_SYNC_BOOST = 2
NVML_PERF_POLICY_BOARD_LIMIT = 3
NVML_PERF_POLICY_LOW_UTILIZATION = 4
NVML_PERF_POLICY_RELIABILITY = 5
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_FEATURE_ENABLED = 1
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59

MIB = 1024 * 1024

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLLibraryMismatchError(Exception):
    """nvidia-ml-py's own class: raised by unversioned wrappers when the versioned symbol is missing."""


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


# -- devices ---------------------------------------------------------------------------------


@dataclass
class FakeMig:
    gi_id: int
    ci_id: int
    uuid: str
    profile_id: int
    profile: str
    start: int
    size: int
    mem_total_mib: int
    mem_used_mib: int = 0
    processes: int = 0
    gpm: dict[int, float] = field(default_factory=dict)
    vanish_on: str = ""
    """Function name whose call destroys this instance (a reconfiguration mid-read)."""
    parent: FakeGpu | None = None
    destroyed: bool = False


@dataclass
class FakeGpu:
    uuid: str
    name: str
    bus_id: str
    pci_device_id: int
    minor: int
    mem_total_mib: int
    mem_used_mib: int = 1024
    mem_reserved_mib: int = 512
    mig_capable: bool = False
    mig_enabled: bool = False
    gpm: bool = False
    temp: int = 40
    mem_temp: int | None = 45
    power_mw: int = 250_000
    energy_mj: int = 9_000_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    replay: int = 0
    util: tuple[int, int] = (37, 12)
    enc: int = 0
    dec: int = 0
    ecc: tuple[int, int] | None = (0, 0)
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    nvlink: list[int] | None = None
    nvlink_kibps: int = 0
    """KiB/s each NVLink counter grows by with the fake clock (NVML's counters are cumulative)."""
    pcie_kbps: tuple[int, int] = (1000, 2000)
    gpm_metrics: dict[int, float] = field(default_factory=dict)
    gpm_whole_in_mig: bool = True
    processes: int = 0
    profiles: dict[int, tuple[int, str, int]] = field(default_factory=dict)
    migs: list[FakeMig] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    """Function name → NVML error code that call raises on this GPU."""
    lost: bool = False
    violations_ns: tuple[int, ...] | None = (5_000_000, 0, 0, 0, 7_000_000_000, 0)
    """Throttled ns per NVML_PERF_POLICY_* (power, thermal, sync boost, board, low util, reliability)."""
    ecc_aggregate: tuple[int, int] | None = (12, 0)
    retired_pages: tuple[int, int] | None = None
    """(single-bit, double-bit) retired pages; None = row remapping GPU (Ampere+), NOT_SUPPORTED."""
    retired_pending: bool = False
    nvlink_errors: dict[int, int] = field(default_factory=dict)
    """NVML field id (…_ERROR_COUNT_TOTAL) → count, for GPUs with NVLink."""
    vgpu_licensed: bool | None = None
    """None: not a vGPU (NOT_SUPPORTED)."""
    clock_event_reasons: int = 0x1

    def add_mig(self, mig: FakeMig) -> FakeMig:
        mig.parent = self
        self.migs.append(mig)
        return mig


H100_PROFILES = {
    0: (19, "1g.10gb", 1),
    1: (14, "2g.20gb", 2),
    2: (9, "3g.40gb", 3),
    3: (5, "4g.40gb", 4),
    4: (0, "7g.80gb", 7),
}
A100_PROFILES = {
    0: (19, "1g.5gb", 1),
    1: (14, "2g.10gb", 2),
    2: (9, "3g.20gb", 3),
    3: (5, "4g.20gb", 4),
    4: (0, "7g.40gb", 7),
}
GPM_BUSY = {1: 62.5, 2: 48.0, 3: 30.0, 5: 22.0, 10: 41.0, 11: 2.0, 12: 25.0, 13: 12.5, 20: 100.0, 21: 200.0}


def h100_mig(index: int = 0) -> FakeGpu:
    """H100 80GB HBM3 with MIG 3g.40gb@4 + 4 × 1g.10gb@0..3 and GPM."""
    gpu = FakeGpu(
        uuid=f"GPU-h100-{index:04d}-0000-0000-000000000000",
        name="NVIDIA H100 80GB HBM3",
        bus_id=f"00000000:{0x18 + index:02X}:00.0",
        pci_device_id=0x2330,
        minor=index,
        mem_total_mib=81559,
        mig_capable=True,
        mig_enabled=True,
        gpm=True,
        gpm_metrics=dict(GPM_BUSY),
        nvlink=[1000] * 18,
        nvlink_kibps=500,
        profiles=dict(H100_PROFILES),
    )
    gpu.remapped = None  # NOT_SUPPORTED while MIG instances exist
    gpu.add_mig(
        FakeMig(
            2,
            0,
            f"MIG-h100-{index}-gi2",
            9,
            "3g.40gb",
            4,
            4,
            40192,
            mem_used_mib=30000,
            processes=2,
            gpm={1: 80.0, 2: 70.0, 3: 50.0, 5: 45.0, 10: 60.0},
        )
    )
    for n, start in enumerate((0, 1, 2, 3)):
        busy = n == 0
        gpu.add_mig(
            FakeMig(
                7 + n,
                0,
                f"MIG-h100-{index}-gi{7 + n}",
                19,
                "1g.10gb",
                start,
                1,
                9984,
                mem_used_mib=5000 if busy else 13,
                processes=1 if busy else 0,
                gpm={1: 55.0, 2: 40.0, 3: 20.0, 5: 10.0, 10: 25.0}
                if busy
                else {1: 0.0, 2: 0.0, 3: 0.0, 5: 0.0, 10: 0.0},
            )
        )
    return gpu


def add_compute_instance(gpu: FakeGpu, gi_id: int, ci_id: int, *, processes: int = 0) -> FakeMig:
    """A second (third…) compute instance in GPU instance ``gi_id``: shares its memory and GPM."""
    base = next(m for m in gpu.migs if m.gi_id == gi_id)
    return gpu.add_mig(
        FakeMig(
            gi_id,
            ci_id,
            f"{base.uuid}-ci{ci_id}",
            base.profile_id,
            base.profile,
            base.start,
            base.size,
            base.mem_total_mib,
            mem_used_mib=base.mem_used_mib,
            processes=processes,
            gpm=base.gpm,
        )
    )


def a100_mig(index: int = 0) -> FakeGpu:
    """A100-SXM4-40GB with MIG 3g.20gb@4 + 2g.10gb@0 + 1g.5gb@2 + 1g.5gb@3, no GPM (Ampere)."""
    gpu = FakeGpu(
        uuid=f"GPU-a100-{index:04d}-0000-0000-000000000000",
        name="NVIDIA A100-SXM4-40GB",
        bus_id=f"00000000:{0x07 + index:02X}:00.0",
        pci_device_id=0x20B0,
        minor=index,
        mem_total_mib=40960,
        mig_capable=True,
        mig_enabled=True,
        gpm=False,
        profiles=dict(A100_PROFILES),
        nvlink=[500] * 12,
    )
    gpu.remapped = None
    gpu.add_mig(
        FakeMig(1, 0, f"MIG-a100-{index}-gi1", 9, "3g.20gb", 4, 4, 19968, mem_used_mib=12000, processes=3)
    )
    gpu.add_mig(
        FakeMig(3, 0, f"MIG-a100-{index}-gi3", 14, "2g.10gb", 0, 2, 9856, mem_used_mib=0, processes=0)
    )
    gpu.add_mig(FakeMig(9, 0, f"MIG-a100-{index}-gi9", 19, "1g.5gb", 2, 1, 4864, mem_used_mib=3, processes=0))
    gpu.add_mig(
        FakeMig(10, 0, f"MIG-a100-{index}-gi10", 19, "1g.5gb", 3, 1, 4864, mem_used_mib=2000, processes=1)
    )
    return gpu


def l4(index: int = 0) -> FakeGpu:
    """NVIDIA L4: no MIG, no GPM, no NVLink, no memory temperature sensor."""
    return FakeGpu(
        uuid=f"GPU-l4-{index:04d}-0000-0000-000000000000",
        name="NVIDIA L4",
        bus_id=f"00000000:{0x31 + index:02X}:00.0",
        pci_device_id=0x27B8,
        minor=index,
        mem_total_mib=23034,
        mem_used_mib=6000,
        mem_temp=None,
        power_mw=41_500,
        util=(88, 40),
        enc=5,
        dec=17,
        processes=2,
    )


# -- the library -----------------------------------------------------------------------------


class _Sample:
    def __init__(self) -> None:
        self.entity: str | None = None
        self.taken_at = 0.0
        self.values: dict[int, float] = {}
        self.freed = False


class _MetricArray:
    """Like the real fixed array of NVML_GPM_METRIC_MAX entries, built on first touch (cheap)."""

    def __init__(self) -> None:
        self._items: dict[int, SimpleNamespace] = {}

    def __getitem__(self, i: int) -> SimpleNamespace:
        if not 0 <= i < NVML_GPM_METRIC_MAX:
            raise IndexError(i)
        return self._items.setdefault(i, SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0))


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = _MetricArray()


class _EventSet:
    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.queue: collections.deque[SimpleNamespace] = collections.deque()


class FakeNvml:
    """The fake library: module-level names of ``pynvml`` as attributes and methods."""

    NVMLError = NVMLError
    NVMLLibraryMismatchError = NVMLLibraryMismatchError
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver: str = "570.124.06",
        init_error: int | None = None,
        admin: bool = True,
        gpm_admin_only: bool = False,
        host_pid: bool = True,
        process_api: int = 3,
    ) -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_error = init_error
        self.admin = admin
        self.gpm_admin_only = gpm_admin_only
        self.host_pid = host_pid
        self.process_api = process_api
        self.initialised = False
        self.now = 1000.0
        self.calls: collections.Counter[str] = collections.Counter()
        self.live_samples = 0
        self.event_sets: list[_EventSet] = []
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlMemory_v", "nvmlEventType")):
                setattr(self, name, value)

    # clock
    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds

    # helpers
    def _enter(self, fn: str, handle: Any = None) -> None:
        self.calls[fn] += 1
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if isinstance(handle, FakeMig):
            if handle.vanish_on == fn and not handle.destroyed:
                handle.destroyed = True
                assert handle.parent is not None
                handle.parent.migs.remove(handle)
            if handle.destroyed:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            gpu = handle.parent
        else:
            gpu = handle
        if isinstance(gpu, FakeGpu):
            if gpu.lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            if fn in gpu.fail:
                raise NVMLError(gpu.fail[fn])

    @staticmethod
    def _whole_only(handle: Any) -> FakeGpu:
        if isinstance(handle, FakeMig):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle

    def inject_xid(self, gpu: FakeGpu, code: int) -> None:
        for es in self.event_sets:
            if gpu.uuid in es.registered:
                es.queue.append(
                    SimpleNamespace(
                        device=gpu,
                        eventType=nvmlEventTypeXidCriticalError,
                        eventData=code,
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
                )

    # init
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        gpu = self.gpus[index]
        self._enter("nvmlDeviceGetHandleByIndex", gpu)
        return gpu

    # identity
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetName", handle)
        if isinstance(handle, FakeMig):
            assert handle.parent is not None
            return f"{handle.parent.name} MIG {handle.profile}"
        return handle.name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        gpu = self._whole_only(handle)
        self._enter("nvmlDeviceGetPciInfo", gpu)
        return SimpleNamespace(busId=gpu.bus_id.encode(), pciDeviceId=(gpu.pci_device_id << 16) | 0x10DE)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        return self._whole_only(handle).minor

    def _admin_only(self, gpu: FakeGpu) -> None:
        if not self.admin and gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(handle, FakeGpu):
            self._admin_only(handle)  # the MIG parent's memory needs CAP_SYS_ADMIN
        if isinstance(handle, FakeMig):
            total, used, reserved = handle.mem_total_mib, handle.mem_used_mib, 0
        else:
            total, used, reserved = handle.mem_total_mib, handle.mem_used_mib, handle.mem_reserved_mib
        if version:
            return SimpleNamespace(
                total=total * MIB,
                reserved=reserved * MIB,
                used=used * MIB,
                free=(total - used - reserved) * MIB,
            )
        return SimpleNamespace(
            total=total * MIB, used=(used + reserved) * MIB, free=(total - used - reserved) * MIB
        )

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        if self.process_api < 3:
            raise NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version."
            )
        return self._processes(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses_v2", handle)
        return self._processes(handle)

    def _processes(self, handle: Any) -> list[SimpleNamespace]:
        # Other containers' processes are invisible from another PID namespace.
        count = handle.processes if self.host_pid else 0
        return [SimpleNamespace(pid=1000 + i, usedGpuMemory=MIB) for i in range(count)]

    # GPU-level fields
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle)
        gpu = self._whole_only(handle)
        return gpu.sm_clock if type == NVML_CLOCK_SM else gpu.mem_clock

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        return self._whole_only(handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return self._whole_only(handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return self._whole_only(handle).energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", handle)
        return self._whole_only(handle).replay

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", device)
        gpu = self._whole_only(device)
        if gpu.remapped is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", handle)
        gpu = self._whole_only(handle)
        counts = gpu.ecc if counterType == NVML_VOLATILE_ECC else gpu.ecc_aggregate
        if counts is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return counts[errorType]

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetFieldValues", handle)
        gpu = self._whole_only(handle)
        out = []
        for requested in fieldIds:
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            fv = SimpleNamespace(
                fieldId=fid,
                scopeId=scope,
                nvmlReturn=NVML_ERROR_NOT_SUPPORTED,
                valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                value=SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0),
            )
            if fid == NVML_FI_DEV_MEMORY_TEMP and gpu.mem_temp is not None:
                fv.nvmlReturn, fv.valueType = NVML_SUCCESS, NVML_VALUE_TYPE_UNSIGNED_INT
                fv.value.uiVal = gpu.mem_temp
            elif (
                fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
                and gpu.nvlink is not None
                and scope < len(gpu.nvlink)
            ):
                fv.nvmlReturn = NVML_SUCCESS
                fv.value.ullVal = gpu.nvlink[scope] + int(gpu.nvlink_kibps * self.now)
            elif fid in gpu.nvlink_errors and gpu.nvlink is not None:
                fv.nvmlReturn = NVML_SUCCESS
                fv.value.ullVal = gpu.nvlink_errors[fid]
            out.append(fv)
        return out

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", device)
        return self._whole_only(device).pcie_kbps[counter]

    # whole-GPU only
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        gpu = self._whole_only(handle)
        if gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu.util[0], memory=gpu.util[1])

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetEncoderUtilization", handle)
        return [self._whole_only(handle).enc, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetDecoderUtilization", handle)
        return [self._whole_only(handle).dec, 167000]

    # MIG
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", device)
        gpu = self._whole_only(device)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7 if self._whole_only(device).mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> FakeMig:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        gpu = self._whole_only(device)
        if index >= len(gpu.migs):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return gpu.migs[index]

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", device)
        if not isinstance(device, FakeMig):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return device.gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", device)
        if not isinstance(device, FakeMig):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return device.ci_id

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", device)
        gpu = self._whole_only(device)
        if profile not in gpu.profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        pid, name, slices = gpu.profiles[profile]
        return SimpleNamespace(id=pid, sliceCount=slices, name=f"MIG {name}".encode())

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> FakeMig:
        self._enter("nvmlDeviceGetGpuInstanceById", device)
        self._admin_only(self._whole_only(device))
        for mig in self._whole_only(device).migs:
            if mig.gi_id == gpuInstanceId:
                return mig
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: FakeMig) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetInfo", gpuInstance)
        return SimpleNamespace(
            id=gpuInstance.gi_id,
            profileId=gpuInstance.profile_id,
            placement=SimpleNamespace(start=gpuInstance.start, size=gpuInstance.size),
        )

    # events
    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")
        es = _EventSet()
        self.event_sets.append(es)
        return es

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: _EventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        eventSet.registered.add(handle.uuid)

    def nvmlEventSetWait(self, eventSet: _EventSet, timeoutms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait")
        if not eventSet.queue:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return eventSet.queue.popleft()

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")
        self.event_sets.remove(eventSet)

    # GPM
    def nvmlGpmQueryDeviceSupport(self, device: Any) -> SimpleNamespace:
        self._enter("nvmlGpmQueryDeviceSupport", device)
        return SimpleNamespace(version=1, isSupportedDevice=int(self._whole_only(device).gpm))

    def nvmlGpmSampleAlloc(self) -> _Sample:
        self._enter("nvmlGpmSampleAlloc")
        self.live_samples += 1
        return _Sample()

    def nvmlGpmSampleFree(self, gpmSample: _Sample) -> None:
        self._enter("nvmlGpmSampleFree")
        assert not gpmSample.freed, "GPM sample freed twice"
        gpmSample.freed = True
        self.live_samples -= 1

    def nvmlGpmSampleGet(self, device: Any, gpmSample: _Sample) -> _Sample:
        self._enter("nvmlGpmSampleGet", device)
        gpu = self._whole_only(device)
        if not gpu.gpm or (gpu.mig_enabled and not gpu.gpm_whole_in_mig):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpmSample.entity, gpmSample.taken_at, gpmSample.values = gpu.uuid, self.now, dict(gpu.gpm_metrics)
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: _Sample) -> _Sample:
        self._enter("nvmlGpmMigSampleGet", device)
        gpu = self._whole_only(device)
        if self.gpm_admin_only:
            self._admin_only(gpu)
        if not gpu.gpm:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        for mig in gpu.migs:
            if mig.gi_id == gpuInstanceId:
                gpmSample.entity, gpmSample.taken_at, gpmSample.values = mig.uuid, self.now, dict(mig.gpm)
                return gpmSample
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmMetricsGet(self, metricsGet: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        self._enter("nvmlGpmMetricsGet")
        s1, s2 = metricsGet.sample1, metricsGet.sample2
        if (
            metricsGet.version != NVML_GPM_METRICS_GET_VERSION
            or s1.entity != s2.entity
            or s1.freed
            or s2.freed
        ):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if s2.taken_at - s1.taken_at <= 0.1:  # nvml.h: samples more than 100 ms apart
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            m = metricsGet.metrics[i]
            if m.metricId in s2.values:
                m.nvmlReturn, m.value = NVML_SUCCESS, s2.values[m.metricId]
            else:
                m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # opt-in GPU-level fields
    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetViolationStatus", device)
        gpu = self._whole_only(device)
        if gpu.violations_ns is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(referenceTime=0, violationTime=gpu.violations_ns[perfPolicyType])

    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        self._enter("nvmlDeviceGetRetiredPages", device)
        gpu = self._whole_only(device)
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [0x1000 * i for i in range(gpu.retired_pages[sourceFilter])]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: Any) -> int:
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus", device)
        gpu = self._whole_only(device)
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if gpu.retired_pending else 0

    def nvmlDeviceGetGridLicensableFeatures(self, handle: Any) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGridLicensableFeatures", handle)
        gpu = self._whole_only(handle)
        if gpu.vgpu_licensed is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        feature = SimpleNamespace(featureCode=1, featureState=int(gpu.vgpu_licensed))
        return SimpleNamespace(
            isGridLicenseSupported=1, licensableFeaturesCount=1, gridLicensableFeatures=[feature]
        )

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return self._whole_only(handle).clock_event_reasons
