"""Seed a double with the cluster a ``plan.json`` describes: its nodes on their current layouts, and
the GPU pods it saw (disrupted and kept) as Deployments' pods holding the devices the plan names.

This is the simulated cluster of the demo (``make demo`` applies its plan to it). From the plan:

- every node, with its GPU model, GPU count, MIG strategy and ``nvidia.com/mig.config`` label (the
  plan's ``current_config_name``, or ``observed-<node>`` when unknown), the MIG Manager knowing that
  config as the plan's ``current`` layouts (added to the operator's default ConfigMap);
- every pod the plan lists, bound to its node, Running and Ready, asking for its devices
  (``nvidia.com/mig-<profile>`` under the mixed strategy, ``nvidia.com/gpu`` for whole GPUs and under
  single), owned by a ReplicaSet of a Deployment named after the pod (``<deployment>-<hash>-<id>``)
  with a ``nodeSelector`` on that node. Pods of one deployment that ask for different devices or run
  on different nodes become Deployments of their own (``<deployment>``, ``<deployment>-2``, …): one
  template cannot ask for two things.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tests.support.kubedouble.double import KubeDouble
from tests.support.kubedouble.migmanager import GPU_INDICES_ANNOTATION
from tests.support.kubedouble.store import now_rfc3339
from tests.support.kubedouble.workloads import DEPLOYMENTS, REPLICASETS, template_hash

CONFIGMAP = "/configmaps"


def _deployment_of(pod_name: str) -> str:
    parts = pod_name.rsplit("-", 2)
    return parts[0] if len(parts) == 3 else pod_name


def _requests(pod: dict[str, Any], strategy: str) -> dict[str, str]:
    out: Counter[str] = Counter()
    for d in pod.get("devices") or []:
        profile = d.get("profile") or ""
        out["nvidia.com/gpu" if not profile or strategy == "single" else f"nvidia.com/mig-{profile}"] += 1
    return {k: str(v) for k, v in sorted(out.items())}


def _entries(current: list[dict[str, Any]], pci_device_id: str) -> list[dict[str, Any]]:
    out = []
    for g in current:
        entry: dict[str, Any] = {"devices": [int(g["index"])], "mig-enabled": bool(g.get("mig_enabled"))}
        if pci_device_id:  # one config name may hold several models' layouts (mig-parted's device-filter)
            entry["device-filter"] = f"{pci_device_id}10DE"
        if g.get("mig_enabled"):
            entry["mig-devices"] = {k: int(v) for k, v in (g.get("mig_devices") or {}).items()}
        out.append(entry)
    return out


def seed(kube: KubeDouble, plan: dict[str, Any]) -> dict[str, int]:
    """Add the plan's nodes and pods; returns counts (nodes, deployments, pods)."""
    nodes = [n for n in plan.get("nodes") or [] if n.get("current")]
    configs: dict[str, list[dict[str, Any]]] = {}
    names: dict[str, str] = {}
    for n in nodes:
        name = n.get("current_config_name") or f"observed-{n['name']}"
        names[n["name"]] = name
        entries = _entries(n["current"], str(n.get("pci_device_id") or ""))
        known = configs.setdefault(name, [])
        if not any(e.get("device-filter") == entries[0].get("device-filter") for e in known):
            known.extend(entries)  # a second node of the same model keeps the first's layout
    cm_name = kube.mig_settings.default_configmap

    def add_configs(obj: dict[str, Any]) -> None:
        doc = yaml.safe_load(obj["data"]["config.yaml"])
        doc["mig-configs"].update(configs)
        obj["data"]["config.yaml"] = yaml.safe_dump(doc, sort_keys=False)

    kube.store.update(CONFIGMAP, kube.mig_settings.namespace, cm_name, add_configs)
    for n in nodes:
        kube.add_node(
            n["name"],
            model=n["model"],
            gpus=len(n["current"]),
            mig_config=names[n["name"]],
            strategy=n.get("mig_strategy") or "mixed",
        )
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {}
    for n in nodes:
        strategy = n.get("mig_strategy") or "mixed"
        for pod in [*(n.get("pods_disrupted") or []), *(n.get("pods_kept") or [])]:
            req = _requests(pod, strategy)
            if not req:
                continue
            key = (pod["namespace"], _deployment_of(pod["name"]), n["name"], json.dumps(req))
            groups.setdefault(key, []).append(pod)
    used: Counter[tuple[str, str]] = Counter()
    pods = 0
    for (ns, base, node, req_text), members in sorted(groups.items()):
        used[(ns, base)] += 1
        name = base if used[(ns, base)] == 1 else f"{base}-{used[(ns, base)]}"
        add_deployment(kube, namespace=ns, name=name, node=node, requests=json.loads(req_text), pods=members)
        pods += len(members)
    return {"nodes": len(nodes), "deployments": len(groups), "pods": pods}


def add_deployment(
    kube: KubeDouble,
    *,
    namespace: str,
    name: str,
    node: str,
    requests: dict[str, str],
    pods: list[dict[str, Any]],
) -> None:
    """A Deployment (``nodeSelector`` on ``node``, one container asking ``requests``) whose current
    ReplicaSet owns ``pods`` (plan-shaped: ``name`` and ``devices`` with their ``gpu``; a pod without
    GPU indices may hold any GPU of the node), bound to ``node``, Running and Ready."""
    ns, members = namespace, pods
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/app:1",
                    "resources": {"limits": dict(requests), "requests": dict(requests)},
                }
            ],
        },
    }
    h = template_hash(template)
    deploy_uid, rs_uid = f"uid-deploy-{ns}-{name}", f"uid-rs-{ns}-{name}"
    labels = {"app": name, "pod-template-hash": h}
    with kube.store.lock:  # pods, then their ReplicaSet, then the Deployment: no spurious replacements
        for pod in members:
            gpus = sorted({int(d["gpu"]) for d in pod.get("devices") or [] if "gpu" in d})
            held = {GPU_INDICES_ANNOTATION: ",".join(map(str, gpus))} if gpus else {}
            kube.store.put(
                "/pods",
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": pod["name"],
                        "namespace": ns,
                        "labels": labels,
                        "annotations": held,
                        "ownerReferences": [
                            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{name}-{h}",
                             "uid": rs_uid, "controller": True}
                        ],
                    },
                    "spec": {**json.loads(json.dumps(template["spec"])), "nodeName": node},
                    "status": {
                        "phase": "Running",
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}],
                    },
                },
                event="ADDED",
            )  # fmt: skip
        kube.store.put(
            REPLICASETS,
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"{name}-{h}",
                    "namespace": ns,
                    "uid": rs_uid,
                    "labels": labels,
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "uid": deploy_uid, "controller": True}
                    ],
                },
                "spec": {
                    "replicas": len(members),
                    "selector": {"matchLabels": labels},
                    "template": {**template, "metadata": {"labels": labels}},
                },
            },
            event="ADDED",
        )  # fmt: skip
        kube.store.put(
            DEPLOYMENTS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns, "uid": deploy_uid, "generation": 1},
                "spec": {
                    "replicas": len(members),
                    "selector": {"matchLabels": {"app": name}},
                    "template": template,
                },
            },
            event="ADDED",
        )


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc
