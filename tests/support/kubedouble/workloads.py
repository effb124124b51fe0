"""Workload controllers of the double: Deployments, StatefulSets and Jobs make pods from their
*current* template, so a pod that is evicted comes back asking for what the template asks now.

- Deployment (``pkg/controller/deployment``): the template's hash names a ReplicaSet
  (``<name>-<hash>``, label ``pod-template-hash``); a new template gets a new ReplicaSet scaled to
  ``spec.replicas`` while the old ones shrink as the new pods become Ready, keeping at least
  ``replicas - maxUnavailable`` (default 25%, rounded down; 1 when that and ``maxSurge`` are both 0)
  of the old pods until then (``RollingUpdate``), or at once (``Recreate``). The ReplicaSet controller
  (:mod:`tests.support.kubedouble.disruption`) makes and removes the pods.
- StatefulSet (``pkg/controller/statefulset``): pods ``<name>-<ordinal>`` with the label
  ``controller-revision-hash``; a missing one is re-created from the current template; on a template
  change, when every pod is Ready, the highest ordinal still on the old revision is deleted (it comes
  back on the new one): ``RollingUpdate`` with ``maxUnavailable`` 1.
- Job (``pkg/controller/job``): ``spec.parallelism`` (default 1) active pods from its template (which
  the API server keeps immutable); pods never finish in the double.

New pods start Pending and unbound; :mod:`tests.support.kubedouble.scheduler` places them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.support.kubedouble.store import Store

PODS = "/pods"
REPLICASETS = "apps/replicasets"
DEPLOYMENTS = "apps/deployments"
STATEFULSETS = "apps/statefulsets"
JOBS = "batch/jobs"
CRONJOBS = "batch/cronjobs"


def template_hash(template: Any) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _owned_by(obj: dict[str, Any], kind: str, owner: dict[str, Any]) -> bool:
    return any(
        r.get("kind") == kind
        and r.get("name") == owner["metadata"]["name"]
        and r.get("uid") in (owner["metadata"].get("uid"), None)
        for r in obj["metadata"].get("ownerReferences") or []
    )


def _active(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _owner_ref(owner: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"].get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def new_pod(
    template: dict[str, Any], *, name: str, namespace: str, owner: dict[str, Any], labels: dict[str, str]
) -> dict[str, Any]:
    spec = json.loads(json.dumps(template.get("spec") or {"containers": []}))
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**((template.get("metadata") or {}).get("labels") or {}), **labels},
            "ownerReferences": [owner],
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def _scaled(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1]) * total
        return -(-pct // 100) if round_up else pct // 100
    return int(value)


class WorkloadControllers:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._serial = 0

    def hook(self, skey: str) -> None:
        if skey in (DEPLOYMENTS, REPLICASETS, PODS):
            for d in self.store.view(DEPLOYMENTS):
                self._deployment(d)
        if skey in (STATEFULSETS, PODS):
            for s in self.store.view(STATEFULSETS):
                self._statefulset(s)
        if skey in (JOBS, PODS):
            for j in self.store.view(JOBS):
                self._job(j)

    # -- Deployment → ReplicaSets ----------------------------------------------------------------
    def _deployment(self, d: dict[str, Any]) -> None:
        meta, spec = d["metadata"], d.get("spec") or {}
        ns = meta.get("namespace", "default")
        desired = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        h = template_hash(template)
        owned = [rs for rs in self.store.view(REPLICASETS, ns) if _owned_by(rs, "Deployment", d)]
        current = next((rs for rs in owned if rs["metadata"]["name"] == f"{meta['name']}-{h}"), None)
        if current is None:
            labels = {**((template.get("metadata") or {}).get("labels") or {}), "pod-template-hash": h}
            selector = dict((spec.get("selector") or {}).get("matchLabels") or {})
            current = self.store.put(
                REPLICASETS,
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "metadata": {
                        "name": f"{meta['name']}-{h}",
                        "namespace": ns,
                        "labels": labels,
                        "ownerReferences": [_owner_ref(d, "apps/v1", "Deployment")],
                    },
                    "spec": {
                        "replicas": desired,
                        "selector": {"matchLabels": {**selector, "pod-template-hash": h}},
                        "template": {
                            **template,
                            "metadata": {**(template.get("metadata") or {}), "labels": labels},
                        },
                    },
                },
                event="ADDED",
            )
        self._scale(current, desired)
        old = [rs for rs in owned if rs["metadata"]["name"] != current["metadata"]["name"]]
        self._rollout(d, old, current, desired)
        self._status(d, current, owned)

    def _rollout(
        self, d: dict[str, Any], old: list[dict[str, Any]], current: dict[str, Any], desired: int
    ) -> None:
        if not old:
            return
        spec, ns = d.get("spec") or {}, d["metadata"].get("namespace", "default")
        strategy = spec.get("strategy") or {}
        if strategy.get("type") == "Recreate":
            keep = 0
        else:
            rolling = strategy.get("rollingUpdate") or {}
            unavailable = _scaled(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
            surge = _scaled(rolling.get("maxSurge", "25%"), desired, round_up=True)
            if unavailable == 0 and surge == 0:
                unavailable = 1
            new_ready = sum(
                1
                for p in self.store.view(PODS, ns)
                if _owned_by(p, "ReplicaSet", current) and _active(p) and _ready(p)
            )
            keep = max(0, desired - unavailable - new_ready)
        for rs in old:
            self._scale(rs, min(keep, int((rs.get("spec") or {}).get("replicas", 0))))
            keep -= int((rs.get("spec") or {}).get("replicas", 0))
            keep = max(0, keep)

    def _status(self, d: dict[str, Any], current: dict[str, Any], owned: list[dict[str, Any]]) -> None:
        """``syncRolloutStatus``: what ``kubectl rollout status`` reads (minReadySeconds 0: Ready is available)."""
        ns = d["metadata"].get("namespace", "default")
        sets = [*owned, current]
        mine = [
            p
            for p in self.store.view(PODS, ns)
            if _active(p) and any(_owned_by(p, "ReplicaSet", rs) for rs in sets)
        ]
        updated = [p for p in mine if _owned_by(p, "ReplicaSet", current)]
        ready = sum(1 for p in mine if _ready(p))
        status = {
            "observedGeneration": int(d["metadata"].get("generation") or 1),
            "replicas": len(mine),
            "updatedReplicas": len(updated),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, len(mine) - ready),
        }
        if d.get("status") == status:
            return

        def change(o: dict[str, Any]) -> None:
            o["status"] = status

        self.store.update(DEPLOYMENTS, ns, d["metadata"]["name"], change)

    def _scale(self, rs: dict[str, Any], replicas: int) -> None:
        if int((rs.get("spec") or {}).get("replicas", 0)) == replicas:
            return

        def change(o: dict[str, Any]) -> None:
            o["spec"]["replicas"] = replicas

        self.store.update(REPLICASETS, rs["metadata"].get("namespace", ""), rs["metadata"]["name"], change)

    # -- StatefulSet --------------------------------------------------------------------------------
    def _statefulset(self, s: dict[str, Any]) -> None:
        meta, spec = s["metadata"], s.get("spec") or {}
        ns = meta.get("namespace", "default")
        template = spec.get("template") or {}
        revision = f"{meta['name']}-{template_hash(template)}"
        pods = {p["metadata"]["name"]: p for p in self.store.view(PODS, ns) if _owned_by(p, "StatefulSet", s)}
        replicas = int(spec.get("replicas", 1))
        for i in range(replicas):
            name = f"{meta['name']}-{i}"
            if name not in pods:
                pod = new_pod(
                    template,
                    name=name,
                    namespace=ns,
                    owner=_owner_ref(s, "apps/v1", "StatefulSet"),
                    labels={"controller-revision-hash": revision, "statefulset.kubernetes.io/pod-name": name},
                )
                self.store.put(PODS, pod, event="ADDED")
                return  # OrderedReady: one at a time; the next pass makes the next one
            if not (_active(pods[name]) and _ready(pods[name])):
                return  # OrderedReady: the next ordinal waits for this one to be Running and Ready
        if not all(_active(p) and _ready(p) for p in pods.values()):
            return
        stale = [
            p
            for p in pods.values()
            if (p["metadata"].get("labels") or {}).get("controller-revision-hash") != revision
        ]
        if stale:
            last = max(stale, key=lambda p: int(p["metadata"]["name"].rsplit("-", 1)[1]))
            self.store.remove(PODS, ns, last["metadata"]["name"])

    # -- Job ----------------------------------------------------------------------------------------
    def _job(self, j: dict[str, Any]) -> None:
        meta, spec = j["metadata"], j.get("spec") or {}
        ns = meta.get("namespace", "default")
        active = [p for p in self.store.view(PODS, ns) if _owned_by(p, "Job", j) and _active(p)]
        for _ in range(int(spec.get("parallelism", 1)) - len(active)):
            self._serial += 1
            pod = new_pod(
                spec.get("template") or {},
                name=f"{meta['name']}-{self._serial:05x}",
                namespace=ns,
                owner=_owner_ref(j, "batch/v1", "Job"),
                labels={"job-name": meta["name"], "batch.kubernetes.io/job-name": meta["name"]},
            )
            self.store.put(PODS, pod, event="ADDED")
