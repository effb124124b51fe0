"""NVIDIA device-plugin configs (time-slicing, MPS): build, find and check them.

The form is k8s-device-plugin v0.20's config file (``version: v1``, ``flags``, ``resources``,
``sharing.timeSlicing`` / ``sharing.mps`` each ``{renameByDefault, failRequestsGreaterThanOne,
resources[{name, rename, devices, replicas}]}``, ``imex``), stored in a ConfigMap under a key that
``ClusterPolicy.spec.devicePlugin.config.default`` (or a node's ``nvidia.com/device-plugin.config``
label) names, as in the seed's ``time-slicing-config``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SHARING_FIELDS = ("version", "flags", "resources", "sharing", "imex")
"""Top-level fields of k8s-device-plugin v0.20's config file (``api/config/v1``, ``Config``)."""
SHARING_BLOCKS = ("timeSlicing", "mps")
REPLICATED_FIELDS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")
RESOURCE_FIELDS = ("name", "rename", "replicas", "devices")
NAMING_FIELDS = ("pattern", "name")
IMEX_FIELDS = ("channelIDs", "required")
MIG_STRATEGIES = ("none", "single", "mixed")
_DEVICE_REF = re.compile(
    r"^(\d+|\d+:\d+|GPU-[0-9a-fA-F-]{36}|MIG-[0-9a-fA-F-]{36}|MIG-GPU-[0-9a-fA-F-]{36}/\d+/\d+)$"
)
_RESOURCE_NAME = re.compile(r"^(nvidia\.com/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")


@dataclass(frozen=True)
class SharingConfig:
    source: str
    document: Mapping[str, Any]


def sharing_document(
    *, replicas: int, resource: str = "nvidia.com/gpu", mig_strategy: str = "none"
) -> dict[str, Any]:
    """A device-plugin config that advertises each GPU ``replicas`` times; a pod asking for more than
    one replica is refused (``failRequestsGreaterThanOne``, as NVIDIA recommends: two replicas of one
    GPU give no more of it)."""
    if replicas < 2:
        raise ValueError("time-slicing needs at least 2 replicas")
    return {
        "version": "v1",
        "flags": {"migStrategy": mig_strategy},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": False,
                "failRequestsGreaterThanOne": True,
                "resources": [{"name": resource, "replicas": replicas}],
            }
        },
    }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _resource_name(value: object) -> str | None:
    """The full resource name (the plugin prefixes a bare name with ``nvidia.com/``), None if invalid."""
    if not isinstance(value, str) or not _RESOURCE_NAME.match(value):
        return None
    return value if value.startswith("nvidia.com/") else f"nvidia.com/{value}"


def _devices_problem(devices: object) -> str:
    if devices == "all":
        return ""
    if _is_int(devices):
        return "" if int(str(devices)) > 0 else "a count of devices must be > 0"
    if isinstance(devices, list):
        bad = [
            d
            for d in devices
            if not ((_is_int(d) and int(str(d)) >= 0) or (isinstance(d, str) and _DEVICE_REF.match(d)))
        ]
        return f"unsupported device {bad[0]!r} (GPU index, MIG index i:j, GPU or MIG UUID)" if bad else ""
    return f"must be 'all', a count or a list of devices, got {devices!r}"


