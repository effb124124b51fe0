"""The MIG Manager's side of the label protocol as pure functions over mig-parted configs and GPU
Feature Discovery labels: which model a node has, which GPUs a config change re-creates, whether a
config can be applied to a node, what the device plugin advertises afterwards, and the GPU
Operator's built-in config names. Shared by the real control plane's MIG Manager stand-in
(:mod:`devkit.cluster.migmanager`) and the API double's (``tests/support/kubedouble/migmanager.py``).
"""

from __future__ import annotations

from typing import Any

from devkit.cluster import deviceplugin
from mig_geometry.catalogue import MODELS, GpuModel, find_model
from mig_geometry.placement import place

ENTRY_FIELDS = {"devices", "device-filter", "mig-enabled", "mig-devices"}


def gpu_model_of(labels: dict[str, str]) -> GpuModel | None:
    product = labels.get("nvidia.com/gpu.product", "")
    product = product.split("-MIG-")[0].removesuffix("-SHARED")
    return find_model(product.replace("-", " ")) if product else None


def gpu_layouts(entries: Any, count: int) -> dict[int, tuple[bool, tuple[tuple[str, int], ...]]]:
    """GPU index → (MIG enabled, sorted non-zero mig-devices) for a mig-parted config's entries."""
    out: dict[int, tuple[bool, tuple[tuple[str, int], ...]]] = {}
    for entry in entries if isinstance(entries, list) else []:
        devices = entry.get("devices", "all")
        indices = range(count) if devices == "all" else [d for d in devices if isinstance(d, int)]
        devs = tuple(sorted((k, v) for k, v in (entry.get("mig-devices") or {}).items() if v))
        for i in indices:
            out[i] = (bool(entry.get("mig-enabled")), devs)
    return out


def reconfigured_gpus(old: Any, new: Any, count: int) -> set[int] | None:
    """What ``nvidia-mig-parted apply`` destroys going from config ``old`` to ``new``: ``None`` (every
    GPU) when the old layout is unknown or a GPU changes MIG mode (mode.go clears every GPU and
    resets them all), else the GPUs whose mig-devices differ (config.go skips the others)."""
    if old is None:
        return None
    before, after = gpu_layouts(old, count), gpu_layouts(new, count)
    changed = {i for i in after if before.get(i) != after[i]}
    if any(before.get(i, (after[i][0], ()))[0] != after[i][0] for i in after):
        return None
    return changed


def default_mig_configs() -> dict[str, list[dict[str, Any]]]:
    """The operator's built-in config names, generated from the catalogue (one entry per model)."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    for model in MODELS:
        if not model.mig_capable:
            continue
        dfilter = [model.device_filter(d) for d in model.device_ids]
        for prof in model.profiles:
            if prof.media_extensions:
                continue
            count = prof.max_count
            while count > 0 and not place(model, {prof.name: count}).ok:
                count -= 1
            configs.setdefault(f"all-{prof.name}", []).append(
                {
                    "devices": "all",
                    "device-filter": dfilter,
                    "mig-enabled": True,
                    "mig-devices": {prof.name: count},
                }
            )
        by_id = {p.gi_profile_id: p.name for p in model.profiles}
        if model.compute_slices == 7:
            balanced = {by_id[19]: 2, by_id[14]: 1, by_id[9]: 1}
        else:
            small = min(model.profiles, key=lambda p: p.compute_slices)
            mid = next(p for p in model.profiles if p.compute_slices == 2)
            balanced = {small.name: 2, mid.name: 1}
        configs.setdefault("all-balanced", []).append(
            {"devices": "all", "device-filter": dfilter, "mig-enabled": True, "mig-devices": balanced}
        )
    return configs


def check_config(labels: dict[str, str], entries: Any) -> str:
    """'' when the config can be applied to this node's GPUs, else the reason."""
    model = gpu_model_of(labels)
    count = int(labels.get("nvidia.com/gpu.count", "1") or 1)
    if not isinstance(entries, list) or not entries:
        return "config must be a non-empty list of device entries"
    matched = 0
    for entry in entries:
        unknown = set(entry) - ENTRY_FIELDS if isinstance(entry, dict) else {"<not a mapping>"}
        if unknown:
            return f"unknown field(s) {sorted(unknown)} in config entry"
        filt = entry.get("device-filter")
        if filt is not None:
            filters = [filt] if isinstance(filt, str) else list(filt)
            ids = {int(str(f), 16) >> 16 for f in filters}
            if model is None or not ids & set(model.device_ids):
                continue
        devices = entry.get("devices", "all")
        if devices != "all" and not any(isinstance(d, int) and d < count for d in devices):
            continue
        matched += 1
        if entry.get("mig-enabled"):
            if model is None:
                return f"unknown GPU product {labels.get('nvidia.com/gpu.product', '')!r}"
            result = place(model, dict(entry.get("mig-devices") or {}))
            if not result.ok and entry.get("mig-devices"):
                return f"invalid MIG layout: {result.reason}"
    if not matched:
        return "no config entry matches this node's GPUs"
    return ""


def node_resources(labels: dict[str, str], entries: Any) -> dict[str, int]:
    """The extended resources a node with these GFD labels advertises under config ``entries``."""
    count = int(labels.get("nvidia.com/gpu.count", "1") or 1)
    layout = deviceplugin.per_gpu(entries, model=gpu_model_of(labels), count=count)
    replicas = deviceplugin.replicas_of(labels)
    strategy = labels.get(deviceplugin.STRATEGY_LABEL, "mixed") or "mixed"
    return deviceplugin.advertised(layout, strategy=strategy, replicas=replicas)
