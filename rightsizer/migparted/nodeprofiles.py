"""The MIG Manager's per-node profile list (v26.3+): the node's own truth about its GPU.

Since GPU Operator v26.3 the MIG Manager queries NVML at start and writes, per node, a ConfigMap
``<node>-mig-config`` holding a mig-parted document of the configs that node's GPU supports
(``all-<profile>`` with the most instances that fit). Every profile name in it is one NVML reported
on that node, with mig-parted's own naming, so it is the authority for that node: a GPU released
after our catalogue still works, and a driver that names profiles differently is caught.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from mig_geometry.catalogue import GpuModel, find_model
from rightsizer.migparted.applicability import NodeProfiles, validate
from rightsizer.migparted.config import MigPartedError, parse_document
from rightsizer.migparted.manifest import load_manifest

SUFFIX = "-mig-config"


def configmap_name(node: str) -> str:
    return f"{node}{SUFFIX}"


def model_from_labels(labels: Mapping[str, str]) -> GpuModel | None:
    """The GPU model from GPU Feature Discovery's ``nvidia.com/gpu.product`` label."""
    product = str(labels.get("nvidia.com/gpu.product", ""))
    for suffix in ("-SHARED",):
        product = product.removesuffix(suffix)
    product = product.split("-MIG-", 1)[0]
    return find_model(product) if product else None


def from_configmap(cm: Mapping[str, Any], *, node: str, device_id: int | None) -> NodeProfiles:
    """Profile name → most instances per GPU, from every mig-parted config the ConfigMap holds."""
    source = f"ConfigMap {configmap_name(node)}"
    found = load_manifest(yaml.safe_dump(dict(cm)), source=source)
    problems = [i.line() for doc in found.mig for i in doc.issues]
    if problems:
        raise MigPartedError(problems[0])
    if not found.mig:
        raise MigPartedError(f"{source}: no mig-parted config under data")
    counts: dict[str, int] = {}
    filters: set[int] = set()
    for doc in found.mig:
        for entries in doc.configs.values():
            for entry in entries:
                filters.update(entry.device_filter)
                for name, count in entry.mig_devices.items():
                    counts[name] = max(counts.get(name, 0), count)
    if device_id is None and len(filters) == 1:
        device_id = next(iter(filters))
    return NodeProfiles(node=node, device_id=device_id, max_counts=counts)


def disagreements(node: NodeProfiles, model: GpuModel | None) -> list[str]:
    """Where the node's list and the catalogue differ (names, maximum counts)."""
    if model is None:
        return [
            f"node {node.node}: its GPU is not in the geometry catalogue; using the "
            f"{len(node.max_counts)} profile(s) its MIG Manager lists"
        ]
    out = []
    for name, count in sorted(node.max_counts.items()):
        prof = model.compute_profile(name)
        if prof is None:
            out.append(
                f"node {node.node}: its MIG Manager offers {name}, which the catalogue's {model.key} lacks"
            )
        elif prof[0].max_count < count and prof[1] == prof[0].compute_slices:
            out.append(
                f"node {node.node}: its MIG Manager allows {name}×{count}; the catalogue says at most "
                f"{prof[0].max_count}"
            )
    offered = set(node.max_counts)
    for gi in model.profiles:
        if not gi.media_extensions and not offered.intersection(gi.names):
            out.append(
                f"node {node.node}: the catalogue's {model.key} has {gi.name}; its MIG Manager does not list it"
            )
    return out


def veto(
    cm: Mapping[str, Any] | None,
    *,
    node: str,
    device_id: int | None,
    config_name: str,
    document: Mapping[str, Any],
) -> str | None:
    """Why the node's own profile list refuses ``config_name`` of ``document``; ``None``: no objection.

    No per-node ConfigMap (MIG Manager before v26.3) is no objection: the catalogue decided already.
    """
    if cm is None:
        return None
    node_profiles = from_configmap(cm, node=node, device_id=device_id)
    raw = (document.get("mig-configs") or {}).get(config_name)
    parsed = parse_document({"version": "v1", "mig-configs": {config_name: raw}}, source=config_name)
    result = validate([parsed], device_id=device_id, node=node_profiles)
    problems = [v.reason for v in result.verdicts if v.error] + [i.reason for i in result.structural]
    return problems[0] if problems else None