def _replicated(block: object, where: str) -> list[str]:
    """Problems of one ``sharing.timeSlicing`` / ``sharing.mps`` block (``ReplicatedResources``)."""
    if not isinstance(block, dict):
        return [f"{where} must be a mapping with resources"]
    errs = [f"{where}: unknown field {k!r}" for k in block if k not in REPLICATED_FIELDS]
    for flag in ("renameByDefault", "failRequestsGreaterThanOne"):
        if flag in block and not isinstance(block[flag], bool):
            errs.append(f"{where}.{flag} must be true or false, got {block[flag]!r}")
    resources = block.get("resources")
    if not isinstance(resources, list) or not resources:
        errs.append(f"{where}.resources must be a non-empty list")
        return errs
    for i, res in enumerate(resources):
        at = f"{where}.resources[{i}]"
        if not isinstance(res, dict):
            errs.append(f"{at} must be a mapping with name and replicas")
            continue
        errs += [f"{at}: unknown field {k!r}" for k in res if k not in RESOURCE_FIELDS]
        if _resource_name(res.get("name")) is None:
            errs.append(f"{at}.name must be a resource like nvidia.com/gpu, got {res.get('name')!r}")
        if "rename" in res and _resource_name(res.get("rename")) is None:
            errs.append(
                f"{at}.rename must be a resource name like nvidia.com/gpu.shared, got {res.get('rename')!r}"
            )
        replicas = res.get("replicas")
        if not _is_int(replicas) or int(str(replicas)) < 2:
            errs.append(f"{at}.replicas must be an integer >= 2, got {replicas!r}")
        if "devices" in res and (why := _devices_problem(res["devices"])):
            errs.append(f"{at}.devices: {why}")
    return errs


def _naming_problems(naming: object, src: str) -> list[str]:
    if not isinstance(naming, dict):
        return [f"{src}: resources must be a mapping with gpus and mig lists"]
    errs = []
    for kind, entries in naming.items():
        if kind not in ("gpus", "mig") or not isinstance(entries, list):
            errs.append(f"{src}: resources.{kind}: expected gpus or mig, each a list of pattern and name")
            continue
        for i, e in enumerate(entries):
            if (
                not isinstance(e, dict)
                or set(e) - set(NAMING_FIELDS)
                or "pattern" not in e
                or "name" not in e
            ):
                errs.append(f"{src}: resources.{kind}[{i}] must be a mapping with pattern and name")
    return errs


def _imex_problems(imex: object, src: str) -> list[str]:
    if not isinstance(imex, dict):
        return [f"{src}: imex must be a mapping with channelIDs and required"]
    errs = [f"{src}: imex: unknown field {k!r}" for k in imex if k not in IMEX_FIELDS]
    ids = imex.get("channelIDs", [])
    if not isinstance(ids, list) or not all(_is_int(c) and int(str(c)) >= 0 for c in ids):
        errs.append(f"{src}: imex.channelIDs must be a list of channel numbers, got {ids!r}")
    if "required" in imex and not isinstance(imex["required"], bool):
        errs.append(f"{src}: imex.required must be true or false, got {imex['required']!r}")
    return errs


def check(config: SharingConfig) -> list[str]:
    """Problems of one device-plugin config file, each a one-line message naming the field. Every
    config the plugin (v0.20) accepts passes: flags only, ``resources``, ``sharing.timeSlicing`` and/or
    ``sharing.mps``, ``imex``; an absent ``version`` means v1, as in the plugin."""
    doc = config.document
    src = config.source
    if not isinstance(doc, dict):
        return [f"{src}: expected a mapping with {', '.join(SHARING_FIELDS)}"]
    errs = [f"{src}: unknown field {k!r}" for k in doc if k not in SHARING_FIELDS]
    if doc.get("version", "v1") != "v1":
        errs.append(f"{src}: version must be v1, got {doc.get('version')!r}")
    flags = doc.get("flags") or {}
    if not isinstance(flags, dict):
        errs.append(f"{src}: flags must be a mapping (migStrategy, failOnInitError, plugin, gfd, ...)")
    elif flags.get("migStrategy", "none") not in MIG_STRATEGIES:
        errs.append(
            f"{src}: flags.migStrategy must be one of {', '.join(MIG_STRATEGIES)}, got {flags.get('migStrategy')!r}"
        )
    errs += _naming_problems(doc.get("resources") or {}, src) + _imex_problems(doc.get("imex") or {}, src)
    sharing = doc.get("sharing")
    if sharing is None:
        return errs
    if not isinstance(sharing, dict):
        errs.append(f"{src}: sharing must be a mapping with timeSlicing and/or mps")
        return errs
    errs += [f"{src}: sharing: unknown field {k!r}" for k in sharing if k not in SHARING_BLOCKS]
    for block in SHARING_BLOCKS:
        if sharing.get(block) is not None:
            errs += _replicated(sharing[block], f"{src}: sharing.{block}")
    return errs
