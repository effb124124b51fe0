"""NVML calls and the DCGM fields they feed, for one collection.

This module never imports ``pynvml``: the library object is handed in (the real module, or the
fake NVML of the tests). :class:`NvmlCalls` is the one place that interprets NVML return codes:

* ``NOT_SUPPORTED`` / ``FUNCTION_NOT_FOUND`` → the field is absent, and the call is remembered as
  unsupported for that device so it is not retried every cycle;
* ``GPU_IS_LOST`` → :class:`GpuLost` (the whole GPU leaves the snapshot);
* ``INVALID_ARGUMENT`` / ``NOT_FOUND`` on a MIG handle → :class:`StaleHandle` (re-enumerate);
* ``NO_PERMISSION`` → the field is absent, counted as ``no_permission:<call>`` (the exporter lacks
  CAP_SYS_ADMIN; see deploy/exporter) and remembered like "not supported": it will not change;
* ``NVMLLibraryMismatchError`` (nvidia-ml-py calls a versioned function, such as the ``_v3`` process
  list, that this driver lacks; it is not an ``NVMLError``) → like "not supported", counted as
  ``library_mismatch:<call>``;
* anything else → the field is absent and counted as ``field:<DCGM name>``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

MIB = 1024 * 1024

NvmlLib = Any
"""The ``pynvml`` module, or an object with the same functions and constants."""


def text(value: Any) -> str:
    """nvidia-ml-py returns ``str`` for most strings but ``bytes`` inside structures."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


class GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus."""


class StaleHandle(Exception):
    """A MIG handle no longer names an instance: MIG was reconfigured under us."""


def mismatch_error(lib: NvmlLib) -> type[BaseException] | tuple[()]:
    """nvidia-ml-py's ``NVMLLibraryMismatchError`` (a plain ``Exception``), or ``()`` when absent."""
    found = getattr(lib, "NVMLLibraryMismatchError", None)
    return found if isinstance(found, type) and issubclass(found, BaseException) else ()


