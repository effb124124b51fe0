"""Per-pod figures on shared (time-sliced or MPS) whole GPUs, from per-process accounting: pure.

Every pod on a time-sliced GPU sees the whole device's ``DCGM_FI_DEV_GPU_UTIL`` and
``DCGM_FI_DEV_FB_USED``. Here each container gets its own share:

* ``gpupilot_pod_gpu_utilization_ratio`` — the SM utilisation of its processes (NVML's per-process
  samples), 0-1. If the per-process figures add up to more than the device's own utilisation (the
  two are sampled differently), every share is scaled down by the same factor, so the sum never
  exceeds ``DCGM_FI_DEV_GPU_UTIL / 100``.
* ``gpupilot_pod_gpu_memory_used_bytes`` — the framebuffer its processes hold, scaled the same way
  against ``DCGM_FI_DEV_FB_USED`` (MiB) when that is known.

Labels: ``pod``, ``namespace``, ``container``, ``gpu``, ``UUID`` (and the node label). Only GPUs
whose snapshot carries per-process accounting take part. Where NVML gives no per-process
utilisation (``process_util_visible`` False: ``NOT_SUPPORTED``, e.g. vGPU), or where a process in no
pod holds SM samples while pods run on the GPU (MPS clients' work accounted to the MPS server, on
older drivers), utilisation is left out, not 0, and ``gpupilot_gpu_process_utilization_visible``
is 0 for that GPU. A process without a Kubernetes container (host process, MPS daemon) counts in
no pod's share.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.contract.layout import SeriesLayout
from exporter.expose.exposition import Family, LabelPairs
from exporter.snapshot import DeviceShares, GpuSnapshot, NodeSnapshot, PodRef

MIB = 1024 * 1024
UTIL_FIELD = "DCGM_FI_DEV_GPU_UTIL"
FB_USED_FIELD = "DCGM_FI_DEV_FB_USED"

PidOwners = Mapping[int, PodRef]
"""Host PID → the container it runs in."""


def _scale(
    shares: dict[tuple[str, str, str], float], limit: float | None
) -> dict[tuple[str, str, str], float]:
    total = sum(shares.values())
    if limit is None or total <= limit or total <= 0:
        return shares
    factor = max(0.0, limit) / total
    return {k: v * factor for k, v in shares.items()}


def utilisation_visible(gpu: GpuSnapshot, owners: PidOwners) -> bool:
    """Whether per-pod utilisation on this GPU can be told: NVML answers per process, and no process
    outside every pod holds SM samples while pods run there — on drivers that account MPS clients'
    work to the MPS server, the server (a process in no pod) is where their utilisation shows."""
    if not gpu.process_util_visible:
        return False
    procs = gpu.processes or ()
    in_pods = any(p.pid in owners for p in procs)
    outside = any(p.pid not in owners and (p.sm_util or 0.0) > 0 for p in procs)
    return not (in_pods and outside)


def gpu_pod_shares(
    gpu: GpuSnapshot, owners: PidOwners
) -> tuple[dict[tuple[str, str, str], float], dict[tuple[str, str, str], float]]:
    """(utilisation ratio, memory bytes) per (namespace, pod, container) on one GPU.

    Utilisation is empty when NVML cannot see it per process on this GPU."""
    util: dict[tuple[str, str, str], float] = {}
    mem: dict[tuple[str, str, str], float] = {}
    visible = utilisation_visible(gpu, owners)
    for proc in gpu.processes or ():
        ref = owners.get(proc.pid)
        if ref is None:
            continue
        key = (ref.namespace, ref.pod, ref.container)
        mem[key] = mem.get(key, 0.0) + (proc.memory_bytes or 0.0)
        if visible:
            util[key] = util.get(key, 0.0) + min(100.0, max(0.0, proc.sm_util or 0.0)) / 100.0
    device_util = gpu.values.get(UTIL_FIELD)
    device_mem = gpu.values.get(FB_USED_FIELD)
    return (
        _scale(util, None if device_util is None else device_util / 100.0),
        _scale(mem, None if device_mem is None else device_mem * MIB),
    )


def device_shares(snapshot: NodeSnapshot, owners: PidOwners) -> dict[str, DeviceShares]:
    """GPU UUID → each container's share of that whole GPU (the figures of :func:`gpu_pod_shares`),
    for the per-pod ``DCGM_FI_DEV_*`` series of ``--kubernetes-virtual-gpus``."""
    out = {}
    for gpu in snapshot.gpus:
        if gpu.processes is None or gpu.info.mig_enabled:
            continue
        util, mem = gpu_pod_shares(gpu, owners)
        uids = {}
        for proc in gpu.processes:
            ref = owners.get(proc.pid)
            if ref is not None and ref.pod_uid:
                uids[(ref.namespace, ref.pod, ref.container)] = ref.pod_uid
        out[gpu.info.uuid] = DeviceShares(util if utilisation_visible(gpu, owners) else None, mem, uids)
    return out


def pod_usage_families(
    snapshot: NodeSnapshot, owners: PidOwners, *, hostname: str, layout: SeriesLayout
) -> list[Family]:
    """The per-pod families of one snapshot (empty lists left out)."""
    util = Family(
        "gpupilot_pod_gpu_utilization_ratio",
        "gauge",
        "SM utilisation (0-1) of one container's processes on a shared whole GPU, from NVML's "
        "per-process samples; shares on a GPU never add up to more than DCGM_FI_DEV_GPU_UTIL/100.",
    )
    mem = Family(
        "gpupilot_pod_gpu_memory_used_bytes",
        "gauge",
        "Framebuffer bytes held by one container's processes on a whole GPU (NVML running processes); "
        "shares never add up to more than DCGM_FI_DEV_FB_USED.",
    )
    visible = Family(
        "gpupilot_gpu_process_utilization_visible",
        "gauge",
        "1 when NVML reports per-process utilisation on this GPU; 0 when it does not (e.g. MPS clients "
        "on older drivers), and then no gpupilot_pod_gpu_utilization_ratio is published for it.",
    )
    host: LabelPairs = ((layout.host_label, hostname),) if layout.host_label is not None else ()
    for gpu in snapshot.gpus:
        if gpu.processes is None or gpu.info.mig_enabled:
            continue
        base: LabelPairs = (("gpu", str(gpu.info.index)), ("UUID", gpu.info.uuid), *host)
        visible.samples.append((base, 1.0 if utilisation_visible(gpu, owners) else 0.0))
        shares_util, shares_mem = gpu_pod_shares(gpu, owners)
        for (ns, pod, container), value in sorted(shares_mem.items()):
            mem.samples.append(((*base, ("pod", pod), ("namespace", ns), ("container", container)), value))
        for (ns, pod, container), value in sorted(shares_util.items()):
            util.samples.append(((*base, ("pod", pod), ("namespace", ns), ("container", container)), value))
    return [f for f in (util, mem, visible) if f.samples]
