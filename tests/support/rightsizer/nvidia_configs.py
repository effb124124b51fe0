"""Test configs built from NVIDIA's published facts (not copies of NVIDIA's files).

The facts: which config names the GPU Operator's default MIG Manager ConfigMap
(``default-mig-parted-config``) defines, which of them carry a ``device-filter`` and for which PCI
ids, and their counts; how mig-parted's Hopper/Blackwell example names GB200's profiles (the
189 GiB set) and how its MIG Manager example ships a DaemonSet, a ServiceAccount and RBAC objects
in the same file as the ConfigMap. Layout here is our own: Python data dumped with PyYAML.
"""

from __future__ import annotations

from typing import Any

import yaml

A100_40 = ["0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"]
EIGHTY = [
    "0x233010DE",
    "0x233110DE",
    "0x232210DE",
    "0x20B210DE",
    "0x20B510DE",
    "0x20F310DE",
    "0x20F510DE",
    "0x232410DE",
]
H100_NVL = ["0x232110DE", "0x233A10DE"]
H100_96 = ["0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"]
H200 = ["0x233510DE", "0x233B10DE"]

# Unfiltered single-profile configs of the default ConfigMap: name → count ("all-<name>").
UNFILTERED_SINGLE = {
    "1g.5gb": 7, "1g.5gb+me": 1, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1,
    "1g.24gb+gfx": 4, "1g.24gb+me.all": 1, "1g.24gb-me": 4, "2g.48gb": 2, "2g.48gb+gfx": 2,
    "2g.48gb+me.all": 1, "2g.48gb-me": 2, "4g.96gb": 1, "4g.96gb+gfx": 1,
    "1g.10gb+me": 1, "1g.20gb": 4, "1g.23gb": 7, "1g.23gb+me": 1, "1g.24gb+me": 1,
    "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1,
    "1g.6gb": 4, "1g.6gb+me": 1, "2g.12gb": 2, "2g.12gb+me": 1, "4g.24gb": 1,
    "1g.12gb": 7, "1g.12gb+me": 1, "1g.24gb": 4, "1g.45gb": 4, "1g.47gb": 4,
    "2g.24gb": 3, "2g.45gb": 3, "2g.47gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1,
    "3g.48gb": 2, "3g.90gb": 2, "3g.93gb": 2, "3g.95gb": 2, "4g.48gb": 1, "4g.90gb": 1,
    "4g.93gb": 1, "4g.95gb": 1, "7g.96gb": 1, "7g.180gb": 1, "7g.186gb": 1, "7g.189gb": 1,
    "1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1,
    "7g.141gb": 1, "1g.36gb": 4, "2g.36gb": 3, "3g.72gb": 2, "4g.72gb": 1, "7g.144gb": 1,
}  # fmt: skip

# all-balanced: (device-filter, mig-devices) per product, as the default ConfigMap lists them
# The B300 and GB300 rows are ours, in the same pattern (newer default ConfigMaps filter 0x3182 and
# 0x31C2; their exact rows were not available).
BALANCED: list[tuple[Any, dict[str, int]]] = [
    (["0x294110DE"], {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}),
    (["0x2BB510DE"], {"1g.24gb": 2, "2g.48gb": 1}),
    (["0x290110DE"], {"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}),
    (["0x234810DE"], {"1g.18gb": 2, "2g.36gb": 1, "3g.72gb": 1}),
    (H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
    (H100_NVL, {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}),
    (EIGHTY, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
    (A100_40, {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
    ("0x20B710DE", {"1g.6gb": 2, "2g.12gb": 1}),
    (H100_96, {"1g.12gb": 2, "2g.24gb": 1, "3g.48gb": 1}),
    (["0x318210DE"], {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}),
    (["0x31C210DE"], {"1g.35gb": 2, "2g.70gb": 1, "3g.139gb": 1}),
]

NAMED_DEVICE_IDS = sorted(
    {int(f, 16) >> 16 for flt, _ in BALANCED for f in ([flt] if isinstance(flt, str) else flt)}
)
"""Every device the default-like ConfigMap names in a filter: it must pass for each."""


def _entry(mig: dict[str, int] | None, device_filter: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if device_filter is not None:
        out["device-filter"] = device_filter
    out["devices"] = "all"
    out["mig-enabled"] = mig is not None
    if mig is not None:
        out["mig-devices"] = mig
    return out


def default_like_configs() -> dict[str, Any]:
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [_entry(None)],
        "all-enabled": [_entry({})],
        "all-1g.10gb": [_entry({"1g.10gb": 7}, EIGHTY), _entry({"1g.10gb": 4}, A100_40)],
        "all-balanced": [_entry(mig, flt) for flt, mig in BALANCED],
    }
    for name, count in UNFILTERED_SINGLE.items():
        configs[f"all-{name.replace('+', '.')}"] = [_entry({name: count})]
    return {"version": "v1", "mig-configs": configs}


def default_like_configmap() -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "default-mig-parted-config", "namespace": "gpu-operator"},
        "data": {"config.yaml": yaml.safe_dump(default_like_configs(), sort_keys=False)},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def manager_example_manifest() -> str:
    """DaemonSet + ServiceAccount + ClusterRole + ClusterRoleBinding + the ConfigMap, one file."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-mig-manager", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "nvidia-mig-manager"}},
                "template": {
                    "metadata": {"labels": {"app": "nvidia-mig-manager"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "nvidia-mig-manager",
                                "env": [{"name": "CONFIG_FILE", "value": "/mig-parted-config/config.yaml"}],
                            }
                        ]
                    },
                },
            },
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nvidia-mig-manager"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "nvidia-mig-manager-role"},
            "rules": [{"apiGroups": [""], "resources": ["*"], "verbs": ["*"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "nvidia-mig-manager-role-binding"},
            "roleRef": {"kind": "ClusterRole", "name": "nvidia-mig-manager-role"},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "mig-parted-config", "namespace": "default"},
            "data": {"config.yaml": yaml.safe_dump(hopper_blackwell_example(), sort_keys=False)},
        },
    ]
    return yaml.safe_dump_all(objects, sort_keys=False, explicit_start=True)


def hopper_blackwell_example() -> dict[str, Any]:
    """mig-parted's Hopper/Blackwell example facts: GB200 with the 189 GiB names, unfiltered all-*."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [_entry(None)],
        "all-1g.10gb": [_entry({"1g.10gb": 7})],
        "all-1g.18gb": [_entry({"1g.18gb": 7})],
        "all-1g.24gb": [_entry({"1g.24gb": 7}, ["0x294110DE"]), _entry({"1g.24gb": 4}, ["0x232110DE"])],
        "all-3g.95gb": [_entry({"3g.95gb": 2})],
        "all-7g.189gb": [_entry({"7g.189gb": 1})],
        "all-balanced": [
            _entry({"1g.24gb": 2, "2g.47gb": 1, "3g.95gb": 1}, ["0x294110DE"]),
            _entry({"1g.23gb": 2, "2g.45gb": 1, "3g.90gb": 1}, ["0x290110DE"]),
            _entry({"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, H200),
            _entry({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, ["0x233110DE", "0x233010DE", "0x232210DE"]),
            _entry({"1g.12gb": 1, "2g.24gb": 1, "3g.47gb": 1}, H100_NVL),
        ],
    }
    return {"version": "v1", "mig-configs": configs}
