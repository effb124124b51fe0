"""Shared helpers for the apply tests: plans built through the real plan schema, and a seeded double."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rightsizer.apply.applier import Applier, ApplySettings
from rightsizer.clients.kube import Kube
from rightsizer.plan.model import (
    DisruptedPod,
    HeldDevice,
    Plan,
    TargetDevice,
    config_name_for,
    dump_plan,
    plan_from_dict,
    plan_id_for,
)
from tests.support.kubedouble import KubeDouble

H100_FILTER = "0x233010DE"
FAST = ApplySettings(
    configmap_sync_s=0, retry_interval_s=0.02, timeout_s=5, eviction_timeout_s=2, repoint_cluster_policy=True
)
GPU_FAULT = "Xid 79: GPU has fallen off the bus (injected)"


def break_node(kube: KubeDouble, node: str) -> None:
    """The MIG Manager will fail any new config on ``node`` (a failure no plan check can foresee)."""
    kube.mig_settings.failing_nodes[node] = GPU_FAULT


@dataclass(frozen=True)
class Change:
    node: str
    current: str  # current config name (node label)
    layout: Mapping[str, int]  # proposed per-GPU layout (all GPUs)
    gpus: int = 8
    gpus_freed: int = 1


def entries_for(layout: Mapping[str, int]) -> list[dict[str, Any]]:
    return [
        {"devices": "all", "device-filter": H100_FILTER, "mig-enabled": True, "mig-devices": dict(layout)}
    ]


def make_plan(changes: Sequence[Change], *, unchanged: Sequence[str] = ()) -> Plan:
    nodes = []
    configs: dict[str, Any] = {}
    for ch in changes:
        entries = entries_for(ch.layout)
        name = config_name_for(entries)
        configs[name] = entries
        nodes.append(
            {
                "name": ch.node,
                "model": "H100 80GB",
                "pci_device_id": "0x2330",
                "mig_strategy": "mixed",
                "changed": True,
                "current_config_name": ch.current,
                "current": [
                    {"index": i, "mig_enabled": True, "mig_devices": {"1g.10gb": 7}} for i in range(ch.gpus)
                ],
                "proposed": [
                    {"index": i, "mig_enabled": True, "mig_devices": dict(ch.layout)} for i in range(ch.gpus)
                ],
                "config_name": name,
                "config_document": {"version": "v1", "mig-configs": {name: entries}},
                "slices_freed": 7 * ch.gpus_freed,
                "gpus_freed": ch.gpus_freed,
                "expected_utilisation": 0.7,
                "current_utilisation": 0.3,
            }
        )
    for name in unchanged:
        nodes.append(
            {
                "name": name,
                "model": "H100 80GB",
                "pci_device_id": "0x2330",
                "changed": False,
                "current_config_name": "all-balanced",
                "current": [],
                "proposed": [],
                "config_name": "all-balanced",
                "config_document": {},
                "slices_freed": 0,
                "gpus_freed": 0,
                "expected_utilisation": 0.5,
            }
        )
    doc = {
        "schema": "gpupilot.plan/v1",
        "plan_id": "set-below",
        "created_at": "2026-11-29T23:00:00Z",
        "window": {"start": "2026-11-22T23:00:00Z", "end": "2026-11-29T23:00:00Z", "duration": "7d"},
        "prometheus_url": "http://prometheus:9090",
        "settings": {},
        "solver": {"method": "milp", "status": "optimal", "lower_bound_gpus": 0, "seconds": 0.1},
        "totals": {
            "nodes": len(nodes),
            "nodes_changed": len(changes),
            "gpus": 8 * len(nodes),
            "gpus_needed": 0,
            "gpus_freed": sum(c.gpus_freed for c in changes),
            "slices_freed": 0,
            "pods_disrupted": 0,
        },
        "mig_parted_config": {"version": "v1", "mig-configs": configs},
        "nodes": nodes,
    }
    plan = plan_from_dict(doc, source="test-plan")
    return dataclasses.replace(plan, plan_id=plan_id_for(nodes=plan.nodes, window=plan.window))


def write_plan(plan: Plan, path: Path) -> Path:
    dump_plan(plan, path)
    return path


def seed_node(
    kube: KubeDouble, name: str, *, config: str = "all-1g.10gb", pods: int = 2, app: str | None = None
) -> None:
    kube.add_node(name, mig_config=config)
    for i in range(pods):
        kube.add_pod(
            f"{name}-infer-{i}",
            namespace="ml",
            node=name,
            resources={"nvidia.com/mig-1g.10gb": 1},
            labels={"app": app or f"{name}-infer"},
        )
    kube.add_pod(f"{name}-cpu-job", namespace="ml", node=name, resources={"cpu": 1}, labels={"app": "cpu"})


GOOD = {"3g.40gb": 1, "1g.10gb": 4}
"""A per-GPU layout every seeded H100 node can take."""


def run_apply(kube, plan, settings=FAST, progress=None):
    lines: list[tuple[str, str]] = []

    def record(node: str, msg: str) -> None:
        lines.append((node, msg))
        if progress is not None:
            progress(node, msg)

    report = Applier(Kube(kube.api_client()), plan, settings, progress=record).run()
    return report, lines


def resize_plan(
    node: str, current: str, layout: Mapping[str, int], moves: Sequence[tuple[str, str, str]]
) -> Plan:
    """A one-GPU node moved to ``layout``; ``moves``: (namespace, pod, target profile) from 3g.40gb."""
    plan = make_plan([Change(node, current, layout, gpus=1)])
    pods = tuple(
        DisruptedPod(
            namespace=ns,
            name=name,
            devices=(HeldDevice(gpu=0, profile="3g.40gb"),),
            targets=(TargetDevice(node=node, gpu=0, profile=target),),
        )
        for ns, name, target in moves
    )
    nodes = tuple(dataclasses.replace(n, pods_disrupted=pods) for n in plan.nodes)
    return dataclasses.replace(plan, nodes=nodes, plan_id=plan_id_for(nodes=nodes, window=plan.window))
