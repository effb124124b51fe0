"""NVIDIA device-plugin sharing configs (time-slicing): build, find and check them.

The form is the device plugin's config file (``version: v1``, ``flags.migStrategy``,
``sharing.timeSlicing.resources[{name, replicas}]``), stored in a ConfigMap under a key that
``ClusterPolicy.spec.devicePlugin.config.default`` (or a node's ``nvidia.com/device-plugin.config``
label) names, as in the seed's ``time-slicing-config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SHARING_FIELDS = ("version", "flags", "sharing")
TIME_SLICING_FIELDS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
RESOURCE_FIELDS = ("name", "rename", "replicas", "devices")
MIG_STRATEGIES = ("none", "single", "mixed")


@dataclass(frozen=True)
class SharingConfig:
    source: str
    document: Mapping[str, Any]


def sharing_document(
    *, replicas: int, resource: str = "nvidia.com/gpu", mig_strategy: str = "none"
) -> dict[str, Any]:
    """A device-plugin config that advertises each GPU ``replicas`` times."""
    if replicas < 2:
        raise ValueError("time-slicing needs at least 2 replicas")
    return {
        "version": "v1",
        "flags": {"migStrategy": mig_strategy},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": False,
                "resources": [{"name": resource, "replicas": replicas}],
            }
        },
    }


def check(config: SharingConfig) -> list[str]:
    """Problems of one device-plugin config, each a one-line message naming the field."""
    doc = config.document
    src = config.source
    if not isinstance(doc, dict):
        return [f"{src}: expected a mapping with {', '.join(SHARING_FIELDS)}"]
    errs = [f"{src}: unknown field {k!r}" for k in doc if k not in SHARING_FIELDS]
    if doc.get("version") != "v1":
        errs.append(f"{src}: version must be v1, got {doc.get('version')!r}")
    flags = doc.get("flags") or {}
    strategy = flags.get("migStrategy", "none") if isinstance(flags, dict) else None
    if strategy not in MIG_STRATEGIES:
        errs.append(f"{src}: flags.migStrategy must be one of {', '.join(MIG_STRATEGIES)}, got {strategy!r}")
    ts = (doc.get("sharing") or {}).get("timeSlicing") if isinstance(doc.get("sharing"), dict) else None
    if not isinstance(ts, dict):
        errs.append(f"{src}: sharing.timeSlicing must be a mapping")
        return errs
    errs += [f"{src}: sharing.timeSlicing: unknown field {k!r}" for k in ts if k not in TIME_SLICING_FIELDS]
    resources = ts.get("resources")
    if not isinstance(resources, list) or not resources:
        errs.append(f"{src}: sharing.timeSlicing.resources must be a non-empty list")
        return errs
    for i, res in enumerate(resources):
        where = f"{src}: sharing.timeSlicing.resources[{i}]"
        if not isinstance(res, dict):
            errs.append(f"{where} must be a mapping with name and replicas")
            continue
        errs += [f"{where}: unknown field {k!r}" for k in res if k not in RESOURCE_FIELDS]
        name = res.get("name")
        if not isinstance(name, str) or not name.startswith("nvidia.com/"):
            errs.append(f"{where}.name must be a resource like nvidia.com/gpu, got {name!r}")
        replicas = res.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
            errs.append(f"{where}.replicas must be an integer >= 2, got {replicas!r}")
    return errs
