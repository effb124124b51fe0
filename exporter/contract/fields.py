"""The metric contract: DCGM-compatible fields, their types and where they live.

Names, types and units follow dcgm-exporter 4.5–4.8 (shared/reference/dcgm-exporter-compat.md).
Counters keep their DCGM names (no ``_total``). ``level`` says where a field is published:

* ``gpu``      — once per physical GPU, MIG or not (power, temperature, clocks, energy, PCIe, ECC…);
                 dcgm-exporter repeats these on every MIG instance, so sums over-count there.
* ``device``   — on a whole (non-MIG) GPU, and per MIG instance on a MIG GPU (framebuffer and
                 profiling activity), so ``sum by (pod)`` is right for both.
* ``whole``    — only on non-MIG GPUs (NVML returns NOT_SUPPORTED for MIG).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["gpu", "device", "whole"]
Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: Kind
    level: Level
    help: str
    reads: str = ""
    """For a DCGM 4.6 name (an alias): the older name whose value it publishes; empty otherwise."""

    @property
    def source(self) -> str:
        """The name the snapshot's values are keyed by."""
        return self.reads or self.name


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "gpu", "SM clock frequency (in MHz)."),
    FieldSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "gpu", "Memory clock frequency (in MHz)."),
    FieldSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "gpu", "Memory temperature (in C)."),
    FieldSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "gpu", "GPU temperature (in C)."),
    FieldSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "gpu", "Power draw (in W)."),
    FieldSpec(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "gpu",
        "Total energy consumption since boot (in mJ).",
    ),
    FieldSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "gpu", "Total number of PCIe retries."),
    FieldSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "whole", "GPU utilization (in %)."),
    FieldSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "whole", "Memory utilization (in %)."),
    FieldSpec("DCGM_FI_DEV_ENC_UTIL", "gauge", "whole", "Encoder utilization (in %)."),
    FieldSpec("DCGM_FI_DEV_DEC_UTIL", "gauge", "whole", "Decoder utilization (in %)."),
    FieldSpec("DCGM_FI_DEV_FB_FREE", "gauge", "device", "Framebuffer memory free (in MiB)."),
    FieldSpec("DCGM_FI_DEV_FB_USED", "gauge", "device", "Framebuffer memory used (in MiB)."),
    FieldSpec("DCGM_FI_DEV_FB_RESERVED", "gauge", "device", "Framebuffer memory reserved (in MiB)."),
    FieldSpec(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "gpu",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    FieldSpec(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "gpu",
        "Number of remapped rows for uncorrectable errors.",
    ),
    FieldSpec(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "gpu",
        "Number of remapped rows for correctable errors.",
    ),
    FieldSpec("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "gpu", "Whether remapping of rows has failed."),
    FieldSpec(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "gpu", "Total number of single-bit volatile ECC errors."
    ),
    FieldSpec(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "gpu", "Total number of double-bit volatile ECC errors."
    ),
    FieldSpec(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "device",
        "Ratio of time the graphics engine is active (in %).",
    ),
    FieldSpec(
        "DCGM_FI_PROF_SM_ACTIVE", "gauge", "device", "The ratio of cycles an SM has at least 1 warp assigned."
    ),
    FieldSpec(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "device",
        "The ratio of number of warps resident on an SM.",
    ),
    FieldSpec(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "device",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    FieldSpec(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "device",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    FieldSpec(
        "DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "gpu", "The rate of data transmitted over the PCIe bus."
    ),
    FieldSpec("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "gpu", "The rate of data received over the PCIe bus."),
    # -- opt-in fields of dcgm-exporter's counters file (commented out in its default) ----------
    FieldSpec(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "device", "Ratio of cycles the fp64 pipes are active."
    ),
    FieldSpec(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "device", "Ratio of cycles the fp32 pipes are active."
    ),
    FieldSpec(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "device", "Ratio of cycles the fp16 pipes are active."
    ),
    *(
        FieldSpec(
            f"DCGM_FI_DEV_{cause}_VIOLATION",
            "counter",
            "gpu",
            f"Throttling duration due to {what} (in us).",
        )
        for cause, what in (
            ("POWER", "power constraints"),
            ("THERMAL", "thermal constraints"),
            ("SYNC_BOOST", "sync-boost constraints"),
            ("BOARD_LIMIT", "board limit constraints"),
            ("LOW_UTIL", "low utilization"),
            ("RELIABILITY", "reliability constraints"),
        )
    ),
    FieldSpec(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "gpu", "Total number of single-bit persistent ECC errors."
    ),
    FieldSpec(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "gpu", "Total number of double-bit persistent ECC errors."
    ),
    FieldSpec(
        "DCGM_FI_DEV_RETIRED_SBE", "counter", "gpu", "Total number of retired pages due to single-bit errors."
    ),
    FieldSpec(
        "DCGM_FI_DEV_RETIRED_DBE", "counter", "gpu", "Total number of retired pages due to double-bit errors."
    ),
    FieldSpec("DCGM_FI_DEV_RETIRED_PENDING", "counter", "gpu", "Total number of pages pending retirement."),
    FieldSpec(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "gpu",
        "Total number of NVLink flow-control CRC errors.",
    ),
    FieldSpec(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "gpu",
        "Total number of NVLink data CRC errors.",
    ),
    FieldSpec(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "gpu", "Total number of NVLink retries."
    ),
    FieldSpec(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "gpu",
        "Total number of NVLink recovery errors.",
    ),
    FieldSpec(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0",
        "counter",
        "gpu",
        "The number of bytes of active NVLink rx or tx data including both header and payload.",
    ),
    FieldSpec("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "gpu", "vGPU License status"),
    FieldSpec(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "gpu",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
    ),
)

XID_FIELD = FieldSpec("DCGM_FI_DEV_XID_ERRORS", "gauge", "gpu", "Value of the last XID error encountered.")

EXP_XID_COUNT = FieldSpec(
    "DCGM_EXP_XID_ERRORS_COUNT",
    "gauge",
    "gpu",
    "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
)
EXP_CLOCK_EVENTS_COUNT = FieldSpec(
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "gauge",
    "gpu",
    "Count of clock events within the user-specified time window (see clock-events-count-window-size param).",
)
EXP_GPU_HEALTH = FieldSpec(
    "DCGM_EXP_GPU_HEALTH_STATUS", "gauge", "gpu", "GPU health status (0 pass, 10 warn, 20 fail) by watch."
)
EXP_FIELDS: tuple[FieldSpec, ...] = (EXP_XID_COUNT, EXP_CLOCK_EVENTS_COUNT, EXP_GPU_HEALTH)
"""dcgm-exporter's own series: computed from other fields over a window, not read from a device."""

BY_NAME: dict[str, FieldSpec] = {f.name: f for f in (*FIELDS, XID_FIELD, *EXP_FIELDS)}

RENAMED_IN_DCGM_4_6: dict[str, str] = {
    # new identifier (same field id, same unit) → the name dcgm-exporter 4.5-4.8 and this exporter use
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_BOARD_POWER_WATTS": "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILED": "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_XID_ERROR": "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_SYSTEM_DRIVER_VERSION": "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_UTIL_RATIO": "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_FP64_UTIL_RATIO": "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_FP32_UTIL_RATIO": "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": "DCGM_FI_PROF_DRAM_ACTIVE",
}
"""Field identifiers DCGM 4.6 renamed (the old ones stay as deprecated aliases in ``dcgm_fields.h``),
from NVIDIA's Field Identifiers reference. A counters file may use either name; the series is
published under the name the file uses, with the same value. Renames that changed the unit or the
field id (``…_RATIO`` utilisation 1613-1616, ``…_BYTES``, ``…_HERTZ``, ``…_SECONDS_TOTAL``) are new
fields, not aliases, and are not read."""
"""Every field this exporter can publish, with its default type and help."""

GPM_ONLY: frozenset[str] = frozenset(
    {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    }
)
"""Profiling fields read only from NVML GPM (GPU Performance Monitoring, Hopper and newer): absent on
older GPUs (Ampere, Turing), where dcgm-exporter reads them from DCGM's profiling module. The PCIe
rates have a non-GPM source (NVML's throughput counters) and are not listed."""

LABEL_FIELDS: frozenset[str] = frozenset({"DCGM_FI_DRIVER_VERSION"})
"""Fields a counters file may turn into labels (type ``label``) that this exporter can read."""

GPUPILOT_EXTRAS: tuple[str, ...] = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
)
"""Published on top of dcgm-exporter's default set when no ``--collectors`` file is given: the
per-slice activity of the metric contract and the volatile ECC counts the alert rules use."""
