"""Per-process accounting of a whole GPU: who holds its memory, who used its SMs since last time.

``nvmlDeviceGetComputeRunningProcesses`` gives each process's framebuffer; ``nvmlDeviceGetProcess
Utilization(handle, since)`` the SM utilisation samples NVML kept since the last collection's
newest sample (microsecond timestamps), averaged here per PID. ``NOT_FOUND`` there means "no sample
in the interval" (every process idle); ``NOT_SUPPORTED`` means NVML cannot tell per process on this
GPU (MPS clients on drivers that account them to the MPS server, vGPU): the GPU is then marked, and
its per-pod utilisation left out rather than reported as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exporter.nvml.fields import NvmlCalls
from exporter.snapshot import ProcessUsage

CALL = "process_utilization"


class ProcessSampler:
    """Keeps, per GPU, the newest sample timestamp NVML returned, so each interval is read once."""

    def __init__(self, calls: NvmlCalls) -> None:
        self.calls = calls
        self._since: dict[str, int] = {}

    def forget(self, key: str) -> None:
        self._since.pop(key, None)

    def read(self, key: str, handle: Any, running: Sequence[Any]) -> tuple[tuple[ProcessUsage, ...], bool]:
        """(processes, utilisation visible) for one whole GPU; ``running`` is the process list
        already read for the process count."""
        util, visible = self._utilisation(key, handle)
        out = []
        for proc in running:
            pid = int(proc.pid)
            used = getattr(proc, "usedGpuMemory", None)
            out.append(
                ProcessUsage(
                    pid=pid,
                    memory_bytes=float(used) if isinstance(used, int) and used >= 0 else None,
                    sm_util=util.get(pid, 0.0) if visible else None,
                )
            )
        return tuple(out), visible

    def _utilisation(self, key: str, handle: Any) -> tuple[dict[int, float], bool]:
        calls, lib = self.calls, self.calls.lib
        if (key, CALL) in calls.unsupported:
            return {}, False
        since = self._since.get(key, 0)
        try:
            samples = lib.nvmlDeviceGetProcessUtilization(handle, since)
        except lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (lib.NVML_ERROR_NOT_FOUND, lib.NVML_SUCCESS):
                # No sample since the last one: nothing ran. (nvidia-ml-py raises NVMLError(SUCCESS)
                # when the size query finds no sample instead of returning an empty list.)
                return {}, True
            if code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND):
                calls.unsupported.add((key, CALL))
                return {}, False
            calls.errors[f"processes:{CALL}"] += 1
            return {}, False
        sums: dict[int, list[float]] = {}
        newest = since
        for s in samples:
            stamp = int(s.timeStamp)
            if stamp <= since:
                continue
            newest = max(newest, stamp)
            sums.setdefault(int(s.pid), []).append(float(s.smUtil))
        self._since[key] = newest
        return {pid: sum(v) / len(v) for pid, v in sums.items()}, True
