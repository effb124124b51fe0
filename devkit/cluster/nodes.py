"""Simulated GPU nodes on the real control plane, from a simulator scenario.

Each scenario node becomes a Node labelled as GPU Feature Discovery and the GPU Operator label it
(``nvidia.com/gpu.product``, ``.count``, ``.memory``, ``nvidia.com/mig.capable``,
``nvidia.com/mig.strategy``, ``nvidia.com/mig.config`` with its state ``success``, the operand
``nvidia.com/gpu.deploy.*`` labels), with the extended resources NVIDIA's device plugin would
advertise for its layout and MIG strategy in ``status.capacity``/``allocatable``
(:mod:`devkit.cluster.deviceplugin`); a node NVIDIA's DRA driver serves (``dra: static|dynamic`` in
the scenario) publishes its ResourceSlices as that driver does (:func:`dra_slices`). KWOK then acts
as the node's kubelet (heartbeats, pods).

Beside the nodes, the GPU Operator's side the rightsizer talks to: the ``gpu-operator`` namespace,
a ClusterPolicy (a minimal CRD of ours for ``clusterpolicies.nvidia.com``: ``spec`` is kept as
given; the operator's full schema is not reproduced) whose ``spec.migManager.config.name`` points at
``default-mig-parted-config``, and that ConfigMap holding every node's current layout (a config per
node, ``observed-<node>``, unless the node uses a built-in name) and the GPU Operator's built-in ``all-*`` configs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from devkit.cluster import deviceplugin, draslices
from devkit.cluster.kubeclient import Kube, KubeError
from devkit.cluster.migconfig import default_mig_configs
from exporter.errors import ScenarioError
from simulator import scenario as scenario_mod

OPERATOR_NAMESPACE = "gpu-operator"
"""Where the GPU Operator runs (its Helm chart's default; OpenShift's OperatorHub install uses
``nvidia-gpu-operator``)."""
DEFAULT_CONFIGMAP = "default-mig-parted-config"
CLUSTER_POLICY = "cluster-policy"
DEPLOY_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
)
CPU_NODES = 2
"""Nodes without GPUs beside the scenario's, as clusters have them."""
NODE_RESOURCES = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}

CLUSTER_POLICY_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "clusterpolicies.nvidia.com"},
    "spec": {
        "group": "nvidia.com",
        "scope": "Cluster",
        "names": {
            "kind": "ClusterPolicy",
            "listKind": "ClusterPolicyList",
            "plural": "clusterpolicies",
            "singular": "clusterpolicy",
        },
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "operator": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                        "properties": {"defaultRuntime": {"type": "string"}},
                                    },
                                    "migManager": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                        "properties": {
                                            "enabled": {"type": "boolean"},
                                            "config": {
                                                "type": "object",
                                                "properties": {
                                                    "name": {"type": "string"},
                                                    "default": {"type": "string"},
                                                },
                                            },
                                        },
                                    },
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


class NodeError(RuntimeError):
    """A scenario that cannot be turned into nodes; one line naming it."""


