"""Which configured fields this node's GPUs cannot give, said once at start-up: pure.

The counters file (or the default set) may ask for fields a GPU cannot produce here: the profiling
fields (``DCGM_FI_PROF_*`` activity ratios) come from NVML GPM, which Hopper and newer GPUs have and
Ampere or older do not (dcgm-exporter reads them from DCGM's profiling module instead). Their series
are absent on such GPUs, so the dashboards and HPAs built on them stay empty; one line says so.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.contract.fields import GPM_ONLY
from exporter.snapshot import NodeSnapshot


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2,5``."""
    out, start = [], None
    for i, n in enumerate(indices):
        if start is None:
            start = n
        if i + 1 == len(indices) or indices[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ",".join(out)


def missing_fields_line(selected: Iterable[str], snapshot: NodeSnapshot) -> str:
    """One warning line naming the configured GPM-only fields and the GPUs without GPM ("" if none)."""
    wanted = sorted(set(selected) & GPM_ONLY)
    without = [g.info for g in snapshot.gpus if not g.info.gpm_supported]
    if not wanted or not without:
        return ""
    models = sorted({info.model_name for info in without})
    gpus = _ranges(sorted(info.index for info in without))
    return (
        f"{', '.join(wanted)} cannot be collected on GPU {gpus} ({', '.join(models)}): these profiling "
        "fields come from NVML GPM here, which needs a Hopper or newer GPU (dcgm-exporter reads them from "
        "DCGM's profiling module); their series are absent for these GPUs, so dashboards and HPAs on them "
        "stay empty (DCGM_FI_DEV_GPU_UTIL and gpupilot_device_compute_processes are published)"
    )
