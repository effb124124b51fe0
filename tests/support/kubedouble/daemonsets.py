"""A simulated DaemonSet controller: one pod per node whose labels the pod template's
``nodeSelector`` and required node affinity match; a pod leaves a node whose labels stop matching.

That is the mechanism behind the GPU Operator's pause protocol: the MIG Manager relabels a node
(``nvidia.com/gpu.deploy.*=paused-for-mig-change``) and the DaemonSet controller, not the MIG
Manager, removes the paused pods. ``delete_delay_s`` is how long a removed pod lingers (with a
``deletionTimestamp``) before it is gone, as a terminating pod does; the MIG Manager must wait for
the pods to be *gone*. Every create and delete is journalled as a ``daemonset-controller`` action.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from tests.support.kubedouble.store import Store, now_rfc3339

DAEMONSETS = "apps/daemonsets"


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise ValueError(f"node affinity operator {op!r} is not simulated")


def node_matches(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """``nodeSelector`` (all keys equal) AND required node affinity (terms ORed, expressions ANDed)."""
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions") or []) for term in terms
    )


class DaemonSetController:
    def __init__(self, store: Store, *, delete_delay_s: float = 0.0, poll_s: float = 0.05) -> None:
        self.store = store
        self.delete_delay_s = delete_delay_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubedouble-daemonsets", daemon=True)
        self._removing: set[tuple[str, str]] = set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.store.closed:
            self.reconcile()
            with self.store.changed:
                self.store.changed.wait(timeout=self.poll_s)

    def reconcile(self) -> None:
        nodes = self.store.view("/nodes")
        pods = self.store.view("/pods")
        for ds in self.store.view(DAEMONSETS):
            meta = ds["metadata"]
            ns, uid = meta.get("namespace", ""), meta["uid"]
            template = ds["spec"]["template"]
            mine = {
                p["spec"].get("nodeName"): p
                for p in pods
                if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences") or [])
            }
            for node in nodes:
                node_name = node["metadata"]["name"]
                wanted = node_matches(template.get("spec") or {}, node["metadata"].get("labels") or {})
                pod = mine.get(node_name)
                if wanted and pod is None:
                    self._create(ds, node_name)
                elif not wanted and pod is not None:
                    self._delete(ns, pod["metadata"]["name"])

    def _create(self, ds: dict[str, Any], node: str) -> None:
        meta = ds["metadata"]
        template = ds["spec"]["template"]
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{node}",
                "namespace": meta.get("namespace", ""),
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {**template.get("spec", {}), "nodeName": node},
            "status": {"phase": "Running"},
        }
        self.store.put("/pods", pod, event="ADDED")
        self.store.record(
            "daemonset-controller", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"], op="create"
        )

    def _delete(self, ns: str, name: str) -> None:
        if (ns, name) in self._removing:
            return
        self._removing.add((ns, name))

        def mark(obj: dict[str, Any]) -> None:
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()

        self.store.update("/pods", ns, name, mark)

        def finish() -> None:
            time.sleep(self.delete_delay_s)
            self.store.remove("/pods", ns, name)
            self.store.record("daemonset-controller", "pods", ns, name, op="delete")
            self._removing.discard((ns, name))

        threading.Thread(target=finish, daemon=True).start()
