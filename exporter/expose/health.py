"""``DCGM_EXP_GPU_HEALTH_STATUS`` from the values NVML gives, without DCGM's health watches.

dcgm-exporter asks the DCGM hostengine for incidents per watch (PCIE, NVLINK, PMU, MCU, MEM, SM,
INFOROM, THERMAL, POWER, DRIVER) and publishes one series per watch with ``health_watch`` and
``health_error_code`` labels, value 0 (pass), 10 (warn) or 20 (fail). Without a hostengine we apply
the checks whose inputs NVML has; the other watches report pass. Pure function of one GPU's values.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.expose.windows import REASONS_FIELD

PASS, WARN, FAIL = 0, 10, 20
WATCHES = ("PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER")

_HW_THERMAL, _SW_THERMAL, _HW_POWER_BRAKE = 0x40, 0x20, 0x80


def _mem(v: Mapping[str, float]) -> tuple[int, str]:
    if v.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) > 0:
        return FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED"
    if v.get("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0) > 0:
        return FAIL, "DCGM_FR_ROW_REMAP_FAILURE"
    if v.get("DCGM_FI_DEV_RETIRED_PENDING", 0) > 0:
        return WARN, "DCGM_FR_PENDING_PAGE_RETIREMENTS"
    return PASS, "DCGM_FR_OK"


def _thermal(v: Mapping[str, float]) -> tuple[int, str]:
    mask = int(v.get(REASONS_FIELD, 0))
    if mask & (_HW_THERMAL | _SW_THERMAL):
        return WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL"
    return PASS, "DCGM_FR_OK"


def _power(v: Mapping[str, float]) -> tuple[int, str]:
    if "DCGM_FI_DEV_POWER_USAGE" not in v:
        return WARN, "DCGM_FR_POWER_UNREADABLE"
    if int(v.get(REASONS_FIELD, 0)) & _HW_POWER_BRAKE:
        return WARN, "DCGM_FR_CLOCK_THROTTLE_POWER"
    return PASS, "DCGM_FR_OK"


def _nvlink(v: Mapping[str, float]) -> tuple[int, str]:
    if v.get("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 0) > 0:
        return WARN, "DCGM_FR_NVLINK_ERROR_THRESHOLD"
    return PASS, "DCGM_FR_OK"


def status(values: Mapping[str, float]) -> list[tuple[str, int, str]]:
    """(watch, result, DCGM error code name) for every watch, in dcgm-exporter's order."""
    checks = {"MEM": _mem, "THERMAL": _thermal, "POWER": _power, "NVLINK": _nvlink}
    out = []
    for watch in WATCHES:
        check = checks.get(watch)
        result, code = check(values) if check else (PASS, "DCGM_FR_OK")
        out.append((watch, result, code))
    return out
