"""What the NVIDIA device plugin advertises in a node's ``status.capacity``/``allocatable``.

After the MIG Manager applies a layout, the device plugin (restarted by the operator) lists the
devices it finds and the kubelet publishes them as extended resources (NVIDIA k8s-device-plugin,
``docs/gpu-sharing`` and the MIG strategies in ``docs/mig``):

- ``mixed``: one ``nvidia.com/mig-<profile>`` per MIG instance, ``nvidia.com/gpu`` per GPU with MIG off;
- ``single``: every MIG instance (all of one profile) and every MIG-off GPU as ``nvidia.com/gpu``;
- ``none``: ``nvidia.com/gpu`` per physical GPU, MIG or not;
- time-slicing: each device of a replicated resource advertised ``replicas`` times (GPU Feature
  Discovery labels the node ``<resource>.replicas`` per resource, e.g. ``nvidia.com/gpu.replicas``;
  resources the sharing config does not name stay at one each).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mig_geometry.catalogue import GpuModel

GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
REPLICAS_SUFFIX = ".replicas"
STRATEGY_LABEL = "nvidia.com/mig.strategy"


def per_gpu(entries: Any, *, model: GpuModel | None, count: int) -> dict[int, dict[str, int] | None]:
    """GPU index → its MIG devices (``None``: MIG off) for the config entries that match the node."""
    out: dict[int, dict[str, int] | None] = dict.fromkeys(range(count))
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        filt = entry.get("device-filter")
        if filt is not None and model is not None:
            filters = [filt] if isinstance(filt, str) else list(filt)
            if not {int(str(f), 16) >> 16 for f in filters} & set(model.device_ids):
                continue
        devices = entry.get("devices", "all")
        indices = (
            range(count) if devices == "all" else [d for d in devices if isinstance(d, int) and d < count]
        )
        for i in indices:
            if entry.get("mig-enabled"):
                out[i] = {str(k): int(v) for k, v in (entry.get("mig-devices") or {}).items() if v}
            else:
                out[i] = None
    return out


def replicas_of(labels: Mapping[str, str]) -> dict[str, int]:
    """Resource → replicas from GFD's ``<resource>.replicas`` labels."""
    out = {}
    for key, value in labels.items():
        if key.startswith("nvidia.com/") and key.endswith(REPLICAS_SUFFIX):
            try:
                out[key[: -len(REPLICAS_SUFFIX)]] = max(1, int(value))
            except ValueError:
                continue
    return out


def advertised(
    layout: Mapping[int, dict[str, int] | None], *, strategy: str, replicas: Mapping[str, int]
) -> dict[str, int]:
    """Extended resources → count for a node whose GPUs have ``layout``."""
    totals: dict[str, int] = {}

    def add(name: str, n: int) -> None:
        if n:
            totals[name] = totals.get(name, 0) + n * max(1, replicas.get(name, 1))

    for devices in layout.values():
        if devices is None or strategy == "none":
            add(GPU, 1)
        elif strategy == "single":
            add(GPU, sum(devices.values()))
        else:
            for profile, n in devices.items():
                add(f"{MIG_PREFIX}{profile}", n)
    return totals


def publish(obj: dict[str, Any], resources: Mapping[str, int]) -> None:
    """Replace the node's GPU extended resources (capacity and allocatable) and GFD's count labels."""
    labels = obj["metadata"].setdefault("labels", {})
    for key in [k for k in labels if k.startswith(MIG_PREFIX) and k.endswith(".count")]:
        del labels[key]
    for name, total in resources.items():
        if name.startswith(MIG_PREFIX):
            labels[f"{name}.count"] = str(total)
    status = obj.setdefault("status", {})
    for field_name in ("capacity", "allocatable"):
        res = {
            k: v
            for k, v in (status.get(field_name) or {}).items()
            if k != GPU and not k.startswith(MIG_PREFIX)
        }
        res.update({k: str(v) for k, v in resources.items()})
        status[field_name] = res
