"""The forged-annotation attack on ``apply``, through the Kubernetes API only, so that it can be played
against any API server: the double (tests/rightsizer/apply/test_apply_forged_node.py) or a real
control plane (build a :class:`Target` with :meth:`Target.from_kubeconfigs`).

Whoever holds one GPU node's kubelet credentials may write its own Node's annotations
(NodeRestriction limits a kubelet's labels, not its annotations). The attack writes the annotations
an in-flight ``apply`` leaves (``gpupilot.io/step``, ``gpupilot.io/workloads``, …) on that node,
naming a workload on another node in no plan (the victim), and lets a real ``apply`` run under the
rightsizer's own identity:

- ``rollback``: on a node the plan does not change; an apply that trusts the node "restores" the
  victim to the forged old request;
- ``forward``: on a node the plan changes, with the plan's id and configs; an apply that trusts the
  node "resumes" it and moves the victim to the forged new request.

What the cluster needs: a MIG node the plan changes and one it does not (the attacker), the
victim Deployment with ``nvidia.com/gpu: 1`` on a third node, the rightsizer's RBAC and admission
policies installed, and the attacker's credentials allowed to get and patch its own Node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes

from rightsizer.apply import protocol as proto
from rightsizer.apply import record
from rightsizer.apply import workloads as wl

VICTIM_NAMESPACE, VICTIM = "payments", "api"
GPU = "nvidia.com/gpu"
FORGED = "nvidia.com/mig-1g.5gb"


@dataclass(frozen=True)
class Target:
    """The API to play against, as three identities (``kubernetes.client.ApiClient`` each)."""

    rightsizer: Any
    """The rightsizer's own (its ServiceAccount: RBAC and admission policies apply)."""
    node: Any
    """The attacking node's kubelet (may get and patch its own Node)."""
    admin: Any
    """Reads what the run changed."""

    @classmethod
    def from_kubeconfigs(cls, *, rightsizer: Path, node: Path, admin: Path) -> Target:
        def client(path: Path) -> Any:
            return kubernetes.config.new_client_from_config(config_file=str(path))

        return cls(rightsizer=client(rightsizer), node=client(node), admin=client(admin))


def forged_workloads(moves: tuple[tuple[str, str, int], ...], *, namespace: str = VICTIM_NAMESPACE) -> str:
    """The ``gpupilot.io/workloads`` annotation naming the victim (in ``namespace``) with ``moves``."""
    victim = wl.Change(
        kind="Deployment",
        namespace=namespace,
        name=VICTIM,
        replicas=1,
        selector={"app": VICTIM},
        moves=moves,
        pods=(f"{namespace}/{VICTIM}-0",),
    )
    return wl.encode([victim])


def forge(
    target: Target,
    node: str,
    *,
    plan_id: str,
    previous: str,
    config: str,
    moves: tuple[tuple[str, str, int], ...],
    namespace: str = VICTIM_NAMESPACE,
) -> dict[str, str]:
    """Write, as the node itself, the annotations of a change left at ``cordoned``; returns them."""
    annotations = {
        proto.ANN_PLAN: plan_id,
        proto.ANN_STEP: str(proto.Step.CORDONED),
        proto.ANN_PREVIOUS: previous,
        proto.ANN_TARGET: config,
        proto.ANN_WAS_UNSCHEDULABLE: "false",
        wl.ANN_WORKLOADS: forged_workloads(moves, namespace=namespace),
        wl.ANN_WORKLOAD_MODE: "patch",
    }
    kubernetes.client.CoreV1Api(target.node).patch_node(node, {"metadata": {"annotations": annotations}})
    return annotations


def rollback_attack(
    target: Target, node: str, *, previous: str, config: str, namespace: str = VICTIM_NAMESPACE
) -> dict[str, str]:
    """On a node the plan leaves alone: "restoring" the victim would move its GPU to :data:`FORGED`."""
    return forge(
        target,
        node,
        plan_id="forged-plan",
        previous=previous,
        config=config,
        moves=((FORGED, GPU, 1),),
        namespace=namespace,
    )


def forward_attack(target: Target, node: str, *, plan_id: str, previous: str, config: str) -> dict[str, str]:
    """On a node the plan changes: "resuming" it would move the victim's GPU to :data:`FORGED`."""
    return forge(target, node, plan_id=plan_id, previous=previous, config=config, moves=((GPU, FORGED, 1),))


def victim(target: Target, namespace: str = VICTIM_NAMESPACE) -> dict[str, Any]:
    """The victim Deployment as the API has it now (plain JSON)."""
    apps = kubernetes.client.AppsV1Api(target.admin)
    obj = apps.read_namespaced_deployment(VICTIM, namespace)
    out: dict[str, Any] = target.admin.sanitize_for_serialization(obj)
    return out


def victim_requests(target: Target, namespace: str = VICTIM_NAMESPACE) -> dict[str, str]:
    """The GPU limits and requests of the victim's containers, summed by name."""
    out: dict[str, str] = {}
    for c in victim(target, namespace)["spec"]["template"]["spec"]["containers"]:
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            for name, value in (res.get(part) or {}).items():
                if name.startswith("nvidia.com/"):
                    out[f"{part}/{name}"] = str(value)
    return out


def node_state(target: Target, node: str) -> Mapping[str, Any]:
    """What the rightsizer could change on the attacking node: its annotations, MIG label, cordon."""
    core = kubernetes.client.CoreV1Api(target.admin)
    obj = target.admin.sanitize_for_serialization(core.read_node(node))
    meta = obj.get("metadata") or {}
    return {
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("gpupilot.io/")
        },
        "config": (meta.get("labels") or {}).get(proto.CONFIG_LABEL),
        "unschedulable": bool((obj.get("spec") or {}).get("unschedulable")),
    }


def node_may_write_record(target: Target, namespace: str) -> int:
    """The status the API answers the attacking node's attempt to create the in-flight record
    (403 where nodes cannot write it)."""
    core = kubernetes.client.CoreV1Api(target.node)
    body = kubernetes.client.V1ConfigMap(
        metadata=kubernetes.client.V1ObjectMeta(name=record.CONFIGMAP, namespace=namespace),
        data={record.DATA_KEY: "{}"},
    )
    try:
        core.create_namespaced_config_map(namespace, body)
    except kubernetes.client.ApiException as exc:
        return int(exc.status)
    return 201