class NvmlCalls:
    """Calls NVML for one backend, classifying errors and caching "not supported" per device."""

    def __init__(self, lib: NvmlLib, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.lib = lib
        self.clock = clock
        self.counters: dict[tuple[str, str], tuple[float, float]] = {}
        """(device, field) → (cumulative value, clock) of the last read, for fields DCGM publishes
        as a rate of an NVML counter (NVLink bandwidth)."""
        self.unsupported: set[tuple[str, str]] = set()
        self.errors: Counter[str] = Counter()
        self.mismatch = mismatch_error(lib)
        self.mismatched: set[tuple[str, str]] = set()
        """(device, call) that raised NVMLLibraryMismatchError: a versioned fallback may exist."""

    def forget(self, device_key: str) -> None:
        """Drop the "not supported" memory of one device (its MIG mode changed)."""
        self.unsupported = {k for k in self.unsupported if k[0] != device_key}

    def call(
        self,
        device_key: str,
        call_name: str,
        error_kinds: Sequence[str],
        fn: Callable[..., Any],
        *args: Any,
        stale_on_missing: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``fn(*args)``, or ``None`` when unsupported or failed (counted under ``error_kinds``)."""
        if (device_key, call_name) in self.unsupported:
            return None
        lib = self.lib
        try:
            return fn(*args, **kwargs)
        except self.mismatch:
            self.unsupported.add((device_key, call_name))
            self.mismatched.add((device_key, call_name))
            self.errors[f"library_mismatch:{call_name}"] += 1
            return None
        except lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND):
                self.unsupported.add((device_key, call_name))
                return None
            if code == lib.NVML_ERROR_NO_PERMISSION:
                self.unsupported.add((device_key, call_name))
                self.errors[f"no_permission:{call_name}"] += 1
                return None
            if code == lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"{call_name}: {exc}") from exc
            if stale_on_missing and code in (lib.NVML_ERROR_INVALID_ARGUMENT, lib.NVML_ERROR_NOT_FOUND):
                raise StaleHandle(f"{call_name}: {exc}") from exc
            for kind in error_kinds:
                self.errors[kind] += 1
            return None


def _kinds(*names: str) -> tuple[str, ...]:
    return tuple(f"field:{n}" for n in names)


def _field_value(lib: NvmlLib, fv: Any) -> float | None:
    """One ``nvmlFieldValue_t`` → a number, or None when its own return code is not success."""
    if fv.nvmlReturn != lib.NVML_SUCCESS:
        return None
    vt = fv.valueType
    v = fv.value
    if vt == lib.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vt == lib.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.uiVal)
    if vt == lib.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.ulVal)
    if vt == lib.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(v.ullVal)
    if vt == lib.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    if vt == lib.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.siVal)
    return None


def read_gpu_level(calls: NvmlCalls, key: str, handle: Any, out: dict[str, float]) -> None:
    """Fields published once per physical GPU (``level == "gpu"``), except GPM's PCIe rates."""
    lib = calls.lib
    c = calls.call
    v = c(
        key, "clock_sm", _kinds("DCGM_FI_DEV_SM_CLOCK"), lib.nvmlDeviceGetClockInfo, handle, lib.NVML_CLOCK_SM
    )
    if v is not None:
        out["DCGM_FI_DEV_SM_CLOCK"] = float(v)
    v = c(
        key,
        "clock_mem",
        _kinds("DCGM_FI_DEV_MEM_CLOCK"),
        lib.nvmlDeviceGetClockInfo,
        handle,
        lib.NVML_CLOCK_MEM,
    )
    if v is not None:
        out["DCGM_FI_DEV_MEM_CLOCK"] = float(v)
    v = c(
        key,
        "temperature",
        _kinds("DCGM_FI_DEV_GPU_TEMP"),
        lib.nvmlDeviceGetTemperature,
        handle,
        lib.NVML_TEMPERATURE_GPU,
    )
    if v is not None:
        out["DCGM_FI_DEV_GPU_TEMP"] = float(v)
    v = c(key, "power", _kinds("DCGM_FI_DEV_POWER_USAGE"), lib.nvmlDeviceGetPowerUsage, handle)
    if v is not None:
        out["DCGM_FI_DEV_POWER_USAGE"] = v / 1000.0  # mW → W
    v = c(
        key,
        "energy",
        _kinds("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        lib.nvmlDeviceGetTotalEnergyConsumption,
        handle,
    )
    if v is not None:
        out["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = float(v)  # already mJ
    v = c(
        key,
        "pcie_replay",
        _kinds("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
        lib.nvmlDeviceGetPcieReplayCounter,
        handle,
    )
    if v is not None:
        out["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = float(v)
    rows = c(
        key,
        "remapped_rows",
        _kinds(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        ),
        lib.nvmlDeviceGetRemappedRows,
        handle,
    )
    if rows is not None:
        corr, unc, _pending, failure = rows
        out["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = float(corr)
        out["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = float(unc)
        out["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = 1.0 if failure else 0.0
    _read_ecc_totals(calls, key, handle, out, volatile=True)
    _read_field_values(calls, key, handle, out)
    read_opt_in(calls, key, handle, out)


def _read_ecc_totals(
    calls: NvmlCalls, key: str, handle: Any, out: dict[str, float], *, volatile: bool
) -> None:
    """Corrected (SBE) and uncorrected (DBE) ECC error totals: since boot (``volatile``, the
    ``*_VOL_TOTAL`` fields) or over the board's life (``*_AGG_TOTAL``)."""
    lib = calls.lib
    counter, kind = (lib.NVML_VOLATILE_ECC, "VOL") if volatile else (lib.NVML_AGGREGATE_ECC, "AGG")
    for name, err_type in (
        (f"DCGM_FI_DEV_ECC_SBE_{kind}_TOTAL", lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        (f"DCGM_FI_DEV_ECC_DBE_{kind}_TOTAL", lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        v = calls.call(
            key, f"ecc:{name}", _kinds(name), lib.nvmlDeviceGetTotalEccErrors, handle, err_type, counter
        )
        if v is not None:
            out[name] = float(v)


def _read_field_values(calls: NvmlCalls, key: str, handle: Any, out: dict[str, float]) -> None:
    """Memory temperature, NVLink data counters (all links, and link 0 alone) and NVLink error
    totals through one ``nvmlDeviceGetFieldValues``."""
    lib = calls.lib
    ids: list[Any] = [lib.NVML_FI_DEV_MEMORY_TEMP]
    with_nvlink = (key, "nvlink") not in calls.unsupported
    links = int(lib.NVML_NVLINK_MAX_LINKS) if with_nvlink else 0
    for link in range(links):
        ids.append((lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link))
        ids.append((lib.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link))
    # NVML's all-links error totals → DCGM's fields of the same meaning
    errors = [
        (lib.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
        (lib.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        (lib.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
        (lib.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    ]
    if with_nvlink:
        ids.extend(fid for fid, _ in errors)
    values = calls.call(
        key,
        "field_values",
        _kinds("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"),
        lib.nvmlDeviceGetFieldValues,
        handle,
        ids,
    )
    if values is None:
        return
    values = list(values)
    temp = _field_value(lib, values[0])
    if temp is not None:
        out["DCGM_FI_DEV_MEMORY_TEMP"] = temp
    if not with_nvlink:
        return
    data = values[1 : 1 + 2 * links]
    nvlink = [x for x in (_field_value(lib, fv) for fv in data) if x is not None]
    if nvlink:
        now = calls.clock()
        _rate(calls, key, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", kib=float(sum(nvlink)), now=now, out=out)
        link0 = [x for x in (_field_value(lib, fv) for fv in data[:2]) if x is not None]
        if link0:
            _rate(calls, key, "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", kib=float(sum(link0)), now=now, out=out)
    elif all(fv.nvmlReturn == lib.NVML_ERROR_NOT_SUPPORTED for fv in data):
        calls.unsupported.add((key, "nvlink"))  # no NVLink on this GPU: stop asking
        return
    for fv, (_, dcgm) in zip(values[1 + 2 * links :], errors, strict=False):
        v = _field_value(lib, fv)
        if v is not None:
            out[dcgm] = v


def _rate(calls: NvmlCalls, key: str, name: str, *, kib: float, now: float, out: dict[str, float]) -> None:
    """DCGM's NVLink bandwidth: not NVML's cumulative KiB counter but its rate between two reads,
    in KiB/s ÷ 1000 (DCGM's ``ReadAndCacheNvLinkBandwidth``: "MiB/s, approximate"; dcgm-exporter
    still types it ``counter``). The first read after start, a reset (the counter went down) or no
    time elapsed publishes nothing and keeps the reading as the new base."""
    last = calls.counters.get((key, name))
    calls.counters[(key, name)] = (kib, now)
    if last is None or kib < last[0] or now <= last[1]:
        return
    out[name] = round((kib - last[0]) / (now - last[1]) / 1000.0, 3)


def read_opt_in(calls: NvmlCalls, key: str, handle: Any, out: dict[str, float]) -> None:
    """dcgm-exporter's opt-in GPU-level fields: throttling (violation) time, aggregate ECC, retired
    pages, vGPU licence, clock event reasons. Each absent where NVML says NOT_SUPPORTED."""
    lib = calls.lib
    c = calls.call
    for policy, name in (
        (lib.NVML_PERF_POLICY_POWER, "DCGM_FI_DEV_POWER_VIOLATION"),
        (lib.NVML_PERF_POLICY_THERMAL, "DCGM_FI_DEV_THERMAL_VIOLATION"),
        (lib.NVML_PERF_POLICY_SYNC_BOOST, "DCGM_FI_DEV_SYNC_BOOST_VIOLATION"),
        (lib.NVML_PERF_POLICY_BOARD_LIMIT, "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION"),
        (lib.NVML_PERF_POLICY_LOW_UTILIZATION, "DCGM_FI_DEV_LOW_UTIL_VIOLATION"),
        (lib.NVML_PERF_POLICY_RELIABILITY, "DCGM_FI_DEV_RELIABILITY_VIOLATION"),
    ):
        # NVML counts throttled time in ns; DCGM's violation fields are in us.
        v = c(key, f"violation:{name}", _kinds(name), lib.nvmlDeviceGetViolationStatus, handle, policy)
        if v is not None:
            out[name] = float(v.violationTime) / 1000.0
    _read_ecc_totals(calls, key, handle, out, volatile=False)
    for name, cause in (
        ("DCGM_FI_DEV_RETIRED_SBE", lib.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        ("DCGM_FI_DEV_RETIRED_DBE", lib.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    ):
        pages = c(key, f"retired:{name}", _kinds(name), lib.nvmlDeviceGetRetiredPages, handle, cause)
        if pages is not None:
            out[name] = float(len(pages))
    pending = c(
        key,
        "retired_pending",
        _kinds("DCGM_FI_DEV_RETIRED_PENDING"),
        lib.nvmlDeviceGetRetiredPagesPendingStatus,
        handle,
    )
    if pending is not None:
        out["DCGM_FI_DEV_RETIRED_PENDING"] = 1.0 if pending == lib.NVML_FEATURE_ENABLED else 0.0
    lic = c(
        key,
        "vgpu_license",
        _kinds("DCGM_FI_DEV_VGPU_LICENSE_STATUS"),
        lib.nvmlDeviceGetGridLicensableFeatures,
        handle,
    )
    if lic is not None and int(lic.isGridLicenseSupported):
        features = lic.gridLicensableFeatures[: int(lic.licensableFeaturesCount)]
        out["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] = 1.0 if any(int(f.featureState) for f in features) else 0.0
    mask = c(
        key,
        "clock_events",
        _kinds("DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        lib.nvmlDeviceGetCurrentClocksEventReasons,
        handle,
    )
    if mask is not None:
        out["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = float(mask)


def read_pcie_throughput(calls: NvmlCalls, key: str, handle: Any, out: dict[str, float]) -> None:
    """PCIe rates without GPM: NVML's 20 ms throughput sample, KB/s → bytes/s."""
    lib = calls.lib
    for name, counter in (
        ("DCGM_FI_PROF_PCIE_TX_BYTES", lib.NVML_PCIE_UTIL_TX_BYTES),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", lib.NVML_PCIE_UTIL_RX_BYTES),
    ):
        v = calls.call(key, f"pcie:{name}", _kinds(name), lib.nvmlDeviceGetPcieThroughput, handle, counter)
        if v is not None:
            out[name] = float(v) * 1024.0


def read_whole_gpu(calls: NvmlCalls, key: str, handle: Any, out: dict[str, float]) -> None:
    """Fields NVML only has for whole GPUs (NOT_SUPPORTED on MIG): utilisation, encoder, decoder."""
    lib = calls.lib
    util = calls.call(
        key,
        "utilization",
        _kinds("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"),
        lib.nvmlDeviceGetUtilizationRates,
        handle,
    )
    if util is not None:
        out["DCGM_FI_DEV_GPU_UTIL"] = float(util.gpu)
        out["DCGM_FI_DEV_MEM_COPY_UTIL"] = float(util.memory)
    for name, fn in (
        ("DCGM_FI_DEV_ENC_UTIL", lib.nvmlDeviceGetEncoderUtilization),
        ("DCGM_FI_DEV_DEC_UTIL", lib.nvmlDeviceGetDecoderUtilization),
    ):
        v = calls.call(key, name, _kinds(name), fn, handle)
        if v is not None:
            out[name] = float(v[0])


def read_device(
    calls: NvmlCalls,
    key: str,
    handle: Any,
    out: dict[str, float],
    *,
    mig: bool = False,
    memory: bool = True,
    processes: bool = True,
) -> int | None:
    """Framebuffer (MiB) of a whole GPU or MIG handle; returns the number of compute processes.

    ``memory=False`` skips the framebuffer (a second compute instance of a GPU instance: the memory
    belongs to the GPU instance and is published once). ``processes=False`` skips the process list
    (the exporter cannot see other containers' processes: a count would read 0, not "unknown").
    """
    lib = calls.lib
    if memory:
        _read_memory(calls, key, handle, out, mig=mig)
    if not processes:
        return None
    procs = calls.call(
        key,
        "compute_processes",
        ("compute_processes",),
        lib.nvmlDeviceGetComputeRunningProcesses,
        handle,
        stale_on_missing=mig,
    )
    fallback = getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v2", None)
    if procs is None and fallback is not None and (key, "compute_processes") in calls.mismatched:
        # Drivers before the _v3 process list: nvidia-ml-py's versioned call is missing, _v2 is not.
        procs = calls.call(
            key, "compute_processes_v2", ("compute_processes",), fallback, handle, stale_on_missing=mig
        )
    return None if procs is None else len(procs)


def _read_memory(calls: NvmlCalls, key: str, handle: Any, out: dict[str, float], *, mig: bool) -> None:
    lib = calls.lib
    fb = _kinds("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")
    mem = calls.call(
        key,
        "memory_v2",
        fb,
        lib.nvmlDeviceGetMemoryInfo,
        handle,
        version=lib.nvmlMemory_v2,
        stale_on_missing=mig,
    )
    if mem is None and (key, "memory_v2") in calls.unsupported:
        # Drivers before v2 memory info: no reserved figure, and "used" includes it.
        mem = calls.call(key, "memory_v1", fb, lib.nvmlDeviceGetMemoryInfo, handle, stale_on_missing=mig)
    if mem is not None:
        out["DCGM_FI_DEV_FB_FREE"] = mem.free / MIB
        out["DCGM_FI_DEV_FB_USED"] = mem.used / MIB
        reserved = getattr(mem, "reserved", None)
        if reserved is not None:
            out["DCGM_FI_DEV_FB_RESERVED"] = reserved / MIB
