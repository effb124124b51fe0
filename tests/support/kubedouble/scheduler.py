"""A scheduler for the double: binds Pending pods where their extended resources fit.

``kube-scheduler``'s ``NodeResourcesFit`` filter (``pkg/scheduler/framework/plugins/noderesources/fit.go``)
for the resources GPU pods ask for: a pod fits a node when, for every ``nvidia.com/*`` resource it
requests, the node's ``status.allocatable`` minus what the pods bound to it request (terminating ones
too: they hold their devices until they are gone) covers it. Unschedulable (cordoned) and NotReady
nodes are filtered out (``NodeUnschedulable``), and so are nodes whose labels miss the pod's ``nodeSelector``. A pod that fits nowhere stays ``Pending`` with the
condition ``PodScheduled=False``, reason ``Unschedulable`` and the scheduler's message
("0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient nvidia.com/mig-3g.40gb."),
and a ``FailedScheduling`` Event, as ``kubectl describe pod`` shows them.

CPU and memory are not modelled (the double's nodes have plenty). A bound pod starts at once:
``Running`` and ``Ready``. Pods placed by the older ReplicaSet rule (``kube.add_replicaset(...,
replacement_node=)``) carry :data:`PLACED_BY_RULE` and are left to it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tests.support.kubedouble.store import Store, now_rfc3339

PODS = "/pods"
NODES = "/nodes"
PLACED_BY_RULE = "kubedouble.test/placed-by-rule"
"""Pod annotation: the ReplicaSet's ``kubedouble/replacement-node`` rule places this pod, not the scheduler."""


def quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def gpu_requests(pod: dict[str, Any]) -> Counter[str]:
    """``nvidia.com/*`` requests of the pod (limits stand for requests of extended resources)."""
    out: Counter[str] = Counter()
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in merged.items():
            if name.startswith("nvidia.com/"):
                out[name] += quantity(value)
    return out


def _schedulable(node: dict[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _pending(pod: dict[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    return (
        not (pod.get("spec") or {}).get("nodeName")
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
        and not meta.get("deletionTimestamp")
        and PLACED_BY_RULE not in (meta.get("annotations") or {})
    )


class Scheduler:
    def __init__(self, store: Store) -> None:
        self.store = store

    def hook(self, skey: str) -> None:
        if skey in (PODS, NODES):
            self.schedule()

    def schedule(self) -> None:
        pods = self.store.view(PODS)
        pending = sorted(
            (p for p in pods if _pending(p)),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        if not pending:
            return
        nodes = {n["metadata"]["name"]: n for n in self.store.view(NODES)}
        used: dict[str, Counter[str]] = {name: Counter() for name in nodes}
        for p in pods:
            bound = (p.get("spec") or {}).get("nodeName")
            if bound in used and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                used[bound] += gpu_requests(p)
        for pod in pending:
            need = gpu_requests(pod)
            short: Counter[str] = Counter()
            chosen = ""
            for name in sorted(nodes):
                node = nodes[name]
                if not _schedulable(node):
                    short["node(s) were unschedulable"] += 1
                    continue
                wanted = (pod.get("spec") or {}).get("nodeSelector") or {}
                labels = node["metadata"].get("labels") or {}
                if any(labels.get(k) != v for k, v in wanted.items()):
                    short["node(s) didn't match Pod's node affinity/selector"] += 1
                    continue
                alloc = (node.get("status") or {}).get("allocatable") or {}
                missing = [r for r, q in need.items() if quantity(alloc.get(r, 0)) - used[name][r] < q]
                if missing:
                    short[f"Insufficient {missing[0]}"] += 1
                    continue
                chosen = name
                break
            if chosen:
                used[chosen] += need
                self._bind(pod, chosen)
            else:
                reasons = ", ".join(f"{n} {why}" for why, n in sorted(short.items()))
                message = f"0/{len(nodes)} nodes are available: {reasons or 'no nodes'}."
                self._unschedulable(pod, message)

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        ns, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
        now = now_rfc3339()

        def change(o: dict[str, Any]) -> None:
            o["spec"]["nodeName"] = node
            o["status"] = {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now},
                ],
            }

        self.store.update(PODS, ns, name, change)
        self.store.record("schedule", "pods", ns, name, node=node)

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        ns, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "PodScheduled" and c.get("message") == message for c in conditions):
            return

        def change(o: dict[str, Any]) -> None:
            o["status"] = {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": message,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ],
            }

        self.store.update(PODS, ns, name, change)
        self.store.put(
            "events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{name}.{self.store.resource_version + 1:x}", "namespace": ns},
                "involvedObject": {"kind": "Pod", "name": name, "namespace": ns},
                "reason": "FailedScheduling",
                "message": message,
                "type": "Warning",
                "source": {"component": "default-scheduler"},
            },
            event="ADDED",
        )
