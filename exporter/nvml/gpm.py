"""GPU Performance Monitoring (GPM, Hopper and newer): activity per whole GPU and per MIG instance.

GPM metrics are computed over two samples of the same entity taken at least 100 ms apart. The
sampler keeps the previous sample of every entity (a GPU by UUID, a MIG instance by MIG UUID) and
each collection turns (previous, current) into DCGM profiling fields, then keeps the current one.
The library object is injected; this module never imports ``pynvml``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.nvml.fields import GpuLost, NvmlCalls

MIB = 1024 * 1024

RATIO_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("NVML_GPM_METRIC_SM_UTIL", "DCGM_FI_PROF_SM_ACTIVE"),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY"),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE"),
    ("NVML_GPM_METRIC_FP64_UTIL", "DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
    ("NVML_GPM_METRIC_FP32_UTIL", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"),
    ("NVML_GPM_METRIC_FP16_UTIL", "DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
)
"""GPM percentage metrics (0–100) → DCGM ratio fields (0–1), DCGM's own mapping."""

RATE_METRICS: tuple[tuple[str, str], ...] = (
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", "DCGM_FI_PROF_PCIE_TX_BYTES"),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", "DCGM_FI_PROF_PCIE_RX_BYTES"),
)
"""GPM MiB/s metrics → DCGM bytes/s fields; GPU-level, so only sampled on whole GPUs."""

RATIO_SLACK = 1.0
"""Percentage points a GPM ratio may stray outside 0–100 (rounding) before it is dropped as invalid."""


@dataclass
class _Held:
    sample: Any
    taken_at: float


class GpmSampler:
    """Previous samples per entity; :meth:`collect` yields DCGM fields from (previous, current)."""

    def __init__(self, calls: NvmlCalls, *, min_interval_s: float, clock: Callable[[], float]) -> None:
        self.calls = calls
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._unsupported: set[str] = set()

    @property
    def lib(self) -> Any:
        return self.calls.lib

    def oldest_age(self) -> float | None:
        """Seconds since the oldest held sample was taken (None when nothing is held)."""
        if not self._held:
            return None
        return self.clock() - min(h.taken_at for h in self._held.values())

    def forget(self, entity: str) -> None:
        """Start afresh for ``entity``: its MIG mode changed, so whole-GPU samples may work again."""
        self._unsupported.discard(entity)
        held = self._held.pop(entity, None)
        if held is not None:
            self._free(held.sample)

    def supported(self, handle: Any) -> bool:
        lib = self.lib
        try:
            return bool(lib.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) == lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"nvmlGpmQueryDeviceSupport: {exc}") from exc
            return False

    def collect(
        self, entity: str, take: Callable[[Any], Any], *, with_rates: bool
    ) -> dict[str, float] | None:
        """Take a sample of ``entity`` with ``take(sample)``; return fields over the interval since
        the previous one, or None on the first sample (or when samples are < min interval apart)."""
        lib = self.lib
        if entity in self._unsupported:
            return None
        now = self.clock()
        held = self._held.get(entity)
        if held is not None and now - held.taken_at < self.min_interval_s:
            return None
        try:
            current = lib.nvmlGpmSampleAlloc()
        except lib.NVMLError:
            self.calls.errors["gpm"] += 1
            return None
        try:
            take(current)
        except lib.NVMLError as exc:
            self._free(current)
            code = getattr(exc, "value", None)
            if code == lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"GPM sample: {exc}") from exc
            if code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported.add(entity)  # e.g. whole-GPU samples in MIG mode: stop asking
            elif code == lib.NVML_ERROR_NO_PERMISSION:
                self._unsupported.add(entity)  # no CAP_SYS_ADMIN: it will not change while we run
                self.calls.errors["no_permission:gpm"] += 1
            else:
                self.calls.errors["gpm"] += 1
            return None
        self._held[entity] = _Held(current, now)
        if held is None:
            return None
        try:
            return self._metrics(held.sample, current, with_rates=with_rates)
        finally:
            self._free(held.sample)

    def _metrics(self, earlier: Any, later: Any, *, with_rates: bool) -> dict[str, float]:
        lib = self.lib
        wanted = RATIO_METRICS + (RATE_METRICS if with_rates else ())
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = lib.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = earlier
        request.sample2 = later
        for i, (metric, _) in enumerate(wanted):
            request.metrics[i].metricId = getattr(lib, metric)
        try:
            lib.nvmlGpmMetricsGet(request)
        except lib.NVMLError:
            self.calls.errors["gpm"] += 1
            return {}
        out: dict[str, float] = {}
        ratio_fields = {f for _, f in RATIO_METRICS}
        for i, (_, field) in enumerate(wanted):
            m = request.metrics[i]
            if m.nvmlReturn != lib.NVML_SUCCESS:
                continue
            value = float(m.value)
            # DCGM leaves a field blank when GPM yields NaN/inf (e.g. counters that did not move
            # between samples); publishing NaN would poison every avg_over_time over it.
            if not math.isfinite(value):
                self.calls.errors["gpm:not_finite"] += 1
                continue
            if field in ratio_fields:
                if not -RATIO_SLACK <= value <= 100.0 + RATIO_SLACK:
                    self.calls.errors["gpm:out_of_range"] += 1
                    continue
                out[field] = min(max(value, 0.0), 100.0) / 100.0
            elif value < 0:
                self.calls.errors["gpm:out_of_range"] += 1
            else:
                out[field] = value * MIB
        return out

    def keep_only(self, entities: set[str]) -> None:
        """Free the samples of entities that are gone (MIG instance destroyed, GPU lost)."""
        self._unsupported &= entities
        for entity in [e for e in self._held if e not in entities]:
            self._free(self._held.pop(entity).sample)

    def close(self) -> None:
        self.keep_only(set())

    def _free(self, sample: Any) -> None:
        lib = self.lib
        try:
            lib.nvmlGpmSampleFree(sample)
        except lib.NVMLError:
            self.calls.errors["gpm"] += 1