def _gpu_entries(gpus: Iterable[Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for g in gpus:
        entry: dict[str, Any] = {"devices": [g.index], "mig-enabled": g.mig_enabled}
        if g.mig_enabled:
            entry["mig-devices"] = {k: v for k, v in sorted((g.mig_counts or {}).items()) if v}
        entries.append(entry)
    return entries


def cpu_node(name: str) -> dict[str, Any]:
    """A node without GPUs, where the services' own pods (the adapter, the rightsizer) land."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {},
        "status": {"capacity": dict(NODE_RESOURCES), "allocatable": dict(NODE_RESOURCES)},
    }


def node_object(node: Any, *, config_name: str) -> dict[str, Any]:
    """The Node (labels and status) a scenario node becomes."""
    labels: dict[str, str] = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "nvidia.com/gpu.present": "true",
        **dict.fromkeys(DEPLOY_LABELS, "true"),
        **dict(node.labels),
        "nvidia.com/mig.config": config_name,
        "nvidia.com/mig.config.state": "success",
    }
    layout = {g.index: (dict(g.mig_counts) if g.mig_enabled else None) for g in node.gpus}
    replicas = (
        {"nvidia.com/gpu": max(g.time_slicing for g in node.gpus)}
        if any(g.time_slicing for g in node.gpus)
        else {}
    )
    if replicas:
        labels[deviceplugin.REPLICAS_LABEL] = str(replicas["nvidia.com/gpu"])
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {},
        "status": {"capacity": dict(NODE_RESOURCES), "allocatable": dict(NODE_RESOURCES)},
    }
    resources = deviceplugin.advertised(layout, strategy=node.mig_strategy, replicas=replicas)
    deviceplugin.publish(obj, resources)
    return obj


def add_from_scenario(
    kubeconfig: Path, scenario_path: Path, *, operator_namespace: str = OPERATOR_NAMESPACE
) -> list[str]:
    """Create the GPU Operator's objects and one Node per scenario node; returns the node names."""
    try:
        scen = scenario_mod.load(scenario_path)
    except (ScenarioError, OSError) as exc:
        raise NodeError(f"{scenario_path}: {exc}") from None
    return add_nodes(Kube(kubeconfig), scen.nodes, operator_namespace=operator_namespace)


def dra_slices(node: Any) -> list[dict[str, Any]]:
    """The ResourceSlices NVIDIA's DRA driver publishes for a scenario node it serves (``dra:
    static``: whole GPUs and the MIG instances made ahead of time, each with its UUID; ``dra:
    dynamic``: every placement of every profile a claim could get, without UUID, consuming the GPU's
    shared counters, which a slice of their own holds)."""
    if node.dra not in ("static", "dynamic"):
        return []
    gpus = {g.index: g.uuid for g in node.gpus}
    migs: list[draslices.MigDevice] = []
    for g in node.gpus:
        if node.dra == "static":
            migs += [
                draslices.MigDevice(
                    g.index,
                    i.profile.name,
                    i.profile.gi_profile_id,
                    i.start,
                    i.profile.memory_slices,
                    uuid=i.uuid,
                )
                for i in g.instances
            ]
        elif g.model.mig_capable:
            migs += [
                draslices.MigDevice(g.index, p.name, p.gi_profile_id, start, p.memory_slices)
                for p in g.model.profiles
                if not p.media_extensions
                for start in p.starts
            ]
    release = node.dra_names if node.dra_names in ("v25.12", "v25.8") else "v25.12"
    out = [draslices.resource_slice(node.name, gpus=gpus, migs=migs, release=release)]
    out[0]["metadata"] = {"name": f"{node.name}-{draslices.DRIVER}"}
    if node.dra == "dynamic":
        out.append(draslices.counter_slice(node.name, minors=sorted(gpus)))
    return out


def add_nodes(
    kube: Kube, scenario_nodes: Iterable[Any], *, operator_namespace: str = OPERATOR_NAMESPACE
) -> list[str]:
    nodes = list(scenario_nodes)
    configs = default_mig_configs()
    names: dict[str, str] = {}
    for node in nodes:
        label = node.labels.get("nvidia.com/mig.config", "")
        name = label if label in configs and label != "all-enabled" else f"observed-{node.name}"
        if name.startswith("observed-"):
            configs[name] = _gpu_entries(node.gpus)
        names[node.name] = name
    try:
        ensure_operator(kube, configs, namespace=operator_namespace)
        for node in nodes:
            kube.create(node_object(node, config_name=names[node.name]))
            for rslice in dra_slices(node):
                kube.create(rslice)
        for i in range(CPU_NODES):
            kube.create(cpu_node(f"cpu-{i}"))
    except KubeError as exc:
        raise NodeError(str(exc)) from None
    return [n.name for n in nodes]


def ensure_operator(
    kube: Kube, configs: Mapping[str, list[dict[str, Any]]], *, namespace: str = OPERATOR_NAMESPACE
) -> None:
    """The ClusterPolicy CRD, the operator namespace, the default mig-parted ConfigMap, the policy."""
    kube.apply(CLUSTER_POLICY_CRD)
    kube.wait_established("clusterpolicies.nvidia.com")
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    # the GPU Operator's container-toolkit creates it; GPU pods (the exporter's too) name it
    kube.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
    )
    text = yaml.safe_dump({"version": "v1", "mig-configs": dict(configs)}, sort_keys=True)
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": DEFAULT_CONFIGMAP, "namespace": namespace},
            "data": {"config.yaml": text},
        }
    )
    kube.apply(
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": CLUSTER_POLICY},
            "spec": {
                "operator": {"defaultRuntime": "containerd"},
                "migManager": {
                    "enabled": True,
                    "config": {"name": DEFAULT_CONFIGMAP, "default": "all-disabled"},
                },
            },
        }
    )
